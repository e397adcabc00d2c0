// A process to start and how a process ended: the plain values that pass between the agent's
// pure parts and its ProcessLauncher (client/agent/process_launcher.h), which does the starting.
#ifndef RDZV_CLIENT_AGENT_CORE_PROCESS_SPEC_H_
#define RDZV_CLIENT_AGENT_CORE_PROCESS_SPEC_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace rdzv {

struct ProcessSpec {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH when it has no '/'
  std::vector<std::string> env;   // "NAME=value"
  // Removed by the guard, in this order, should the agent die before the worker ends (files are
  // unlinked, empty directories removed): what the agent would have cleaned up itself.
  std::vector<std::string> remove_if_orphaned;
  // The job's workers on each node in node order, in Slurm's SLURM_TASKS_PER_NODE syntax, from
  // the round's assignment: what ShapeWorker describes the job's layout with. "" when not known.
  std::string workers_per_node;
  // Descriptors the agent inherited that are not the process's (a launcher's PMI socket): closed
  // in it at exec.
  std::vector<int> close_fds;
  // A variable set to the process's own pid in its environment (SLURM_TASK_PID, which srun sets
  // to each task's pid); "" for none.
  std::string own_pid_variable;
};

struct ProcessExit {
  pid_t pid = -1;
  int exit_status = 0;  // valid when signal == 0
  int signal = 0;       // the signal that killed it, or 0
  // The shell convention: the exit status, or 128 + signal.
  int code() const { return signal != 0 ? 128 + signal : exit_status; }
};

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_CORE_PROCESS_SPEC_H_
