#include "server/core/job_claims.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace rdzv {
namespace {

using Verdict = JobClaims::Verdict;

constexpr Micros kMs = 1000;
const std::string kJob = "uid:1000\njob";

TEST(JobClaimsTest, AServerThatServesTheJobSaysSo) {
  JobClaims c(5);
  EXPECT_TRUE(c.Answer(kJob, /*serves=*/true, /*asking=*/false, 9, 0));
  EXPECT_TRUE(c.Answer(kJob, true, false, 1, 0));
  EXPECT_EQ(c.yielded(), 0u);
}

TEST(JobClaimsTest, AServerNotAskingSaysNoAndStaysFreeToTakeTheJob) {
  JobClaims c(5);
  EXPECT_FALSE(c.Answer(kJob, false, /*asking=*/false, 1, 0));
  EXPECT_EQ(c.yielded(), 0u);
  // Its own agents come next: nothing keeps it from the job.
  EXPECT_EQ(c.Decide(kJob, /*held_elsewhere=*/false, 10 * kMs), Verdict::kTakeUp);
}

TEST(JobClaimsTest, TwoAskersTheLowerNumberTakesTheJob) {
  JobClaims low(3);
  JobClaims high(7);
  // Each is asked by the other while asking itself.
  EXPECT_TRUE(low.Answer(kJob, false, true, 7, 0));
  EXPECT_FALSE(high.Answer(kJob, false, true, 3, 0));
  EXPECT_EQ(low.yielded(), 0u);
  EXPECT_EQ(high.yielded(), 1u);
  // What each hears back: the high one that the low one holds it, the low one that nobody does.
  EXPECT_EQ(low.Decide(kJob, false, 5 * kMs), Verdict::kTakeUp);
  EXPECT_EQ(high.Decide(kJob, true, 5 * kMs), Verdict::kServedElsewhere);
}

// The high one's question reached the low one before the low one was asking, so it heard "no";
// only its own concession keeps it from the job the low one takes.
TEST(JobClaimsTest, AYieldedJobIsRefusedUntilTheConcessionEnds) {
  JobClaims high(7);
  EXPECT_FALSE(high.Answer(kJob, false, true, 3, 0));
  EXPECT_EQ(high.Decide(kJob, false, 1 * kMs), Verdict::kYielded);
  EXPECT_EQ(high.Decide(kJob, false, JobClaims::kConcedeFor - 1), Verdict::kYielded);
  EXPECT_EQ(high.Decide(kJob, false, JobClaims::kConcedeFor), Verdict::kTakeUp);
  EXPECT_EQ(high.yielded(), 0u);
}

TEST(JobClaimsTest, AQuestionOfItsOwnIsAnsweredNo) {
  // Its own address in its peer list: the same list on every server.
  JobClaims c(5);
  EXPECT_FALSE(c.Answer(kJob, false, true, 5, 0));
  EXPECT_EQ(c.yielded(), 0u);
  EXPECT_EQ(c.Decide(kJob, false, 1 * kMs), Verdict::kTakeUp);
}

TEST(JobClaimsTest, ConcessionsAreKeptPerJobAndSwept) {
  JobClaims c(7);
  EXPECT_FALSE(c.Answer("uid:1\na", false, true, 3, 0));
  EXPECT_FALSE(c.Answer("uid:2\na", false, true, 3, 1 * kMs));
  EXPECT_EQ(c.Decide("uid:1\nb", false, 2 * kMs), Verdict::kTakeUp) << "another job";
  EXPECT_EQ(c.Decide("uid:2\na", false, 2 * kMs), Verdict::kYielded);
  c.Sweep(JobClaims::kConcedeFor);
  EXPECT_EQ(c.yielded(), 1u);
  c.Sweep(JobClaims::kConcedeFor + 1 * kMs);
  EXPECT_EQ(c.yielded(), 0u);
}

TEST(JobClaimsTest, PastItsBoundAServerSaysItHoldsTheJobRatherThanForget) {
  JobClaims c(7, /*max_conceded=*/2);
  EXPECT_FALSE(c.Answer("uid:1\na", false, true, 3, 0));
  EXPECT_FALSE(c.Answer("uid:1\nb", false, true, 3, 0));
  // Full: the asker is told to refuse its agents (they come back), and nothing is remembered.
  EXPECT_TRUE(c.Answer("uid:1\nc", false, true, 3, 1 * kMs));
  EXPECT_EQ(c.yielded(), 2u);
  // Once the first two expire there is room again.
  EXPECT_FALSE(c.Answer("uid:1\nc", false, true, 3, JobClaims::kConcedeFor));
  EXPECT_EQ(c.yielded(), 1u);
}

// The servers of a list and the agents of one job, with every message delayed at random: agents
// join servers at random, a server not serving the job asks all its peers and decides when every
// answer is in, and a refused agent tries again (at a random server) a little later. Over many
// schedules, with two and three servers, the job is never taken up by two servers, and it is
// always taken up, within a few rounds of retries.
class Simulation {
 public:
  Simulation(int servers, uint64_t seed) : rng_(seed) {
    for (int s = 0; s < servers; ++s) {
      servers_.push_back(Server{JobClaims(rng_())});
    }
  }

