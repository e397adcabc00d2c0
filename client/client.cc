#include "client/client.h"

#include <grpcpp/client_context.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>
#include <random>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "client/client_calls.h"
#include "client/server_list.h"
#include "common/grpc_status.h"
#include "common/proto_convert.h"
#include "common/tls.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "rdzv/v1/rdzv.grpc.pb.h"

namespace rdzv {

// How long a join keeps trying while no credential can be made (munged does not answer).
constexpr absl::Duration kCredentialRetryWindow = absl::Seconds(15);

using internal::LiveCalls;
using internal::UnaryCall;

namespace {

absl::Status NotJoined() {
  return absl::FailedPreconditionError("this client has not joined a job; call Join first");
}

// An operator's call that failed at the server at `endpoint` or on the way there, in one line.
absl::Status OperatorCallFailed(const grpc::Status& status, const std::string& endpoint, bool tls) {
  const absl::Status failed = FromGrpcStatus(status);
  if (std::optional<absl::Status> handshake = TlsConnectFailure(failed, endpoint, tls)) {
    return *handshake;
  }
  if (failed.code() == absl::StatusCode::kUnavailable ||
      failed.code() == absl::StatusCode::kDeadlineExceeded) {
    return absl::Status(
        failed.code(),
        absl::StrFormat("rdzvd at %s did not answer (%s); check that it runs and that "
                        "--rdzv-endpoint/RDZV_ENDPOINT names it",
                        endpoint, failed.message()));
  }
  return failed;
}

}  // namespace

struct Client::Impl {
  ClientOptions options;
  // The servers, and the one in use; only Join moves it, before any other call is made.
  std::unique_ptr<ServerList> servers;
  v1::Rendezvous::Stub* stub() const { return servers->server().stub.get(); }

  absl::Mutex mu;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  // Bumped by every Join and by CancelJoin: a Join whose number is no longer current stops.
  uint64_t join_generation ABSL_GUARDED_BY(mu) = 0;
  bool joining ABSL_GUARDED_BY(mu) = false;
  std::shared_ptr<JoinCall> call ABSL_GUARDED_BY(mu);
  // The server the relay at `servers` reached for the last join that got an assignment.
  std::string relayed_server ABSL_GUARDED_BY(mu);
  const std::shared_ptr<LiveCalls> live_calls = std::make_shared<LiveCalls>();
  std::string job_id ABSL_GUARDED_BY(mu);  // of the latest Join; empty before any
  std::string agent_id ABSL_GUARDED_BY(mu);
  bool left ABSL_GUARDED_BY(mu) = false;  // the server answered a Leave of the latest Join
  std::mt19937_64 rng{std::random_device{}()};

  void SetDeadline(grpc::ClientContext& ctx) const {
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.rpc_timeout));
  }

  absl::Status Authorize(grpc::ClientContext& ctx, absl::string_view method,
                         absl::string_view job) const {
    return AttachCredential(ctx, options.auth, method, job);
  }

  // One blocking call of `method` on `job` for an operator, its answer taken only from a server
  // that proves itself (CallProven). `call` makes the call on the stub with the context it is
  // given.
  template <typename Call>
  absl::Status OperatorCall(absl::string_view method, const std::string& job, Call call) const {
    const ServerList::Server& server = servers->server();
    absl::StatusOr<ProvenCall> answer =
        CallProven(server, options.auth, method, job, options.rpc_timeout, std::move(call));
    if (!answer.ok()) return answer.status();
    if (!answer->status.ok()) {
      return OperatorCallFailed(answer->status, server.name, !options.tls.ca_file.empty());
    }
    if (!answer->proof.ok()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "the server at %s did not prove that it is rdzvd: %s; check --rdzv-endpoint "
          "(RDZV_ENDPOINT) and --server-uid (RDZV_SERVER_UID)",
          server.name, answer->proof.message()));
    }
    return absl::OkStatus();
  }

  class JoinRun;

  // Endpoints whose server did not prove itself, logged once each.
  absl::flat_hash_set<std::string> unproven_logged ABSL_GUARDED_BY(mu);
  // ReportFailureAsync's and LeaveAsync's credentials are made here.
  internal::CallThread call_thread;
};

