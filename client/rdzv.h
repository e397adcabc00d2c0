/* librdzv's C interface: join a rendezvous from any language that can call C (Python's ctypes,
 * Rust, Go, Fortran, ...), without C++ types or exceptions across the boundary. It wraps
 * rdzv::Client (client/client.h) and rdzv::PrepareLocalEndpoint (client/local_endpoint.h).
 *
 *   rdzv_client* c;
 *   if (rdzv_client_create("head:29400", 600, RDZV_AUTH_AUTO, NULL, NULL, &c) != RDZV_OK) {
 *     fprintf(stderr, "%s\n", rdzv_last_error());
 *   }
 *   rdzv_join_spec spec;
 *   rdzv_join_spec_init(&spec);
 *   spec.job_id = "job1"; spec.min_nodes = spec.max_nodes = 2; spec.nproc = 4;
 *   rdzv_assignment a;
 *   if (rdzv_join(c, &spec, NULL, &a) == RDZV_OK) {
 *     ... start workers with RANK = a.rank_offset + i, WORLD_SIZE = a.world_size, ...
 *     rdzv_leave(c);
 *   }
 *   rdzv_client_destroy(c);
 *
 * Errors: every call returns an rdzv_code (RDZV_OK or the reason; the numbers are those of
 * gRPC and absl::StatusCode). The message of the last call that failed is kept per thread, as
 * errno is: rdzv_last_error() on the thread that made the call, before its next rdzv_ call.
 * Null pointers and out-of-range numbers are RDZV_INVALID_ARGUMENT with a message naming the
 * argument. Nothing throws across this interface.
 *
 * Ownership: the caller owns every buffer it passes in; strings are read during the call only.
 * The library owns rdzv_client objects; rdzv_client_destroy frees one.
 *
 * Thread safety: the functions may be called from any thread, and several threads may use one
 * client at once (rdzv_cancel ends a rdzv_join blocked on another thread). rdzv_client_destroy
 * ends a call blocked on another thread and waits for it to return, but no call on the client
 * may begin once rdzv_client_destroy has. Callbacks
 * run on the library's own threads and must not block.
 *
 * Stability: types and functions are only added, never changed, while the library's SONAME is
 * librdzv.so.0. Compiles as C99 and as C++. */
#ifndef RDZV_CLIENT_RDZV_H_
#define RDZV_CLIENT_RDZV_H_

#include <stddef.h>
#include <stdint.h>

/* Marks what librdzv.so exports; a build may define it beforehand (e.g. empty). */
#ifndef RDZV_EXPORT
#if defined(__GNUC__) || defined(__clang__)
#define RDZV_EXPORT __attribute__((visibility("default")))
#else
#define RDZV_EXPORT
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* What a call returned; the numbers are gRPC's status codes. */
typedef enum rdzv_code {
  RDZV_OK = 0,
  RDZV_CANCELLED = 1, /* rdzv_cancel ended the call */
  RDZV_UNKNOWN = 2,
  RDZV_INVALID_ARGUMENT = 3,  /* a bad argument or spec: do not retry */
  RDZV_DEADLINE_EXCEEDED = 4, /* the round did not fill within the join timeout */
  RDZV_NOT_FOUND = 5,
  RDZV_ALREADY_EXISTS = 6,
  RDZV_PERMISSION_DENIED = 7,
  RDZV_RESOURCE_EXHAUSTED = 8,
  RDZV_FAILED_PRECONDITION = 9, /* refused in this state (e.g. a mismatched job): do not retry */
  RDZV_ABORTED = 10,            /* the job ended (e.g. it failed elsewhere) */
  RDZV_OUT_OF_RANGE = 11,
  RDZV_UNIMPLEMENTED = 12,
  RDZV_INTERNAL = 13,
  RDZV_UNAVAILABLE = 14, /* the server could not be reached */
  RDZV_DATA_LOSS = 15,
  RDZV_UNAUTHENTICATED = 16 /* the server did not accept this process's credential */
} rdzv_code;

/* The message of the last call on this thread that did not return RDZV_OK ("" after one that
 * did; rdzv_last_error, rdzv_code_name, rdzv_join_spec_init and rdzv_client_destroy leave it as
 * it is). Valid until this thread's next rdzv_ call; never NULL. */
RDZV_EXPORT const char* rdzv_last_error(void);

/* "OK", "INVALID_ARGUMENT", ...; "UNKNOWN" for a number that is no code. Static storage. */
RDZV_EXPORT const char* rdzv_code_name(int code);

/* How the client proves who it is to the server. */
typedef enum rdzv_auth_mode {
  RDZV_AUTH_AUTO = 0,  /* the token when a token file is given, else MUNGE when munged listens,
                          else nothing */
  RDZV_AUTH_MUNGE = 1, /* a MUNGE credential on every call */
  RDZV_AUTH_TOKEN = 2, /* the job's token (token_file) on every call */
  RDZV_AUTH_NONE = 3   /* nothing: a server started with --auth none */
} rdzv_auth_mode;

