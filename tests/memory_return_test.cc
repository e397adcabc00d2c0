#include "server/core/memory_return.h"

#include <gtest/gtest.h>

namespace rdzv {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
const absl::Time kStart = absl::FromUnixSeconds(1000);

TEST(MemoryReturnTest, TrimsWhenAgentsMemoryIsGivenUp) {
  MemoryReturn m(32 * kMiB, absl::Seconds(10));
  EXPECT_FALSE(m.Check(kStart, 0, 20 * kMiB));
  // A job of 10,000 agents comes: the count and the process grow together.
  EXPECT_FALSE(m.Check(kStart + absl::Seconds(5), 360 * kMiB, 380 * kMiB));
  EXPECT_FALSE(m.Check(kStart + absl::Seconds(10), 360 * kMiB, 380 * kMiB));
  // It ends; malloc keeps what it freed.
  EXPECT_TRUE(m.Check(kStart + absl::Seconds(15), 0, 380 * kMiB));
  m.Trimmed(kStart + absl::Seconds(15), 0, 25 * kMiB);
  EXPECT_FALSE(m.Check(kStart + absl::Seconds(30), 0, 25 * kMiB));
}

TEST(MemoryReturnTest, NeverDuringABurst) {
  MemoryReturn m(32 * kMiB, absl::Seconds(10));
  int64_t held = 0;
  for (int s = 0; s < 60; s += 5) {
    held += 50 * kMiB;  // joins keep coming; transient buffers on top
    EXPECT_FALSE(m.Check(kStart + absl::Seconds(s), held, held + 120 * kMiB)) << s;
  }
}

TEST(MemoryReturnTest, TrimsUncountedMemoryOnceTheCountStandsStill) {
  MemoryReturn m(32 * kMiB, absl::Seconds(10));
  EXPECT_FALSE(m.Check(kStart, 10 * kMiB, 30 * kMiB));
  // Refused connections left 100 MiB behind; the count did not move.
  EXPECT_TRUE(m.Check(kStart + absl::Seconds(5), 10 * kMiB, 130 * kMiB));
}

TEST(MemoryReturnTest, AtMostOncePerInterval) {
  MemoryReturn m(32 * kMiB, absl::Seconds(10));
  EXPECT_FALSE(m.Check(kStart, 200 * kMiB, 220 * kMiB));
  EXPECT_TRUE(m.Check(kStart + absl::Seconds(1), 0, 220 * kMiB));
  m.Trimmed(kStart + absl::Seconds(1), 0, 200 * kMiB);  // malloc could give little back
  EXPECT_FALSE(m.Check(kStart + absl::Seconds(5), 0, 200 * kMiB));
  EXPECT_FALSE(m.Check(kStart + absl::Seconds(12), 0, 200 * kMiB));
}

}  // namespace
}  // namespace rdzv
