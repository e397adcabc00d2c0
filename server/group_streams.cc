// RendezvousService's group joins (JoinRequest.members): a relay's one stream for the agents of
// its node, each of them an agent of its own to the state, on an id of its own.
#include <spdlog/spdlog.h>

#include <string>
#include <vector>

#include "common/logging.h"
#include "common/proto_convert.h"
#include "server/join_stream.h"
#include "server/rendezvous_service.h"

namespace rdzv {

void RendezvousService::JoinMembersLocked(StreamId id, RendezvousState& state,
                                          const v1::JoinRequest& request, const std::string& client,
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

void RendezvousService::LoseMemberLocked(const MemberRef& member, Decisions& decisions) {
  const StreamId id = member.group().first + member.index;
  const StreamId group = member.group_id;
  const Micros now = clock_();
  if (options_.metrics != nullptr) options_.metrics->OnAgentGone(now, group);
  RendezvousState* state = member.stream->state;
  EraseMember(id);
  state->StreamClosed(now, id, decisions);
}

void RendezvousService::EndIfEmpty(StreamId group, std::vector<JoinStream*>& writers) {
  // A group with no member left on it is over.
  if (auto it = streams_.find(group);
      it != streams_.end() && it->second.group != nullptr && it->second.group->live == 0) {
    if (it->second.stream->PushClose(grpc::Status::OK)) writers.push_back(it->second.stream);
    EraseStream(it);
  }
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

}  // namespace rdzv
