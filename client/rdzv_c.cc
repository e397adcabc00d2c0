// librdzv's C interface (client/rdzv.h) over rdzv::Client. Every entry point validates its
// arguments, converts absl::Status into an rdzv_code plus this thread's last error message, and
// catches every exception, so that nothing C++ crosses the boundary.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/local_endpoint.h"
#include "client/rdzv.h"
#include "common/clock.h"
#include "common/core/connection_flags.h"
#include "common/core/flags.h"
#include "common/host_name.h"
#include "common/net.h"

// The handle behind rdzv_client*. Defined outside namespace rdzv: it is the C type.
struct rdzv_client {
  std::string server_host;  // for the route that picks this host's address
  absl::Mutex mu;
  // What a failure report says about this launcher, known once it has joined.
  bool joined ABSL_GUARDED_BY(mu) = false;
  std::string host ABSL_GUARDED_BY(mu);
  int32_t group_rank ABSL_GUARDED_BY(mu) = 0;
  int calls ABSL_GUARDED_BY(mu) = 0;  // in progress, for rdzv_client_destroy to wait for
  // Last, so that it goes first: its callbacks run until it is gone, and may call rdzv_cancel,
  // which needs the members above.
  std::unique_ptr<rdzv::Client> client;
};

namespace rdzv {
namespace {

// Per thread, as errno: calls on other threads cannot overwrite it before its reader sees it.
thread_local std::string last_error;

void SetLastError(absl::string_view message) noexcept {
  try {
    last_error.assign(message.data(), message.size());
  } catch (...) {
    last_error.clear();  // out of memory: an empty message is better than none at all
  }
}

rdzv_code Fail(rdzv_code code, absl::string_view message) noexcept {
  SetLastError(message);
  return code;
}

rdzv_code Ok() noexcept {
  last_error.clear();
  return RDZV_OK;
}

rdzv_code CodeOf(absl::StatusCode code) {
  const int n = static_cast<int>(code);
  return n >= RDZV_OK && n <= RDZV_UNAUTHENTICATED ? static_cast<rdzv_code>(n) : RDZV_UNKNOWN;
}

rdzv_code FromStatus(const char* function, const absl::Status& status) {
  if (status.ok()) return Ok();
  return Fail(CodeOf(status.code()), absl::StrCat(function, ": ", status.message()));
}

rdzv_code NullArgument(const char* function, const char* argument) {
  return Fail(RDZV_INVALID_ARGUMENT, absl::StrCat(function, ": ", argument, " is NULL"));
}

// Runs one entry point's body; an exception becomes RDZV_INTERNAL.
template <typename Body>
rdzv_code Guarded(const char* function, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& e) {
    return Fail(RDZV_INTERNAL, absl::StrCat(function, ": ", e.what()));
  } catch (...) {
    return Fail(RDZV_INTERNAL, absl::StrCat(function, ": unexpected exception"));
  }
}

// Copies `text` into a caller's fixed buffer, always NUL-terminated; false when it was cut.
template <size_t N>
bool CopyOut(const std::string& text, char (&buffer)[N]) {
  const size_t n = std::min(text.size(), N - 1);
  std::memcpy(buffer, text.data(), n);
  buffer[n] = '\0';
  return n == text.size();
}

bool Empty(const char* s) { return s == nullptr || *s == '\0'; }

// A call in progress on a client: rdzv_client_destroy waits until there is none.
class InCall {
 public:
  explicit InCall(rdzv_client* client) : client_(client) {
    absl::MutexLock lock(&client_->mu);
    ++client_->calls;
  }
  ~InCall() {
    absl::MutexLock lock(&client_->mu);
    --client_->calls;
  }
  InCall(const InCall&) = delete;
  InCall& operator=(const InCall&) = delete;