// One Join's way through the servers: each try opens a stream at the server in use and waits for
// the assignment; a server that does not answer, or serves another job, gives way to the next at
// once, and after a round over all of them the join backs off (with jitter) until its deadline.
// What a try came to is judged in Judge, where to go next in MoveOn: the places a change to the
// join's retry policy would go. Lives on the joining thread.
class Client::Impl::JoinRun {
 public:
  JoinRun(Impl& impl, const JoinSpec& spec, const Handlers& handlers, absl::Duration timeout,
          uint64_t generation)
      : impl_(impl),
        spec_(spec),
        handlers_(handlers),
        timeout_(timeout),
        deadline_(absl::Now() + timeout),
        generation_(generation),
        request_(ToProto(spec)),
        several_(impl.servers->several()),
        resuming_(spec.resume.has_value()) {}

  absl::StatusOr<AssignmentEvent> Run();

 private:
  // What a try came to, when it is the join's answer.
  using Answer = std::optional<absl::StatusOr<AssignmentEvent>>;

  // Cancel() or CancelJoin() (or a newer Join) ends this one.
  bool Stopped() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(impl_.mu) {
    return impl_.cancelled || impl_.join_generation != generation_;
  }
  // Waits `delay`, or less when the join is stopped meanwhile.
  void Sleep(absl::Duration delay) {
    const auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(impl_.mu) { return Stopped(); };
    absl::MutexLock lock(&impl_.mu);
    impl_.mu.AwaitWithTimeout(absl::Condition(&stopped), delay);
  }
  absl::Duration Backoff(int attempt) {
    return BackoffDelay(impl_.options.backoff, attempt, unit_(impl_.rng));
  }

  // A credential could not be made for try `attempt`: the answer, or nothing after a wait.
  Answer CredentialFailed(const absl::Status& s, int attempt);
  // The stream `call` to `server` has its assignment, has ended, or the deadline has come.
  Answer Judge(JoinCall& call, const absl::Status& proof, const std::string& server,
               absl::Status& status);
  // After a failed try: on to the next server at once (true), or wait for the next try (false);
  // the answer when the deadline has come.
  Answer MoveOn(const absl::Status& status, int attempt, bool& at_once);
  // Why no server would do, once the deadline has come.
  absl::Status Unreachable() const;

  Impl& impl_;
  const JoinSpec& spec_;
  const Handlers& handlers_;
  const absl::Duration timeout_;
  const absl::Time deadline_;
  const uint64_t generation_;
  const v1::JoinRequest request_;
  const bool several_;
  // A resume keeps to its server for failover_after from its first failure to answer.
  const bool resuming_;
  std::uniform_real_distribution<double> unit_{0.0, 1.0};

  absl::Status last_ = absl::UnavailableError("not tried");
  // Why a candidate that answered did not count: its proof was missing or wrong.
  std::string unproven_;
  // What a server of a list that proved itself said of the job being served by another.
  std::string served_elsewhere_;
  absl::Time credential_failing_since_ = absl::InfiniteFuture();
  absl::Time unreachable_since_ = absl::InfiniteFuture();
};

