// GroupBatching: how one round of the state's decisions reaches the members of group joins
// (JoinRequest.members), whose events share their group's stream. An event that is the same for
// every member of a group goes once, for all of them: progress (a snapshot of the round, the
// same for every waiting member) once per group; a job's abort once when every member still on
// the group gets that same abort. Anything else (an assignment, with each member's own ranks; an
// abort that only some members get, or that differs between them) goes to each member under its
// agent id.
//
// Events in, actions out: the shell first tells it of every abort sent to a member still on a
// group (CountAbort), then asks, send by send and in order, what to do (Decide), and carries it
// out on the group's batch (event_batches.h).
//
// Pure: no clock, no I/O. Not thread-safe; one per round of decisions.
#ifndef RDZV_SERVER_CORE_GROUP_BATCHING_H_
#define RDZV_SERVER_CORE_GROUP_BATCHING_H_

#include <cstddef>
#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/core/rendezvous_state.h"

namespace rdzv {

class GroupBatching {
 public:
  enum class Kind { kProgress, kAbort, kAssignment };
  static Kind KindOf(const Event& event);

  // Before any Decide: an abort, event `event`, goes to a member still on `group`.
  void CountAbort(StreamId group, uint32_t event);

  enum class Action {
    kSkip,      // the group has heard it already, for all its members
    kToGroup,   // add it to the group's batch once, for all its members
    kToMember,  // add it to the group's batch for this member (an assignment: its own)
  };
  // A send of `event` (of `kind`) to a member still on `group`, which has `live` such members.
  Action Decide(StreamId group, size_t live, uint32_t event, Kind kind);

 private:
  // Per group, the first abort and how many of its members get that same one.
  struct GroupAbort {
    uint32_t event = 0;
    size_t members = 0;
    bool same = true;
  };
  absl::flat_hash_map<StreamId, GroupAbort> aborts_;
  absl::flat_hash_set<StreamId> progressed_;
  absl::flat_hash_set<StreamId> aborted_;
};

}  // namespace rdzv

#endif  // RDZV_SERVER_CORE_GROUP_BATCHING_H_
