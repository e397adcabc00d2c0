#include "client/client.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <optional>
#include <random>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "client/client_calls.h"
#include "client/client_channel.h"
#include "common/auth.h"
#include "common/grpc_status.h"
#include "common/net.h"
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
  struct Endpoint {
    std::string name;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Rendezvous::Stub> stub;
  };
  std::vector<Endpoint> endpoints;
  // The endpoint in use; only Join moves it, before any other call is made.
  std::atomic<size_t> current{0};
  v1::Rendezvous::Stub* stub() const { return endpoints[current].stub.get(); }

  absl::Mutex mu;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  // Bumped by every Join and by CancelJoin: a Join whose number is no longer current stops.
  uint64_t join_generation ABSL_GUARDED_BY(mu) = 0;
  bool joining ABSL_GUARDED_BY(mu) = false;
  std::shared_ptr<JoinCall> call ABSL_GUARDED_BY(mu);
  // The server the relay at `endpoints` reached for the last join that got an assignment.
  std::string relayed_server ABSL_GUARDED_BY(mu);
  const std::shared_ptr<LiveCalls> live_calls = std::make_shared<LiveCalls>();
  std::string job_id ABSL_GUARDED_BY(mu);  // of the latest Join; empty before any
  std::string agent_id ABSL_GUARDED_BY(mu);
  bool left ABSL_GUARDED_BY(mu) = false;  // the server answered a Leave of the latest Join
  std::mt19937_64 rng{std::random_device{}()};

  void SetDeadline(grpc::ClientContext& ctx) const {
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.rpc_timeout));
  }

  absl::Status Authorize(grpc::ClientContext& ctx, absl::string_view method, absl::string_view job,
                         absl::string_view nonce = {}) const {
    return AttachCredential(ctx, options.auth, method, job, nonce);
  }

  // Waits for the server's initial metadata on `call` (until `wait_until`) and checks its proof
  // for the nonce the call was made with: the call then goes on to read its events, or is
  // abandoned. Nothing the stream carries counts before this: no assignment, no abort.
  absl::Status ProveJoin(JoinCall& call, const std::string& job, const std::string& nonce,
                         bool required, absl::Time wait_until) const {
    switch (call.AwaitHeaders(wait_until)) {
      case JoinCall::Headers::kWaiting:
        call.Abandon();
        return absl::FailedPreconditionError("it sent nothing in answer");
      case JoinCall::Headers::kNone:
        // Ended at once: a refusal, whose proof (if any) came with its status.
        call.LetEnd();
        call.AwaitDone();
        return CheckServerProof(call.context(), options.auth, "Join", job, nonce, required);
      case JoinCall::Headers::kArrived:
        break;
    }
    absl::Status proof =
        CheckServerProof(call.context(), options.auth, "Join", job, nonce, required);
    if (proof.ok()) {
      call.Proceed();
    } else {
      call.Abandon();
    }
    return proof;
  }

  // One blocking call of `method` on `job` for an operator: made with the credential and a nonce,
  // and its answer taken only from a server that proves itself. `call` makes the call on the
  // stub with the context it is given.
  template <typename Call>
  absl::Status OperatorCall(absl::string_view method, const std::string& job, Call call) const {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    const std::string nonce = NewNonce();
    if (absl::Status a = Authorize(ctx, method, job, nonce); !a.ok()) return a;
    const std::string& endpoint = endpoints[current].name;
    if (grpc::Status s = call(*stub(), &ctx); !s.ok()) {
      return OperatorCallFailed(s, endpoint, !options.tls.ca_file.empty());
    }
    if (absl::Status proof =
            CheckServerProof(ctx, options.auth, method, job, nonce, ProofRequiredAt(endpoint));
        !proof.ok()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "the server at %s did not prove that it is rdzvd: %s; check --rdzv-endpoint "
          "(RDZV_ENDPOINT) and --server-uid (RDZV_SERVER_UID)",
          endpoint, proof.message()));
    }
    return absl::OkStatus();
  }

  // Endpoints whose server did not prove itself, logged once each.
  absl::flat_hash_set<std::string> unproven_logged ABSL_GUARDED_BY(mu);
  // ReportFailureAsync's and LeaveAsync's credentials are made here.
  internal::CallThread call_thread;
};

