#include "server/core/service_ledger.h"

#include <gtest/gtest.h>

#include <optional>

namespace rdzv {
namespace {

using Limit = LimitBreach::Limit;

constexpr int kAlice = 1;
constexpr int kBob = 2;
const ServiceLedger::User alice = &kAlice;
const ServiceLedger::User bob = &kBob;

LedgerLimits Limits() {
  LedgerLimits l;
  l.max_jobs_per_user = 2;
  l.max_agents_per_user = 10;
  l.max_memory_per_user_bytes = 1000;
  l.max_memory_bytes = 1500;
  return l;
}

// The limit a join passes, or nullopt.
std::optional<Limit> Breach(const ServiceLedger& ledger, ServiceLedger::User user, bool new_job,
                            int64_t jobs, int64_t agents, int64_t bytes,
                            std::optional<int64_t> user_bytes, int64_t all_bytes) {
  const std::optional<LimitBreach> b =
      ledger.CheckJoin(user, new_job, jobs, agents, bytes, user_bytes, all_bytes);
  if (!b) return std::nullopt;
  return b->limit;
}

TEST(ServiceLedgerTest, AJoinCostsItsAgentsAndItsRequest) {
  EXPECT_EQ(JoinBytes(1, 100), kAgentBaseBytes + 100);
  EXPECT_EQ(JoinBytes(64, 100), kAgentBaseBytes + 63 * kGroupMemberBytes + 100);
}

TEST(ServiceLedgerTest, ANewJobPastTheUsersJobsIsRefusedAndAKnownOneIsNot) {
  ServiceLedger ledger(Limits());
  EXPECT_EQ(Breach(ledger, alice, true, 1, 1, 0, std::nullopt, 0), std::nullopt);
  EXPECT_EQ(Breach(ledger, alice, true, 2, 1, 0, std::nullopt, 0), Limit::kJobs);
  EXPECT_EQ(Breach(ledger, alice, false, 2, 1, 0, std::nullopt, 0), std::nullopt);
  // A job held for the peers' answer counts as one.
  ledger.JobParked(alice);
  const std::optional<LimitBreach> b = ledger.CheckJoin(alice, true, 1, 1, 0, std::nullopt, 0);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->limit, Limit::kJobs);
  EXPECT_EQ(b->held, 2);
  EXPECT_EQ(b->most, 2);
  EXPECT_EQ(Breach(ledger, bob, true, 1, 1, 0, std::nullopt, 0), std::nullopt);
  ledger.JobUnparked(alice);
  EXPECT_EQ(Breach(ledger, alice, true, 1, 1, 0, std::nullopt, 0), std::nullopt);
  ledger.JobParked(alice);
  ledger.ClearParked();
  EXPECT_EQ(Breach(ledger, alice, true, 1, 1, 0, std::nullopt, 0), std::nullopt);
}

TEST(ServiceLedgerTest, AUsersAgentsOnOpenStreamsAreCountedUntilTheyClose) {
  ServiceLedger ledger(Limits());
  ledger.StreamOpened(alice, 8);
  EXPECT_EQ(Breach(ledger, alice, false, 1, 2, 0, std::nullopt, 0), std::nullopt);
  const std::optional<LimitBreach> b = ledger.CheckJoin(alice, false, 1, 3, 0, std::nullopt, 0);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->limit, Limit::kAgents);
  EXPECT_EQ(b->held, 8);
  // Another user's count is its own.
  EXPECT_EQ(Breach(ledger, bob, false, 1, 10, 0, std::nullopt, 0), std::nullopt);
  ledger.StreamClosed(alice, 8);
  EXPECT_EQ(Breach(ledger, alice, false, 1, 10, 0, std::nullopt, 0), std::nullopt);
}

TEST(ServiceLedgerTest, MemoryIsBoundedPerUserAndForAll) {
  ServiceLedger ledger(Limits());
  EXPECT_EQ(Breach(ledger, alice, false, 1, 1, 400, 600, 600), std::nullopt);
  EXPECT_EQ(Breach(ledger, alice, false, 1, 1, 401, 600, 600), Limit::kUserMemory);
  // A user with no stream yet is held to the limit for all only.
  EXPECT_EQ(Breach(ledger, alice, false, 1, 1, 1200, std::nullopt, 0), std::nullopt);
  EXPECT_EQ(Breach(ledger, bob, false, 1, 1, 400, 0, 1200), Limit::kAllMemory);
  // Zero: no limit.
  LedgerLimits none = Limits();
  none.max_memory_per_user_bytes = 0;
  none.max_memory_bytes = 0;
  ServiceLedger unbounded(none);
  EXPECT_EQ(Breach(unbounded, alice, false, 1, 1, 1 << 30, 1 << 30, 1 << 30), std::nullopt);
}

TEST(ServiceLedgerTest, LeftOutAgentsAreChargedAsTheyComeAndGo) {
  ServiceLedger ledger(Limits());
  EXPECT_EQ(ledger.ChargeExcluded(alice, 0), 0);
  EXPECT_EQ(ledger.ChargeExcluded(alice, 3), 3 * kExcludedAgentBytes);
  EXPECT_EQ(ledger.ChargeExcluded(alice, 3), 0);
  EXPECT_EQ(ledger.ChargeExcluded(bob, 1), kExcludedAgentBytes);
  EXPECT_EQ(ledger.ChargeExcluded(alice, 1), -2 * kExcludedAgentBytes);
}

}  // namespace
}  // namespace rdzv