absl::StatusOr<AssignmentEvent> Client::Impl::JoinRun::Run() {
  for (int attempt = 0;; ++attempt) {
    auto call = std::make_shared<JoinCall>(handlers_, impl_.live_calls);
    std::shared_ptr<JoinCall> previous;
    {
      absl::MutexLock lock(&impl_.mu);
      if (Stopped()) return absl::CancelledError("join cancelled");
      previous = std::exchange(impl_.call, call);
    }
    // A new round (or a retry) replaces the earlier stream; its end is no loss. It is ended
    // once the new stream has its answer's headers (or has failed): a server hosted by an agent
    // that waits for the others to go (agent.cc AwaitOthers) must never see none of this
    // agent's streams open in between, as it would at a restart.
    struct EndLater {
      std::shared_ptr<JoinCall> call;
      void Now() {
        if (call) std::exchange(call, nullptr)->Cancel();
      }
      ~EndLater() { Now(); }
    } previous_end{previous};
    if (previous) previous->MarkLeaving();
    if (attempt > 0 && absl::Now() >= deadline_) return Unreachable();
    const size_t at = impl_.servers->current();
    const std::string& server = impl_.servers->at(at).name;
    // Among candidates, one that holds the line without answering must not hold up the others.
    const absl::Time wait_until =
        several_ ? std::min(deadline_, absl::Now() + impl_.options.rpc_timeout) : deadline_;
    absl::StatusOr<JoinOpening> opening =
        OpenJoin(*call, *impl_.servers, at, impl_.options.auth, request_, wait_until);
    if (!opening.ok()) {
      if (Answer answer = CredentialFailed(opening.status(), attempt)) return *std::move(answer);
      continue;
    }
    credential_failing_since_ = absl::InfiniteFuture();
    const absl::Status& proof = opening->proof;
    if (proof.ok()) call->Proceed();
    previous_end.Now();
    absl::Status status;
    if (Answer answer = Judge(*call, proof, server, status)) return *std::move(answer);
    bool at_once = false;
    if (Answer answer = MoveOn(status, attempt, at_once)) return *std::move(answer);
    if (at_once) --attempt;
  }
}

Client::Impl::JoinRun::Answer Client::Impl::JoinRun::CredentialFailed(const absl::Status& s,
                                                                      int attempt) {
  // munged restarting (a package upgrade, a node's reconfiguration) fails credentials for a
  // moment: try again for a short while before reporting it.
  const absl::Time now = absl::Now();
  credential_failing_since_ = std::min(credential_failing_since_, now);
  if (s.code() != absl::StatusCode::kUnavailable || now >= deadline_ ||
      now - credential_failing_since_ >= kCredentialRetryWindow) {
    return s;
  }
  Sleep(std::min(deadline_ - now, Backoff(attempt)));
  return std::nullopt;
}

Client::Impl::JoinRun::Answer Client::Impl::JoinRun::Judge(JoinCall& call,
                                                           const absl::Status& proof,
                                                           const std::string& server,
                                                           absl::Status& status) {
  if (proof.ok()) {
    call.Await(deadline_);
  } else {
    call.AwaitDone();
  }
  if (std::optional<AssignmentEvent> a = call.assignment()) {
    absl::MutexLock lock(&impl_.mu);
    impl_.relayed_server = call.server();
    return *a;
  }
  std::optional<absl::Status> ended = call.final_status();
  if (!ended) {
    // Still waiting at the deadline: the round did not fill in time.
    call.Cancel();
    call.AwaitDone();
    return absl::DeadlineExceededError(
        absl::StrCat(kDidNotComplete, absl::FormatDuration(timeout_)));
  }
  status = *ended;
  if (std::optional<AbortEvent> abort = call.early_abort()) {
    if (handlers_.on_abort) handlers_.on_abort(*abort);
    return absl::AbortedError(abort->reason);
  }
  {
    absl::MutexLock lock(&impl_.mu);
    if (Stopped()) return absl::CancelledError("join cancelled");
  }
  if (call.leaving()) {
    // Leave() on another thread: the server dropped this agent from the round.
    return absl::CancelledError("Leave ended the join before its round completed");
  }
  if (!proof.ok() && status.code() != absl::StatusCode::kUnavailable) {
    const bool refused = !status.ok() && status.code() != absl::StatusCode::kCancelled;
    // A single server's refusal is shown as it is (the fix is usually in it: a credential
    // that does not fit); one candidate's among several is no reason to give up on the others.
    if (!several_ && refused) return status;
    const std::string why = absl::StrFormat(
        "the server at %s did not prove that it is the rendezvous server of job %s: %s", server,
        spec_.job_id, refused ? status.message() : proof.message());
    if (!several_) {
      return absl::FailedPreconditionError(
          absl::StrCat(why,
                       "; check that --rdzv-endpoint (RDZV_ENDPOINT) names your rdzvd, and "
                       "RDZV_SERVER_UID the uid it runs as"));
    }
    bool first;
    {
      absl::MutexLock lock(&impl_.mu);
      first = impl_.unproven_logged.insert(server).second;
    }
    if (first) spdlog::info("{}; trying the other candidates", why);
    unproven_ = why;
    status = absl::NotFoundError(why);
  } else if (status.ok()) {
    // The server ended the stream cleanly before any assignment: this agent left (Leave while
    // joining) or the server let it go. Not a reason to retry.
    return absl::AbortedError("the rendezvous server ended the join without an assignment");
  }
  const bool elsewhere = status.code() == absl::StatusCode::kNotFound;
  if (elsewhere && proof.ok()) served_elsewhere_ = std::string(status.message());
  if (!MovesOn(status.code(), several_)) return status;
  if (std::optional<absl::Status> tls =
          TlsConnectFailure(status, server, !impl_.options.tls.ca_file.empty())) {
    return *tls;
  }
  return std::nullopt;
}

