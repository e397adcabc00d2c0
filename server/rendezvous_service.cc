#include "server/rendezvous_service.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <asio/post.hpp>
#include <list>
#include <optional>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/auth.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/proto_convert.h"
#include "server/event_batches.h"
#include "guard/request_limits.h"
#include "server/status_reply.h"

namespace rdzv {

// One agent's Join stream. gRPC allows one write in flight per stream, so events queue here
// and go out one after another; a requested finish waits until the queue has drained. The queue
// is a list: it is almost always empty, and an empty std::deque still costs half a KiB, which
// thousands of idle streams pay.
//
// Events and closes are queued under the service's lock, which fixes their order (Push,
// PushClose), but the write or finish that sends them is started by a writer thread
// (StartWrites): started from a thread that is not gRPC's, a write runs to the socket inline, and
// a broadcast to thousands of streams would otherwise hold the lock, or a gRPC thread, for as
// long. A Push that asks for StartWrites holds the stream alive until that call is over.
//
// Owned by gRPC: it deletes itself once OnDone has run and no StartWrites is pending.
class RendezvousService::JoinStream final : public grpc::ServerWriteReactor<v1::JoinEvent> {
 public:
  JoinStream(RendezvousService* service, StreamId id) : service_(service), id_(id) {}

  // Counts `bytes`, and from now on the events queued here, against `user` and `total` until
  // the stream is done. Call once, before the first Push.
  void Charge(std::shared_ptr<Usage> user, std::shared_ptr<Usage> total, int64_t bytes,
              int64_t max_queued) {
    absl::MutexLock lock(&mu_);
    user_ = std::move(user);
    total_ = std::move(total);
    max_queued_ = max_queued;
    AddLocked(bytes);
  }

  enum class Pushed { kQueued, kStartWrites, kOverfull, kOverfullStartWrites };

  // Queues `event` (`bytes` long). kStartWrites when the caller must have StartWrites() called
  // (outside the service's lock); kOverfull* when the queue has passed its bound: the queue is
  // dropped, the stream ends with RESOURCE_EXHAUSTED once the write in flight is done, and the
  // caller must forget the stream (and, for kOverfullStartWrites, call StartWrites()).
  Pushed Push(std::shared_ptr<const v1::JoinEvent> event, int64_t bytes) {
    absl::MutexLock lock(&mu_);
    if (finishing_) return Pushed::kQueued;
    // Progress is a snapshot: a newer one replaces one still waiting (not the one in flight).
    if (event->has_progress() && queue_.size() > (writing_ ? 1u : 0u) &&
        queue_.back().first->has_progress()) {
      AddLocked(bytes - queue_.back().second);
      queue_.back() = {std::move(event), bytes};
      return Pushed::kQueued;
    }
    queue_.emplace_back(std::move(event), bytes);
    queued_bytes_ += bytes;
    AddLocked(bytes);
    if (max_queued_ > 0 && queued_bytes_ > max_queued_) {
      DropQueueLocked();
      finishing_ = true;
      pending_finish_ = grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          "this agent did not read its messages from the rendezvous server; its stream ended");
      return Hold() ? Pushed::kOverfullStartWrites : Pushed::kOverfull;
    }
    return Hold() ? Pushed::kStartWrites : Pushed::kQueued;
  }

  // Ends the stream with `status` once what is queued has been written. True when the caller
  // must have StartWrites() called.
  bool PushClose(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    if (finishing_) return false;
    finishing_ = true;
    pending_finish_ = status;
    return Hold();
  }

