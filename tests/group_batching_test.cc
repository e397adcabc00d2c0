#include "server/core/group_batching.h"

#include <gtest/gtest.h>

namespace rdzv {
namespace {

using Action = GroupBatching::Action;
using Kind = GroupBatching::Kind;

TEST(GroupBatchingTest, EventKinds) {
  EXPECT_EQ(GroupBatching::KindOf(ProgressEvent{}), Kind::kProgress);
  EXPECT_EQ(GroupBatching::KindOf(AbortEvent{}), Kind::kAbort);
  EXPECT_EQ(GroupBatching::KindOf(AssignmentEvent{}), Kind::kAssignment);
}

TEST(GroupBatchingTest, AGroupHearsProgressOnceForAllItsMembers) {
  GroupBatching g;
  EXPECT_EQ(g.Decide(10, 3, 0, Kind::kProgress), Action::kToGroup);
  EXPECT_EQ(g.Decide(10, 3, 0, Kind::kProgress), Action::kSkip);
  EXPECT_EQ(g.Decide(10, 3, 0, Kind::kProgress), Action::kSkip);
  // Another group hears it too.
  EXPECT_EQ(g.Decide(20, 1, 0, Kind::kProgress), Action::kToGroup);
}

TEST(GroupBatchingTest, EachMemberGetsItsOwnAssignment) {
  GroupBatching g;
  EXPECT_EQ(g.Decide(10, 2, 0, Kind::kAssignment), Action::kToMember);
  EXPECT_EQ(g.Decide(10, 2, 0, Kind::kAssignment), Action::kToMember);
}

TEST(GroupBatchingTest, AnAbortThatEveryMemberGetsGoesOnce) {
  GroupBatching g;
  for (int k = 0; k < 3; ++k) g.CountAbort(10, 4);
  EXPECT_EQ(g.Decide(10, 3, 4, Kind::kAbort), Action::kToGroup);
  EXPECT_EQ(g.Decide(10, 3, 4, Kind::kAbort), Action::kSkip);
  EXPECT_EQ(g.Decide(10, 3, 4, Kind::kAbort), Action::kSkip);
}

TEST(GroupBatchingTest, AnAbortThatSomeMembersGetGoesToEachOfThem) {
  GroupBatching g;
  // Two of three members: the third still waits and must not hear it.
  g.CountAbort(10, 4);
  g.CountAbort(10, 4);
  EXPECT_EQ(g.Decide(10, 3, 4, Kind::kAbort), Action::kToMember);
  EXPECT_EQ(g.Decide(10, 3, 4, Kind::kAbort), Action::kToMember);
}

TEST(GroupBatchingTest, DifferentAbortsGoToEachMember) {
  GroupBatching g;
  // The members are in two jobs that ended differently.
  g.CountAbort(10, 4);
  g.CountAbort(10, 5);
  EXPECT_EQ(g.Decide(10, 2, 4, Kind::kAbort), Action::kToMember);
  EXPECT_EQ(g.Decide(10, 2, 5, Kind::kAbort), Action::kToMember);
}

}  // namespace
}  // namespace rdzv
