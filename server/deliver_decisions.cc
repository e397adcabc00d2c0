// RendezvousService's delivery: the state's decisions queued on their Join streams (Apply), and
// the writer threads handed the streams whose writes must start. Which group member's event goes
// once for the whole group is GroupBatching's to decide (server/core/group_batching.h); here it
// is carried out.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <asio/post.hpp>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "server/core/group_batching.h"
#include "server/event_batches.h"
#include "server/join_stream.h"
#include "server/rendezvous_service.h"

namespace rdzv {

// What one Apply queues: the messages of its events, made once; the group batches it fills; the
// streams whose writes must start, and those whose queues overflowed.
struct RendezvousService::Outbox {
  Outbox(const Decisions& decisions, std::vector<JoinStream*>& writers)
      : messages(decisions), writers(writers) {}

  // Queues `event` (`bytes` long) on `stream`, whose id is `id`.
  void Push(StreamId id, JoinStream* stream, std::shared_ptr<const v1::JoinEvent> event,
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
  }

  EventMessages messages;
  // A group's events go out as one message per group stream, in order.
  EventBatches batches;
  GroupBatching grouping;
  std::vector<JoinStream*>& writers;
  std::vector<StreamId> overfull;
  // The member a send or close names, looked up once per run of consecutive members (a round's
  // sends go out member after member, a group's together).
  MemberRef last_member;
  v1::JoinEvent scratch;  // one member's event, made over and over
  std::string scratch_bytes;
};

RendezvousService::MemberRef RendezvousService::MemberOf(Outbox& box, StreamId id) {
  if (box.last_member.stream != nullptr) {
    const Group& g = box.last_member.group();
    if (id >= g.first && id - g.first < g.members.size()) {
      box.last_member.index = static_cast<size_t>(id - g.first);
      return box.last_member;
    }
  }
  box.last_member = FindMember(id);
  return box.last_member;
}

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
  Outbox box(decisions, writers);
  CountGroupAborts(decisions, box);
  QueueSends(decisions, box);
  QueueCloses(decisions, box);
  QueueBatches(box);
  if (!box.overfull.empty()) EndOverfull(box.overfull, writers);
}

void RendezvousService::CountGroupAborts(const Decisions& decisions, Outbox& box) {
  for (const Decisions::Send& send : decisions.sends) {
    if (!std::holds_alternative<AbortEvent>(decisions.events[send.event]) ||
        streams_.contains(send.stream)) {
      continue;
    }
    const MemberRef member = MemberOf(box, send.stream);
    if (member.stream == nullptr || member.state() != Group::Member::kJoined) continue;
    box.grouping.CountAbort(member.group_id, send.event);
  }
}

void RendezvousService::QueueSends(const Decisions& decisions, Outbox& box) {
  for (const Decisions::Send& send : decisions.sends) {
    const GroupBatching::Kind kind = GroupBatching::KindOf(decisions.events[send.event]);
    const bool assignment = kind == GroupBatching::Kind::kAssignment;
    if (auto it = streams_.find(send.stream); it != streams_.end()) {
      if (!assignment) {
        box.Push(send.stream, it->second.stream, box.messages.Message(send.event),
                 box.messages.Bytes(send.event));
        continue;
      }
      auto own = std::make_shared<v1::JoinEvent>();
      box.messages.AssignmentInto(send, *own);
      const auto bytes = static_cast<int64_t>(own->ByteSizeLong());
      box.Push(send.stream, it->second.stream, std::move(own), bytes);
      continue;
    }
    const MemberRef member = MemberOf(box, send.stream);
    if (member.stream == nullptr || member.state() != Group::Member::kJoined) continue;
    switch (box.grouping.Decide(member.group_id, member.group().live, send.event, kind)) {
      case GroupBatching::Action::kSkip:
        break;
      case GroupBatching::Action::kToGroup:
        box.batches.Add(member.group_id, box.messages.Serialized(send.event), "");
        break;
      case GroupBatching::Action::kToMember:
        if (!assignment) {
          box.batches.Add(member.group_id, box.messages.Serialized(send.event), member.agent_id());
          break;
        }
        box.messages.AssignmentInto(send, box.scratch);
        box.scratch.SerializeToString(&box.scratch_bytes);
        box.batches.Add(member.group_id, box.scratch_bytes, member.agent_id());
        break;
    }
  }
}

void RendezvousService::QueueCloses(const Decisions& decisions, Outbox& box) {
  for (const Decisions::Close& close : decisions.closes) {
    auto it = streams_.find(close.stream);
    const MemberRef member = it == streams_.end() ? MemberOf(box, close.stream) : MemberRef{};
    const bool known = it != streams_.end() ||
                       (member.stream != nullptr && member.state() != Group::Member::kGone);
    if (options_.log_jobs && !close.status.ok() && !absl::IsAborted(close.status) && known) {
      spdlog::info("refused a join: {}", EscapeControl(close.status.message()));
    }
    if (it == streams_.end()) {
      if (!known) continue;
      // The member's own stream would have ended here: its group hears how, under its name.
      box.scratch.Clear();
      box.scratch.mutable_member_end()->set_code(static_cast<int32_t>(close.status.code()));
      box.scratch.mutable_member_end()->set_message(std::string(close.status.message()));
      box.scratch.SerializeToString(&box.scratch_bytes);
      box.batches.Add(member.group_id, box.scratch_bytes, member.agent_id());
      EraseMember(close.stream);
      continue;
    }
    if (it->second.stream->PushClose(ToGrpcStatus(close.status))) {
      box.writers.push_back(it->second.stream);
    }
    // The stream is finished from our side: the state already forgot it.
    EraseStream(it);
    box.last_member = MemberRef{};  // it may have been the group it points into
  }
}

void RendezvousService::QueueBatches(Outbox& box) {
  for (EventBatches::Message& message : box.batches.Take()) {
    auto it = streams_.find(message.group);
    if (it == streams_.end()) continue;
    box.Push(message.group, it->second.stream, std::move(message.event), message.bytes);
    EndIfEmpty(message.group, box.writers);
  }
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

}  // namespace rdzv