typedef struct rdzv_client rdzv_client;

/* Makes a client of the rdzvd at `endpoint` ("host:port"; the port defaults to 29400), or of a
 * server list "host1:port,host2:port" (a primary rdzvd and its backups, rdzvd --peers): a join
 * uses the first server that answers, and the calls after it go to that one. Joins give up after
 * `join_timeout_s` seconds (> 0). `token_file` (may be NULL) holds the job's token for
 * RDZV_AUTH_TOKEN/AUTO; `munge_socket` (may be NULL) names munged's socket when it is not the
 * default. Sends nothing yet. On success *out is a client to free with rdzv_client_destroy.
 *
 * The server proves itself in its answer to rdzv_join and rdzv_status: with MUNGE, by a
 * credential that its munged made for this call, which must come from the uid in the environment
 * variable RDZV_SERVER_UID when that is set (else from any uid); with a token, by a digest only a
 * holder of the token can make. A server that does not is refused (RDZV_FAILED_PRECONDITION). */
RDZV_EXPORT rdzv_code rdzv_client_create(const char* endpoint, double join_timeout_s,
                                         int auth /* an rdzv_auth_mode */, const char* token_file,
                                         const char* munge_socket, rdzv_client** out);

/* rdzv_client_create for an rdzvd that serves TLS (rdzvd --tls-cert): the calls are encrypted and
 * the server's certificate is verified with the CA in the PEM file `tls_ca_file`. The certificate
 * must hold `tls_server_name`, or the endpoint's host when it is NULL or "". With `tls_ca_file`
 * NULL or "" this is rdzv_client_create. A server that fails verification makes rdzv_join return
 * RDZV_FAILED_PRECONDITION at once. */
RDZV_EXPORT rdzv_code rdzv_client_create_tls(const char* endpoint, double join_timeout_s,
                                             int auth /* an rdzv_auth_mode */,
                                             const char* token_file, const char* munge_socket,
                                             const char* tls_ca_file, const char* tls_server_name,
                                             rdzv_client** out);

/* Ends any join in progress (it returns RDZV_CANCELLED), closes the event stream, waits for the
 * calls on the client in progress on other threads to return, and frees the client. Blocks until
 * no callback of this client runs or will run: user data given to rdzv_join may be freed after.
 * NULL is allowed and does nothing. */
RDZV_EXPORT void rdzv_client_destroy(rdzv_client* client);

/* What this launcher asks for when it joins. Strings are read during rdzv_join only. */
typedef struct rdzv_join_spec {
  const char* job_id;   /* required: the same for every launcher of the job */
  int32_t min_nodes;    /* the round completes with this many launchers (>= 1) ... */
  int32_t max_nodes;    /* ... or at once with this many (>= min_nodes) */
  int64_t node_index;   /* this node's index (0..max_nodes-1), or -1 for "any" */
  int32_t nproc;        /* workers this launcher starts (>= 1) */
  const char* host;     /* this host's name for messages; NULL or "": gethostname() */
  const char* agent_id; /* unique per launcher of the job; NULL or "": "<host>:<pid>" */
  /* Where rank 0's TCPStore would listen, should this launcher get rank 0. NULL or "": the
   * address of this host on the route toward the server, then its other addresses. */
  const char* master_addr;
  /* 0: a port that is free here, held by the library until rdzv_join returns (so that rank 0
   * can bind it once the workers start). */
  int32_t master_port;
} rdzv_join_spec;

/* Fills `spec` with the defaults: no job id, 1 node, node index -1, 1 process, everything else
 * chosen by the library. */
RDZV_EXPORT void rdzv_join_spec_init(rdzv_join_spec* spec);

/* Why a job ended early (rdzv::AbortCause). */
typedef enum rdzv_abort_cause {
  RDZV_ABORT_UNSPECIFIED = 0,
  RDZV_ABORT_WORKER_FAILED = 1,    /* a worker exited non-zero or was killed by a signal */
  RDZV_ABORT_AGENT_SIGNALLED = 2,  /* a launcher was told to stop (SIGTERM, SIGINT) */
  RDZV_ABORT_AGENT_LOST = 3,       /* the server lost a launcher */
  RDZV_ABORT_SERVER_LOST = 4,      /* a launcher lost the server */
  RDZV_ABORT_RESUME_TIMED_OUT = 5, /* a restarted server gave up waiting for the launchers */
  RDZV_ABORT_WORKER_HUNG = 6,      /* a worker hung */
  RDZV_ABORT_NODE_UNHEALTHY = 7    /* a node failed its health check; the job fell below MIN */
} rdzv_abort_cause;

/* Callbacks of one join; every member may be NULL. They run on the library's threads and must
 * not block: no rdzv_ call in them but rdzv_cancel. They may run until rdzv_client_destroy
 * returns. */
