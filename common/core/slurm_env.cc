#include "common/core/slurm_env.h"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/core/hostlist.h"

namespace rdzv {
namespace {

// Every contradiction has the same likely cause and the same fix.
constexpr absl::string_view kConsistentExpected =
    "all SLURM_* variables from one job step (unset stale ones exported from an outer job)";

// Integers above this are refused rather than risk overflow; no count or index Slurm sets gets
// near it.
constexpr std::size_t kMaxIntDigits = 9;

// Error messages quote values, but a huge one would drown the line that says what to fix.
constexpr std::size_t kMaxQuoted = 200;

// A variable's value with the name it was found under, so that errors name what the user sees
// in `env`, not the alias we looked for first.
struct Var {
  std::string name;
  std::string value;
};

std::string Quote(absl::string_view value) {
  if (value.size() <= kMaxQuoted) return absl::StrCat("\"", absl::CHexEscape(value), "\"");
  return absl::StrCat("\"", absl::CHexEscape(value.substr(0, kMaxQuoted)), "...\"");
}

// Renders NAME="value" as a user would write it in a shell.
std::string Show(const Var& var) { return absl::StrCat(var.name, "=", Quote(var.value)); }

// Returns the first of `names` that is set to a non-empty value. Empty counts as unset because
// `export SLURM_X=` is how people clear a variable in a shell.
std::optional<Var> Lookup(const EnvLookup& env, std::initializer_list<std::string_view> names) {
  for (std::string_view name : names) {
    std::optional<std::string> value = env(name);
    if (value.has_value() && !value->empty()) return Var{std::string(name), std::move(*value)};
  }
  return std::nullopt;
}

// Parses a variable holding a decimal integer of at least `min` (0 for indices, 1 for counts).
// Unlike absl::SimpleAtoi it refuses signs and surrounding spaces, which Slurm never writes.
absl::StatusOr<int> ParseInt(const Var& var, int min) {
  const absl::string_view expected =
      min == 0 ? "a non-negative integer e.g. 0" : "a positive integer e.g. 2";
  bool digits = !var.value.empty();
  for (char c : var.value) digits = digits && absl::ascii_isdigit(c);
  if (!digits) {
    return absl::InvalidArgumentError(
        absl::StrCat(Show(var), " is malformed (not all digits); expected ", expected));
  }
  if (var.value.size() > kMaxIntDigits) {
    return absl::InvalidArgumentError(
        absl::StrCat(Show(var), " is too large; expected ", expected));
  }
  const int value = std::stoi(var.value);
  if (value < min) {
    return absl::InvalidArgumentError(
        absl::StrCat(Show(var), " is invalid (below ", min, "); expected ", expected));
  }
  return value;
}

// Sets `field` from the first of `names` that is set; leaves it alone when none is.
absl::Status ReadInt(const EnvLookup& env, std::initializer_list<std::string_view> names, int min,
                     int& field, std::optional<Var>& source) {
  source = Lookup(env, names);
  if (!source) return absl::OkStatus();
  absl::StatusOr<int> value = ParseInt(*source, min);
  if (!value.ok()) return value.status();
  field = *value;
  return absl::OkStatus();
}

absl::Status Contradiction(const Var& a, const Var& b, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(Show(a), " contradicts ", Show(b), " (", why,
                                                 "); expected ", kConsistentExpected));
}

// The variables the parsed fields came from, kept for the consistency checks' messages.
struct Sources {
  std::optional<Var> num_nodes;
  std::optional<Var> node_id;
  std::optional<Var> proc_id;
  std::optional<Var> local_id;
  std::optional<Var> num_tasks;
  std::optional<Var> tasks_per_node;
  std::optional<Var> nodes;
  std::optional<Var> job_num_nodes;
  std::optional<Var> job_nodes;
};

absl::Status CheckConsistency(const SlurmEnv& s, const Sources& src) {
  if (src.nodes && src.num_nodes && s.nodes.size() != static_cast<std::size_t>(s.num_nodes)) {
    return Contradiction(*src.nodes, *src.num_nodes,
                         absl::StrCat("the list names ", s.nodes.size(), " nodes"));
  }
  if (src.job_nodes && src.job_num_nodes &&
      s.job_nodes.size() != static_cast<std::size_t>(s.job_num_nodes)) {
    return Contradiction(*src.job_nodes, *src.job_num_nodes,
                         absl::StrCat("the list names ", s.job_nodes.size(), " nodes"));
  }
  if (src.tasks_per_node) {
    // Compared with the node list when there is one, else with the node count.
    const std::optional<Var>& other = src.nodes ? src.nodes : src.num_nodes;
    const std::size_t count =
        src.nodes ? s.nodes.size() : static_cast<std::size_t>(std::max(s.num_nodes, 0));
    if (other && s.tasks_per_node.size() != count) {
      return Contradiction(
          *src.tasks_per_node, *other,
          absl::StrCat(s.tasks_per_node.size(), " task counts for ", count, " nodes"));
    }
  }
  if (src.node_id) {
    // The node count to check against, from the most direct variable that is set.
    std::optional<std::pair<const Var*, std::size_t>> bound;
    if (src.num_nodes) {
      bound.emplace(&*src.num_nodes, static_cast<std::size_t>(s.num_nodes));
    } else if (src.nodes) {
      bound.emplace(&*src.nodes, s.nodes.size());
    } else if (src.tasks_per_node) {
      bound.emplace(&*src.tasks_per_node, s.tasks_per_node.size());
    }
    if (bound && static_cast<std::size_t>(s.node_id) >= bound->second) {
      return Contradiction(*src.node_id, *bound->first,
                           absl::StrCat("node index must be below the node count ", bound->second));
    }
  }
  if (src.local_id && src.node_id && src.tasks_per_node &&
      s.local_id >= s.tasks_per_node[s.node_id]) {
    return Contradiction(
        *src.local_id, *src.tasks_per_node,
        absl::StrCat("node ", s.node_id, " has ", s.tasks_per_node[s.node_id],
                     " task(s), so local ids stop at ", s.tasks_per_node[s.node_id] - 1));
  }
  if (src.proc_id && src.num_tasks && s.proc_id >= s.num_tasks) {
    return Contradiction(*src.proc_id, *src.num_tasks,
                         absl::StrCat("task ids stop at ", s.num_tasks - 1));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::optional<SlurmEnv>> ParseSlurmEnv(const EnvLookup& env) {
  std::optional<Var> job_id = Lookup(env, {"SLURM_JOB_ID", "SLURM_JOBID"});
  if (!job_id) return std::nullopt;
  SlurmEnv s;
  Sources src;
  s.job_id = std::move(job_id->value);
  if (std::optional<Var> step_id = Lookup(env, {"SLURM_STEP_ID", "SLURM_STEPID"})) {
    s.step_id = std::move(step_id->value);
  }
  if (std::optional<Var> node_name = Lookup(env, {"SLURMD_NODENAME"})) {
    s.node_name = std::move(node_name->value);
  }

  // SLURM_NNODES and SLURM_NODELIST come before their SLURM_JOB_* twins because srun rewrites
  // them for the step while the SLURM_JOB_* ones keep describing the whole allocation.
  // Braced lists evaluate left to right, so the first bad variable in this order is reported.
  std::optional<Var> unused;
  for (const absl::Status& status : {
           ReadInt(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"}, 1,
                   s.num_nodes, src.num_nodes),
           ReadInt(env, {"SLURM_JOB_NUM_NODES"}, 1, s.job_num_nodes, src.job_num_nodes),
           ReadInt(env, {"SLURM_NODEID"}, 0, s.node_id, src.node_id),
           ReadInt(env, {"SLURM_PROCID"}, 0, s.proc_id, src.proc_id),
           ReadInt(env, {"SLURM_LOCALID"}, 0, s.local_id, src.local_id),
           ReadInt(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"}, 1, s.num_tasks,
                   src.num_tasks),
           ReadInt(env, {"SLURM_GPUS_ON_NODE"}, 0, s.gpus_on_node, unused),
           ReadInt(env, {"SLURM_CPUS_PER_TASK"}, 1, s.cpus_per_task, unused),
       }) {
    if (!status.ok()) return status;
  }

  src.tasks_per_node = Lookup(env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"});
  if (src.tasks_per_node) {
    absl::StatusOr<std::vector<int>> counts = ExpandTasksPerNode(src.tasks_per_node->value);
    if (!counts.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(src.tasks_per_node->name, "=", counts.status().message()));
    }
    s.tasks_per_node = *std::move(counts);
  }
  src.nodes = Lookup(env, {"SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"});
  if (src.nodes) {
    absl::StatusOr<std::vector<std::string>> nodes = ExpandHostlist(src.nodes->value);
    if (!nodes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(src.nodes->name, "=", nodes.status().message()));
    }
    s.nodes = *std::move(nodes);
  }

  src.job_nodes = Lookup(env, {"SLURM_JOB_NODELIST"});
  if (src.job_nodes) {
    absl::StatusOr<std::vector<std::string>> nodes = ExpandHostlist(src.job_nodes->value);
    if (!nodes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(src.job_nodes->name, "=", nodes.status().message()));
    }
    s.job_nodes = *std::move(nodes);
  }

  if (absl::Status status = CheckConsistency(s, src); !status.ok()) return status;
  return s;
}

}  // namespace rdzv
