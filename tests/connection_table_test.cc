#include "guard/core/connection_table.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <utility>
#include <vector>

namespace rdzv {
namespace {

using Handle = ConnectionTable::Handle;

// Microseconds, as the table takes the time.
constexpr Micros kStart = Micros{1000} * 1'000'000;
Micros At(absl::Duration since_start) { return kStart + absl::ToInt64Microseconds(since_start); }

// The sockets still open, as the shell would find them.
struct OpenSockets {
  std::set<int> fds;
  ConnectionTable::IsOpen check() const {
    return [this](const Handle& h) { return fds.count(h.fd) > 0; };
  }
};

TEST(ConnectionTableTest, RefusesAHostPastItsBoundOnlyWhenAllItsConnectionsAreProven) {
  ConnectionTable table(2, absl::ZeroDuration());
  OpenSockets open;
  open.fds = {1, 2, 3};
  EXPECT_TRUE(table.Admit("10.0.0.1", 100, {1, 11}, kStart, open.check()).admitted);
  EXPECT_TRUE(table.Admit("10.0.0.1", 101, {2, 12}, kStart, open.check()).admitted);
  table.CallAccepted("10.0.0.1", 100);
  table.CallAccepted("10.0.0.1", 101);
  const ConnectionTable::Admission refused =
      table.Admit("10.0.0.1", 102, {4, 14}, kStart, open.check());
  EXPECT_FALSE(refused.admitted);
  EXPECT_TRUE(refused.dropped.empty());
  EXPECT_TRUE(table.Admit("10.0.0.2", 100, {3, 13}, kStart, open.check()).admitted);
  EXPECT_EQ(table.refused(), 1);
  EXPECT_EQ(table.dropped(), 0);
  EXPECT_EQ(table.size(), 3u);
}

TEST(ConnectionTableTest, AtTheBoundAnUnprovenConnectionMakesRoomNotTheNewcomer) {
  ConnectionTable table(2, absl::ZeroDuration());
  OpenSockets open;
  open.fds = {1, 2, 3};
  ASSERT_TRUE(table.Admit("10.0.0.1", 100, {1, 11}, kStart, open.check()).admitted);
  ASSERT_TRUE(table.Admit("10.0.0.1", 101, {2, 12}, kStart, open.check()).admitted);
  table.CallAccepted("10.0.0.1", 101);  // proven: never dropped
  const ConnectionTable::Admission a =
      table.Admit("10.0.0.1", 102, {3, 13}, At(absl::Seconds(1)), open.check());
  EXPECT_TRUE(a.admitted);
  EXPECT_EQ(a.dropped, std::vector<Handle>{(Handle{1, 11})});
  EXPECT_EQ(table.dropped(), 1);
  EXPECT_EQ(table.refused(), 0);
  EXPECT_FALSE(table.Find("10.0.0.1", 100).has_value());
  EXPECT_TRUE(table.Find("10.0.0.1", 101).has_value());
}

ConnectionTable::Limits Budget(int all, int unproven, absl::Duration grace) {
  ConnectionTable::Limits l;
  l.max_per_host = all;
  l.max_unproven_per_host = unproven;
  l.grace = grace;
  return l;
}

TEST(ConnectionTableTest, UnprovenConnectionsShareASmallerBudget) {
  ConnectionTable table(Budget(10, 2, absl::ZeroDuration()));
  OpenSockets open;
  open.fds = {1, 2, 3, 4, 5};
  ASSERT_TRUE(table.Admit("h", 1, {1, 1}, kStart, open.check()).admitted);
  table.CallAccepted("h", 1);
  ASSERT_TRUE(table.Admit("h", 2, {2, 2}, At(absl::Seconds(1)), open.check()).admitted);
  ASSERT_TRUE(table.Admit("h", 3, {3, 3}, At(absl::Seconds(2)), open.check()).admitted);
  // A third unproven one: the oldest unproven (port 2) goes, the proven one stays.
  const ConnectionTable::Admission a =
      table.Admit("h", 4, {4, 4}, At(absl::Seconds(3)), open.check());
  ASSERT_TRUE(a.admitted);
  EXPECT_EQ(a.dropped, std::vector<Handle>{(Handle{2, 2})});
  EXPECT_EQ(table.size(), 3u);
  // Another host has its own budget.
  EXPECT_TRUE(table.Admit("g", 1, {5, 5}, kStart, open.check()).dropped.empty());
}

TEST(ConnectionTableTest, ANewcomerIsSparedForItsGraceAndAnOlderOneGoesAtRandom) {
  ConnectionTable table(Budget(0, 3, absl::Seconds(2)));
  OpenSockets open;
  for (int fd = 1; fd <= 10; ++fd) open.fds.insert(fd);
  // Two old ones (past their grace) and a young one.
  ASSERT_TRUE(table.Admit("h", 1, {1, 1}, kStart, open.check()).admitted);
  ASSERT_TRUE(table.Admit("h", 2, {2, 2}, kStart, open.check()).admitted);
  ASSERT_TRUE(table.Admit("h", 3, {3, 3}, At(absl::Seconds(9)), open.check()).admitted);
  std::set<int> dropped;
  for (uint64_t r = 0; r < 2; ++r) {
    ConnectionTable copy = table;
    const ConnectionTable::Admission a =
        copy.Admit("h", 4, {4, 4}, At(absl::Seconds(10)), open.check(), r);
    ASSERT_EQ(a.dropped.size(), 1u);
    dropped.insert(a.dropped[0].fd);
  }
  EXPECT_EQ(dropped, (std::set<int>{1, 2})) << "the young one (3) went, or chance played no part";
  // When every unproven one is within its grace (a burst), the oldest goes.
  ConnectionTable burst(Budget(0, 2, absl::Seconds(2)));
  ASSERT_TRUE(burst.Admit("h", 1, {1, 1}, kStart, open.check()).admitted);
  ASSERT_TRUE(burst.Admit("h", 2, {2, 2}, At(absl::Milliseconds(1)), open.check()).admitted);
  EXPECT_EQ(burst.Admit("h", 3, {3, 3}, At(absl::Milliseconds(2)), open.check(), 1).dropped,
            std::vector<Handle>{(Handle{1, 1})});
}

// A host's users at the bounds of rdzvd's defaults (512 connections, 128 unproven, 2 s of grace):
// an attacker without credentials opens 60 connections a second and never sends a valid call,
// for a minute; meanwhile a victim of the same host connects every half second and proves itself
// after a delay of up to 1 s. No victim connection is ever refused or dropped, the host never
// holds more than its bounds, and the victim's proven connections all stay. The old rule (refuse
// the newcomer once the host is full) refused the victim after about 8.5 s.
TEST(ConnectionTableTest, AnAttackerOfTheSameHostNeverKeepsTheVictimOut) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    ConnectionTable table(Budget(512, 128, absl::Seconds(2)));
    const ConnectionTable::IsOpen open = [](const Handle&) { return true; };
    std::set<int> victims;        // fds of the victim's connections
    std::set<int> victim_proven;  // the ports of those proven
    std::vector<std::pair<Micros, int>> to_prove;
    int next_fd = 1;
    uint16_t next_port = 1;
    for (int ms = 0; ms < 60'000; ms += 1) {
      const Micros now = At(absl::Milliseconds(ms));
      for (auto it = to_prove.begin(); it != to_prove.end();) {
        if (it->first > now) {
          ++it;
          continue;
        }
        table.CallAccepted("h", static_cast<uint16_t>(it->second));
        victim_proven.insert(it->second);
        it = to_prove.erase(it);
      }
      const auto admit = [&](bool victim) {
        const int fd = next_fd++;
        const uint16_t port = next_port++;
        const ConnectionTable::Admission a = table.Admit("h", port, {fd, 0}, now, open, rng());
        if (victim) {
          ASSERT_TRUE(a.admitted) << "seed " << seed << " at " << ms << " ms";
          victims.insert(fd);
          to_prove.emplace_back(now + static_cast<Micros>(rng() % 1000) * 1000, port);
        }
        for (const Handle& h : a.dropped) {
          ASSERT_FALSE(victims.contains(h.fd)) << "a victim's connection dropped, seed " << seed;
        }
      };
      if (ms % 17 == 0) admit(false);  // ~60 a second
      if (ms % 500 == 0) admit(true);
      ASSERT_LE(table.size(), 512u);
    }
    EXPECT_EQ(table.refused(), 0) << "seed " << seed;
    EXPECT_GT(table.dropped(), 3000) << "seed " << seed;
    for (int port : victim_proven) {
      EXPECT_TRUE(table.Find("h", static_cast<uint16_t>(port)).has_value()) << "seed " << seed;
    }
  }
}

