// rdzv::Client — librdzv's entry point: join a rendezvous and get this process's place in the
// job, for rdzv-agent and for custom launchers.
//
//   rdzv::ClientOptions opts{.endpoint = "head:29400"};
//   auto client = rdzv::Client::Create(opts);            // no I/O yet
//   rdzv::JoinSpec spec = ...;                           // job id, this node, worker count
//   auto assignment = (*client)->Join(spec, handlers);   // blocks until the round completes
//   ... start workers at assignment->slot.rank_offset ...
//   (*client)->Leave();
//
// After Join returns, the client keeps the job's event stream open: the server uses it to see
// that this agent is alive and to deliver an Abort when the job fails elsewhere (delivered to
// Handlers::on_abort on a gRPC thread). Unreachable servers are retried with exponential
// backoff and jitter until the join timeout. client/local_endpoint.h finds the addresses and the
// master port a JoinSpec needs.
//
// Thread-safe; Cancel() may be called from any thread to end a blocking Join early. No call
// sequence crashes: every call, in any order, ends with a value or a status.
#ifndef RDZV_CLIENT_CLIENT_H_
#define RDZV_CLIENT_CLIENT_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/core/backoff.h"
#include "common/core/rendezvous_types.h"

namespace grpc {
class ClientContext;
}  // namespace grpc

