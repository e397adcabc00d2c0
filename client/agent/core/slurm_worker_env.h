// The SLURM_* variables that describe the task layout, rewritten for workers that an agent starts
// itself, so that each worker sees what it would have seen had srun started it as a task.
//
// In per-node mode srun starts one agent per node and the agent starts the workers. Without this
// every worker of a node inherits the agent's SLURM_PROCID, SLURM_LOCALID and SLURM_NTASKS, and
// code that takes its rank from Slurm (submitit, Lightning's SLURMEnvironment, scripts reading
// SLURM_PROCID) sees duplicate ranks. SlurmWorkerVariables returns the layout variables of one
// worker; job-wide ones (SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_CPUS_ON_NODE, ...) are the
// agent's and stay as they are.
//
// What srun sets, seen on the local cluster (Slurm 22.05.8, deploy/slurm/local-cluster.sh) for
// `srun -N3 -n7`, task 4:
//   SLURM_PROCID=4 SLURM_LOCALID=1 SLURM_NODEID=1 SLURM_GTIDS=3,4
//   SLURM_NTASKS=7 SLURM_NPROCS=7 SLURM_STEP_NUM_TASKS=7
//   SLURM_TASKS_PER_NODE=3,2(x2) SLURM_STEP_TASKS_PER_NODE=3,2(x2)
//   SLURM_NNODES=3 SLURM_STEP_NUM_NODES=3 SLURM_NODELIST=n[1-3] SLURM_STEP_NODELIST=n[1-3]
// SLURM_NTASKS_PER_NODE is set only when every node runs the same number of tasks and srun was
// asked for that number (`srun -N2 --ntasks-per-node=2` sets 2; `srun -N2 -n3` sets none, and so
// does `srun -N2 -n4`). SLURM_TASK_PID (the pid of the process srun started, which for workers is
// the agent) and SLURMD_NODENAME/SLURM_TOPOLOGY_ADDR (the node, the same for every worker of an
// agent) are the other per-task variables; they are left alone.
//
// Pure: no I/O, no environment access; thread-safe.

#ifndef RDZV_CLIENT_AGENT_CORE_SLURM_WORKER_ENV_H_
#define RDZV_CLIENT_AGENT_CORE_SLURM_WORKER_ENV_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "client/agent/core/worker_env.h"
#include "common/core/slurm_env.h"

namespace rdzv {

// Where one worker sits in the job, in the rendezvous' terms (torchrun's variable names).
struct SlurmWorkerPlace {
  int32_t rank = 0;        // RANK
  int32_t local_rank = 0;  // LOCAL_RANK
  int32_t group_rank = 0;  // GROUP_RANK: the node's index, 0..num_nodes-1
  int32_t world_size = 1;  // WORLD_SIZE
  int32_t num_nodes = 1;   // GROUP_WORLD_SIZE
  // Workers on each node in node order (index = GROUP_RANK); the ranks of a node follow those
  // of the nodes before it. Empty when not known: the per-node counts are then left unset.
  std::vector<int> workers_per_node = {1};
  // Slurm's names of the nodes in node order, or empty when not known. Needed only when the
  // nodes of the job are not those of the agent's step (a job that went on without a lost node).
  std::vector<std::string> node_names;
};

// Every variable SlurmWorkerVariables decides. The caller removes these from the agent's
// environment before merging the result over it: a variable that srun would not set for this
// layout (SLURM_NTASKS_PER_NODE on uneven nodes) must not reach the worker with the agent's
// value either.
inline constexpr std::array<std::string_view, 14> kSlurmTaskLayoutVariables = {
    "SLURM_PROCID",         "SLURM_LOCALID",
    "SLURM_NODEID",         "SLURM_GTIDS",
    "SLURM_NTASKS",         "SLURM_NPROCS",
    "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_NNODES",         "SLURM_STEP_NUM_NODES",
    "SLURM_NODELIST",       "SLURM_STEP_NODELIST",
};

// The layout variables (a subset of kSlurmTaskLayoutVariables) of the worker at `place`, as srun
// would set them had it started every worker as a task of one step on `agent`'s nodes:
// SLURM_PROCID=RANK, SLURM_LOCALID=LOCAL_RANK, SLURM_NODEID=GROUP_RANK, SLURM_GTIDS (the ranks on
// this node), SLURM_NTASKS=SLURM_NPROCS=SLURM_STEP_NUM_TASKS=WORLD_SIZE, SLURM_TASKS_PER_NODE and
// SLURM_STEP_TASKS_PER_NODE in Slurm's compressed syntax, SLURM_NTASKS_PER_NODE only when every
// node runs the same number of workers, and the node count and list.
//
// The node list is place.node_names when given, else the agent's step node list when the job
// has as many nodes as the step; either is set only when it names the agent's own node
// (agent.node_name, SLURMD_NODENAME) at the worker's node index, so no list is set when the job
// lost a node (the agent's would name a node that is gone), when the nodes are ordered otherwise
// (--node-rank, mpirun), or when the agent's node is not known. Feeding the result to
// ParseSlurmEnv gives proc_id/local_id/node_id equal to the worker's ranks.
//
// When place.workers_per_node is empty, SLURM_GTIDS and the per-node counts are left unset.
//
// Returns InvalidArgumentError when `place` is inconsistent: counts below 1, workers_per_node not
// num_nodes long or not summing to world_size, a rank outside its node's range, or node_names
// of the wrong length.
absl::StatusOr<EnvList> SlurmWorkerVariables(const SlurmWorkerPlace& place, const SlurmEnv& agent);

// The place of the worker whose torchrun variables are `vars` (RANK, LOCAL_RANK, GROUP_RANK,
// WORLD_SIZE, GROUP_WORLD_SIZE, LOCAL_WORLD_SIZE, as WorkerVariables sets them). The counts of
// the job's nodes come from `workers_per_node`, the round's assignment in Slurm's syntax
// ("2(x3),1"), when it agrees with the ranks; else, inside a step, from the step
// (agent.tasks_per_node) when it agrees with them (per-task mode under a server that does not
// send the counts); otherwise workers_per_node is left empty rather than guessed. Returns
// InvalidArgumentError when a variable is missing or not a number.
absl::StatusOr<SlurmWorkerPlace> PlaceFromWorkerVariables(const EnvList& vars,
                                                          const SlurmEnv& agent,
                                                          std::string_view workers_per_node);

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_CORE_SLURM_WORKER_ENV_H_
