#include "server/core/memory_return.h"

#include <algorithm>
#include <cstdlib>

namespace rdzv {

MemoryReturn::MemoryReturn(int64_t slack, absl::Duration interval)
    : slack_(slack), interval_(interval) {}

bool MemoryReturn::Check(absl::Time now, int64_t held, int64_t rss) {
  const int64_t previous_held = last_held_;
  last_held_ = held;
  peak_held_ = std::max(peak_held_, held);
  if (base_gap_ < 0) base_gap_ = rss - held;
  if (now - last_trim_ < interval_) return false;
  // Agents' memory was given up: jobs (or an attacker's joins) ended.
  if (peak_held_ - held >= slack_ && rss - held - base_gap_ >= slack_) return true;
  // Memory nobody counts (connections, refused calls) grew and the count stands still: no
  // burst of joins is under way.
  const bool still = previous_held >= 0 && std::abs(held - previous_held) < (slack_ >> 4);
  return still && rss - held - base_gap_ >= 2 * slack_;
}

void MemoryReturn::Trimmed(absl::Time now, int64_t held, int64_t rss) {
  last_trim_ = now;
  peak_held_ = held;
  last_held_ = held;
  base_gap_ = rss - held;
}

}  // namespace rdzv