 private:
  rdzv_client* const client_;
};

static_assert(static_cast<int>(RDZV_ABORT_NODE_UNHEALTHY) == kMaxAbortCause,
              "rdzv_abort_cause and AbortCause differ");
rdzv_abort_cause CauseOf(AbortCause cause) { return static_cast<rdzv_abort_cause>(cause); }

void FillAbort(const AbortEvent& abort, rdzv_abort_info& out) {
  out.cause = CauseOf(abort.cause);
  out.exit_code = abort.exit_code;
  CopyOut(abort.reason, out.reason);
}

// Checks a rdzv_join_spec and turns it into a JoinSpec (without this host's endpoint yet).
rdzv_code MakeJoinSpec(const rdzv_join_spec& in, JoinSpec& spec) {
  constexpr const char* kFn = "rdzv_join";
  if (Empty(in.job_id)) return Fail(RDZV_INVALID_ARGUMENT, "rdzv_join: spec->job_id is empty");
  if (in.min_nodes < 1) {
    return Fail(RDZV_INVALID_ARGUMENT,
                absl::StrCat(kFn, ": spec->min_nodes is ", in.min_nodes, "; it must be >= 1"));
  }
  if (in.max_nodes < in.min_nodes) {
    return Fail(RDZV_INVALID_ARGUMENT,
                absl::StrCat(kFn, ": spec->max_nodes is ", in.max_nodes,
                             "; it must be >= spec->min_nodes (", in.min_nodes, ")"));
  }
  if (in.node_index < -1 || in.node_index >= in.max_nodes) {
    return Fail(RDZV_INVALID_ARGUMENT, absl::StrCat(kFn, ": spec->node_index is ", in.node_index,
                                                    "; it must be -1 or 0..", in.max_nodes - 1));
  }
  if (in.nproc < 1) {
    return Fail(RDZV_INVALID_ARGUMENT,
                absl::StrCat(kFn, ": spec->nproc is ", in.nproc, "; it must be >= 1"));
  }
  if (in.master_port < 0 || in.master_port > 65535) {
    return Fail(RDZV_INVALID_ARGUMENT, absl::StrCat(kFn, ": spec->master_port is ", in.master_port,
                                                    "; it must be 0 (pick one) or 1..65535"));
  }
  spec.job_id = in.job_id;
  spec.min_agents = in.min_nodes;
  spec.max_agents = in.max_nodes;
  spec.agent.node_index = in.node_index;
  spec.agent.nproc = in.nproc;
  spec.agent.host = Empty(in.host) ? HostName() : std::string(in.host);
  spec.agent.agent_id =
      Empty(in.agent_id) ? absl::StrCat(spec.agent.host, ":", getpid()) : std::string(in.agent_id);
  return Ok();
}

Handlers MakeHandlers(const rdzv_callbacks* callbacks) {
  Handlers handlers;
  if (callbacks == nullptr) return handlers;
  const rdzv_callbacks cb = *callbacks;
  if (cb.on_progress != nullptr) {
    handlers.on_progress = [cb](const ProgressEvent& e) {
      cb.on_progress(cb.user_data, e.joined, e.expected);
    };
  }
  if (cb.on_abort != nullptr) {
    handlers.on_abort = [cb](const AbortEvent& e) {
      cb.on_abort(cb.user_data, CauseOf(e.cause), e.exit_code, e.reason.c_str());
    };
  }
  if (cb.on_lost != nullptr) {
    handlers.on_lost = [cb](const absl::Status& s) {
      const std::string message(s.message());
      cb.on_lost(cb.user_data, CodeOf(s.code()), message.c_str());
    };
  }
  return handlers;
}

// `auth` is an int across the interface: a caller's out-of-range value is an error, not UB.
rdzv_code CreateClient(const char* kFn, const char* endpoint, double join_timeout_s, int auth,
                       const char* token_file, const char* munge_socket, const char* tls_ca_file,
                       const char* tls_server_name, rdzv_client** out) {
  if (out == nullptr) return NullArgument(kFn, "out");
  *out = nullptr;
  if (Empty(endpoint)) {
    return Fail(RDZV_INVALID_ARGUMENT,
                absl::StrCat(kFn, ": endpoint is empty; give the server as host:port"));
  }
  // The upper bound keeps the duration arithmetic finite: a year is "forever" here.
  if (!(join_timeout_s > 0) || join_timeout_s > 365.0 * 24 * 3600) {
    return Fail(RDZV_INVALID_ARGUMENT,
                absl::StrCat(kFn, ": join_timeout_s is ", join_timeout_s,
                             "; it must be a number of seconds > 0 (and at most a year)"));
  }
  ClientOptions options;
  options.endpoint = endpoint;
  options.join_timeout = absl::Seconds(join_timeout_s);
  switch (auth) {
    case RDZV_AUTH_AUTO:
      options.auth.mode = ClientAuth::Mode::kAuto;
      break;
    case RDZV_AUTH_MUNGE:
      options.auth.mode = ClientAuth::Mode::kMunge;
      break;
    case RDZV_AUTH_TOKEN:
      options.auth.mode = ClientAuth::Mode::kToken;
      if (Empty(token_file)) {
        return Fail(RDZV_INVALID_ARGUMENT,
                    absl::StrCat(kFn,
                                 ": token_file is empty; RDZV_AUTH_TOKEN needs the file "
                                 "that holds the job's token"));
      }
      break;
    case RDZV_AUTH_NONE:
      options.auth.mode = ClientAuth::Mode::kNone;
      break;
    default:
      return Fail(RDZV_INVALID_ARGUMENT,
                  absl::StrCat(kFn, ": auth is ", static_cast<int>(auth),
                               "; it must be RDZV_AUTH_AUTO, _MUNGE, _TOKEN or _NONE"));
  }
  if (!Empty(munge_socket)) options.auth.munge_socket = munge_socket;
  absl::StatusOr<ClientAuth> loaded =
      LoadClientAuth(std::move(options.auth), Empty(token_file) ? "" : token_file);
  if (!loaded.ok()) return FromStatus(kFn, loaded.status());
  options.auth = *std::move(loaded);
  if (const char* uid = std::getenv("RDZV_SERVER_UID"); !Empty(uid)) {
    absl::StatusOr<uid_t> parsed = ParseUid(uid);
    if (!parsed.ok()) {
      return Fail(RDZV_INVALID_ARGUMENT,
                  absl::StrCat(kFn, ": RDZV_SERVER_UID ", parsed.status().message()));
    }
    options.auth.server_uid = *parsed;
  }
  if (absl::Status s = CheckTlsServerName(Empty(tls_ca_file) ? "" : tls_ca_file,
                                          Empty(tls_server_name) ? "" : tls_server_name,
                                          "tls_ca_file", "tls_server_name");
      !s.ok()) {
    return FromStatus(kFn, s);
  }
  if (!Empty(tls_ca_file)) options.tls.ca_file = tls_ca_file;
  if (!Empty(tls_server_name)) options.tls.server_name = tls_server_name;
  // A server list's first server: its host is where rank 0's address is picked toward.
  absl::StatusOr<HostPort> server = ParseHostPort(
      absl::StripAsciiWhitespace(options.endpoint.substr(0, options.endpoint.find(','))), 29400);
  if (!server.ok()) return FromStatus(kFn, server.status());
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(std::move(options));
  if (!client.ok()) return FromStatus(kFn, client.status());
  auto handle = std::make_unique<rdzv_client>();
  handle->client = *std::move(client);
  handle->server_host = server->host;
  *out = handle.release();
  return Ok();
}

rdzv_code Join(rdzv_client* client, const rdzv_join_spec* spec, const rdzv_callbacks* callbacks,
               rdzv_assignment* out) {
  constexpr const char* kFn = "rdzv_join";
  if (client == nullptr) return NullArgument(kFn, "client");
  const InCall in_call(client);
  if (spec == nullptr) return NullArgument(kFn, "spec");
  if (out == nullptr) return NullArgument(kFn, "out");
  JoinSpec join;
  if (rdzv_code c = MakeJoinSpec(*spec, join); c != RDZV_OK) return c;
  // This host's endpoint for rank 0, as rdzv-agent picks it; a picked port stays reserved
  // until the join returns, so that no other process takes it meanwhile.
  std::optional<ReservedPort> reserved;
  if (Empty(spec->master_addr) || spec->master_port == 0) {
    absl::StatusOr<ReservedPort> port = PrepareLocalEndpoint(join, client->server_host);
    if (!port.ok()) return FromStatus(kFn, port.status());
    if (spec->master_port == 0) reserved = *std::move(port);
  }
  if (!Empty(spec->master_addr)) join.addresses = {spec->master_addr};
  if (spec->master_port != 0) join.master_port = spec->master_port;

  absl::StatusOr<AssignmentEvent> a = client->client->Join(join, MakeHandlers(callbacks));
  if (reserved) reserved->Release();
  if (!a.ok()) return FromStatus(kFn, a.status());
  rdzv_assignment result{};
  result.round = a->round;
  result.rank_offset = a->slot.rank_offset;
  result.local_rank_offset = a->slot.local_rank_offset;
  result.local_world_size = a->slot.local_world_size;
  result.world_size = a->world_size;
  result.group_rank = a->slot.group_rank;
  result.group_world_size = a->group_world_size;
  result.restart_count = a->restart_count;
  result.master_port = a->master_port;
  if (!CopyOut(a->master_addr, result.master_addr)) {
    return Fail(RDZV_INTERNAL, absl::StrCat(kFn, ": the master address \"", a->master_addr,
                                            "\" is longer than rdzv_assignment holds"));
  }
  {
    absl::MutexLock lock(&client->mu);
    client->joined = true;
    client->host = join.agent.host;
    client->group_rank = a->slot.group_rank;
  }
  *out = result;
  return Ok();
}

rdzv_code ReportFailure(rdzv_client* client, const rdzv_failure* failure, rdzv_abort_info* first) {
  constexpr const char* kFn = "rdzv_report_failure";
  if (client == nullptr) return NullArgument(kFn, "client");
  const InCall in_call(client);
  if (failure == nullptr) return NullArgument(kFn, "failure");
  if (failure->cause != RDZV_ABORT_WORKER_FAILED && failure->cause != RDZV_ABORT_AGENT_SIGNALLED &&
      failure->cause != RDZV_ABORT_WORKER_HUNG) {
    return Fail(RDZV_INVALID_ARGUMENT,
                absl::StrCat(kFn, ": failure->cause is ", static_cast<int>(failure->cause),
                             "; it must be RDZV_ABORT_WORKER_FAILED, _AGENT_SIGNALLED or "
                             "_WORKER_HUNG"));
  }
  if (failure->rank < 0 || failure->local_rank < 0 || failure->signal < 0) {
    return Fail(
        RDZV_INVALID_ARGUMENT,
        absl::StrCat(kFn, ": failure->rank (", failure->rank, "), local_rank (",
                     failure->local_rank, ") and signal (", failure->signal, ") must be >= 0"));
  }
  FailureInfo info;
  {
    absl::MutexLock lock(&client->mu);
    if (!client->joined) {
      return Fail(RDZV_FAILED_PRECONDITION,
                  absl::StrCat(kFn, ": this client has not joined a job; call rdzv_join first"));
    }
    info.host = client->host;
    info.group_rank = client->group_rank;
  }
  info.cause = static_cast<AbortCause>(failure->cause);
  info.rank = failure->rank;
  info.local_rank = failure->local_rank;
  info.exit_code = failure->exit_code;
  info.signal = failure->signal;
  if (failure->message != nullptr) info.error_message = failure->message;
  info.time_us = WallMicros();
  absl::StatusOr<AbortEvent> abort = client->client->ReportFailure(info);
  if (!abort.ok()) return FromStatus(kFn, abort.status());
  if (first != nullptr) FillAbort(*abort, *first);
  return Ok();
}

rdzv_code Leave(rdzv_client* client) {
  constexpr const char* kFn = "rdzv_leave";
  if (client == nullptr) return NullArgument(kFn, "client");
  const InCall in_call(client);
  return FromStatus(kFn, client->client->Leave());
}

rdzv_code Cancel(rdzv_client* client) {
  constexpr const char* kFn = "rdzv_cancel";
  if (client == nullptr) return NullArgument(kFn, "client");
  const InCall in_call(client);
  client->client->Cancel();
  return Ok();
}

rdzv_code JobStatus(rdzv_client* client, const char* job_id, rdzv_job_status* out) {
  constexpr const char* kFn = "rdzv_status";
  if (client == nullptr) return NullArgument(kFn, "client");
  const InCall in_call(client);
  if (job_id == nullptr) return NullArgument(kFn, "job_id");
  if (out == nullptr) return NullArgument(kFn, "out");
  if (*job_id == '\0') return Fail(RDZV_INVALID_ARGUMENT, absl::StrCat(kFn, ": job_id is empty"));
  absl::StatusOr<std::vector<JobStatusView>> jobs = client->client->Status(job_id);
  if (!jobs.ok()) return FromStatus(kFn, jobs.status());
  for (const JobStatusView& job : *jobs) {
    if (job.job_id != job_id) continue;
    rdzv_job_status result{};
    result.round = job.round;
    result.joined = job.joined;
    result.min_nodes = job.min_agents;
    result.max_nodes = job.max_agents;
    result.world_size = job.world_size;
    CopyOut(job.state, result.state);
    *out = result;
    return Ok();
  }
  return Fail(RDZV_NOT_FOUND, absl::StrCat(kFn, ": the server has no job \"", job_id, "\""));
}

}  // namespace
}  // namespace rdzv

