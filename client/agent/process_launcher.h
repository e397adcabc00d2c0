// ProcessLauncher: every OS call the agent makes about worker processes goes through this
// small interface (spawn, signal, reap), so that tests can inject faults and so that the
// agent's logic reads without system-call noise.
//
// The POSIX implementation starts each worker behind a small guard process: the worker runs in
// a process group of its own, signals to the guard are passed on to that group, and when the
// worker ends or the agent dies (even by SIGKILL) the guard kills what is left of the group, so
// no worker or child of one outlives the job. Spawn returns the guard's pid, whose exit status
// is the worker's; it hands back pipes for the worker's stdout and stderr. The worker inherits
// none of the spec's close_fds (the guard closes its own copies too), and finds its own pid in
// the spec's own_pid_variable.
#ifndef RDZV_CLIENT_AGENT_PROCESS_LAUNCHER_H_
#define RDZV_CLIENT_AGENT_PROCESS_LAUNCHER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/agent/core/process_spec.h"

namespace rdzv {

struct SpawnedProcess {
  pid_t pid = -1;      // also the process group id
  int stdout_fd = -1;  // read ends, owned by the caller
  int stderr_fd = -1;
  // The process itself behind the guard `pid`, and its group: SIGKILL to that group ends it and
  // lets its guard kill what left the group; -1 where no guard stands between.
  pid_t worker = -1;
};

class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;

  // Starts a process. Fails (with the command and the reason) when the program cannot be found
  // or executed; nothing is left running then.
  virtual absl::StatusOr<SpawnedProcess> Spawn(const ProcessSpec& spec) = 0;

  // Sends `sig` to the worker started as `pid` (and its children). A worker that is already
  // gone is not an error.
  virtual absl::Status SignalGroup(pid_t pid, int sig) = 0;

  // Collects every child that has ended, without blocking.
  virtual std::vector<ProcessExit> Reap() = 0;
};

std::unique_ptr<ProcessLauncher> NewPosixProcessLauncher();

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_PROCESS_LAUNCHER_H_