TEST(ConnectionTableTest, AClosedConnectionFreesItsPlace) {
  ConnectionTable table(2, absl::ZeroDuration());
  OpenSockets open;
  open.fds = {1, 2};
  ASSERT_TRUE(table.Admit("10.0.0.1", 100, {1, 11}, kStart, open.check()).admitted);
  ASSERT_TRUE(table.Admit("10.0.0.1", 101, {2, 12}, kStart, open.check()).admitted);
  open.fds.erase(1);  // closed by gRPC, unannounced
  open.fds.insert(5);
  EXPECT_TRUE(table.Admit("10.0.0.1", 102, {5, 15}, kStart, open.check()).admitted);
  EXPECT_EQ(table.size(), 2u);
}

TEST(ConnectionTableTest, NoBoundWithZero) {
  ConnectionTable table(0, absl::ZeroDuration());
  OpenSockets open;
  for (int i = 0; i < 5000; ++i) {
    ASSERT_TRUE(
        table.Admit("127.0.0.1", static_cast<uint16_t>(i), {i, 0}, kStart, open.check()).admitted);
  }
  EXPECT_EQ(table.refused(), 0);
}

TEST(ConnectionTableTest, AReusedPortReplacesTheClosedConnection) {
  ConnectionTable table(1, absl::ZeroDuration());
  OpenSockets open;
  open.fds = {1, 2};
  ASSERT_TRUE(table.Admit("10.0.0.1", 100, {1, 11}, kStart, open.check()).admitted);
  open.fds.erase(1);
  EXPECT_TRUE(table.Admit("10.0.0.1", 100, {2, 12}, kStart, open.check()).admitted);
  EXPECT_EQ(table.size(), 1u);
}

