// Rank assignment: turns the agents of one completed round into global ranks, local ranks and
// node indices. A pure function of its input: no clock, no I/O, the same result on every call
// and in every order the agents arrived in.
//
// Agents are ordered by (order, node_index, host, agent_id); a missing order or node index (-1)
// leaves the decision to the fields after it. Nodes are the distinct node indices numbered
// densely 0..G-1 in ascending order; without node indices every agent is a node of its own (as
// with torchrun's --nnodes). Global ranks are prefix sums of the agents' worker counts in agent
// order, so nodes may run different numbers of workers.
#ifndef RDZV_COMMON_CORE_RANK_ASSIGNMENT_H_
#define RDZV_COMMON_CORE_RANK_ASSIGNMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/core/rendezvous_types.h"

namespace rdzv {

struct RankTable {
  int32_t world_size = 0;
  int32_t group_world_size = 0;
  int32_t master_agent = 0;           // index (into the input) of the agent holding global rank 0
  std::vector<Slot> slots;            // one per input agent, same index
  std::vector<int> workers_per_node;  // one per node, by group rank
};

// One agent as rank assignment reads it: an AgentSpec's fields, its names not copied (a round of
// 100,000 agents is ranked from the server's own records).
struct RankInput {
  absl::string_view agent_id;
  absl::string_view host;
  int64_t node_index = -1;
  int64_t order = -1;
  int32_t nproc = 1;
};

// Assigns ranks to `agents`. Fails with InvalidArgument when two agents claim the same
// (node index, order) position, when some agents give a node index and others do not, when
// a worker count is not positive, or when the workers are more than 32-bit ranks can number.
absl::StatusOr<RankTable> AssignRanks(const std::vector<RankInput>& agents);
// The same, for agents given whole.
absl::StatusOr<RankTable> AssignRanks(const std::vector<AgentSpec>& agents);

}  // namespace rdzv

#endif  // RDZV_COMMON_CORE_RANK_ASSIGNMENT_H_
