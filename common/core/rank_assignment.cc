#include "common/core/rank_assignment.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace rdzv {
namespace {

auto SortKey(const RankInput& a) { return std::tie(a.order, a.node_index, a.host, a.agent_id); }

absl::Status CheckConsistent(const std::vector<RankInput>& agents) {
  const RankInput& first = agents.front();
  for (const RankInput& a : agents) {
    if (a.nproc <= 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("the agent on %s runs %d workers; expected at least 1", a.host, a.nproc));
    }
    if ((a.node_index >= 0) != (first.node_index >= 0)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the agents on %s and %s disagree on whether a node rank is given; pass --node-rank "
          "to every agent or to none",
          first.host, a.host));
    }
    if ((a.order >= 0) != (first.order >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("the agents on %s and %s disagree on whether a global order is given",
                          first.host, a.host));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RankTable> AssignRanks(const std::vector<AgentSpec>& agents) {
  std::vector<RankInput> inputs;
  inputs.reserve(agents.size());
  for (const AgentSpec& a : agents) {
    inputs.push_back({a.agent_id, a.host, a.node_index, a.order, a.nproc});
  }
  return AssignRanks(inputs);
}

absl::StatusOr<RankTable> AssignRanks(const std::vector<RankInput>& agents) {
  RankTable table;
  if (agents.empty()) return table;
  if (absl::Status s = CheckConsistent(agents); !s.ok()) return s;
  const bool indexed = agents.front().node_index >= 0;
  const bool ordered = agents.front().order >= 0;

  std::vector<size_t> by_position(agents.size());
  std::iota(by_position.begin(), by_position.end(), 0);
  std::sort(by_position.begin(), by_position.end(),
            [&](size_t l, size_t r) { return SortKey(agents[l]) < SortKey(agents[r]); });

  for (size_t i = 1; i < by_position.size(); ++i) {
    const RankInput& prev = agents[by_position[i - 1]];
    const RankInput& cur = agents[by_position[i]];
    if (ordered && cur.order == prev.order) {
      return absl::InvalidArgumentError(
          absl::StrFormat("global position %d is claimed by two agents (on %s and %s)", cur.order,
                          prev.host, cur.host));
    }
    if (!ordered && indexed && cur.node_index == prev.node_index) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "node rank %d is claimed by two agents (on %s and %s); give each node its own "
          "--node-rank",
          cur.node_index, prev.host, cur.host));
    }
  }

  // Dense node numbering: ascending node index, or agent position when nodes carry no index.
  std::vector<int64_t> node_indices;
  if (indexed) {
    node_indices.reserve(agents.size());
    for (const RankInput& a : agents) node_indices.push_back(a.node_index);
    std::sort(node_indices.begin(), node_indices.end());
    node_indices.erase(std::unique(node_indices.begin(), node_indices.end()), node_indices.end());
  }
  table.group_world_size = static_cast<int32_t>(indexed ? node_indices.size() : agents.size());
  // Summed in 64 bits: the sum is checked against the 32 bits ranks have before any is handed
  // out, and every per-node sum is at most the whole.
  int64_t world = 0;
  for (const RankInput& a : agents) world += a.nproc;
  if (world > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the %d agents run %d workers in all, over the limit of %d ranks; lower --nnodes or "
        "--nproc-per-node",
        agents.size(), world, std::numeric_limits<int32_t>::max()));
  }
  std::vector<int64_t> node_workers(table.group_world_size, 0);

  table.slots.resize(agents.size());
  int64_t next_rank = 0;
  for (size_t pos = 0; pos < by_position.size(); ++pos) {
    const size_t idx = by_position[pos];
    Slot& slot = table.slots[idx];
    slot.group_rank =
        indexed ? static_cast<int32_t>(std::lower_bound(node_indices.begin(), node_indices.end(),
                                                        agents[idx].node_index) -
                                       node_indices.begin())
                : static_cast<int32_t>(pos);
    slot.rank_offset = static_cast<int32_t>(next_rank);
    slot.local_rank_offset = static_cast<int32_t>(node_workers[slot.group_rank]);
    node_workers[slot.group_rank] += agents[idx].nproc;
    next_rank += agents[idx].nproc;
  }
  for (Slot& slot : table.slots) {
    slot.local_world_size = static_cast<int32_t>(node_workers[slot.group_rank]);
  }
  table.workers_per_node.assign(node_workers.begin(), node_workers.end());
  table.world_size = static_cast<int32_t>(next_rank);
  table.master_agent = static_cast<int32_t>(by_position.front());
  return table;
}

}  // namespace rdzv
