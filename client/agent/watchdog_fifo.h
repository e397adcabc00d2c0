// WatchdogFifo: the agent's end of the watchdog FIFO (TORCHELASTIC_TIMER_FILE). It creates the
// FIFO, holds it open for reading and writing (so it never reads end-of-file when a writer
// closes, and a worker's non-blocking open always finds a reader), reads requests line by line
// on the agent's io_context without ever blocking it, traces each to the worker it came from,
// and feeds the pure HangWatchdog; every 100 ms of a round it asks the watchdog whether a worker
// is overdue and reports the first one through `on_hang`. What the FIFO holds is read before
// each look, so that an agent that was itself held up (stopped, or starved of CPU) judges its
// workers on what they wrote meanwhile, not on what it had read before.
//
// Requests from processes outside this agent's workers are ignored, as are malformed lines;
// both are counted, and the first of each kind is logged. The FIFO is removed on destruction.
//
// Owns the FIFO's descriptor and its file. Not thread-safe: use it from the thread that runs
// the io_context; `on_hang` runs there too (posted, never from inside a method).
#ifndef RDZV_CLIENT_AGENT_WATCHDOG_FIFO_H_
#define RDZV_CLIENT_AGENT_WATCHDOG_FIFO_H_

#include <sys/types.h>

#include <array>
#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "client/agent/core/hang_watchdog.h"

namespace rdzv {

class WatchdogFifo {
 public:
  using OnHang = std::function<void(const WorkerHang&)>;
  // What a worker of this round asked of the job ("exclude_node", "no_restart"): its global
  // rank, the request and its words.
  struct RankAsk {
    int32_t rank = 0;
    RankRequest request = RankRequest::kNone;
    std::string reason;
  };
  // Told (posted, as on_hang) that requests wait for TakeRequests.
  using OnRankRequest = std::function<void()>;

  // Creates the FIFO at `path` (which must not exist) and starts reading it.
  static absl::StatusOr<std::unique_ptr<WatchdogFifo>> Open(asio::io_context& io, std::string path,
                                                            HangWatchdogOptions options,
                                                            OnHang on_hang);
  ~WatchdogFifo();
  WatchdogFifo(const WatchdogFifo&) = delete;
  WatchdogFifo& operator=(const WatchdogFifo&) = delete;

  // A round's workers have started: `pids[i]` is worker i's process (its guard; the worker and
  // its children descend from it), with global rank first_rank + i and local rank
  // first_local_rank + i. `job_longest_interval`: the job's longest heartbeat interval so far.
  // `processes[i]`, where known (else -1), is worker i itself: a request from it is traced to
  // it even after it has ended (a request written just before it exits is read after).
  void StartRound(std::vector<pid_t> pids, int32_t first_rank, int32_t first_local_rank,
                  Micros job_longest_interval, std::vector<pid_t> processes = {});
  // Who is told of workers' requests; none: they wait for TakeRequests.
  void OnRequest(OnRankRequest on_request) { on_request_ = std::move(on_request); }
  // Reads what the FIFO holds, then hands over the requests not yet taken (at most
  // kMaxPendingRequests; later ones wait for the next call). Called before a worker's end is
  // judged, so that what it wrote just before it exited counts.
  std::vector<RankAsk> TakeRequests();
  // The round's workers are being stopped: no more hangs are reported.
  void StopRound();
  // Worker `worker` has ended.
  void WorkerEnded(int32_t worker);
  // Looks now, outside the 100 ms rhythm, after reading what the FIFO holds: the worker that is
  // overdue first, with its ranks, if any (and none once the round is stopped). A worker found
  // here is not reported through `on_hang`, here or later.
  std::optional<WorkerHang> CheckNow();

  const std::string& path() const { return path_; }
  // The longest heartbeat interval seen in the job (for the next join).
  Micros longest_interval() const { return watchdog_.longest_interval(); }

 private:
  WatchdogFifo(asio::io_context& io, std::string path, int fd, HangWatchdogOptions options,
               OnHang on_hang);
  void WaitReadable();
  // Reads and handles what the FIFO holds, without blocking; false on a read error (errno).
  bool ReadAvailable();
  void Consume(absl::string_view data);
  void HandleLine(absl::string_view line);
  void Poll();

  asio::io_context& io_;
  const std::string path_;
  asio::posix::stream_descriptor stream_;
  std::array<char, 8192> buffer_;
  std::string partial_;
  bool discarding_ = false;  // inside a line longer than kMaxWatchdogLine
  const OnHang on_hang_;
  OnRankRequest on_request_;
  static constexpr size_t kMaxPendingRequests = 64;
  std::vector<RankAsk> requests_;
  HangWatchdog watchdog_;
  asio::steady_timer poll_timer_;
  bool round_live_ = false;
  std::vector<pid_t> pids_;
  std::vector<pid_t> processes_;
  int32_t first_rank_ = 0;
  int32_t first_local_rank_ = 0;
  absl::flat_hash_map<int64_t, int32_t> owner_cache_;  // pid -> worker, this round
  int64_t malformed_ = 0;
  int64_t foreign_ = 0;
};

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_WATCHDOG_FIFO_H_
