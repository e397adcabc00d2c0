// What Slurm tells a process about its job and step through environment variables.
//
// ParseSlurmEnv reads the variables through an injected EnvLookup rather than getenv, so that it
// is a pure function: tests feed it the environments that sbatch and srun produce, and the
// agent passes ProcessEnv(). Values are checked for syntax and for contradictions between them,
// because a stale SLURM_* variable exported from an outer job or step otherwise surfaces much
// later as a wrong rank.

#ifndef RDZV_COMMON_CORE_SLURM_ENV_H_
#define RDZV_COMMON_CORE_SLURM_ENV_H_

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/core/env.h"

namespace rdzv {

// The job and step as Slurm describes them to one process. Where a step variable exists it wins
// over the job-wide one, since inside srun the step is what the process belongs to. Fields whose
// variables are unset keep the defaults below; a batch script (no step) leaves the step fields
// empty or -1 unless Slurm's batch environment sets them.
struct SlurmEnv {
  std::string job_id;               // SLURM_JOB_ID (or SLURM_JOBID)
  std::string step_id;              // SLURM_STEP_ID (or SLURM_STEPID); empty when not in a step
  int num_nodes = 0;                // SLURM_STEP_NUM_NODES, else SLURM_NNODES, SLURM_JOB_NUM_NODES
  int node_id = -1;                 // SLURM_NODEID: index of this node in `nodes`
  int proc_id = -1;                 // SLURM_PROCID
  int local_id = -1;                // SLURM_LOCALID
  int num_tasks = 0;                // SLURM_STEP_NUM_TASKS, else SLURM_NTASKS, SLURM_NPROCS
  std::vector<int> tasks_per_node;  // SLURM_STEP_TASKS_PER_NODE, else SLURM_TASKS_PER_NODE
  std::vector<std::string> nodes;   // SLURM_STEP_NODELIST, else SLURM_NODELIST, SLURM_JOB_NODELIST
  // The whole allocation, which a step may cover only part of (one srun step per node).
  int job_num_nodes = 0;               // SLURM_JOB_NUM_NODES
  std::vector<std::string> job_nodes;  // SLURM_JOB_NODELIST
  std::string node_name;               // SLURMD_NODENAME
  int gpus_on_node = -1;               // SLURM_GPUS_ON_NODE
  int cpus_per_task = -1;              // SLURM_CPUS_PER_TASK

  // True when this process was launched by srun as a task of a step: SLURM_STEP_ID and
  // SLURM_PROCID are both set. False in a batch script or an salloc shell.
  bool in_step() const { return !step_id.empty() && proc_id >= 0; }
};

// Parses Slurm's variables from `env`; an empty value counts as unset.
//
// Returns std::nullopt when not inside a Slurm job (neither SLURM_JOB_ID nor SLURM_JOBID set).
// Returns InvalidArgumentError, one line naming the variable and its value, when a value is
// malformed (e.g. SLURM_NODEID="1a") or contradicts another (SLURM_NODEID not below the node
// count, a node list or tasks-per-node list of the wrong length, SLURM_LOCALID not below this
// node's task count, SLURM_PROCID not below the task count, SLURM_JOB_NODELIST not naming
// SLURM_JOB_NUM_NODES nodes). Callers prefix the program name.
absl::StatusOr<std::optional<SlurmEnv>> ParseSlurmEnv(const EnvLookup& env);

}  // namespace rdzv

#endif  // RDZV_COMMON_CORE_SLURM_ENV_H_
