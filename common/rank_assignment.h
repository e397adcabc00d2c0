// Rank assignment: turns the agents of one completed round into global ranks, local ranks and
// node indices. A pure function of its input: no clock, no I/O, the same result on every call
// and in every order the agents arrived in.
//
// Agents are ordered by (order, node_index, host, agent_id); a missing order or node index (-1)
// leaves the decision to the fields after it. Nodes are the distinct node indices numbered
// densely 0..G-1 in ascending order; without node indices every agent is a node of its own (as
// with torchrun's --nnodes). Global ranks are prefix sums of the agents' worker counts in agent
// order, so nodes may run different numbers of workers.
#ifndef RDZV_COMMON_RANK_ASSIGNMENT_H_
#define RDZV_COMMON_RANK_ASSIGNMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rdzv {

// What rank assignment needs to know about one agent.
struct AgentSpec {
  std::string agent_id;
  std::string host;
  int64_t node_index = -1;  // --node-rank / SLURM_NODEID, or -1
  int64_t order = -1;       // global position (SLURM_PROCID in per-task mode), or -1
  int32_t nproc = 1;        // workers this agent runs
};

// Where one agent's workers sit in the job.
struct Slot {
  int32_t rank_offset = 0;        // global rank of the agent's first worker
  int32_t group_rank = 0;         // dense node index
  int32_t local_rank_offset = 0;  // local rank of the agent's first worker on its node
  int32_t local_world_size = 0;   // workers on this node, over all of its agents
};

struct RankTable {
  int32_t world_size = 0;
  int32_t group_world_size = 0;
  int32_t master_agent = 0;  // index (into the input) of the agent holding global rank 0
  std::vector<Slot> slots;   // one per input agent, same index
};

// Assigns ranks to `agents`. Fails with InvalidArgument when two agents claim the same
// (node index, order) position, when some agents give a node index and others do not, or when
// a worker count is not positive.
absl::StatusOr<RankTable> AssignRanks(const std::vector<AgentSpec>& agents);

}  // namespace rdzv

#endif  // RDZV_COMMON_RANK_ASSIGNMENT_H_
