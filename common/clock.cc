#include "common/clock.h"

#include <chrono>

namespace rdzv {

Clock SteadyClock() {
  return [] {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
}

}  // namespace rdzv
