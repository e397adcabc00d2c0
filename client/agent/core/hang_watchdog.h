// HangWatchdog: decides when one of an agent's workers is hung, as a pure state machine. It
// holds no clock, file or thread: the agent's shell (watchdog_fifo.h) feeds it the requests its
// workers write (torch's file timers and rdzv's heartbeats, watchdog_request.h), each already
// traced to the worker it came from, and asks it with the current wall time which worker is
// overdue.
//
// A worker is hung when a timer it holds has passed its expiration time, or when it has sent
// at least one heartbeat and then nothing for longer than the heartbeat timeout. The timeout is
// fixed (--hang-timeout D) or learned (--hang-timeout auto): after a warm-up, a safety factor
// times the longest interval between two heartbeats seen in the job, including earlier rounds
// (the rendezvous keeps the job's longest interval across restarts).
//
// Not thread-safe: the agent calls it from its event loop.
#ifndef RDZV_CLIENT_AGENT_CORE_HANG_WATCHDOG_H_
#define RDZV_CLIENT_AGENT_CORE_HANG_WATCHDOG_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "client/agent/core/watchdog_request.h"
#include "common/core/rendezvous_types.h"

namespace rdzv {

struct HangWatchdogOptions {
  // Heartbeats: a fixed timeout; zero and no auto means heartbeats are only counted.
  absl::Duration heartbeat_timeout = absl::ZeroDuration();
  bool auto_timeout = false;
  // --hang-timeout auto: timeout = max(auto_floor, auto_factor × the longest interval), once
  // auto_warmup intervals have been seen on this node or the job already knew one.
  double auto_factor = 5.0;
  int32_t auto_warmup = 5;
  absl::Duration auto_floor = absl::Seconds(30);
};

// A worker found hung. `worker` is its index among the agent's workers (0..nproc-1).
struct WorkerHang {
  int32_t worker = 0;
  int32_t rank = 0;  // filled in by the shell, which knows the assignment
  int32_t local_rank = 0;
  // When it became overdue: the timer's expiration time, or last heartbeat + timeout (wall
  // time, microseconds since the Unix epoch). The job names the hang that began first.
  Micros since_us = 0;
  // For people: `timer "train.py#12" expired 0.1s ago (pid 4242)` or `no heartbeat for 12.0s
  // (timeout 10s)`.
  std::string detail;
};

class HangWatchdog {
 public:
  explicit HangWatchdog(HangWatchdogOptions options);

  // A new round with `workers` workers starts at `now`; forgets the last round's timers and
  // heartbeats. `job_longest_interval` is the longest heartbeat interval the job has seen so
  // far (0 when none), for auto.
  void Start(int32_t workers, Micros now, Micros job_longest_interval);

  // The timers one worker may hold at once: past it, further timers of that worker are not
  // kept (until it releases some), so that a worker naming ever new timers cannot grow its agent.
  static constexpr size_t kMaxTimersPerWorker = 1024;

  // A request from worker `worker`, received at `now`. A line to log the first time in a round
  // that the worker holds kMaxTimersPerWorker timers and acquires another, which is not kept.
  std::optional<std::string> Apply(int32_t worker, const WatchdogRequest& request, Micros now);

  // Worker `worker` has ended: its timers and heartbeats no longer count.
  void WorkerEnded(int32_t worker);

  // The worker overdue first at `now`, if any. A worker is reported once per round.
  std::optional<WorkerHang> Check(Micros now);

  // The heartbeat timeout in force (zero: none yet).
  absl::Duration heartbeat_timeout() const;
  // The longest interval between two heartbeats of one worker seen in this job.
  Micros longest_interval() const { return longest_interval_; }

 private:
  struct Worker {
    bool ended = false;
    bool reported = false;
    bool told_too_many = false;
    std::optional<Micros> last_beat;
    // Timers by (pid, scope), as torch keys them: expiration time.
    std::map<std::pair<int64_t, std::string>, Micros> timers;
  };

  const HangWatchdogOptions options_;
  std::vector<Worker> workers_;
  Micros longest_interval_ = 0;
  int32_t intervals_seen_ = 0;
  bool job_knew_interval_ = false;
};

// Which worker `pid` belongs to: the index of the entry of `worker_pids` that is `pid` or one of
// its ancestors, following `parent_of` (which returns 0 or less when a pid has no known parent)
// for at most 64 generations. nullopt for a process outside the workers.
std::optional<int32_t> OwningWorker(int64_t pid, const std::vector<pid_t>& worker_pids,
                                    const std::function<int64_t(int64_t)>& parent_of);

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_CORE_HANG_WATCHDOG_H_