extern "C" {

const char* rdzv_last_error(void) { return rdzv::last_error.c_str(); }

const char* rdzv_code_name(int code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  if (code < 0 || code >= static_cast<int>(sizeof(kNames) / sizeof(kNames[0]))) return "UNKNOWN";
  return kNames[code];
}

void rdzv_client_destroy(rdzv_client* client) {
  rdzv::Guarded("rdzv_client_destroy", [&] {
    if (client == nullptr) return RDZV_OK;
    // A call blocked on another thread (a join) returns now; the client goes once it has.
    client->client->Cancel();
    {
      absl::MutexLock lock(&client->mu);
      client->mu.Await(absl::Condition(
          +[](rdzv_client* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) { return c->calls == 0; },
          client));
    }
    delete client;
    return RDZV_OK;
  });
}

void rdzv_join_spec_init(rdzv_join_spec* spec) {
  if (spec == nullptr) return;
  *spec = rdzv_join_spec{};
  spec->min_nodes = 1;
  spec->max_nodes = 1;
  spec->node_index = -1;
  spec->nproc = 1;
}

rdzv_code rdzv_client_create(const char* endpoint, double join_timeout_s, int auth,
                             const char* token_file, const char* munge_socket, rdzv_client** out) {
  return rdzv::Guarded("rdzv_client_create", [&] {
    return rdzv::CreateClient("rdzv_client_create", endpoint, join_timeout_s, auth, token_file,
                              munge_socket, nullptr, nullptr, out);
  });
}

rdzv_code rdzv_client_create_tls(const char* endpoint, double join_timeout_s, int auth,
                                 const char* token_file, const char* munge_socket,
                                 const char* tls_ca_file, const char* tls_server_name,
                                 rdzv_client** out) {
  return rdzv::Guarded("rdzv_client_create_tls", [&] {
    return rdzv::CreateClient("rdzv_client_create_tls", endpoint, join_timeout_s, auth, token_file,
                              munge_socket, tls_ca_file, tls_server_name, out);
  });
}

rdzv_code rdzv_join(rdzv_client* client, const rdzv_join_spec* spec,
                    const rdzv_callbacks* callbacks, rdzv_assignment* out) {
  return rdzv::Guarded("rdzv_join", [&] { return rdzv::Join(client, spec, callbacks, out); });
}

rdzv_code rdzv_report_failure(rdzv_client* client, const rdzv_failure* failure,
                              rdzv_abort_info* first) {
  return rdzv::Guarded("rdzv_report_failure",
                       [&] { return rdzv::ReportFailure(client, failure, first); });
}

rdzv_code rdzv_leave(rdzv_client* client) {
  return rdzv::Guarded("rdzv_leave", [&] { return rdzv::Leave(client); });
}

rdzv_code rdzv_cancel(rdzv_client* client) {
  return rdzv::Guarded("rdzv_cancel", [&] { return rdzv::Cancel(client); });
}

rdzv_code rdzv_status(rdzv_client* client, const char* job_id, rdzv_job_status* out) {
  return rdzv::Guarded("rdzv_status", [&] { return rdzv::JobStatus(client, job_id, out); });
}

}  // extern "C"
