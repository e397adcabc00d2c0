// How long a test waits for what must happen before it calls it a hang: generous, as a round of a
// thousand agents on two loaded cores is slow, but never this slow. Each test takes seconds.
#ifndef RDZV_TESTS_TESTING_LONG_WAIT_H_
#define RDZV_TESTS_TESTING_LONG_WAIT_H_

#include "absl/time/time.h"

namespace rdzv::testing {

inline constexpr absl::Duration kLongWait = absl::Seconds(60);

}  // namespace rdzv::testing

#endif  // RDZV_TESTS_TESTING_LONG_WAIT_H_