Client::Impl::JoinRun::Answer Client::Impl::JoinRun::MoveOn(const absl::Status& status, int attempt,
                                                            bool& at_once) {
  last_ = status;
  const bool elsewhere = status.code() == absl::StatusCode::kNotFound;
  const absl::Time now = absl::Now();
  if (status.code() == absl::StatusCode::kUnavailable) {
    unreachable_since_ = std::min(unreachable_since_, now);
  }
  const bool keep_to_it = resuming_ && several_ && !elsewhere &&
                          now - unreachable_since_ < impl_.options.failover_after;
  if (!keep_to_it) {
    // Try the next candidate at once; back off only after a round over all of them.
    ServerList& servers = *impl_.servers;
    const size_t from = servers.current();
    const size_t next = (from + 1) % servers.size();
    if (resuming_ && several_ && next != from && !elsewhere) {
      spdlog::info(
          "the rendezvous server at {} has not answered for {}; trying {}", servers.at(from).name,
          absl::FormatDuration(absl::Trunc(now - unreachable_since_, absl::Milliseconds(100))),
          servers.at(next).name);
    }
    servers.MoveOn(from);
    unreachable_since_ = absl::InfiniteFuture();
    if (next != 0) {
      at_once = true;
      return std::nullopt;
    }
  }
  // Keep trying until the deadline itself, then say why the last try failed.
  const absl::Duration left = deadline_ - absl::Now();
  if (left <= absl::ZeroDuration()) return Unreachable();
  absl::Duration delay = std::min(left, Backoff(attempt));
  if (keep_to_it) {
    // The move to the next server comes on time, whatever the backoff has grown to.
    delay =
        std::max(absl::ZeroDuration(),
                 std::min(delay, unreachable_since_ + impl_.options.failover_after - absl::Now()));
  }
  Sleep(delay);
  return std::nullopt;
}

absl::Status Client::Impl::JoinRun::Unreachable() const {
  const std::string names = impl_.servers->Names();
  if (!unproven_.empty()) {
    return absl::UnavailableError(absl::StrFormat(
        "%s; no server at %s proved it within %s: is the agent that hosts the job's server "
        "running? Another user's process may be listening on one of its ports",
        unproven_, names, absl::FormatDuration(timeout_)));
  }
  return absl::UnavailableError(
      absl::StrFormat("cannot reach the rendezvous server at %s for %s (%s)%s", names,
                      absl::FormatDuration(timeout_), last_.message(),
                      served_elsewhere_.empty() ? "" : absl::StrCat("; ", served_elsewhere_)));
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(ClientOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  absl::StatusOr<ClientAuth> auth = ResolveClientAuth(impl->options.auth);
  if (!auth.ok()) return auth.status();
  impl->options.auth = *std::move(auth);
  absl::StatusOr<std::unique_ptr<ServerList>> servers = ServerList::Make(impl->options);
  if (!servers.ok()) return servers.status();
  impl->servers = *std::move(servers);
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::string Client::endpoint() const { return impl_->servers->server().name; }

std::string Client::relayed_server() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->relayed_server;
}

Client::~Client() {
  Cancel();
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->call.reset();
  }
  // A report or a departure still to be sent starts its call now.
  impl_->call_thread.Drain();
  // Every stream ends soon after Cancel(); see LiveCalls for why the channel must wait for it.
  LiveCalls& live = *impl_->live_calls;
  absl::MutexLock lock(&live.mu);
  live.mu.Await(absl::Condition(
      +[](LiveCalls* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) { return c->count == 0; }, &live));
}

