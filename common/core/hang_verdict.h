// Which hang a job's abort names. When one rank hangs, the others soon block in a collective
// and their own watchdogs fire too; and once the hung rank is stopped, its peers' collectives
// fail. Whichever agent reports first, the root cause must name the rank that hung first: the
// one whose deadline passed first (or whose heartbeat is oldest), compared across the job by
// the server. Pure: the rendezvous state calls it for every report on a job that has ended.
//
// Thread-compatible (a free function).
#ifndef RDZV_COMMON_CORE_HANG_VERDICT_H_
#define RDZV_COMMON_CORE_HANG_VERDICT_H_

#include <optional>

#include "common/core/rendezvous_types.h"

namespace rdzv {

// How long after a job ended a hang that began earlier than the failure it ended with still
// takes over the root cause.
inline constexpr Micros kHangVerdictWindow = 5'000'000;

// The abort a job that ended with `current`, `since_end` ago, should carry now that `report`
// arrived; nullopt to keep `current`. A hang report takes over when it began before the
// failure the job ended with (a worker's failure or another hang; time_us compares them) and
// arrived within kHangVerdictWindow. A second report of the same hang, carrying the hung
// worker's last stderr lines (its stack), completes the abort at any time.
std::optional<AbortEvent> RefineAbortWithHang(const AbortEvent& current, Micros since_end,
                                              const FailureInfo& report);

}  // namespace rdzv

#endif  // RDZV_COMMON_CORE_HANG_VERDICT_H_
