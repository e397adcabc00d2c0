// The one time base of the rendezvous core's callers: microseconds on the monotonic clock,
// injected as a function so that tests can drive time (see rendezvous_state.h).
#ifndef RDZV_COMMON_CLOCK_H_
#define RDZV_COMMON_CLOCK_H_

#include <functional>

#include "common/core/rendezvous_types.h"

namespace rdzv {

using Clock = std::function<Micros()>;

// std::chrono::steady_clock in microseconds. Thread-safe.
Clock SteadyClock();

}  // namespace rdzv

#endif  // RDZV_COMMON_CLOCK_H_