namespace rdzv {

// How the client proves who it is to the server (see common/auth.h).
struct ClientAuth {
  enum class Mode {
    kAuto,   // a token when one is given, else MUNGE when munged listens, else nothing
    kMunge,  // a MUNGE credential on every call
    kToken,  // the job's token on every call
    kNone,   // nothing (a server with --auth none)
  };
  Mode mode = Mode::kAuto;
  std::string token;         // the job's token (common/auth.h ReadTokenFile)
  std::string munge_socket;  // "" for munged's default
  // Under MUNGE, the uid the server must run as to prove itself: this user's own for a server
  // the job's agent hosts, the site's rdzvd's uid (RDZV_SERVER_UID) for an rdzvd. Unset: any uid
  // that munged vouches for, which shows only that the server runs on a host of the cluster.
  std::optional<uid_t> server_uid;
  // Set when kAuto resolved to kNone because this host has neither a token nor munged: why, in
  // words. Such a client reaches only a server on this host's loopback (the one place rdzvd
  // --auth none may listen), and refuses any other at once, saying this.
  std::string none_because;
};

// `auth` with kAuto resolved to what this host can use: kToken when a token is given, else
// kMunge when munged listens on its socket, else kNone. InvalidArgument for kToken without a
// token.
absl::StatusOr<ClientAuth> ResolveClientAuth(ClientAuth auth);

// `auth` with the job's token read from `token_file` ("" for none) when its mode may use one
// (kAuto, kToken), then resolved as ResolveClientAuth does. The file must pass common/auth.h
// ReadTokenFile's checks; else one line naming the file and the fix. Reads the file, and under
// kAuto looks for munged's socket.
absl::StatusOr<ClientAuth> LoadClientAuth(ClientAuth auth, const std::string& token_file);

// Puts the credential `auth` (resolved) calls for on a call of `method` on `job`: a MUNGE
// credential made for this one call, or the job's token. With a `nonce` (common/auth.h NewNonce)
// it also asks the server to prove itself in its answer. Blocks on munged under MUNGE.
absl::Status AttachCredential(grpc::ClientContext& ctx, const ClientAuth& auth,
                              absl::string_view method, absl::string_view job,
                              absl::string_view nonce = {});

// Whether the answer to a call made with AttachCredential(..., nonce) proves that it comes from
// the server `auth` expects (see common/auth.h): OK, also under kNone, where nothing is proven;
// else FailedPrecondition saying what is wrong with the proof, or Unavailable when this host's
// munged does not answer. An answer without any proof is OK unless `required`. Call once the
// answer's initial metadata has arrived. Blocks on munged under MUNGE.
absl::Status CheckServerProof(const grpc::ClientContext& ctx, const ClientAuth& auth,
                              absl::string_view method, absl::string_view job,
                              absl::string_view nonce, bool required);

// Whether a server at `endpoint` ("host:port") must prove itself: every server but one named on
// a loopback address, where rdzvd may run with --auth none, which proves nothing. (An agent
// requires the proof of every candidate it scans for its job's server, loopback or not.)
bool ProofRequiredAt(absl::string_view endpoint);

// TLS toward the server: verify it with this CA and encrypt the calls. Both empty: plaintext.
struct ClientTls {
  std::string ca_file;      // PEM bundle of the CA that signed the server's certificate
  std::string server_name;  // the name its certificate must hold; "" for the endpoint's host
};

struct ClientOptions {
  // "host:port" of rdzvd, or an ordered list of them, "host1:port,host2:port": a primary rdzvd
  // and its backups (rdzvd --peers). New jobs use the first that answers.
  std::string endpoint;
  // Where else the server may be (the backups of a list given apart, or the ports an embedded
  // server that found its first port taken moved on to). Join moves on to the next endpoint when
  // one is unreachable or serves another job (or, for a server list, when the job is served
  // elsewhere), and sticks to the one that answers.
  std::vector<std::string> alternate_endpoints;
  // A join that resumes a job (JoinSpec::resume) after its server was lost keeps trying that
  // server this long before it moves on to the next one of the list: a server restarting in
  // place keeps its jobs.
  absl::Duration failover_after = absl::Seconds(3);
  absl::Duration join_timeout = absl::Minutes(10);  // how long Join may wait in total
  absl::Duration rpc_timeout = absl::Seconds(10);   // deadline of each unary call
  BackoffPolicy backoff;
  // How often the client pings the server on the otherwise quiet event stream, and how long
  // it waits for the answer before declaring the server lost. A server that stops or whose host
  // goes away is noticed within their sum; one that is busy answering a burst of ten thousand
  // joins may take seconds to answer a ping, and is not lost.
  absl::Duration keepalive_time = absl::Seconds(5);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  ClientAuth auth;
  ClientTls tls;
};

struct Handlers {
  // While waiting: how the round fills. Called on a gRPC thread; must not block.
  std::function<void(const ProgressEvent&)> on_progress;
  // The job ended elsewhere: after the assignment, or before it when a join finds the job
  // already ended (Join then returns Aborted). Called on a gRPC thread; must not block.
  std::function<void(const AbortEvent&)> on_abort;
  // After the assignment: the event stream ended without Leave (server stopped or
  // unreachable). Called on a gRPC thread; must not block.
  std::function<void(const absl::Status&)> on_lost;
  // After the assignment: the server ended the event stream cleanly without Leave. It does so to
  // a hot spare (AssignmentEvent::spare) whose job completed without it. Called on a gRPC
  // thread; must not block.
  std::function<void()> on_released;
};

// What a server's gRPC health service (grpc.health.v1) says of it.
enum class ServingStatus { kUnknown, kServing, kNotServing, kServiceUnknown };

// How a join that timed out begins its DeadlineExceeded message; the join's timeout follows.
inline constexpr absl::string_view kDidNotComplete = "the rendezvous did not complete within ";

class Client {
 public:
  // InvalidArgument for a malformed endpoint (or an empty one in a list); a one-line error naming
  // the file for a TLS CA file that cannot be read or holds no certificate. Connects lazily.
  static absl::StatusOr<std::unique_ptr<Client>> Create(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Joins `spec.job_id` and blocks until this agent's assignment arrives. Refusals come back
  // as the server's status (InvalidArgument, FailedPrecondition: do not retry); an unreachable
  // server as Unavailable and a round that did not fill in time as DeadlineExceeded, both after
  // join_timeout; a failed TLS handshake at once as FailedPrecondition; Cancelled after Cancel().
  // When munged does not answer, the join tries again for up to 15 seconds (a munged restart)
  // and then returns munged's Unavailable.
  absl::StatusOr<AssignmentEvent> Join(const JoinSpec& spec, Handlers handlers);
  // The same with its own time limit instead of join_timeout (a resume after a lost server).
  absl::StatusOr<AssignmentEvent> Join(const JoinSpec& spec, Handlers handlers,
                                       absl::Duration timeout);

  // Reports a worker failure of this agent; returns the job's first failure. Blocks for up to
  // rpc_timeout. FailedPrecondition before any Join.
  absl::StatusOr<AbortEvent> ReportFailure(const FailureInfo& failure);
  // The same without blocking: `done` runs on a gRPC thread (it must not block) once the server
  // has answered or the call has failed.
  void ReportFailureAsync(const FailureInfo& failure,
                          std::function<void(absl::StatusOr<AbortEvent>)> done);

  // Tells the server this agent is done and closes the event stream. Blocks for up to
  // rpc_timeout; LeaveAsync does not, and runs `done` on a gRPC thread. A Join blocked on another
  // thread ends with Cancelled. FailedPrecondition before any Join; OK at once once the server
  // has answered a Leave of the latest Join.
  absl::Status Leave();
  void LeaveAsync(std::function<void(absl::Status)> done);

  // The calls below are an operator's (rdzvctl's) and need no Join: each is one call, made on the
  // first endpoint (or the one Join stuck to), that blocks for up to rpc_timeout. Errors are one
  // line each: an unreachable server or one that did not answer in time comes back as Unavailable
  // or DeadlineExceeded saying so, a failed TLS handshake as FailedPrecondition, a credential that
  // cannot be made as its own status (Unavailable when munged does not answer), a refusal as the
  // server's status, and an answer whose server did not prove itself as FailedPrecondition.

  // A snapshot of one job (or all, for an empty id): the caller's own jobs, or every job for
  // root and the server's admin groups. An empty list when there is no such job. The server
  // keeps its reply within a fixed size: `*omitted_jobs` (when given) receives how many jobs it
  // left out, and each job's omitted_agents its agents left out.
  absl::StatusOr<std::vector<JobStatusView>> Status(const std::string& job_id,
                                                    int64_t* omitted_jobs = nullptr);

  // Ends `job_id` for every agent, as a failure would, with `reason` for its agents to print;
  // returns how the job ended: this abort, or the earlier one that ended it already. NotFound for
  // a job the server does not know or the caller may not abort (another user's, unless the caller
  // is root or in an admin group).
  absl::StatusOr<AbortEvent> AbortJob(const std::string& job_id, const std::string& reason);

  // What the server's gRPC health service says of it. Sends no credential (the service asks for
  // none), so it shows that something serves there, not who.
  absl::StatusOr<ServingStatus> Health();

  // The endpoint in use: the first, or the one the latest Join stuck to.
  std::string endpoint() const;
  // When `endpoint()` is a node's relay: the rendezvous server the relay reached for the last
  // join that got an assignment ("host:port"); "" otherwise.
  std::string relayed_server() const;

  // Ends a Join in progress, if any (it returns Cancelled); later Joins work as usual. The event
  // stream of a Join that has returned stays open.
  void CancelJoin();

  // Ends a Join in progress (it returns Cancelled) and closes the event stream, for good: later
  // Joins return Cancelled at once.
  void Cancel();

  // Ends the failure reports and departures still waiting for the server (their callbacks get
  // Cancelled), and any made later, for good. For a process that exits without waiting for a
  // server that does not answer: the destructor otherwise waits for them, up to rpc_timeout.
  void AbandonCalls();

 private:
  class JoinCall;
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace rdzv

#endif  // RDZV_CLIENT_CLIENT_H_