absl::StatusOr<std::unique_ptr<Client>> Client::Create(ClientOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  absl::StatusOr<ClientAuth> auth = ResolveClientAuth(impl->options.auth);
  if (!auth.ok()) return auth.status();
  impl->options.auth = *std::move(auth);
  absl::StatusOr<ClientChannelSetup> setup = MakeClientChannelSetup(impl->options);
  if (!setup.ok()) return setup.status();
  std::vector<std::string> names;
  if (absl::StartsWith(impl->options.endpoint, "unix:")) {
    names.push_back(impl->options.endpoint);
  } else {
    // A server list: the primary first, its backups after it.
    for (absl::string_view e : absl::StrSplit(impl->options.endpoint, ',')) {
      e = absl::StripAsciiWhitespace(e);
      if (e.empty()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("the server list \"%s\" has an empty entry; give HOST:PORT,HOST:PORT",
                            impl->options.endpoint));
      }
      names.emplace_back(e);
    }
    if (names.size() > kMaxServerList) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the server list names %d servers; give at most %d (a primary and its backups)",
          names.size(), kMaxServerList));
    }
  }
  names.insert(names.end(), impl->options.alternate_endpoints.begin(),
               impl->options.alternate_endpoints.end());
  for (const std::string& name : names) {
    Impl::Endpoint e;
    if (absl::StartsWith(name, "unix:")) {
      // A node's relay (client/agent/node_relay.h): a socket in a directory of this user's own.
      e.name = name;
    } else {
      absl::StatusOr<HostPort> hp = ParseHostPort(name, 29400);
      if (!hp.ok()) return hp.status();
      e.name = FormatHostPort(hp->host, hp->port);
      // Without a credential only a server on this host's loopback can take the calls: any
      // other would refuse each one, and a wait for it could only end at the join timeout.
      const ClientAuth& auth = impl->options.auth;
      if (!auth.none_because.empty() && !ReachesOnlyThisHost(hp->host)) {
        return absl::FailedPreconditionError(
            absl::StrFormat("cannot prove who this process is to the rendezvous server at %s: %s",
                            e.name, auth.none_because));
      }
    }
    e.channel = grpc::CreateCustomChannel(e.name, setup->credentials, setup->args);
    e.stub = v1::Rendezvous::NewStub(e.channel);
    impl->endpoints.push_back(std::move(e));
  }
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::string Client::EndpointNames() const {
  std::vector<std::string> names;
  for (const Impl::Endpoint& e : impl_->endpoints) names.push_back(e.name);
  // An agent's candidates, one host's consecutive ports, read better as a range.
  std::vector<HostPort> parsed;
  for (const std::string& name : names) {
    absl::StatusOr<HostPort> hp = ParseHostPort(name, 0);
    if (hp.ok()) parsed.push_back(*hp);
  }
  bool range = parsed.size() > 2 && parsed.size() == names.size();
  for (size_t i = 1; range && i < parsed.size(); ++i) {
    range = parsed[i].host == parsed[0].host && parsed[i].port == parsed[i - 1].port + 1;
  }
  if (range) {
    return absl::StrFormat("%s ports %d-%d", names.front().substr(0, names.front().rfind(':')),
                           parsed.front().port, parsed.back().port);
  }
  return absl::StrJoin(names, " or ");
}

