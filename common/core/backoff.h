// Retry pacing as a pure function, kept apart from any sleeping so that it can be tested and
// reused by every caller that retries (joining, reporting, reconnecting).
#ifndef RDZV_COMMON_CORE_BACKOFF_H_
#define RDZV_COMMON_CORE_BACKOFF_H_

#include "absl/time/time.h"

namespace rdzv {

struct BackoffPolicy {
  absl::Duration initial = absl::Milliseconds(50);
  absl::Duration max = absl::Seconds(2);
  double multiplier = 2.0;
  // Each delay is drawn from [d * (1 - jitter), d]: agents that failed together do not retry
  // together.
  double jitter = 0.5;
};

// The delay before retry number `attempt` (0 for the first retry). `unit_random` is a uniform
// draw from [0, 1) supplied by the caller.
absl::Duration BackoffDelay(const BackoffPolicy& policy, int attempt, double unit_random);

}  // namespace rdzv

#endif  // RDZV_COMMON_CORE_BACKOFF_H_
