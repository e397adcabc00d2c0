// One worker as the agent's pure parts see it: what to start (WorkerLaunch) and how it ended
// (WorkerEnd). The WorkerGroup (client/agent/worker_group.h) turns the one into the other.
#ifndef RDZV_CLIENT_AGENT_CORE_WORKER_END_H_
#define RDZV_CLIENT_AGENT_CORE_WORKER_END_H_

#include <cstdint>
#include <string>
#include <vector>

#include "client/agent/core/process_spec.h"

namespace rdzv {

// One worker to start.
struct WorkerLaunch {
  int32_t rank = 0;
  int32_t local_rank = 0;
  std::vector<std::string> env;  // "NAME=value", the whole environment
  std::string error_file;        // torch's error file for this worker; "" for none
  // Removed by the worker's guard should the agent die first (see ProcessSpec).
  std::vector<std::string> remove_if_orphaned;
  // The round's workers on each node (AssignmentEvent::workers_per_node), for the launch shape.
  std::string workers_per_node;
};

// How one worker ended.
struct WorkerEnd {
  int32_t rank = 0;
  int32_t local_rank = 0;
  ProcessExit exit;
  // For a worker that failed (exit code not 0): the last lines of its stderr, and the message
  // of its torch error file if it wrote one.
  std::string stderr_tail;
  std::string error_message;
};

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_CORE_WORKER_END_H_
