#include "server/core/connection_table.h"

#include <gtest/gtest.h>

#include <set>

namespace rdzv {
namespace {

using Handle = ConnectionTable::Handle;

const absl::Time kStart = absl::FromUnixSeconds(1000);

// The sockets still open, as the shell would find them.
struct OpenSockets {
  std::set<int> fds;
  ConnectionTable::IsOpen check() const {
    return [this](const Handle& h) { return fds.count(h.fd) > 0; };
  }
};

TEST(ConnectionTableTest, RefusesAHostPastItsBoundAndOnlyThatHost) {
  ConnectionTable table(2, absl::ZeroDuration());
  OpenSockets open;
  open.fds = {1, 2, 3};
  EXPECT_TRUE(table.Admit("10.0.0.1", 100, {1, 11}, kStart, open.check()));
  EXPECT_TRUE(table.Admit("10.0.0.1", 101, {2, 12}, kStart, open.check()));
  EXPECT_FALSE(table.Admit("10.0.0.1", 102, {4, 14}, kStart, open.check()));
  EXPECT_TRUE(table.Admit("10.0.0.2", 100, {3, 13}, kStart, open.check()));
  EXPECT_EQ(table.refused(), 1);
  EXPECT_EQ(table.size(), 3u);
}

TEST(ConnectionTableTest, AClosedConnectionFreesItsPlace) {
  ConnectionTable table(2, absl::ZeroDuration());
  OpenSockets open;
  open.fds = {1, 2};
  ASSERT_TRUE(table.Admit("10.0.0.1", 100, {1, 11}, kStart, open.check()));
  ASSERT_TRUE(table.Admit("10.0.0.1", 101, {2, 12}, kStart, open.check()));
  open.fds.erase(1);  // closed by gRPC, unannounced
  open.fds.insert(5);
  EXPECT_TRUE(table.Admit("10.0.0.1", 102, {5, 15}, kStart, open.check()));
  EXPECT_EQ(table.size(), 2u);
}

TEST(ConnectionTableTest, NoBoundWithZero) {
  ConnectionTable table(0, absl::ZeroDuration());
  OpenSockets open;
  for (int i = 0; i < 5000; ++i) {
    ASSERT_TRUE(table.Admit("127.0.0.1", static_cast<uint16_t>(i), {i, 0}, kStart, open.check()));
  }
  EXPECT_EQ(table.refused(), 0);
}

TEST(ConnectionTableTest, AReusedPortReplacesTheClosedConnection) {
  ConnectionTable table(1, absl::ZeroDuration());
  OpenSockets open;
  open.fds = {1, 2};
  ASSERT_TRUE(table.Admit("10.0.0.1", 100, {1, 11}, kStart, open.check()));
  open.fds.erase(1);
  EXPECT_TRUE(table.Admit("10.0.0.1", 100, {2, 12}, kStart, open.check()));
  EXPECT_EQ(table.size(), 1u);
}

TEST(ConnectionTableTest, ConnectionsWithoutAnAcceptedCallAreOverdueInTime) {
  ConnectionTable table(0, absl::Seconds(30));
  OpenSockets open;
  ASSERT_TRUE(table.Admit("10.0.0.1", 100, {1, 11}, kStart, open.check()));
  ASSERT_TRUE(table.Admit("10.0.0.1", 101, {2, 12}, kStart + absl::Seconds(1), open.check()));
  ASSERT_TRUE(table.Admit("10.0.0.2", 100, {3, 13}, kStart + absl::Seconds(2), open.check()));
  table.CallAccepted("10.0.0.1", 101);

  EXPECT_TRUE(table.TakeOverdue(kStart + absl::Seconds(29)).empty());
  std::vector<Handle> overdue = table.TakeOverdue(kStart + absl::Seconds(31));
  ASSERT_EQ(overdue.size(), 1u);
  EXPECT_EQ(overdue[0], (Handle{1, 11}));
  overdue = table.TakeOverdue(kStart + absl::Seconds(40));
  ASSERT_EQ(overdue.size(), 1u);
  EXPECT_EQ(overdue[0], (Handle{3, 13}));
  // Taken once; the one that carried a call stays.
  EXPECT_TRUE(table.TakeOverdue(kStart + absl::Hours(1)).empty());
  EXPECT_EQ(table.size(), 1u);
}

TEST(ConnectionTableTest, NeverOverdueWithZero) {
  ConnectionTable table(0, absl::ZeroDuration());
  OpenSockets open;
  ASSERT_TRUE(table.Admit("10.0.0.1", 100, {1, 11}, kStart, open.check()));
  EXPECT_TRUE(table.TakeOverdue(kStart + absl::Hours(100)).empty());
}

TEST(ConnectionTableTest, AReplacedConnectionIsJudgedByItsOwnTime) {
  ConnectionTable table(0, absl::Seconds(30));
  OpenSockets open;
  ASSERT_TRUE(table.Admit("10.0.0.1", 100, {1, 11}, kStart, open.check()));
  // The port comes back on a new connection 20 s later: the first one's time does not count.
  ASSERT_TRUE(table.Admit("10.0.0.1", 100, {1, 21}, kStart + absl::Seconds(20), open.check()));
  EXPECT_TRUE(table.TakeOverdue(kStart + absl::Seconds(35)).empty());
  std::vector<Handle> overdue = table.TakeOverdue(kStart + absl::Seconds(51));
  ASSERT_EQ(overdue.size(), 1u);
  EXPECT_EQ(overdue[0], (Handle{1, 21}));
}

TEST(ConnectionTableTest, SweepForgetsClosedConnections) {
  ConnectionTable table(0, absl::ZeroDuration());
  OpenSockets open;
  open.fds = {2};
  ASSERT_TRUE(table.Admit("10.0.0.1", 100, {1, 11}, kStart, open.check()));
  ASSERT_TRUE(table.Admit("10.0.0.2", 100, {2, 12}, kStart, open.check()));
  table.Sweep(open.check());
  EXPECT_EQ(table.size(), 1u);
  open.fds.clear();
  table.Sweep(open.check());
  EXPECT_EQ(table.size(), 0u);
}

}  // namespace
}  // namespace rdzv