absl::StatusOr<AssignmentEvent> Client::Join(const JoinSpec& spec, Handlers handlers) {
  return Join(spec, std::move(handlers), impl_->options.join_timeout);
}

absl::StatusOr<AssignmentEvent> Client::Join(const JoinSpec& spec, Handlers handlers,
                                             absl::Duration timeout) {
  uint64_t generation;
  {
    absl::MutexLock lock(&impl_->mu);
    if (impl_->cancelled) return absl::CancelledError("join cancelled");
    impl_->job_id = spec.job_id;
    impl_->agent_id = spec.agent.agent_id;
    impl_->left = false;
    generation = ++impl_->join_generation;
    impl_->joining = true;
  }
  struct EndJoining {
    Impl* impl;
    uint64_t generation;
    ~EndJoining() {
      absl::MutexLock lock(&impl->mu);
      if (impl->join_generation == generation) impl->joining = false;
    }
  } end_joining{impl_.get(), generation};
  return Impl::JoinRun(*impl_, spec, handlers, timeout, generation).Run();
}

absl::StatusOr<AbortEvent> Client::ReportFailure(const FailureInfo& failure) {
  absl::Notification answered;
  absl::StatusOr<AbortEvent> result;
  ReportFailureAsync(failure, [&](absl::StatusOr<AbortEvent> r) {
    result = std::move(r);
    answered.Notify();
  });
  answered.WaitForNotification();
  return result;
}

void Client::ReportFailureAsync(const FailureInfo& failure,
                                std::function<void(absl::StatusOr<AbortEvent>)> done) {
  using Call = UnaryCall<v1::ReportExitRequest, v1::ReportExitResponse>;
  std::shared_ptr<Call> call = Call::Make(impl_->live_calls);
  {
    absl::MutexLock lock(&impl_->mu);
    call->request.set_job_id(impl_->job_id);
    call->request.set_agent_id(impl_->agent_id);
  }
  if (call->request.job_id().empty()) {
    done(NotJoined());
    return;
  }
  *call->request.mutable_failure() = ToProto(failure);
  impl_->call_thread.Post([impl = impl_.get(), call, done = std::move(done)]() mutable {
    impl->SetDeadline(call->context);
    if (absl::Status s = impl->Authorize(call->context, "ReportExit", call->request.job_id());
        !s.ok()) {
      call.reset();
      done(s);
      return;
    }
    Call* raw = call.get();
    // The callback owns the call, and lets it go as it ends (not whenever gRPC drops it).
    impl->stub()->async()->ReportExit(&raw->context, &raw->request, &raw->response,
                                      [call = std::move(call), done](grpc::Status s) mutable {
                                        const std::shared_ptr<Call> owned = std::move(call);
                                        if (!s.ok()) {
                                          done(FromGrpcStatus(s));
                                        } else {
                                          done(FromProto(owned->response.abort()));
                                        }
                                      });
  });
}

absl::Status Client::Leave() {
  absl::Notification answered;
  absl::Status result;
  LeaveAsync([&](absl::Status s) {
    result = std::move(s);
    answered.Notify();
  });
  answered.WaitForNotification();
  return result;
}

void Client::LeaveAsync(std::function<void(absl::Status)> done) {
  using Call = UnaryCall<v1::LeaveRequest, v1::LeaveResponse>;
  std::shared_ptr<Call> call = Call::Make(impl_->live_calls);
  std::shared_ptr<JoinCall> join;
  bool left;
  uint64_t generation;
  {
    absl::MutexLock lock(&impl_->mu);
    call->request.set_job_id(impl_->job_id);
    call->request.set_agent_id(impl_->agent_id);
    join = impl_->call;
    left = impl_->left;
    generation = impl_->join_generation;
  }
  if (call->request.job_id().empty() || left) {
    // Nothing to leave, or the server has answered this departure already.
    done(left ? absl::OkStatus() : NotJoined());
    return;
  }
  // The server closes the event stream in answer; that end is no loss.
  if (join) join->MarkLeaving();
  impl_->call_thread.Post([impl = impl_.get(), call, join, generation,
                           done = std::move(done)]() mutable {
    impl->SetDeadline(call->context);
    if (absl::Status s = impl->Authorize(call->context, "Leave", call->request.job_id()); !s.ok()) {
      call.reset();
      if (join) join->Cancel();
      done(s);
      return;
    }
    // The client outlives the callback: it waits for its calls (LiveCalls) before it goes.
    Call* raw = call.get();
    impl->stub()->async()->Leave(
        &raw->context, &raw->request, &raw->response,
        [impl, generation, call = std::move(call), join, done](grpc::Status s) mutable {
          const std::shared_ptr<Call> owned = std::move(call);
          if (join) join->Cancel();
          if (s.ok()) {
            absl::MutexLock lock(&impl->mu);
            if (impl->join_generation == generation) impl->left = true;
          }
          done(FromGrpcStatus(s));
        });
  });
}

