// The time bases of the rendezvous core's callers: microseconds on the monotonic clock,
// injected as a function so that tests can drive time (see rendezvous_state.h), and on the wall
// clock, for times that other hosts read.
#ifndef RDZV_COMMON_CLOCK_H_
#define RDZV_COMMON_CLOCK_H_

#include <functional>

#include "common/core/rendezvous_types.h"

namespace rdzv {

using Clock = std::function<Micros()>;

// std::chrono::steady_clock in microseconds. Thread-safe.
Clock SteadyClock();

// The wall clock in microseconds since the Unix epoch: for times compared across hosts (failure
// records, the torch timer's deadlines), never for how long something took. Thread-safe.
Micros WallMicros();

}  // namespace rdzv

#endif  // RDZV_COMMON_CLOCK_H_
