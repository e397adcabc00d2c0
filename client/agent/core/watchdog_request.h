// WatchdogRequest: one line a worker writes to its agent's watchdog FIFO, the file named by
// TORCHELASTIC_TIMER_FILE. Two kinds share the FIFO:
//
//   torch's file timers (torch.distributed.elastic.timer.FileTimerClient), unchanged:
//     {"version": 1, "pid": 4242, "scope_id": "train.py#12", "expiration_time": 1700000000.5,
//      "signal": 9}
//     a negative expiration_time releases the timer of that pid and scope;
//   rdzv's heartbeat, for code that uses no timers:
//     {"version": 1, "pid": 4242, "heartbeat": true}
//   a rank's request of the job, for when it fails (the same as exit codes 83 and 84, with the
//   rank's own words):
//     {"version": 1, "pid": 4242, "exclude_node": "ECC errors on GPU 3"}
//     {"version": 1, "pid": 4242, "no_restart": "the config names no dataset"}
//
// Parsing is pure: a line in, a request or the reason it is malformed out. Lines are one flat
// JSON object (strings, numbers, true, false, null); anything else is malformed.
#ifndef RDZV_CLIENT_AGENT_CORE_WATCHDOG_REQUEST_H_
#define RDZV_CLIENT_AGENT_CORE_WATCHDOG_REQUEST_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/core/rendezvous_types.h"

namespace rdzv {

// Longer lines are malformed. torch's client refuses requests over PIPE_BUF (4096 bytes), the
// size up to which a write to a FIFO is atomic.
inline constexpr size_t kMaxWatchdogLine = 4096;

struct WatchdogRequest {
  enum class Kind { kAcquire, kRelease, kHeartbeat, kRankRequest };
  Kind kind = Kind::kHeartbeat;
  int64_t pid = 0;
  std::string scope;         // the timer's scope_id; empty for a heartbeat
  Micros expiration_us = 0;  // kAcquire: the deadline, wall time since the Unix epoch
  int32_t signal = 0;        // the signal torch's own server would send; recorded, not used
  // kRankRequest: what is asked, and why (printable, at most kMaxRankRequestReasonBytes).
  RankRequest request = RankRequest::kNone;
  std::string reason;
};

// Parses one line (without its newline). InvalidArgument says what is wrong with it.
absl::StatusOr<WatchdogRequest> ParseWatchdogLine(absl::string_view line);

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_CORE_WATCHDOG_REQUEST_H_
