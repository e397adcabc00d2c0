#include "common/core/backoff.h"

#include <algorithm>
#include <cmath>

namespace rdzv {

absl::Duration BackoffDelay(const BackoffPolicy& policy, int attempt, double unit_random) {
  const double growth = std::pow(policy.multiplier, std::max(attempt, 0));
  const absl::Duration full = std::min(policy.max, policy.initial * std::min(growth, 1e9));
  const double jitter = std::clamp(policy.jitter, 0.0, 1.0);
  const double u = std::clamp(unit_random, 0.0, 1.0);
  return full * (1.0 - jitter * u);
}

}  // namespace rdzv