  // Starts writing the queue (or the finish) unless a write is already in flight; ends the hold
  // of a Push.
  void StartWrites() {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      if (!done_ && !writing_) WriteNextLocked();
      last = --holds_ == 0 && done_;
    }
    if (last) delete this;
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    queued_bytes_ -= queue_.front().second;
    AddLocked(-queue_.front().second);
    queue_.pop_front();
    writing_ = false;
    if (!ok) {
      // The client is gone; OnCancel/OnDone will follow.
      DropQueueLocked();
      if (!finishing_) {
        finishing_ = true;
        pending_finish_ = grpc::Status::CANCELLED;
      }
    }
    WriteNextLocked();
  }

  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      if (!finishing_) {
        finishing_ = true;
        pending_finish_ = grpc::Status::CANCELLED;
        if (!writing_ && queue_.empty()) WriteNextLocked();
      }
    }
    service_->StreamDone(id_, /*cancelled=*/true);
  }

  void OnDone() override {
    service_->StreamDone(id_, /*cancelled=*/false);
    bool last;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      AddLocked(-charged_);
      last = holds_ == 0;
    }
    if (last) delete this;
  }

 private:
  bool Hold() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_) return false;  // OnWriteDone goes on with the queue
    ++holds_;
    return true;
  }

  void AddLocked(int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (user_ == nullptr || bytes == 0) return;
    charged_ += bytes;
    user_->bytes.fetch_add(bytes, std::memory_order_relaxed);
    total_->bytes.fetch_add(bytes, std::memory_order_relaxed);
  }

  // Drops what is queued but not being written.
  void DropQueueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t keep = writing_ ? 1 : 0;
    while (queue_.size() > keep) {
      queued_bytes_ -= queue_.back().second;
      AddLocked(-queue_.back().second);
      queue_.pop_back();
    }
  }

  // The next write, or the finish once the queue is empty and one was asked for.
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    if (!queue_.empty()) {
      writing_ = true;
      StartWrite(queue_.front().first.get());
    } else if (pending_finish_) {
      finished_ = true;
      Finish(*pending_finish_);
      pending_finish_.reset();
    }
  }

  RendezvousService* const service_;
  const StreamId id_;
  absl::Mutex mu_;
  // Shared: a broadcast's one message sits in every stream's queue. With its size, as counted.
  std::list<std::pair<std::shared_ptr<const v1::JoinEvent>, int64_t>> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t max_queued_ ABSL_GUARDED_BY(mu_) = 0;
  // Where this stream's bytes are counted (null: nowhere), and how many it counts there now.
  std::shared_ptr<Usage> user_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Usage> total_ ABSL_GUARDED_BY(mu_);
  int64_t charged_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;  // a finish is asked for: queue no more
  bool finished_ ABSL_GUARDED_BY(mu_) = false;   // Finish has been called
  std::optional<grpc::Status> pending_finish_ ABSL_GUARDED_BY(mu_);
  int holds_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

// A broadcast's writes, spread over the writer threads: a round's assignment or a job's abort
// to thousands of agents is thousands of writes of a few dozen microseconds each, and the last
// agent hears it sooner when several threads share them (10,000 agents on two cores: an abort
// reached all in about 480 ms from one thread, about 390 ms from four). From 256 writes on they
// are shared: 1,000 agents heard an abort in 43 ms (median of 3) against 54 ms from one thread.
constexpr size_t kWriterThreads = 4;
constexpr size_t kWritesPerTask = 256;

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
  const int64_t join_bytes = kAgentBaseBytes + (agents - 1) * kGroupMemberBytes +
                             static_cast<int64_t>(request->ByteSizeLong());
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
  streams_per_user_[&state] += agents;
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
    JoinMembersLocked(id, state, request, peer, decisions);
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
  const int64_t now_held = state.excluded_agents();
  int64_t& charged = charged_excluded_[&state];
  if (now_held == charged) return;
  const int64_t bytes = (now_held - charged) * kExcludedAgentBytes;
  charged = now_held;
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

