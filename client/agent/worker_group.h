// WorkerGroup: the workers an agent runs in one round. It spawns them through a ProcessLauncher
// (each behind its guard process), forwards their output (WorkerOutput), reaps them, and stops
// them: SIGTERM, then SIGKILL after the term timeout for any still running. A hung worker is
// stopped with SIGABRT instead (Abort), so that it prints its stack first.
//
// It reports through the callbacks given at construction, always posted to the io_context and
// never called from inside one of its own methods, so that the owner may call back into the
// group, or start a new round, from a callback. Not thread-safe: use it from the thread that runs
// the io_context.
#ifndef RDZV_CLIENT_AGENT_WORKER_GROUP_H_
#define RDZV_CLIENT_AGENT_WORKER_GROUP_H_

#include <sys/types.h>

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/agent/core/agent_options.h"
#include "client/agent/core/worker_end.h"
#include "client/agent/output_forwarder.h"
#include "client/agent/process_launcher.h"

namespace rdzv {

// How long a failed worker's end waits for its pipes to close before it is reported anyway.
inline constexpr absl::Duration kOutputGrace = absl::Seconds(1);

class WorkerGroup {
 public:
  struct Callbacks {
    std::function<void(const WorkerEnd&)> on_exit;
    // Every worker of the latest Start has ended and its output has been forwarded.
    std::function<void()> on_all_done;
  };

  // `launcher` must outlive the group.
  WorkerGroup(asio::io_context& io, ProcessLauncher& launcher, OutputOptions output,
              absl::Duration term_timeout, Callbacks callbacks);
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Starts one worker per entry of `workers`, each running `command`, in place of the workers
  // of an earlier round (which must have ended). On an error the workers started before it keep
  // running (Stop them); either way on_all_done follows once the ones that started have ended.
  absl::Status Start(const std::vector<std::string>& command,
                     const std::vector<WorkerLaunch>& workers);

  // Collects the workers that have ended, without blocking (call it on SIGCHLD).
  void Reap();

  // SIGTERM to every running worker, then SIGKILL to those still running after the term
  // timeout. Returns how many were signalled.
  int Stop();

  // SIGKILL to every running worker, now.
  void Kill();

  // SIGABRT to the worker at global `rank` (Python with faulthandler prints every thread's
  // stack), SIGKILL after the term timeout; Stop leaves it to that. Its exit is reported once
  // its output has been read to the end, with the stack, from its first line, as its stderr
  // tail (WorkerOutput::CaptureStack). Any failed worker's exit waits for its output (for
  // at most kOutputGrace), so that its last lines are in its stderr tail.
  void Abort(int32_t rank);

  // The process of each worker of the latest Start, in launch order (its guard: the worker and
  // its children descend from it).
  std::vector<pid_t> pids() const;
  // The worker processes themselves, in the same order (-1 where the launcher does not say).
  std::vector<pid_t> processes() const;

  // Passes `sig` to every running worker; returns how many.
  int Signal(int sig);

 private:
  struct Worker {
    WorkerLaunch launch;
    pid_t pid = -1;
    pid_t process = -1;  // behind the guard `pid`
    std::optional<ProcessExit> exit;
    std::unique_ptr<WorkerOutput> output;
    bool aborting = false;
    // A failed worker's end, until its output closes (its last lines may be in flight) or
    // kOutputGrace passes (a descendant that left its group may hold the pipes open).
    std::optional<WorkerEnd> held_end;
    std::unique_ptr<asio::steady_timer> hold_timer;
  };

  // Reports a held end with the tail as it stands now.
  void ReleaseHeld(Worker& w);

  void CheckDone();
  void ReportEnd(WorkerEnd end);
  void ArmKillTimer();

  asio::io_context& io_;
  ProcessLauncher& launcher_;
  const OutputOptions output_;
  const absl::Duration term_timeout_;
  const Callbacks callbacks_;
  asio::steady_timer kill_timer_;
  bool kill_armed_ = false;
  std::vector<std::unique_ptr<Worker>> workers_;
  bool done_reported_ = true;
};

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_WORKER_GROUP_H_