absl::StatusOr<std::vector<JobStatusView>> Client::Status(const std::string& job_id,
                                                          int64_t* omitted_jobs) {
  v1::StatusRequest request;
  request.set_job_id(job_id);
  v1::StatusResponse response;
  if (absl::Status s = impl_->OperatorCall("GetStatus", job_id,
                                           [&](v1::Rendezvous::Stub& stub, grpc::ClientContext* c) {
                                             return stub.GetStatus(c, request, &response);
                                           });
      !s.ok()) {
    return s;
  }
  std::vector<JobStatusView> jobs;
  for (const v1::JobStatus& j : response.jobs()) jobs.push_back(FromProto(j));
  if (omitted_jobs != nullptr) *omitted_jobs = response.omitted_jobs();
  return jobs;
}

absl::StatusOr<AbortEvent> Client::AbortJob(const std::string& job_id, const std::string& reason) {
  v1::AbortJobRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  v1::AbortJobResponse response;
  if (absl::Status s = impl_->OperatorCall("AbortJob", job_id,
                                           [&](v1::Rendezvous::Stub& stub, grpc::ClientContext* c) {
                                             return stub.AbortJob(c, request, &response);
                                           });
      !s.ok()) {
    return s;
  }
  return FromProto(response.abort());
}

absl::StatusOr<ServingStatus> Client::Health() {
  const ServerList::Server& endpoint = impl_->servers->server();
  auto stub = grpc::health::v1::Health::NewStub(endpoint.channel);
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  grpc::ClientContext ctx;
  impl_->SetDeadline(ctx);
  if (grpc::Status s = stub->Check(&ctx, request, &response); !s.ok()) {
    return OperatorCallFailed(s, endpoint.name, !impl_->options.tls.ca_file.empty());
  }
  switch (response.status()) {
    case grpc::health::v1::HealthCheckResponse::SERVING:
      return ServingStatus::kServing;
    case grpc::health::v1::HealthCheckResponse::NOT_SERVING:
      return ServingStatus::kNotServing;
    case grpc::health::v1::HealthCheckResponse::SERVICE_UNKNOWN:
      return ServingStatus::kServiceUnknown;
    default:
      return ServingStatus::kUnknown;
  }
}

void Client::CancelJoin() {
  std::shared_ptr<JoinCall> call;
  {
    absl::MutexLock lock(&impl_->mu);
    if (!impl_->joining) return;
    ++impl_->join_generation;
    impl_->joining = false;
    call = impl_->call;
  }
  if (call) call->Leave();
}

void Client::Cancel() {
  std::shared_ptr<JoinCall> call;
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->cancelled = true;
    call = impl_->call;
  }
  if (call) call->Leave();
}

void Client::AbandonCalls() {
  std::vector<std::shared_ptr<grpc::ClientContext>> calls;
  {
    LiveCalls& live = *impl_->live_calls;
    absl::MutexLock lock(&live.mu);
    live.abandoned = true;
    for (auto& [key, weak] : live.unary) {
      if (std::shared_ptr<grpc::ClientContext> call = weak.lock()) calls.push_back(call);
    }
  }
  // Without the lock: gRPC may run a call's callback (which ends the call) within TryCancel.
  for (const auto& context : calls) context->TryCancel();
}

}  // namespace rdzv