typedef struct rdzv_callbacks {
  /* While the round fills: `joined` of `expected` launchers are in. */
  void (*on_progress)(void* user_data, int32_t joined, int32_t expected);
  /* The job ended elsewhere: after the assignment, or while joining (rdzv_join then returns
   * RDZV_ABORTED). `reason` is one line for people, valid during the call only; `exit_code`
   * (never 0) is what the launcher should exit with. */
  void (*on_abort)(void* user_data, rdzv_abort_cause cause, int32_t exit_code, const char* reason);
  /* After the assignment: the server is gone (stopped or unreachable) without an abort. */
  void (*on_lost)(void* user_data, rdzv_code code, const char* message);
  void* user_data;
} rdzv_callbacks;

/* This launcher's place in the job: what its workers' environment is made of. */
typedef struct rdzv_assignment {
  int32_t round;             /* the rendezvous round, from 1 */
  int32_t rank_offset;       /* RANK of this launcher's first worker; worker i: rank_offset + i */
  int32_t local_rank_offset; /* LOCAL_RANK of the first worker (0 unless the node is shared) */
  int32_t local_world_size;  /* LOCAL_WORLD_SIZE */
  int32_t world_size;        /* WORLD_SIZE */
  int32_t group_rank;        /* GROUP_RANK: this node's dense index */
  int32_t group_world_size;  /* GROUP_WORLD_SIZE: the number of launchers */
  int32_t restart_count;     /* TORCHELASTIC_RESTART_COUNT */
  int32_t master_port;       /* MASTER_PORT */
  char master_addr[256];     /* MASTER_ADDR, NUL-terminated */
} rdzv_assignment;

/* Joins spec->job_id and blocks until the round completes, then fills *out. `callbacks` may be
 * NULL. Afterwards the client keeps the job's event stream open (abort and loss arrive through
 * `callbacks`) until rdzv_leave or rdzv_client_destroy. Errors: RDZV_UNAVAILABLE (no server
 * within the join timeout), RDZV_DEADLINE_EXCEEDED (the round did not fill), RDZV_ABORTED,
 * RDZV_CANCELLED (rdzv_cancel), and the server's refusals (INVALID_ARGUMENT, FAILED_PRECONDITION,
 * UNAUTHENTICATED, PERMISSION_DENIED). */
RDZV_EXPORT rdzv_code rdzv_join(rdzv_client* client, const rdzv_join_spec* spec,
                                const rdzv_callbacks* callbacks, rdzv_assignment* out);

/* A worker of this launcher failed (or the launcher was told to stop). */
typedef struct rdzv_failure {
  rdzv_abort_cause cause; /* RDZV_ABORT_WORKER_FAILED, _AGENT_SIGNALLED or _WORKER_HUNG */
  int32_t rank;           /* the failed worker's RANK */
  int32_t local_rank;     /* and LOCAL_RANK */
  int32_t exit_code;      /* its exit code (128 + signal when a signal killed it) */
  int32_t signal;         /* the signal that killed it (or that the launcher got), else 0 */
  const char* message;    /* one line, may be NULL */
} rdzv_failure;

/* The job's end as the server decided it. */
typedef struct rdzv_abort_info {
  rdzv_abort_cause cause;
  int32_t exit_code; /* never 0 */
  char reason[1024]; /* one line, NUL-terminated, cut to fit */
} rdzv_abort_info;

/* Reports a failure of this launcher's part of the job, after rdzv_join; every launcher of the
 * job then hears on_abort. Fills *first (may be NULL) with the job's first failure, which may be
 * another launcher's. Blocks for up to a few seconds. */
RDZV_EXPORT rdzv_code rdzv_report_failure(rdzv_client* client, const rdzv_failure* failure,
                                          rdzv_abort_info* first);

/* Tells the server this launcher is done and closes the event stream; a rdzv_join blocked on
 * another thread returns RDZV_CANCELLED. Blocks briefly. RDZV_FAILED_PRECONDITION before any
 * rdzv_join; RDZV_OK at once when the server has answered a rdzv_leave already. */
RDZV_EXPORT rdzv_code rdzv_leave(rdzv_client* client);

/* Ends a rdzv_join in progress on another thread (it returns RDZV_CANCELLED) and closes the
 * event stream, for good. Does not block. */
RDZV_EXPORT rdzv_code rdzv_cancel(rdzv_client* client);

/* A snapshot of one job on the server. */
typedef struct rdzv_job_status {
  int32_t round;
  int32_t joined; /* launchers in the current round */
  int32_t min_nodes;
  int32_t max_nodes;
  int32_t world_size; /* 0 while the round fills */
  char state[32];     /* "filling", "running", ...; NUL-terminated */
} rdzv_job_status;

/* The state of `job_id` on the server; RDZV_NOT_FOUND when it has no such job. */
RDZV_EXPORT rdzv_code rdzv_status(rdzv_client* client, const char* job_id, rdzv_job_status* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* RDZV_CLIENT_RDZV_H_ */
