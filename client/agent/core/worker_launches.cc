#include "client/agent/core/worker_launches.h"

#include <utility>

namespace rdzv {

WorkerContext RoundContext(const JoinSpec& spec, const AssignmentEvent& assignment) {
  WorkerContext ctx;
  ctx.assignment = assignment;
  ctx.nproc = spec.agent.nproc;
  ctx.max_restarts = spec.max_restarts.value_or(0);
  ctx.run_id = spec.job_id;
  return ctx;
}

WorkerLaunches BuildWorkerLaunches(const WorkerContext& ctx, const EnvList& base) {
  WorkerLaunches out;
  const Slot& slot = ctx.assignment.slot;
  for (int32_t i = 0; i < ctx.nproc; ++i) {
    MergedEnv env = MergeWorkerEnv(base, WorkerVariables(ctx, i));
    if (i == 0) out.notes = std::move(env.notes);
    WorkerLaunch launch;
    launch.rank = slot.rank_offset + i;
    launch.local_rank = slot.local_rank_offset + i;
    launch.env = std::move(env.entries);
    launch.error_file = ErrorFilePath(ctx, i);
    launch.workers_per_node = ctx.assignment.workers_per_node;
    // The files first, then the directory that holds them.
    for (const std::string& path : {launch.error_file, ctx.timer_file, ctx.error_file_dir}) {
      if (!path.empty()) launch.remove_if_orphaned.push_back(path);
    }
    out.launches.push_back(std::move(launch));
  }
  return out;
}

}  // namespace rdzv