void RendezvousService::JoinMembersLocked(StreamId id, RendezvousState& state,
                                          const v1::JoinRequest& request, const std::string& peer,
                                          Decisions& decisions) {
  const Micros now = clock_();
  Group& group = *streams_.at(id).group;
  const auto count = static_cast<size_t>(request.members_size());
  // The members' ids in one block, found from any of them by the block's start.
  group.first = next_stream_;
  next_stream_ += count;
  groups_by_member_[group.first] = id;
  group.ends.reserve(count);
  group.members.reserve(count);
  for (const v1::JoinRequest& member : request.members()) {
    group.ids.append(member.agent_id());
    group.ends.push_back(static_cast<uint32_t>(group.ids.size()));
    group.members.push_back(Group::Member::kJoined);
  }
  group.live = count;
  const std::string client = PeerAddress(peer);
  JoinSpec spec;
  for (size_t k = 0; k < count; ++k) {
    FromProto(request.members(static_cast<int>(k)), &spec);
    spec.job_id = request.job_id();
    const StreamId member_id = group.first + k;
    // A member out of range is refused alone: the others of its node go on.
    if (absl::Status invalid = ValidateJoinSpec(spec); !invalid.ok()) {
      if (options_.metrics != nullptr) options_.metrics->OnRefused(Metrics::kRefusedInvalid);
      group.members[k] = Group::Member::kRefused;
      decisions.closes.push_back({member_id, invalid});
      continue;
    }
    // The metrics count each member as an agent attached on the group's stream.
    if (options_.metrics != nullptr) options_.metrics->OnJoin(now, id, spec);
    if (spec.unhealthy) LogUnhealthy(spec);
    state.Join(now, member_id, spec, CallerInfo{client}, decisions);
  }
}

RendezvousService::MemberRef RendezvousService::FindMember(StreamId id) {
  auto block = groups_by_member_.upper_bound(id);
  if (block == groups_by_member_.begin()) return {};
  --block;
  auto it = streams_.find(block->second);
  if (it == streams_.end() || it->second.group == nullptr) return {};
  const Group& group = *it->second.group;
  if (id < group.first || id - group.first >= group.members.size()) return {};
  return MemberRef{it->first, &it->second, static_cast<size_t>(id - group.first)};
}

StreamId RendezvousService::CountedOn(StreamId id) {
  if (streams_.contains(id)) return id;
  const MemberRef member = FindMember(id);
  if (member.stream == nullptr) return id;
  return member.state() == Group::Member::kRefused ? 0 : member.group_id;
}

