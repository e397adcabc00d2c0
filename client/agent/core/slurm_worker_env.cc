#include "client/agent/core/slurm_worker_env.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/core/hostlist.h"

namespace rdzv {
namespace {

absl::Status Inconsistent(const SlurmWorkerPlace& place, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "inconsistent worker place (rank ", place.rank, ", local rank ", place.local_rank, ", node ",
      place.group_rank, " of ", place.num_nodes, ", world size ", place.world_size,
      ", workers per node ", FormatTasksPerNode(place.workers_per_node), "): ", why));
}

// Checks `place` and returns the first rank on its node.
absl::StatusOr<int64_t> FirstRankOnNode(const SlurmWorkerPlace& p) {
  if (p.num_nodes < 1 || p.world_size < 1) {
    return Inconsistent(p, "the world needs at least one node and one worker");
  }
  if (p.group_rank < 0 || p.group_rank >= p.num_nodes) {
    return Inconsistent(p, "the node index is outside the nodes");
  }
  if (p.rank < 0 || p.rank >= p.world_size || p.local_rank < 0 || p.local_rank > p.rank) {
    return Inconsistent(p, "the rank is outside the world");
  }
  if (p.workers_per_node.empty()) return p.rank - p.local_rank;
  if (p.workers_per_node.size() != static_cast<std::size_t>(p.num_nodes)) {
    return Inconsistent(
        p, absl::StrCat(p.workers_per_node.size(), " worker counts for ", p.num_nodes, " nodes"));
  }
  if (!p.node_names.empty() && p.node_names.size() != static_cast<std::size_t>(p.num_nodes)) {
    return Inconsistent(
        p, absl::StrCat(p.node_names.size(), " node names for ", p.num_nodes, " nodes"));
  }
  int64_t total = 0;
  int64_t first = 0;
  for (std::size_t node = 0; node < p.workers_per_node.size(); ++node) {
    if (p.workers_per_node[node] < 1) {
      return Inconsistent(p, absl::StrCat("node ", node, " runs no worker"));
    }
    if (node == static_cast<std::size_t>(p.group_rank)) first = total;
    total += p.workers_per_node[node];
  }
  if (total != p.world_size) {
    return Inconsistent(p, absl::StrCat("the nodes run ", total, " workers in all"));
  }
  if (p.local_rank < 0 || p.local_rank >= p.workers_per_node[p.group_rank]) {
    return Inconsistent(p, "the local rank is outside its node's workers");
  }
  if (p.rank != first + p.local_rank) {
    return Inconsistent(
        p, absl::StrCat("ranks on node ", p.group_rank, " start at ", first, ", so local rank ",
                        p.local_rank, " is rank ", first + p.local_rank));
  }
  return first;
}

}  // namespace

absl::StatusOr<EnvList> SlurmWorkerVariables(const SlurmWorkerPlace& place, const SlurmEnv& agent) {
  absl::StatusOr<int64_t> first = FirstRankOnNode(place);
  if (!first.ok()) return first.status();

  const std::string world_size = absl::StrCat(place.world_size);
  const std::string num_nodes = absl::StrCat(place.num_nodes);
  EnvList vars = {
      {"SLURM_PROCID", absl::StrCat(place.rank)},
      {"SLURM_LOCALID", absl::StrCat(place.local_rank)},
      {"SLURM_NODEID", absl::StrCat(place.group_rank)},
      {"SLURM_NTASKS", world_size},
      {"SLURM_NPROCS", world_size},
      {"SLURM_STEP_NUM_TASKS", world_size},
      {"SLURM_NNODES", num_nodes},
      {"SLURM_STEP_NUM_NODES", num_nodes},
  };
  if (!place.workers_per_node.empty()) {
    std::vector<int64_t> gtids;
    gtids.reserve(place.workers_per_node[place.group_rank]);
    for (int i = 0; i < place.workers_per_node[place.group_rank]; ++i) {
      gtids.push_back(*first + i);
    }
    const std::string tasks_per_node = FormatTasksPerNode(place.workers_per_node);
    vars.emplace_back("SLURM_GTIDS", absl::StrJoin(gtids, ","));
    vars.emplace_back("SLURM_TASKS_PER_NODE", tasks_per_node);
    vars.emplace_back("SLURM_STEP_TASKS_PER_NODE", tasks_per_node);
    bool even = true;
    for (int count : place.workers_per_node) even = even && count == place.workers_per_node[0];
    if (even) {
      vars.emplace_back("SLURM_NTASKS_PER_NODE", absl::StrCat(place.workers_per_node[0]));
    }
  }

  const std::vector<std::string>& nodes = place.node_names.empty() ? agent.nodes : place.node_names;
  std::string nodelist;
  if (nodes.size() == static_cast<std::size_t>(place.num_nodes) && !agent.node_name.empty() &&
      nodes[place.group_rank] == agent.node_name) {
    nodelist = CompressHostlist(nodes);
  }
  if (!nodelist.empty()) {
    vars.emplace_back("SLURM_NODELIST", nodelist);
    vars.emplace_back("SLURM_STEP_NODELIST", nodelist);
  }
  return vars;
}

}  // namespace rdzv

namespace rdzv {
namespace {

absl::StatusOr<int32_t> IntVariable(const EnvList& vars, absl::string_view name) {
  for (const auto& [key, value] : vars) {
    if (key != name) continue;
    int32_t n = 0;
    if (!absl::SimpleAtoi(value, &n)) {
      return absl::InvalidArgumentError(absl::StrCat(name, "=\"", value, "\" is not a number"));
    }
    return n;
  }
  return absl::InvalidArgumentError(absl::StrCat(name, " is not set"));
}

}  // namespace

absl::StatusOr<SlurmWorkerPlace> PlaceFromWorkerVariables(const EnvList& vars,
                                                          const SlurmEnv& agent,
                                                          std::string_view workers_per_node) {
  SlurmWorkerPlace p;
  int32_t local_world_size = 0;
  for (auto [name, field] : {std::pair<absl::string_view, int32_t*>{"RANK", &p.rank},
                             {"LOCAL_RANK", &p.local_rank},
                             {"GROUP_RANK", &p.group_rank},
                             {"WORLD_SIZE", &p.world_size},
                             {"GROUP_WORLD_SIZE", &p.num_nodes},
                             {"LOCAL_WORLD_SIZE", &local_world_size}}) {
    absl::StatusOr<int32_t> n = IntVariable(vars, name);
    if (!n.ok()) return n.status();
    *field = *n;
  }
  const int64_t first = static_cast<int64_t>(p.rank) - p.local_rank;
  const auto fits = [&](const std::vector<int>& counts) {
    if (counts.size() != static_cast<std::size_t>(p.num_nodes) || p.group_rank < 0 ||
        p.group_rank >= p.num_nodes || counts[p.group_rank] != local_world_size) {
      return false;
    }
    int64_t total = 0;
    int64_t before = 0;
    for (int i = 0; i < p.num_nodes; ++i) {
      if (i == p.group_rank) before = total;
      total += counts[i];
    }
    return total == p.world_size && before == first;
  };
  p.workers_per_node.clear();
  if (!workers_per_node.empty()) {
    absl::StatusOr<std::vector<int>> counts = ExpandTasksPerNode(workers_per_node);
    if (counts.ok() && fits(*counts)) p.workers_per_node = *std::move(counts);
  }
  if (p.workers_per_node.empty() && agent.in_step() && fits(agent.tasks_per_node)) {
    p.workers_per_node = agent.tasks_per_node;
  }
  p.node_names.clear();
  return p;
}

}  // namespace rdzv
