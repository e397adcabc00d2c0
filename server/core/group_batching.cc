#include "server/core/group_batching.h"

#include <variant>

namespace rdzv {

GroupBatching::Kind GroupBatching::KindOf(const Event& event) {
  if (std::holds_alternative<ProgressEvent>(event)) return Kind::kProgress;
  if (std::holds_alternative<AbortEvent>(event)) return Kind::kAbort;
  return Kind::kAssignment;
}

void GroupBatching::CountAbort(StreamId group, uint32_t event) {
  auto [g, fresh] = aborts_.try_emplace(group);
  if (fresh) g->second.event = event;
  g->second.same = g->second.same && g->second.event == event;
  ++g->second.members;
}

GroupBatching::Action GroupBatching::Decide(StreamId group, size_t live, uint32_t event,
                                            Kind kind) {
  if (kind == Kind::kProgress) {
    return progressed_.insert(group).second ? Action::kToGroup : Action::kSkip;
  }
  // A job's abort that all of the group's members get: the first send of it goes for all.
  if (auto g = aborts_.find(group);
      g != aborts_.end() && g->second.same && g->second.members == live) {
    return g->second.event == event && aborted_.insert(group).second ? Action::kToGroup
                                                                     : Action::kSkip;
  }
  return Action::kToMember;
}

}  // namespace rdzv