void RendezvousService::EraseMember(StreamId id) {
  const MemberRef member = FindMember(id);
  if (member.stream == nullptr || member.state() == Group::Member::kGone) return;
  member.group().members[member.index] = Group::Member::kGone;
  --member.group().live;
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

bool RendezvousService::RelayAlive(StreamId id) {
  if (options_.connections == nullptr) return false;
  std::string peer;
  {
    absl::MutexLock lock(&mu_);
    auto it = streams_.find(id);
    if (it == streams_.end() || it->second.group == nullptr) return false;
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
      reattaching_[id] = Reattaching{it->second.state, it->second.peer,
                                     std::numeric_limits<Micros>::max()};
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

void RendezvousService::LoseStreamLocked(absl::flat_hash_map<StreamId, Stream>::iterator it,
                                         Micros now, Decisions& decisions, bool relay_alive) {
  const StreamId id = it->first;
  RendezvousState* state = it->second.state;
  // Every member of a group still on it is lost with it, as its own stream would have been.
  std::vector<StreamId> lost;
  if (const Group* group = it->second.group.get(); group != nullptr) {
    lost.reserve(group->live);
    for (size_t k = 0; k < group->members.size(); ++k) {
      if (group->members[k] == Group::Member::kJoined) lost.push_back(group->first + k);
    }
  } else {
    lost.push_back(id);
  }
  // A group's stream takes its count in the metrics with it (EraseStream).
  if (options_.metrics != nullptr && it->second.group == nullptr) {
    options_.metrics->OnStreamGone(now, id);
  }
  EraseStream(it);
  for (const StreamId member : lost) {
    if (relay_alive && !state->Runs(member) && state->Awaits(member)) continue;
    state->StreamClosed(now, member, decisions);
  }
}

namespace {

// The messages of one Apply's events, each made once: one that every queue shares (an abort,
// progress) and its serialized bytes for group batches; for a round's assignments, the parts
// every member shares, which each member's copy starts from.
class EventMessages {
 public:
  explicit EventMessages(const Decisions& decisions)
      : decisions_(decisions),
        messages_(decisions.events.size()),
        bytes_(decisions.events.size()) {}

  const std::shared_ptr<const v1::JoinEvent>& Message(uint32_t event) {
    if (messages_[event] == nullptr) {
      messages_[event] = std::make_shared<const v1::JoinEvent>(ToProto(decisions_.events[event]));
    }
    return messages_[event];
  }
  int64_t Bytes(uint32_t event) { return static_cast<int64_t>(Serialized(event).size()); }
  const std::string& Serialized(uint32_t event) {
    if (bytes_[event].empty()) bytes_[event] = Message(event)->SerializeAsString();
    return bytes_[event];
  }

  // `send`'s assignment, the round's message with the agent's own part, into `out` (cleared).
  void AssignmentInto(const Decisions::Send& send, v1::JoinEvent& out) {
    out.Clear();
    v1::Assignment* a = out.mutable_assignment();
    *a = Message(send.event)->assignment();
    a->set_rank_offset(send.slot.rank_offset);
    a->set_group_rank(send.slot.group_rank);
    a->set_local_rank_offset(send.slot.local_rank_offset);
    a->set_local_world_size(send.slot.local_world_size);
    a->set_spare(send.spare);
  }

 private:
  const Decisions& decisions_;
  std::vector<std::shared_ptr<const v1::JoinEvent>> messages_;
  std::vector<std::string> bytes_;
};

}  // namespace

void RendezvousService::Apply(Decisions& decisions, std::vector<JoinStream*>& writers) {
  if (options_.metrics != nullptr) {
    options_.metrics->OnDecisions(clock_(), decisions,
                                  [this](StreamId id)
                                      ABSL_NO_THREAD_SAFETY_ANALYSIS { return CountedOn(id); });
  }
  for (const std::string& job : decisions.taken_up) {
    // Counted in rdzv_failovers_total, with or without --peers.
    spdlog::warn(
        "job {}: taken up from its resuming agents (this rdzvd restarted, or the one that ran it "
        "was lost)",
        EscapeControl(job));
  }
  std::vector<StreamId> overfull;
  const auto push = [&](StreamId id, JoinStream* stream, std::shared_ptr<const v1::JoinEvent> event,
                        int64_t bytes) {
    switch (stream->Push(std::move(event), bytes)) {
      case JoinStream::Pushed::kQueued:
        break;
      case JoinStream::Pushed::kStartWrites:
        writers.push_back(stream);
        break;
      case JoinStream::Pushed::kOverfullStartWrites:
        writers.push_back(stream);
        [[fallthrough]];
      case JoinStream::Pushed::kOverfull:
        overfull.push_back(id);
        break;
    }
  };
  // The member a send or close names, looked up once per group of consecutive members (a round's
  // sends go out member after member, a group's together).
  MemberRef last_member;
  const auto member_of = [&](StreamId id) -> MemberRef {
    if (last_member.stream != nullptr) {
      const Group& g = last_member.group();
      if (id >= g.first && id - g.first < g.members.size()) {
        last_member.index = static_cast<size_t>(id - g.first);
        return last_member;
      }
    }
    last_member = FindMember(id);
    return last_member;
  };
  // A job's abort that every member of a group gets goes once, for all of them, as progress
  // does: per group, the first abort and how many of its members get that same one.
  struct GroupAbort {
    uint32_t event = 0;
    size_t members = 0;
    bool same = true;
  };
  absl::flat_hash_map<StreamId, GroupAbort> group_aborts;
  for (const Decisions::Send& send : decisions.sends) {
    if (!std::holds_alternative<AbortEvent>(decisions.events[send.event]) ||
        streams_.contains(send.stream)) {
      continue;
    }
    const MemberRef member = member_of(send.stream);
    if (member.stream == nullptr || member.state() != Group::Member::kJoined) continue;
    auto [g, fresh] = group_aborts.try_emplace(member.group_id);
    if (fresh) g->second.event = send.event;
    g->second.same = g->second.same && g->second.event == send.event;
    ++g->second.members;
  }
  const auto whole_group_abort = [&](const MemberRef& member) -> std::optional<uint32_t> {
    auto g = group_aborts.find(member.group_id);
    if (g == group_aborts.end() || !g->second.same || g->second.members != member.group().live) {
      return std::nullopt;
    }
    return g->second.event;
  };
  EventMessages messages(decisions);
  // A group's events go out as one message per group stream, in order.
  EventBatches batches;
  absl::flat_hash_set<StreamId> progressed;
  absl::flat_hash_set<StreamId> aborted;
  v1::JoinEvent scratch;  // one member's event, made over and over
  std::string scratch_bytes;
  for (const Decisions::Send& send : decisions.sends) {
    const Event& event = decisions.events[send.event];
    const bool assignment = std::holds_alternative<AssignmentEvent>(event);
    auto it = streams_.find(send.stream);
    if (it != streams_.end()) {
      if (!assignment) {
        push(send.stream, it->second.stream, messages.Message(send.event),
             messages.Bytes(send.event));
        continue;
      }
      auto own = std::make_shared<v1::JoinEvent>();
      messages.AssignmentInto(send, *own);
      const auto bytes = static_cast<int64_t>(own->ByteSizeLong());
      push(send.stream, it->second.stream, std::move(own), bytes);
      continue;
    }
    const MemberRef member = member_of(send.stream);
    if (member.stream == nullptr || member.state() != Group::Member::kJoined) continue;
    // Progress is the same for every waiting member: the group hears it once, for all; so does a
    // job's abort that all of them get.
    if (std::holds_alternative<ProgressEvent>(event)) {
      if (progressed.insert(member.group_id).second) {
        batches.Add(member.group_id, messages.Serialized(send.event), "");
      }
      continue;
    }
    if (const std::optional<uint32_t> once = whole_group_abort(member); once.has_value()) {
      if (*once == send.event && aborted.insert(member.group_id).second) {
        batches.Add(member.group_id, messages.Serialized(send.event), "");
      }
      continue;
    }
    if (!assignment) {
      batches.Add(member.group_id, messages.Serialized(send.event), member.agent_id());
      continue;
    }
    messages.AssignmentInto(send, scratch);
    scratch.SerializeToString(&scratch_bytes);
    batches.Add(member.group_id, scratch_bytes, member.agent_id());
  }
  for (const Decisions::Close& close : decisions.closes) {
    auto it = streams_.find(close.stream);
    const MemberRef member = it == streams_.end() ? member_of(close.stream) : MemberRef{};
    const bool known = it != streams_.end() ||
                       (member.stream != nullptr && member.state() != Group::Member::kGone);
    if (options_.log_jobs && !close.status.ok() && !absl::IsAborted(close.status) && known) {
      spdlog::info("refused a join: {}", EscapeControl(close.status.message()));
    }
    if (it == streams_.end()) {
      if (!known) continue;
      // The member's own stream would have ended here: its group hears how, under its name.
      scratch.Clear();
      scratch.mutable_member_end()->set_code(static_cast<int32_t>(close.status.code()));
      scratch.mutable_member_end()->set_message(std::string(close.status.message()));
      scratch.SerializeToString(&scratch_bytes);
      batches.Add(member.group_id, scratch_bytes, member.agent_id());
      EraseMember(close.stream);
      continue;
    }
    if (it->second.stream->PushClose(ToGrpcStatus(close.status))) {
      writers.push_back(it->second.stream);
    }
    // The stream is finished from our side: the state already forgot it.
    EraseStream(it);
    last_member = MemberRef{};  // it may have been the group it points into
  }
  for (EventBatches::Message& message : batches.Take()) {
    auto it = streams_.find(message.group);
    if (it == streams_.end()) continue;
    push(message.group, it->second.stream, std::move(message.event), message.bytes);
    // A group with no member left on it is over.
    if (it->second.group != nullptr && it->second.group->live == 0) {
      if (it->second.stream->PushClose(grpc::Status::OK)) writers.push_back(it->second.stream);
      EraseStream(it);
    }
  }
  if (!overfull.empty()) EndOverfull(overfull, writers);
}

void RendezvousService::EndOverfull(const std::vector<StreamId>& overfull,
                                    std::vector<JoinStream*>& writers) {
  const Micros now = clock_();
  Decisions decisions;
  for (const StreamId id : overfull) {
    auto it = streams_.find(id);
    if (it == streams_.end()) continue;
    spdlog::warn("ended a join stream whose agent did not read its messages ({} bytes queued)",
                 options_.max_queued_bytes_per_stream);
    LoseStreamLocked(it, now, decisions);
  }
  // What the loss of those agents decides (their jobs' aborts) goes to the others.
  if (!decisions.sends.empty() || !decisions.closes.empty()) Apply(decisions, writers);
}

void RendezvousService::EraseStream(absl::flat_hash_map<StreamId, Stream>::iterator it) {
  auto count = streams_per_user_.find(it->second.state);
  if (count != streams_per_user_.end() && (count->second -= it->second.agents) <= 0) {
    streams_per_user_.erase(count);
  }
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
  const bool auth_none = options_.auth.mode == AuthMode::kNone;
  // Jobs held while the peers are asked count as jobs: each is a question to every peer.
  auto parked = parked_jobs_.find(&state);
  const int64_t jobs =
      static_cast<int64_t>(state.job_count()) + (parked == parked_jobs_.end() ? 0 : parked->second);
  if (!state.has_job(job_id) && !parked_.contains(ParkKey(caller.owner, job_id)) &&
      jobs >= options_.max_jobs_per_user) {
    return UserCapError(UserCap::kJobs, auth_none, caller.name, jobs, options_.max_jobs_per_user);
  }
  auto count = streams_per_user_.find(&state);
  if (count != streams_per_user_.end() && count->second + agents > options_.max_agents_per_user) {
    return UserCapError(UserCap::kAgents, auth_none, caller.name, count->second,
                        options_.max_agents_per_user);
  }
  if (auto usage = usage_.find(&state); usage != usage_.end()) {
    const int64_t held = usage->second->bytes.load(std::memory_order_relaxed);
    if (options_.max_memory_per_user_bytes > 0 &&
        held + join_bytes > options_.max_memory_per_user_bytes) {
      return MemoryCapError(auth_none, caller.name, held, options_.max_memory_per_user_bytes,
                            /*all_users=*/false);
    }
  }
  const int64_t total = total_usage_->bytes.load(std::memory_order_relaxed);
  if (options_.max_memory_bytes > 0 && total + join_bytes > options_.max_memory_bytes) {
    return MemoryCapError(auth_none, caller.name, total, options_.max_memory_bytes,
                          /*all_users=*/true);
  }
  return absl::OkStatus();
}

void RendezvousService::StartWrites(std::vector<JoinStream*> writers) {
  if (writers.empty()) return;
  const size_t tasks =
      std::min(kWriterThreads, (writers.size() + kWritesPerTask - 1) / kWritesPerTask);
  if (tasks <= 1) {
    asio::post(writer_pool_, [writers = std::move(writers)] {
      for (JoinStream* stream : writers) stream->StartWrites();
    });
    return;
  }
  const size_t chunk = (writers.size() + tasks - 1) / tasks;
  for (size_t begin = 0; begin < writers.size(); begin += chunk) {
    std::vector<JoinStream*> part(writers.begin() + begin,
                                  writers.begin() + std::min(writers.size(), begin + chunk));
    asio::post(writer_pool_, [part = std::move(part)] {
      for (JoinStream* stream : part) stream->StartWrites();
    });
  }
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
        const StreamId id = member.group().first + member.index;
        const StreamId group = member.group_id;
        const Micros now = clock_();
        Decisions decisions;
        if (options_.metrics != nullptr) options_.metrics->OnAgentGone(now, group);
        EraseMember(id);
        owner->second->StreamClosed(now, id, decisions);
        Apply(decisions, writers);
        // A group with no member left on it is over.
        if (auto it = streams_.find(group);
            it != streams_.end() && it->second.group != nullptr && it->second.group->live == 0) {
          if (it->second.stream->PushClose(grpc::Status::OK)) writers.push_back(it->second.stream);
          EraseStream(it);
        }
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
    parked_jobs_.clear();
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
