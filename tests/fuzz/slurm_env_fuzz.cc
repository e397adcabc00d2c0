// Fuzzes ParseSlurmEnv (common/core/slurm_env.h). The input is an environment, one NAME=value per
// line; only the SLURM_* names the parser reads are kept, so every byte the fuzzer spends goes
// into values the parser looks at. Properties checked:
//   - errors are one-line InvalidArgument messages;
//   - std::nullopt exactly when no job id is set;
//   - a successful parse is consistent: no negative counts, SLURM_NODEID below the node count
//     and the node list's length, SLURM_PROCID below the task count, the node list as long as
//     the node count, one task count (at least 1) per node, SLURM_LOCALID below this node's
//     task count.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/core/env.h"
#include "common/core/hostlist.h"
#include "common/core/slurm_env.h"
#include "tests/fuzz/fuzz_check.h"

namespace rdzv {
namespace {

// Every variable ParseSlurmEnv reads.
constexpr std::string_view kNames[] = {
    "SLURM_JOB_ID",
    "SLURM_JOBID",
    "SLURM_STEP_ID",
    "SLURM_STEPID",
    "SLURMD_NODENAME",
    "SLURM_STEP_NUM_NODES",
    "SLURM_NNODES",
    "SLURM_JOB_NUM_NODES",
    "SLURM_NODEID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_GPUS_ON_NODE",
    "SLURM_CPUS_PER_TASK",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_STEP_NODELIST",
    "SLURM_NODELIST",
    "SLURM_JOB_NODELIST",
};

bool IsSlurmName(absl::string_view name) {
  for (std::string_view known : kNames) {
    if (name == absl::string_view(known.data(), known.size())) return true;
  }
  return false;
}

void CheckConsistent(const SlurmEnv& s, std::string_view input) {
  FuzzCheck(!s.job_id.empty(), "a parse without a job id", input);
  FuzzCheck(s.num_nodes >= 0, "negative node count", input);
  FuzzCheck(s.num_tasks >= 0, "negative task count", input);
  FuzzCheck(s.node_id >= -1 && s.proc_id >= -1 && s.local_id >= -1, "negative index", input);
  FuzzCheck(s.gpus_on_node >= -1, "negative GPU count", input);
  FuzzCheck(s.cpus_per_task == -1 || s.cpus_per_task >= 1, "CPU count below 1", input);
  FuzzCheck(s.nodes.size() <= kMaxHostlistExpansion, "node list over the limit", input);
  FuzzCheck(s.tasks_per_node.size() <= kMaxHostlistExpansion, "task list over the limit", input);
  if (s.node_id >= 0 && s.num_nodes > 0) {
    FuzzCheck(s.node_id < s.num_nodes, "node id not below the node count", input);
  }
  if (s.proc_id >= 0 && s.num_tasks > 0) {
    FuzzCheck(s.proc_id < s.num_tasks, "proc id not below the task count", input);
  }
  if (!s.nodes.empty()) {
    if (s.num_nodes > 0) {
      FuzzCheck(s.nodes.size() == static_cast<std::size_t>(s.num_nodes),
                "node list length differs from the node count", input);
    }
    if (s.node_id >= 0) {
      FuzzCheck(static_cast<std::size_t>(s.node_id) < s.nodes.size(),
                "node id not below the node list's length", input);
    }
  }
  if (!s.tasks_per_node.empty()) {
    for (int count : s.tasks_per_node) FuzzCheck(count >= 1, "a task count below 1", input);
    if (!s.nodes.empty()) {
      FuzzCheck(s.tasks_per_node.size() == s.nodes.size(),
                "tasks per node differ in length from the node list", input);
    } else if (s.num_nodes > 0) {
      FuzzCheck(s.tasks_per_node.size() == static_cast<std::size_t>(s.num_nodes),
                "tasks per node differ in length from the node count", input);
    }
    if (s.node_id >= 0) {
      FuzzCheck(static_cast<std::size_t>(s.node_id) < s.tasks_per_node.size(),
                "node id not below the tasks-per-node length", input);
      if (s.local_id >= 0) {
        FuzzCheck(s.local_id < s.tasks_per_node[static_cast<std::size_t>(s.node_id)],
                  "local id not below this node's task count", input);
      }
    }
  }
}

void FuzzSlurmEnv(std::string_view input) {
  EnvList vars;
  bool has_job_id = false;
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(input.data(), input.size()), '\n')) {
    const std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits('=', 1));
    if (!IsSlurmName(kv.first)) continue;
    vars.emplace_back(std::string(kv.first), std::string(kv.second));
  }
  // The lookup answers with the last assignment, so that decides whether a job id is set.
  const EnvLookup env = EnvFromList(vars);
  for (std::string_view name : {"SLURM_JOB_ID", "SLURM_JOBID"}) {
    const std::optional<std::string> v = env(name);
    has_job_id = has_job_id || (v && !v->empty());
  }
  absl::StatusOr<std::optional<SlurmEnv>> parsed = ParseSlurmEnv(env);
  if (!parsed.ok()) {
    CheckUserError(parsed.status());
    return;
  }
  FuzzCheck(parsed->has_value() == has_job_id, "job id presence and result disagree", input);
  if (parsed->has_value()) CheckConsistent(**parsed, input);
}

}  // namespace
}  // namespace rdzv

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rdzv::FuzzSlurmEnv(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
