// The launcher that gives every worker its launch shape (client/agent/core/worker_shape.h) before
// another launcher starts it, and that shares this task's GPU with the node's other tasks where
// Slurm shows each task only its own. Used from one thread, like the launcher it wraps.
#ifndef RDZV_CLIENT_AGENT_SHAPING_LAUNCHER_H_
#define RDZV_CLIENT_AGENT_SHAPING_LAUNCHER_H_

#include <memory>

#include "client/agent/core/worker_shape.h"
#include "client/agent/process_launcher.h"

namespace rdzv {

// A launcher that shapes every spawn with ShapeWorker before passing it to `inner`. With a
// gpu_exchange_dir in `shape`, it shares this task's GPU there at once (before the agent joins),
// and at its first spawn takes the node's GPUs from it.
std::unique_ptr<ProcessLauncher> NewShapingLauncher(WorkerShape shape,
                                                    std::unique_ptr<ProcessLauncher> inner);

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_SHAPING_LAUNCHER_H_