  // Runs until `limit`, or until 5 s after a server took the job up (the questions in flight then
  // have long had their answers); when it was first taken up.
  std::optional<Micros> Run(int agents, Micros limit) {
    for (int a = 0; a < agents; ++a) At(Delay(0, 50), [this] { Join(Pick()); });
    while (!events_.empty()) {
      auto next = events_.begin();
      if (next->first > (taken_ ? std::min(limit, *taken_ + 5000 * kMs) : limit)) break;
      now_ = next->first;
      std::function<void()> event = std::move(next->second);
      events_.erase(next);
      event();
    }
    return taken_;
  }

  int takers() const { return takers_; }

 private:
  struct Server {
    JobClaims claims;
    bool serves = false;
    bool asking = false;
    int waiting = 0;  // answers still due
    bool held_elsewhere = false;
  };

  Micros Delay(int lo_ms, int hi_ms) {
    return std::uniform_int_distribution<Micros>(lo_ms * kMs, hi_ms * kMs)(rng_);
  }
  int Pick() { return std::uniform_int_distribution<int>(0, servers_.size() - 1)(rng_); }
  void At(Micros delay, std::function<void()> event) {
    events_.emplace(now_ + delay, std::move(event));
  }

  void Join(int s) {
    Server& server = servers_[s];
    if (server.serves || server.asking) return;  // joined, or held until the answers are in
    server.asking = true;
    server.held_elsewhere = false;
    server.waiting = servers_.size() - 1;
    for (int p = 0; p < static_cast<int>(servers_.size()); ++p) {
      if (p == s) continue;
      At(Delay(0, 20), [this, s, p] {
        Server& peer = servers_[p];
        const bool holds =
            peer.claims.Answer(kJob, peer.serves, peer.asking, servers_[s].claims.instance(), now_);
        At(Delay(0, 20), [this, s, holds] { Answered(s, holds); });
      });
    }
  }

  void Answered(int s, bool holds) {
    Server& server = servers_[s];
    server.held_elsewhere = server.held_elsewhere || holds;
    if (--server.waiting > 0) return;
    server.asking = false;
    if (server.claims.Decide(kJob, server.held_elsewhere, now_) == Verdict::kTakeUp) {
      server.serves = true;
      ++takers_;
      if (!taken_) taken_ = now_;
      return;
    }
    // The held joins are refused; their agents come back, each to a server of its list.
    for (int a = 0; a < 2; ++a) At(Delay(10, 300), [this] { Join(Pick()); });
  }

  std::mt19937_64 rng_;
  std::vector<Server> servers_;
  std::multimap<Micros, std::function<void()>> events_;
  Micros now_ = 0;
  std::optional<Micros> taken_;
  int takers_ = 0;
};

TEST(JobClaimsTest, OverManySchedulesAJobIsTakenUpOnceAndSoon) {
  for (int servers : {2, 3}) {
    for (uint64_t seed = 0; seed < 500; ++seed) {
      Simulation sim(servers, seed);
      const std::optional<Micros> taken = sim.Run(/*agents=*/4, /*limit=*/60'000 * kMs);
      ASSERT_TRUE(taken.has_value()) << servers << " servers, seed " << seed << ": never taken up";
      // The lowest-numbered asker never waits, so the first round of questions settles it, but
      // for one concession's length at most.
      EXPECT_LT(*taken, JobClaims::kConcedeFor + 1000 * kMs)
          << servers << " servers, seed " << seed;
      EXPECT_EQ(sim.takers(), 1) << servers << " servers, seed " << seed;
    }
  }
}

}  // namespace
}  // namespace rdzv