std::string Client::endpoint() const { return impl_->endpoints[impl_->current].name; }

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
  const absl::Time deadline = absl::Now() + timeout;
  const v1::JoinRequest request = ToProto(spec);
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
  // Cancel() or CancelJoin() (or a newer Join) ends this one.
  const auto stopped = [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(impl_->mu) {
    return impl_->cancelled || impl_->join_generation != generation;
  };

  absl::Status last = absl::UnavailableError("not tried");
  // Why a candidate that answered did not count: its proof was missing or wrong.
  std::string unproven;
  // What a server of a list that proved itself said of the job being served by another.
  std::string served_elsewhere;
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const auto unreachable = [&] {
    if (!unproven.empty()) {
      return absl::UnavailableError(absl::StrFormat(
          "%s; no server at %s proved it within %s: is the agent that hosts the job's server "
          "running? Another user's process may be listening on one of its ports",
          unproven, EndpointNames(), absl::FormatDuration(timeout)));
    }
    return absl::UnavailableError(
        absl::StrFormat("cannot reach the rendezvous server at %s for %s (%s)%s", EndpointNames(),
                        absl::FormatDuration(timeout), last.message(),
                        served_elsewhere.empty() ? "" : absl::StrCat("; ", served_elsewhere)));
  };
  const bool several = impl_->endpoints.size() > 1;
  absl::Time credential_failing_since = absl::InfiniteFuture();
  // A resume keeps to its server for failover_after from its first failure to answer.
  const bool resuming = spec.resume.has_value();
  absl::Time unreachable_since = absl::InfiniteFuture();
  for (int attempt = 0;; ++attempt) {
    auto call = std::make_shared<JoinCall>(handlers, impl_->live_calls);
    std::shared_ptr<JoinCall> previous;
    {
      absl::MutexLock lock(&impl_->mu);
      if (stopped()) return absl::CancelledError("join cancelled");
      previous = std::exchange(impl_->call, call);
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
    if (attempt > 0 && absl::Now() >= deadline) {
      return unreachable();
    }
    const std::string nonce = NewNonce();
    if (absl::Status s = impl_->Authorize(call->context(), "Join", spec.job_id, nonce); !s.ok()) {
      // munged restarting (a package upgrade, a node's reconfiguration) fails credentials for a
      // moment: try again for a short while before reporting it.
      const absl::Time now = absl::Now();
      credential_failing_since = std::min(credential_failing_since, now);
      if (s.code() != absl::StatusCode::kUnavailable || now >= deadline ||
          now - credential_failing_since >= kCredentialRetryWindow) {
        return s;
      }
      const absl::Duration delay =
          std::min(deadline - now, BackoffDelay(impl_->options.backoff, attempt, unit(impl_->rng)));
      absl::MutexLock lock(&impl_->mu);
      impl_->mu.AwaitWithTimeout(absl::Condition(&stopped), delay);
      continue;
    }
    credential_failing_since = absl::InfiniteFuture();
    const std::string& endpoint = impl_->endpoints[impl_->current].name;
    call->Start(impl_->stub(), request);
    // Among candidates, one that holds the line without answering must not hold up the others.
    const absl::Status proof = impl_->ProveJoin(
        *call, spec.job_id, nonce, several || ProofRequiredAt(endpoint),
        several ? std::min(deadline, absl::Now() + impl_->options.rpc_timeout) : deadline);
    previous_end.Now();
    if (proof.ok()) {
      call->Await(deadline);
    } else {
      call->AwaitDone();
    }
    if (std::optional<AssignmentEvent> a = call->assignment()) {
      absl::MutexLock lock(&impl_->mu);
      impl_->relayed_server = call->server();
      return *a;
    }
    std::optional<absl::Status> status = call->final_status();
    if (!status) {
      // Still waiting at the deadline: the round did not fill in time.
      call->Cancel();
      call->AwaitDone();
      return absl::DeadlineExceededError(
          absl::StrCat(kDidNotComplete, absl::FormatDuration(timeout)));
    }
    if (std::optional<AbortEvent> abort = call->early_abort()) {
      if (handlers.on_abort) handlers.on_abort(*abort);
      return absl::AbortedError(abort->reason);
    }
    {
      absl::MutexLock lock(&impl_->mu);
      if (stopped()) return absl::CancelledError("join cancelled");
    }
    if (call->leaving()) {
      // Leave() on another thread: the server dropped this agent from the round.
      return absl::CancelledError("Leave ended the join before its round completed");
    }
    if (!proof.ok() && status->code() != absl::StatusCode::kUnavailable) {
      const bool refused = !status->ok() && status->code() != absl::StatusCode::kCancelled;
      // A single server's refusal is shown as it is (the fix is usually in it: a credential
      // that does not fit); one candidate's among several is no reason to give up on the others.
      if (!several && refused) return *status;
      const std::string why = absl::StrFormat(
          "the server at %s did not prove that it is the rendezvous server of job %s: %s", endpoint,
          spec.job_id, refused ? status->message() : proof.message());
      if (!several) {
        return absl::FailedPreconditionError(
            absl::StrCat(why,
                         "; check that --rdzv-endpoint (RDZV_ENDPOINT) names your rdzvd, and "
                         "RDZV_SERVER_UID the uid it runs as"));
      }
      bool first;
      {
        absl::MutexLock lock(&impl_->mu);
        first = impl_->unproven_logged.insert(endpoint).second;
      }
      if (first) spdlog::info("{}; trying the other candidates", why);
      unproven = why;
      status = absl::NotFoundError(why);
    } else if (status->ok()) {
      // The server ended the stream cleanly before any assignment: this agent left (Leave while
      // joining) or the server let it go. Not a reason to retry.
      return absl::AbortedError("the rendezvous server ended the join without an assignment");
    }
    const bool elsewhere = status->code() == absl::StatusCode::kNotFound;
    if (elsewhere && proof.ok()) served_elsewhere = std::string(status->message());
    if (status->code() != absl::StatusCode::kUnavailable && !(elsewhere && several)) {
      return *status;
    }
    if (std::optional<absl::Status> tls =
            TlsConnectFailure(*status, endpoint, !impl_->options.tls.ca_file.empty())) {
      return *tls;
    }
    last = *status;
    const absl::Time now = absl::Now();
    if (status->code() == absl::StatusCode::kUnavailable) {
      unreachable_since = std::min(unreachable_since, now);
    }
    const bool keep_to_it = resuming && several && !elsewhere &&
                            now - unreachable_since < impl_->options.failover_after;
    if (!keep_to_it) {
      // Try the next candidate at once; back off only after a round over all of them.
      const size_t next = (impl_->current + 1) % impl_->endpoints.size();
      if (resuming && several && next != impl_->current && !elsewhere) {
        spdlog::info(
            "the rendezvous server at {} has not answered for {}; trying {}", endpoint,
            absl::FormatDuration(absl::Trunc(now - unreachable_since, absl::Milliseconds(100))),
            impl_->endpoints[next].name);
      }
      impl_->current = next;
      unreachable_since = absl::InfiniteFuture();
      if (next != 0) {
        --attempt;
        continue;
      }
    }
    // Keep trying until the deadline itself, then say why the last try failed.
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return unreachable();
    }
    absl::Duration delay =
        std::min(left, BackoffDelay(impl_->options.backoff, attempt, unit(impl_->rng)));
    if (keep_to_it) {
      // The move to the next server comes on time, whatever the backoff has grown to.
      delay = std::max(
          absl::ZeroDuration(),
          std::min(delay, unreachable_since + impl_->options.failover_after - absl::Now()));
    }
    absl::MutexLock lock(&impl_->mu);
    impl_->mu.AwaitWithTimeout(absl::Condition(&stopped), delay);
  }
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
  const Impl::Endpoint& endpoint = impl_->endpoints[impl_->current];
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
  if (call) {
    call->MarkLeaving();
    call->Cancel();
  }
}

void Client::Cancel() {
  std::shared_ptr<JoinCall> call;
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->cancelled = true;
    call = impl_->call;
  }
  if (call) {
    call->MarkLeaving();
    call->Cancel();
  }
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
