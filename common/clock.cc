#include "common/clock.h"

#include <chrono>

#include "absl/time/clock.h"

namespace rdzv {

Clock SteadyClock() {
  return [] {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
}

Micros WallMicros() { return absl::ToUnixMicros(absl::Now()); }

}  // namespace rdzv
