#include "common/core/backoff.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace rdzv {
namespace {

BackoffPolicy Policy() {
  BackoffPolicy p;
  p.initial = absl::Milliseconds(100);
  p.max = absl::Seconds(2);
  p.multiplier = 2.0;
  p.jitter = 0.5;
  return p;
}

// Just below 1: unit_random is drawn from [0, 1).
constexpr double kAlmostOne = 0.999999;

struct GrowthCase {
  int attempt;
  absl::Duration full;  // the delay before jitter
};

class BackoffGrowthTest : public testing::TestWithParam<GrowthCase> {};

TEST_P(BackoffGrowthTest, GrowsByTheMultiplierUpToTheCap) {
  const GrowthCase& c = GetParam();
  const BackoffPolicy p = Policy();
  EXPECT_EQ(BackoffDelay(p, c.attempt, 0.0), c.full);
  // With the largest draw the delay is the full one less almost all of the jitter.
  const absl::Duration shortest = BackoffDelay(p, c.attempt, kAlmostOne);
  EXPECT_GE(shortest, c.full * (1 - p.jitter));
  EXPECT_LT(shortest, c.full * (1 - p.jitter) + absl::Microseconds(10));
  const absl::Duration middle = BackoffDelay(p, c.attempt, 0.5);
  EXPECT_EQ(middle, c.full * 0.75);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BackoffGrowthTest,
    testing::Values(GrowthCase{0, absl::Milliseconds(100)}, GrowthCase{1, absl::Milliseconds(200)},
                    GrowthCase{2, absl::Milliseconds(400)}, GrowthCase{3, absl::Milliseconds(800)},
                    GrowthCase{4, absl::Milliseconds(1600)}, GrowthCase{5, absl::Seconds(2)},
                    GrowthCase{6, absl::Seconds(2)}, GrowthCase{60, absl::Seconds(2)},
                    GrowthCase{100000, absl::Seconds(2)}, GrowthCase{-1, absl::Milliseconds(100)}),
    [](const testing::TestParamInfo<GrowthCase>& info) {
      return info.param.attempt < 0 ? std::string("Negative")
                                    : "Attempt" + std::to_string(info.param.attempt);
    });

TEST(BackoffTest, OtherMultiplier) {
  BackoffPolicy p = Policy();
  p.multiplier = 1.5;
  p.max = absl::Seconds(100);
  EXPECT_EQ(BackoffDelay(p, 0, 0.0), absl::Milliseconds(100));
  EXPECT_EQ(BackoffDelay(p, 1, 0.0), absl::Milliseconds(150));
  EXPECT_EQ(BackoffDelay(p, 2, 0.0), absl::Milliseconds(225));
}

TEST(BackoffTest, NoJitterGivesTheFullDelay) {
  BackoffPolicy p = Policy();
  p.jitter = 0.0;
  for (double u : {0.0, 0.3, kAlmostOne}) {
    EXPECT_EQ(BackoffDelay(p, 3, u), absl::Milliseconds(800)) << "unit_random " << u;
  }
}

TEST(BackoffTest, NeverNegativeAndNeverAboveTheCap) {
  std::vector<BackoffPolicy> policies;
  policies.push_back(Policy());
  BackoffPolicy full_jitter = Policy();
  full_jitter.jitter = 1.0;
  policies.push_back(full_jitter);
  BackoffPolicy too_much_jitter = Policy();
  too_much_jitter.jitter = 3.0;
  policies.push_back(too_much_jitter);
  BackoffPolicy negative_jitter = Policy();
  negative_jitter.jitter = -1.0;
  policies.push_back(negative_jitter);

  for (const BackoffPolicy& p : policies) {
    for (int attempt : {-5, 0, 1, 7, 31, 64, 1024, 1 << 30}) {
      for (double u : {-1.0, 0.0, 0.25, kAlmostOne, 1.0, 7.0}) {
        const absl::Duration d = BackoffDelay(p, attempt, u);
        EXPECT_GE(d, absl::ZeroDuration())
            << "jitter " << p.jitter << " attempt " << attempt << " unit_random " << u;
        EXPECT_LE(d, p.max) << "jitter " << p.jitter << " attempt " << attempt << " unit_random "
                            << u;
      }
    }
  }
}

TEST(BackoffTest, JitterRangeIsRespected) {
  const BackoffPolicy p = Policy();
  for (int attempt = 0; attempt < 8; ++attempt) {
    const absl::Duration full = BackoffDelay(p, attempt, 0.0);
    for (int i = 0; i < 100; ++i) {
      const double u = i / 100.0;
      const absl::Duration d = BackoffDelay(p, attempt, u);
      EXPECT_LE(d, full);
      EXPECT_GE(d, full * (1 - p.jitter));
    }
  }
}

}  // namespace
}  // namespace rdzv
