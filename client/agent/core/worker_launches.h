// What the agent starts for one round: from the job's spec, the round's assignment and the
// agent's environment, each worker's launch (its ranks, its whole environment, its torch error
// file and what its guard removes should the agent die first). Pure: no process, file or
// environment is touched, so every launch is unit-tested.
//
// Thread-safe (no state).
#ifndef RDZV_CLIENT_AGENT_CORE_WORKER_LAUNCHES_H_
#define RDZV_CLIENT_AGENT_CORE_WORKER_LAUNCHES_H_

#include <string>
#include <vector>

#include "client/agent/core/worker_end.h"
#include "client/agent/core/worker_env.h"
#include "common/core/rendezvous_types.h"

namespace rdzv {

// The round's context for WorkerVariables: `assignment` in the job `spec` describes. The shell
// fills in the rest (the server's endpoint, the error file directory and the timer file).
WorkerContext RoundContext(const JoinSpec& spec, const AssignmentEvent& assignment);

struct WorkerLaunches {
  std::vector<WorkerLaunch> launches;  // one per worker, in local rank order
  // A line for each of the agent's own variables that a worker's environment replaces or keeps
  // (the same for every worker, so said once).
  std::vector<std::string> notes;
};

// One launch for each of ctx.nproc workers, with rdzv's variables merged over `base` (the
// agent's environment). A worker's guard removes its error file, the timer file and the error
// file directory (each when set) should the agent die before it.
WorkerLaunches BuildWorkerLaunches(const WorkerContext& ctx, const EnvList& base);

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_CORE_WORKER_LAUNCHES_H_
