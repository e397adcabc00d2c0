// ServiceMetrics: what the service's calls turn into, read back from the Metrics registry.
#include "server/service_metrics.h"

#include <string>

#include "gtest/gtest.h"
#include "server/metrics.h"

namespace rdzv {
namespace {

JoinSpec Spec(const std::string& job, int restart_count = 0) {
  JoinSpec spec;
  spec.job_id = job;
  spec.restart_count = restart_count;
  return spec;
}

AssignmentEvent Round(int32_t round) {
  AssignmentEvent assignment;
  assignment.round = round;
  return assignment;
}

Decisions Assign(std::initializer_list<StreamId> streams, int32_t round) {
  Decisions d;
  const uint32_t event = d.Keep(Round(round));
  for (StreamId s : streams) d.SendTo(s, event);
  return d;
}

Decisions Abort(std::initializer_list<StreamId> streams, AbortCause cause) {
  Decisions d;
  AbortEvent abort;
  abort.cause = cause;
  const uint32_t event = d.Keep(abort);
  for (StreamId s : streams) d.SendTo(s, event);
  return d;
}

constexpr Micros kSecond = 1'000'000;

TEST(ServiceMetricsTest, ARoundIsCountedOnceWithItsFillingTime) {
  Metrics metrics("test");
  ServiceMetrics m(&metrics);
  m.OnJoin(10 * kSecond, 1, Spec("a"));
  EXPECT_EQ(m.jobs().filling, 1);
  m.OnJoin(12 * kSecond, 2, Spec("a"));
  m.OnDecisions(12 * kSecond, Assign({1, 2}, 1));
  EXPECT_EQ(metrics.joins().value(), 2u);
  EXPECT_EQ(metrics.rounds_completed().value(), 1u);
  const Histogram::Snapshot durations = metrics.rendezvous_duration().Read();
  EXPECT_EQ(durations.count, 1u);
  EXPECT_DOUBLE_EQ(durations.sum, 2.0);
  EXPECT_EQ(m.jobs().running, 1);
  EXPECT_EQ(m.jobs().filling, 0);
  EXPECT_EQ(m.agents_attached(), 2);

  // An agent back in the same round (resume) gets the assignment again: not a new round.
  JoinSpec resume = Spec("a");
  resume.resume = Round(1);
  m.OnJoin(20 * kSecond, 3, resume);
  m.OnDecisions(20 * kSecond, Assign({3}, 1));
  EXPECT_EQ(metrics.rounds_completed().value(), 1u);
}

TEST(ServiceMetricsTest, AbortCountedOncePerRoundByCauseRestartOpensRound) {
  Metrics metrics("test");
  ServiceMetrics m(&metrics);
  m.OnJoin(0, 1, Spec("a"));
  m.OnJoin(0, 2, Spec("a"));
  m.OnDecisions(0, Assign({1, 2}, 1));
  m.OnDecisions(kSecond, Abort({1, 2}, AbortCause::kWorkerFailed));
  EXPECT_EQ(metrics.aborts(AbortCause::kWorkerFailed).value(), 1u);
  EXPECT_EQ(metrics.aborts(AbortCause::kAgentLost).value(), 0u);
  EXPECT_EQ(m.jobs().ended, 1);

  // The agents come back with restart count 1 on new streams.
  m.OnStreamGone(2 * kSecond, 1);
  m.OnStreamGone(2 * kSecond, 2);
  m.OnJoin(3 * kSecond, 3, Spec("a", 1));
  m.OnJoin(3 * kSecond, 4, Spec("a", 1));
  EXPECT_EQ(metrics.restarts().value(), 1u);
  EXPECT_EQ(m.jobs().filling, 1);
  m.OnDecisions(4 * kSecond, Assign({3, 4}, 2));
  EXPECT_EQ(metrics.rounds_completed().value(), 2u);
  m.OnDecisions(5 * kSecond, Abort({3, 4}, AbortCause::kAgentLost));
  EXPECT_EQ(metrics.aborts(AbortCause::kAgentLost).value(), 1u);
}

TEST(ServiceMetricsTest, RefusedJoinsAndClosedStreamsAreCounted) {
  Metrics metrics("test");
  ServiceMetrics m(&metrics);
  m.OnJoin(0, 1, Spec("a"));
  m.OnJoin(0, 2, Spec("a"));
  Decisions refused;
  refused.closes.push_back({2, absl::InvalidArgumentError("bad")});
  m.OnDecisions(0, refused);
  EXPECT_EQ(metrics.refused_calls(Metrics::kRefusedInvalid).value(), 1u);
  EXPECT_EQ(m.agents_attached(), 1);
  m.OnRefused(Metrics::kRefusedUnauthenticated);
  EXPECT_EQ(metrics.refused_calls(Metrics::kRefusedUnauthenticated).value(), 1u);
  // A clean close (Leave) is not a refusal.
  Decisions left;
  left.closes.push_back({1, absl::OkStatus()});
  m.OnDecisions(0, left);
  EXPECT_EQ(metrics.refused_calls(Metrics::kRefusedInvalid).value(), 1u);
  EXPECT_EQ(m.agents_attached(), 0);
}

TEST(ServiceMetricsTest, ARunningJobGoesWithItsLastAgent) {
  Metrics metrics("test");
  ServiceMetrics m(&metrics);
  m.OnJoin(0, 1, Spec("a"));
  m.OnJoin(0, 2, Spec("a"));
  m.OnDecisions(0, Assign({1, 2}, 1));
  m.OnStreamGone(kSecond, 1);
  EXPECT_EQ(m.jobs().running, 1);
  m.OnStreamGone(kSecond, 2);
  EXPECT_EQ(m.jobs().running, 0);
  EXPECT_EQ(m.jobs().ended, 0);
}

TEST(ServiceMetricsTest, AJobWithoutAgentsIsForgottenAfterAWhile) {
  Metrics metrics("test");
  ServiceMetrics m(&metrics);
  m.OnJoin(0, 1, Spec("a"));
  m.OnStreamGone(kSecond, 1);
  EXPECT_EQ(m.jobs().filling, 1);
  // Attached again before the time is up: kept.
  m.OnJoin(kSecond + ServiceMetrics::kForgetAfter / 2, 2, Spec("a"));
  m.OnStreamGone(kSecond + ServiceMetrics::kForgetAfter + 1, 3);  // unknown stream: no effect
  EXPECT_EQ(m.jobs().filling, 1);
  m.OnStreamGone(2 * kSecond + ServiceMetrics::kForgetAfter, 2);
  m.OnStreamGone(3 * kSecond + 2 * ServiceMetrics::kForgetAfter, 99);
  EXPECT_EQ(m.jobs().filling, 0);
}

TEST(ServiceMetricsTest, TheScrapeSourcesReportThroughTheRegistry) {
  Metrics metrics("test");
  {
    ServiceMetrics m(&metrics);
    m.OnJoin(0, 1, Spec("a"));
    const std::string text = metrics.Render();
    EXPECT_NE(text.find("\nrdzv_jobs{state=\"filling\"} 1\n"), std::string::npos) << text;
    EXPECT_NE(text.find("\nrdzv_agents_attached 1\n"), std::string::npos) << text;
  }
  // Gone with the ServiceMetrics: no samples, and no call into a destroyed object.
  EXPECT_EQ(metrics.Render().find("\nrdzv_agents_attached "), std::string::npos);
}

TEST(ServiceMetricsTest, EveryJobTakenUpFromItsResumingAgentsIsCounted) {
  Metrics metrics("test");
  ServiceMetrics m(&metrics);
  Decisions d;
  d.taken_up = {"a", "b"};
  m.OnDecisions(kSecond, d);
  m.OnDecisions(kSecond, Decisions{});
  EXPECT_EQ(metrics.failovers().value(), 2u);
}

}  // namespace
}  // namespace rdzv
