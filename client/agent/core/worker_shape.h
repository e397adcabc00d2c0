// What the agent adds to each worker's launch for the launch shapes it stands in for, on top of
// the torchrun environment that WorkerVariables builds:
//  - Slurm task variables (SLURM_PROCID=RANK, SLURM_LOCALID=LOCAL_RANK, ...) so that workers an
//    agent starts look like tasks srun started (see client/agent/core/slurm_worker_env.h);
//  - `--local_rank=N` after the command, for scripts written for torch.distributed.launch
//    without --use_env;
//  - a device view for steps that give each task one GPU: the node's GPUs of the step, ordered
//    so that device LOCAL_RANK is the task's own, as under torchrun;
//  - where the agent starts its workers itself (every mode but Slurm's per-task mode), none of
//    the variables that give the agent its own place in srun --mpi or mpirun (PMI_RANK, PMIX_*,
//    OMPI_COMM_WORLD_*, ...) and none of the descriptors such a launcher left it (PMI_FD): they
//    describe the agent, and a worker that took them for its own would claim the agent's place.
//
// Pure: client/agent/shaping_launcher.h applies ShapeWorker to every worker the agent starts.
#ifndef RDZV_CLIENT_AGENT_CORE_WORKER_SHAPE_H_
#define RDZV_CLIENT_AGENT_CORE_WORKER_SHAPE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/agent/core/process_spec.h"
#include "common/core/env.h"
#include "common/core/slurm_env.h"

namespace rdzv {

struct WorkerShape {
  // The agent's Slurm view when workers get Slurm task variables (inside a Slurm job, in a step
  // or in a batch script or salloc shell, unless --slurm-env keep); unset to leave the agent's
  // SLURM_* as they are.
  std::optional<SlurmEnv> slurm_tasks;
  // The job's node names in node order, when they are known and differ from the step's (one
  // step per node forming one job, or this node alone for --standalone); empty otherwise.
  std::vector<std::string> job_nodes;
  // Drop the launcher's place variables (IsLauncherPlaceVariable) from each worker's environment
  // and close the descriptors they name (kLauncherDescriptorVariables) in it.
  bool hide_launcher_env = false;
  // Append --local_rank=LOCAL_RANK to each worker's command.
  bool pass_local_rank = false;
  // The one device the task sees (the agent's CUDA_VISIBLE_DEVICES when it names exactly one),
  // and the step's devices on this node (SLURM_STEP_GPUS), in Slurm's order; empty when not
  // known or when the task sees no or several devices.
  std::string task_device;
  std::vector<std::string> node_devices;
  // Set when node_devices came from the node's tasks themselves, each naming its GPU as its
  // CUDA_VISIBLE_DEVICES does, so that no other numbering can be mixed in.
  bool node_devices_from_tasks = false;
  // Where Slurm shows each task only its own GPU (SLURM_STEP_GPUS is CUDA_VISIBLE_DEVICES) on a
  // node with several tasks: the step's directory on this node through which the tasks learn
  // each other's GPU, and this task's place there (SLURM_LOCALID). Empty / -1 otherwise.
  std::string gpu_exchange_dir;
  int local_id = -1;
};

struct ShapedWorker {
  ProcessSpec spec;
  std::vector<std::string> notes;  // one line each, for the agent's log
  bool warning = false;            // notes name something the user has to change
};

// The launch of the worker `spec` (whose env holds WorkerVariables' RANK, LOCAL_RANK, ... and
// whose workers_per_node is the round's) shaped by `shape`. With Slurm task variables, the
// worker's SLURM_TASK_PID becomes its own pid (spec.own_pid_variable). Fails with one line when
// the env lacks the torchrun variables or they disagree.
absl::StatusOr<ShapedWorker> ShapeWorker(const WorkerShape& shape, const ProcessSpec& spec);

// The shape for an agent: Slurm task variables when `slurm_tasks` and the agent runs inside a
// Slurm job (`slurm`), --local_rank when `pass_local_rank`, and the task's device from
// CUDA_VISIBLE_DEVICES and the node's from SLURM_STEP_GPUS (else SLURM_JOB_GPUS) in `env`; when
// those name only the task's own GPU and the node runs several tasks, the GPU exchange directory
// (under TMPDIR, else /tmp, named after the job, step and node).
WorkerShape ResolveWorkerShape(bool slurm_tasks, bool pass_local_rank,
                               const std::optional<SlurmEnv>& slurm, const EnvLookup& env);

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_CORE_WORKER_SHAPE_H_
