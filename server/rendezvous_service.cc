#include "server/rendezvous_service.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "absl/algorithm/container.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/auth.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/proto_convert.h"
#include "guard/request_limits.h"
#include "server/join_stream.h"
#include "server/status_reply.h"

namespace rdzv {
namespace {

// One uid's calls waiting for their handler may hold as much as its memory share (each call's
// message at most kMaxRequestBytes), and never fewer than the Authenticator's own bound: a
// 10,000-node job's burst of joins comes from one uid.
AuthPolicy WithPendingBound(AuthPolicy policy, int64_t max_memory_per_user_bytes) {
  if (policy.max_pending_per_uid == 0) {
    policy.max_pending_per_uid =
        std::max<size_t>(Authenticator::kMaxPendingPerUid,
                         static_cast<size_t>(std::max<int64_t>(max_memory_per_user_bytes, 0) /
                                             static_cast<int64_t>(kMaxRequestBytes)));
  }
  return policy;
}

}  // namespace

RendezvousService::RendezvousService(Clock clock, ServiceOptions options)
    : clock_(std::move(clock)),
      options_(std::move(options)),
      auth_(WithPendingBound(options_.auth, options_.max_memory_per_user_bytes)),
      ledger_(LedgerLimits{options_.max_jobs_per_user, options_.max_agents_per_user,
                           options_.max_memory_per_user_bytes, options_.max_memory_bytes}),
      writer_pool_(kWriterThreads) {
  if (!options_.peers.empty()) {
    absl::StatusOr<std::unique_ptr<PeerServers>> peers = PeerServers::Create(
        {options_.peers, options_.auth.mode, options_.auth.munge_socket, options_.peer_tls_ca_pem});
    if (peers.ok()) {
      peers_ = *std::move(peers);
      absl::MutexLock lock(&mu_);
      claims_.emplace(peers_->instance());
    } else {
      // rdzvd checks --peers before it starts; a library user learns it here.
      spdlog::error("serving without peers: {}", peers.status().message());
    }
  }
}

RendezvousService::~RendezvousService() { peers_.reset(); }

namespace {

// Whether `message`, or a message in it, holds fields this server does not know.
bool HasUnknownFields(const google::protobuf::Message& message) {
  const google::protobuf::Reflection* reflection = message.GetReflection();
  if (!reflection->GetUnknownFields(message).empty()) return true;
  const google::protobuf::Descriptor* descriptor = message.GetDescriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    if (field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (field->is_repeated()) {
      const int n = reflection->FieldSize(message, field);
      for (int k = 0; k < n; ++k) {
        if (HasUnknownFields(reflection->GetRepeatedMessage(message, field, k))) return true;
      }
    } else if (reflection->HasField(message, field) &&
               HasUnknownFields(reflection->GetMessage(message, field))) {
      return true;
    }
  }
  return false;
}

// "ipv4:10.0.0.5:41234" or "ipv6:[fd00::5]:41234" -> the address alone.
std::string PeerAddress(const std::string& peer) {
  absl::string_view p = peer;
  if (absl::ConsumePrefix(&p, "ipv4:")) return std::string(p.substr(0, p.rfind(':')));
  if (absl::ConsumePrefix(&p, "ipv6:[")) return std::string(p.substr(0, p.find(']')));
  return "";
}

}  // namespace

absl::StatusOr<Caller> RendezvousService::Authenticate(grpc::CallbackServerContext* context,
                                                       absl::string_view method,
                                                       absl::string_view job_id,
                                                       const absl::Status& limits) {
  const CallCredentials credentials = CredentialsOf(*context);
  absl::StatusOr<Caller> caller = auth_.Authenticate(credentials, method, job_id);
  // Also on a refusal for a limit, which the caller then knows to be this server's.
  if (caller.ok()) {
    auth_.AddProof(*context, credentials, method, job_id, *caller);
    if (options_.connections != nullptr) options_.connections->CallAccepted(context->peer());
  }
  if (!caller.ok()) {
    spdlog::warn("refused {} from {}: {}", method, absl::CHexEscape(context->peer()),
                 EscapeControl(caller.status().message()));
    CountRefused(caller.status().code() == absl::StatusCode::kPermissionDenied
                     ? Metrics::kRefusedPermissionDenied
                     : Metrics::kRefusedUnauthenticated);
  } else if (!limits.ok()) {
    spdlog::warn("refused {} from {}: {}", method, absl::CHexEscape(context->peer()),
                 EscapeControl(limits.message()));
    CountRefused(Metrics::kRefusedLimit);
    return limits;
  }
  return caller;
}

RendezvousState& RendezvousService::StateOf(const std::string& owner) {
  std::unique_ptr<RendezvousState>& state = states_[owner];
  if (state == nullptr) state = std::make_unique<RendezvousState>(options_.state);
  return *state;
}

grpc::ServerWriteReactor<v1::JoinEvent>* RendezvousService::Join(
    grpc::CallbackServerContext* context, const v1::JoinRequest* request) {
  std::vector<JoinStream*> writers;
  JoinStream* stream;
  std::optional<PeerQuestion> ask;
  absl::StatusOr<Caller> caller =
      Authenticate(context, "Join", request->job_id(), CheckJoinRequest(*request));
  if (!caller.ok()) {
    stream = new JoinStream(this, 0);
    if (stream->PushClose(ToGrpcStatus(caller.status()))) writers.push_back(stream);
  } else {
    // Fields this server does not know are not kept, whatever a caller pads its join with. The
    // check is cheaper than the discard, which walks every field of every member by reflection.
    if (HasUnknownFields(*request)) const_cast<v1::JoinRequest*>(request)->DiscardUnknownFields();
    stream = JoinLocked(context, request, *caller, writers, ask);
    // The state keeps what it needs of the request; gRPC would keep the rest as long as the
    // stream is open.
    v1::JoinRequest().Swap(const_cast<v1::JoinRequest*>(request));
    // At once, with the proof: the agent checks it before it reads any event of the stream.
    stream->StartSendInitialMetadata();
  }
  StartWrites(std::move(writers));
  if (ask) AskPeers(*ask);
  return stream;
}

RendezvousService::JoinStream* RendezvousService::JoinLocked(grpc::CallbackServerContext* context,
                                                             const v1::JoinRequest* request,
                                                             const Caller& caller,
                                                             std::vector<JoinStream*>& writers,
                                                             std::optional<PeerQuestion>& ask) {
  absl::MutexLock lock(&mu_);
  const StreamId id = next_stream_++;
  auto* stream = new JoinStream(this, id);
  const auto refuse = [&](grpc::Status status) {
    if (stream->PushClose(status)) writers.push_back(stream);
    return stream;
  };
  if (shut_down_) {
    return refuse(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the rendezvous server is stopping"));
  }
  if (request->protocol_version() > kProtocolVersion) {
    return refuse(grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrFormat("the client speaks protocol %d but this rdzvd only %d; upgrade rdzvd",
                        request->protocol_version(), kProtocolVersion)));
  }
  if (!options_.only_job.empty() && request->job_id() != options_.only_job) {
    return refuse(grpc::Status(grpc::StatusCode::NOT_FOUND,
                               absl::StrFormat("this rdzv server hosts job %s, not %s",
                                               options_.only_job, request->job_id())));
  }
  RendezvousState& state = StateOf(caller.owner);
  const bool group = request->members_size() > 0;
  const int64_t agents = group ? request->members_size() : 1;
  const int64_t join_bytes = JoinBytes(agents, static_cast<int64_t>(request->ByteSizeLong()));
  if (absl::Status limit = CheckUserLimits(caller, state, request->job_id(), join_bytes, agents);
      !limit.ok()) {
    spdlog::warn("refused a join of job {}: {}", absl::CHexEscape(request->job_id()),
                 limit.message());
    if (options_.metrics != nullptr) options_.metrics->OnRefused(Metrics::kRefusedLimit);
    return refuse(ToGrpcStatus(limit));
  }
  std::optional<JoinSpec> spec;
  if (!group) {
    spec = FromProto(*request);
    // Numbers out of range are refused before anything, the metrics included, counts them.
    if (absl::Status invalid = ValidateJoinSpec(*spec); !invalid.ok()) {
      if (options_.log_jobs) spdlog::info("refused a join: {}", EscapeControl(invalid.message()));
      if (options_.metrics != nullptr) options_.metrics->OnRefused(Metrics::kRefusedInvalid);
      return refuse(ToGrpcStatus(invalid));
    }
  }
  streams_.emplace(id, Stream{stream, &state, context->peer(), agents,
                              group ? std::make_unique<Group>() : nullptr});
  agents_joined_ += agents;
  ledger_.StreamOpened(&state, agents);
  std::shared_ptr<Usage>& usage = usage_[&state];
  if (usage == nullptr) usage = std::make_shared<Usage>();
  stream->Charge(usage, total_usage_, join_bytes, options_.max_queued_bytes_per_stream);
  if (peers_ != nullptr && !state.has_job(request->job_id())) {
    // Another server of the list may serve the job: it is asked first.
    ParkLocked(id, state, caller, *request, context->peer(), ask);
    return stream;
  }
  Decisions decisions;
  JoinStateLocked(id, state, *request, context->peer(), spec ? &*spec : nullptr, decisions);
  ChargeExcluded(state);
  Apply(decisions, writers);
  return stream;
}

void RendezvousService::JoinStateLocked(StreamId id, RendezvousState& state,
                                        const v1::JoinRequest& request, const std::string& peer,
                                        const JoinSpec* converted, Decisions& decisions) {
  if (request.members_size() > 0) {
    JoinMembersLocked(id, state, request, PeerAddress(peer), decisions);
    return;
  }
  const Micros now = clock_();
  std::optional<JoinSpec> here;
  const JoinSpec& spec = converted != nullptr ? *converted : here.emplace(FromProto(request));
  SPDLOG_DEBUG("join job={} agent={} host={} node={} nproc={}", EscapeControl(spec.job_id),
               EscapeControl(spec.agent.agent_id), EscapeControl(spec.agent.host),
               spec.agent.node_index, spec.agent.nproc);
  if (options_.metrics != nullptr) options_.metrics->OnJoin(now, id, spec);
  if (spec.unhealthy) LogUnhealthy(spec);
  state.Join(now, id, spec, CallerInfo{PeerAddress(peer)}, decisions);
}

void RendezvousService::ChargeExcluded(const RendezvousState& state) {
  const int64_t bytes = ledger_.ChargeExcluded(&state, state.excluded_agents());
  if (bytes == 0) return;
  std::shared_ptr<Usage>& usage = usage_[&state];
  if (usage == nullptr) usage = std::make_shared<Usage>();
  usage->bytes.fetch_add(bytes, std::memory_order_relaxed);
  total_usage_->bytes.fetch_add(bytes, std::memory_order_relaxed);
}

void RendezvousService::LogUnhealthy(const JoinSpec& spec) {
  spdlog::warn(
      "job {}: {} reports itself unhealthy: {}", EscapeControl(spec.job_id),
      EscapeControl(spec.agent.host),
      EscapeControl(DescribeExcluded({spec.agent.host, spec.agent.node_index, *spec.unhealthy})));
}

bool RendezvousService::MayReattach(StreamId id) {
  if (options_.connections == nullptr || options_.reattach_window <= 0) return false;
  std::string peer;
  {
    absl::MutexLock lock(&mu_);
    auto it = streams_.find(id);
    if (it == streams_.end() || it->second.group != nullptr ||
        !(it->second.state->Runs(id) || it->second.state->Awaits(id))) {
      return false;
    }
    peer = it->second.peer;
  }
  return options_.connections->ConnectionUp(peer);
}

void RendezvousService::StreamDone(StreamId id, bool cancelled) {
  const bool may_reattach = cancelled && MayReattach(id);
  const bool relay_alive = cancelled && RelayAlive(id);
  std::vector<JoinStream*> writers;
  {
    absl::MutexLock lock(&mu_);
    auto it = streams_.find(id);
    if (it == streams_.end()) return;
    const Micros now = clock_();
    if (may_reattach && !it->second.state->Runs(id)) {
      // An agent the ended job still counts on (it may restart), whose process is alive: it
      // comes back, leaves, or is lost when its connection closes; until then it is not lost.
      reattaching_[id] =
          Reattaching{it->second.state, it->second.peer, std::numeric_limits<Micros>::max()};
      EraseStream(it);
      return;
    }
    if (may_reattach) {
      if (options_.log_jobs) {
        spdlog::info(
            "a running agent's stream from {} ended with its connection still up; it has {} ms "
            "to come back before it counts as lost",
            absl::CHexEscape(it->second.peer), options_.reattach_window / 1000);
      }
      reattaching_[id] =
          Reattaching{it->second.state, it->second.peer, now + options_.reattach_window};
      EraseStream(it);
      return;
    }
    Decisions decisions;
    LoseStreamLocked(it, now, decisions, relay_alive);
    Apply(decisions, writers);
  }
  StartWrites(std::move(writers));
}

void RendezvousService::EraseStream(absl::flat_hash_map<StreamId, Stream>::iterator it) {
  ledger_.StreamClosed(it->second.state, it->second.agents);
  if (const Group* group = it->second.group.get(); group != nullptr) {
    if (group->first != 0) groups_by_member_.erase(group->first);
    // The metrics count a group's agents on its stream, which goes with them.
    if (options_.metrics != nullptr) options_.metrics->OnStreamGone(clock_(), it->first);
  }
  streams_.erase(it);
}

absl::Status RendezvousService::CheckUserLimits(const Caller& caller, const RendezvousState& state,
                                                const std::string& job_id, int64_t join_bytes,
                                                int64_t agents) const {
  const bool new_job = !state.has_job(job_id) && !parked_.contains(ParkKey(caller.owner, job_id));
  std::optional<int64_t> user_bytes;
  if (auto usage = usage_.find(&state); usage != usage_.end()) {
    user_bytes = usage->second->bytes.load(std::memory_order_relaxed);
  }
  const std::optional<LimitBreach> breach = ledger_.CheckJoin(
      &state, new_job, static_cast<int64_t>(state.job_count()), agents, join_bytes, user_bytes,
      total_usage_->bytes.load(std::memory_order_relaxed));
  if (!breach) return absl::OkStatus();
  const bool auth_none = options_.auth.mode == AuthMode::kNone;
  switch (breach->limit) {
    case LimitBreach::Limit::kJobs:
      return UserCapError(UserCap::kJobs, auth_none, caller.name, breach->held, breach->most);
    case LimitBreach::Limit::kAgents:
      return UserCapError(UserCap::kAgents, auth_none, caller.name, breach->held, breach->most);
    case LimitBreach::Limit::kUserMemory:
      return MemoryCapError(auth_none, caller.name, breach->held, breach->most,
                            /*all_users=*/false);
    case LimitBreach::Limit::kAllMemory:
      return MemoryCapError(auth_none, caller.name, breach->held, breach->most,
                            /*all_users=*/true);
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* RendezvousService::ReportExit(grpc::CallbackServerContext* context,
                                                        const v1::ReportExitRequest* request,
                                                        v1::ReportExitResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<Caller> caller =
      Authenticate(context, "ReportExit", request->job_id(), CheckReportExitRequest(*request));
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  absl::Status status;
  std::vector<JoinStream*> writers;
  {
    absl::MutexLock lock(&mu_);
    if (request->member_lost()) {
      // A relay lost one of its group's members: as if that member's own stream had dropped.
      auto owner = states_.find(caller->owner);
      const MemberRef member =
          owner == states_.end()
              ? MemberRef{}
              : FindMember(owner->second->StreamOf(request->job_id(), request->agent_id()));
      if (member.stream == nullptr || member.state() != Group::Member::kJoined ||
          member.stream->state != owner->second.get()) {
        status = absl::NotFoundError(
            absl::StrFormat("job %s has no agent %s on a group stream of this caller",
                            EscapeControl(request->job_id()), EscapeControl(request->agent_id())));
      } else {
        const StreamId group = member.group_id;
        Decisions decisions;
        LoseMemberLocked(member, decisions);
        Apply(decisions, writers);
        EndIfEmpty(group, writers);
      }
    } else if (request->has_failure()) {
      Decisions decisions;
      v1::WorkerFailure failure = request->failure();
      TruncateFailureText(failure);
      absl::StatusOr<AbortEvent> abort =
          StateOf(caller->owner)
              .ReportFailure(clock_(), request->job_id(), request->agent_id(), FromProto(failure),
                             decisions);
      if (abort.ok()) {
        if (options_.log_jobs) {
          spdlog::info("job {}: {}", EscapeControl(request->job_id()),
                       EscapeControl(abort->reason));
        }
        RecordAbort(caller->owner, request->job_id(), *abort);
        *response->mutable_abort() = ToProto(*abort);
      }
      status = abort.status();
      Apply(decisions, writers);
    }
  }
  StartWrites(std::move(writers));
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Leave(grpc::CallbackServerContext* context,
                                                   const v1::LeaveRequest* request,
                                                   v1::LeaveResponse* /*response*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<Caller> caller =
      Authenticate(context, "Leave", request->job_id(), CheckLeaveRequest(*request));
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  std::vector<JoinStream*> writers;
  absl::Status left;
  {
    absl::MutexLock lock(&mu_);
    Decisions decisions;
    RendezvousState& state = StateOf(caller->owner);
    left = state.Leave(clock_(), request->job_id(), request->agent_id(), decisions);
    ChargeExcluded(state);
    Apply(decisions, writers);
  }
  StartWrites(std::move(writers));
  reactor->Finish(ToGrpcStatus(left));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::GetStatus(grpc::CallbackServerContext* context,
                                                       const v1::StatusRequest* request,
                                                       v1::StatusResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<Caller> caller =
      Authenticate(context, "GetStatus", request->job_id(), CheckStatusRequest(*request));
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  std::vector<JobStatusView> jobs;
  std::vector<std::pair<size_t, AbortEvent>> aborts;  // by index into `jobs`
  {
    absl::MutexLock lock(&mu_);
    // A caller sees its own jobs; root and the admin groups see everyone's.
    std::vector<const std::string*> owners;
    for (auto& [owner, state] : states_) {
      if (!caller->admin && owner != caller->owner) continue;
      for (JobStatusView& view : state->Status(request->job_id())) {
        jobs.push_back(std::move(view));
        owners.push_back(&owner);
      }
    }
    AddRecordedAborts(*caller, request->job_id(), owners, jobs, aborts);
  }
  std::vector<v1::JobStatus> replies;
  replies.reserve(jobs.size());
  for (const JobStatusView& j : jobs) replies.push_back(ToProto(j));
  for (const auto& [i, abort] : aborts) *replies[i].mutable_abort() = ToProto(abort);
  FitStatusReply(std::move(replies), kMaxStatusReplyBytes, response);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

void RendezvousService::Tick() {
  // Agents whose streams were reset with their connections up: back (their state no longer
  // runs on the old stream), gone (the connection closed since), or out of time.
  std::vector<std::pair<StreamId, std::string>> waiting;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, r] : reattaching_) waiting.emplace_back(id, r.peer);
  }
  std::vector<StreamId> gone;
  for (const auto& [id, peer] : waiting) {
    if (!options_.connections->ConnectionUp(peer)) gone.push_back(id);
  }
  std::vector<JoinStream*> writers;
  {
    absl::MutexLock lock(&mu_);
    Decisions decisions;
    const auto now = clock_();
    for (auto it = reattaching_.begin(); it != reattaching_.end();) {
      const Reattaching& r = it->second;
      const bool lost = now >= r.deadline || absl::c_linear_search(gone, it->first);
      if ((r.state->Runs(it->first) || r.state->Awaits(it->first)) && !lost) {
        ++it;
        continue;
      }
      if (options_.metrics != nullptr) options_.metrics->OnStreamGone(now, it->first);
      // A no-op for an agent that came back: its new stream replaced this one.
      r.state->StreamClosed(now, it->first, decisions);
      reattaching_.erase(it++);
    }
    for (auto& [owner, state] : states_) {
      state->Tick(now, decisions);
      ChargeExcluded(*state);
    }
    // What this server told its peers holds for a few seconds only.
    if (claims_) claims_->Sweep(now);
    Apply(decisions, writers);
  }
  StartWrites(std::move(writers));
}

void RendezvousService::Shutdown() {
  std::vector<JoinStream*> writers;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    const grpc::Status stopping(grpc::StatusCode::UNAVAILABLE, "the rendezvous server is stopping");
    for (auto& [id, entry] : streams_) {
      if (entry.stream->PushClose(stopping)) writers.push_back(entry.stream);
    }
    streams_.clear();
    parked_.clear();
    ledger_.ClearParked();
  }
  StartWrites(std::move(writers));
}

void RendezvousService::StopWriters() { writer_pool_.join(); }

void RendezvousService::CountRefused(absl::string_view reason) {
  if (options_.metrics != nullptr) options_.metrics->OnRefused(reason);
}

size_t RendezvousService::open_streams() const {
  absl::MutexLock lock(&mu_);
  return streams_.size();
}

int64_t RendezvousService::agents_joined() const {
  absl::MutexLock lock(&mu_);
  return agents_joined_;
}

int64_t RendezvousService::agents_attached() const {
  absl::MutexLock lock(&mu_);
  int64_t attached = 0;
  for (const auto& [id, stream] : streams_) attached += stream.agents;
  return attached;
}

}  // namespace rdzv