TEST(ConnectionTableTest, ConnectionsWithoutAnAcceptedCallAreOverdueInTime) {
  ConnectionTable table(0, absl::Seconds(30));
  OpenSockets open;
  ASSERT_TRUE(table.Admit("10.0.0.1", 100, {1, 11}, kStart, open.check()).admitted);
  ASSERT_TRUE(table.Admit("10.0.0.1", 101, {2, 12}, At(absl::Seconds(1)), open.check()).admitted);
  ASSERT_TRUE(table.Admit("10.0.0.2", 100, {3, 13}, At(absl::Seconds(2)), open.check()).admitted);
  table.CallAccepted("10.0.0.1", 101);

  EXPECT_TRUE(table.TakeOverdue(At(absl::Seconds(29))).empty());
  std::vector<Handle> overdue = table.TakeOverdue(At(absl::Seconds(31)));
  ASSERT_EQ(overdue.size(), 1u);
  EXPECT_EQ(overdue[0], (Handle{1, 11}));
  overdue = table.TakeOverdue(At(absl::Seconds(40)));
  ASSERT_EQ(overdue.size(), 1u);
  EXPECT_EQ(overdue[0], (Handle{3, 13}));
  // Taken once; the one that carried a call stays.
  EXPECT_TRUE(table.TakeOverdue(At(absl::Hours(1))).empty());
  EXPECT_EQ(table.size(), 1u);
}

TEST(ConnectionTableTest, NeverOverdueWithZero) {
  ConnectionTable table(0, absl::ZeroDuration());
  OpenSockets open;
  ASSERT_TRUE(table.Admit("10.0.0.1", 100, {1, 11}, kStart, open.check()).admitted);
  EXPECT_TRUE(table.TakeOverdue(At(absl::Hours(100))).empty());
}

TEST(ConnectionTableTest, AReplacedConnectionIsJudgedByItsOwnTime) {
  ConnectionTable table(0, absl::Seconds(30));
  OpenSockets open;
  ASSERT_TRUE(table.Admit("10.0.0.1", 100, {1, 11}, kStart, open.check()).admitted);
  // The port comes back on a new connection 20 s later: the first one's time does not count.
  ASSERT_TRUE(table.Admit("10.0.0.1", 100, {1, 21}, At(absl::Seconds(20)), open.check()).admitted);
  EXPECT_TRUE(table.TakeOverdue(At(absl::Seconds(35))).empty());
  std::vector<Handle> overdue = table.TakeOverdue(At(absl::Seconds(51)));
  ASSERT_EQ(overdue.size(), 1u);
  EXPECT_EQ(overdue[0], (Handle{1, 21}));
}

TEST(ConnectionTableTest, SweepForgetsClosedConnections) {
  ConnectionTable table(0, absl::ZeroDuration());
  OpenSockets open;
  open.fds = {2};
  ASSERT_TRUE(table.Admit("10.0.0.1", 100, {1, 11}, kStart, open.check()).admitted);
  ASSERT_TRUE(table.Admit("10.0.0.2", 100, {2, 12}, kStart, open.check()).admitted);
  table.Sweep(open.check());
  EXPECT_EQ(table.size(), 1u);
  open.fds.clear();
  table.Sweep(open.check());
  EXPECT_EQ(table.size(), 0u);
}

}  // namespace
}  // namespace rdzv
