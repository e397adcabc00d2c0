// RelayMembers (client/agent/core/relay_members.h): what a node's relay decides, with the time
// passed in. Each case is one rule of the header, as the relay's members would see it.
#include "client/agent/core/relay_members.h"

#include <string>
#include <variant>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace rdzv {
namespace {

constexpr Micros kMs = 1000;

RelayMembers::Options Options(int expected) {
  RelayMembers::Options o;
  o.job_id = "job";
  o.expected = expected;
  o.gather = absl::Milliseconds(500);
  o.rejoin_gather = absl::Seconds(5);
  o.resume_gather = absl::Milliseconds(200);
  return o;
}

RelayJoin Join(const std::string& agent, int64_t order = 0, int32_t round = 0) {
  RelayJoin j;
  j.job_id = "job";
  j.agent_id = agent;
  j.order = order;
  j.round = round;
  return j;
}

MemberId MustJoin(RelayMembers& m, Micros now, const RelayJoin& join) {
  absl::StatusOr<MemberId> id = m.Join(now, join);
  EXPECT_TRUE(id.ok()) << id.status();
  return id.value_or(0);
}

// The actions as text, in order: "push 1", "end 2 UNAVAILABLE: ...", "lost a", "cancel group 7",
// "cancel sending up".
std::vector<std::string> Said(const RelayActions& actions) {
  std::vector<std::string> out;
  for (const RelayAction& a : actions) {
    if (const auto* push = std::get_if<relay_action::Push>(&a)) {
      out.push_back("push " + std::to_string(push->member));
    } else if (const auto* end = std::get_if<relay_action::End>(&a)) {
      out.push_back("end " + std::to_string(end->member) + " " + end->status.ToString());
    } else if (const auto* lost = std::get_if<relay_action::ReportLost>(&a)) {
      out.push_back("lost " + lost->agent_id);
    } else if (const auto* cancel = std::get_if<relay_action::CancelGroup>(&a)) {
      out.push_back("cancel group " + std::to_string(cancel->group));
    } else {
      out.push_back("cancel sending up");
    }
  }
  return out;
}

using Lines = std::vector<std::string>;

TEST(RelayMembersTest, JoinsOfAnotherJobOrNodeAreNotFound) {
  RelayMembers::Options o = Options(2);
  o.nodes = std::make_pair(int64_t{4}, int64_t{7});
  RelayMembers m(o);
  RelayJoin other = Join("a");
  other.job_id = "other";
  EXPECT_TRUE(absl::IsNotFound(m.CheckJoin(other)));
  EXPECT_TRUE(absl::StrContains(m.CheckJoin(other).message(), "serves job job, not other"));
  RelayJoin group = Join("a");
  group.group = true;
  EXPECT_TRUE(absl::IsNotFound(m.CheckJoin(group)));
  RelayJoin node = Join("a");
  node.node_index = 8;
  EXPECT_TRUE(absl::StrContains(m.CheckJoin(node).message(), "nodes 4..7 of job job, not node 8"));
  node.node_index = 7;
  EXPECT_TRUE(m.CheckJoin(node).ok());
  EXPECT_TRUE(absl::IsNotFound(m.Leave("other", "a")));
  EXPECT_TRUE(absl::IsInvalidArgument(m.CheckReportExit("other", false)));
  EXPECT_TRUE(absl::IsInvalidArgument(m.CheckReportExit("job", true)));
  EXPECT_TRUE(m.CheckReportExit("job", false).ok());
}

TEST(RelayMembersTest, ABatchGoesUpWhenTheNodeIsThereOrItsFirstJoinHasWaited) {
  RelayMembers m(Options(3));
  EXPECT_EQ(m.due_at(), RelayMembers::kNever);
  MustJoin(m, 0, Join("a"));
  MustJoin(m, 100 * kMs, Join("b"));
  EXPECT_EQ(m.due_at(), 500 * kMs) << "the first join of the batch sets the time";
  EXPECT_FALSE(m.Due(499 * kMs));
  EXPECT_TRUE(m.Due(500 * kMs));
  MustJoin(m, 200 * kMs, Join("c"));
  EXPECT_TRUE(m.Due(200 * kMs)) << "the whole node is there";
}

TEST(RelayMembersTest, ARestartWaitsLongerAndAResumeShorter) {
  RelayMembers m(Options(2));
  const MemberId a = MustJoin(m, 0, Join("a", 0, 0));
  const MemberId b = MustJoin(m, 0, Join("b", 1, 0));
  const std::vector<MemberId> batch = m.TakeBatch(0);
  ASSERT_EQ(batch, (std::vector<MemberId>{a, b}));
  m.WentUp(1, batch);
  // The server was lost: the same round again, all of them at once.
  m.GroupEnded(1, absl::UnavailableError("gone"));
  MustJoin(m, 1000 * kMs, Join("a", 0, 0));
  EXPECT_EQ(m.due_at(), 1200 * kMs);
  m.TakeBatch(1200 * kMs);
  // A restart: the others stop their workers first.
  MustJoin(m, 2000 * kMs, Join("b", 1, 1));
  EXPECT_EQ(m.due_at(), 7000 * kMs);
}

TEST(RelayMembersTest, MembersGoUpInTaskOrderAndAtMostMaxGroupAtOnce) {
  RelayMembers::Options o = Options(4);
  o.max_group = 3;
  RelayMembers m(o);
  const MemberId t3 = MustJoin(m, 0, Join("t3", 3));
  const MemberId t1 = MustJoin(m, 0, Join("t1", 1));
  const MemberId t0 = MustJoin(m, 0, Join("t0", 0));
  const MemberId t2 = MustJoin(m, 0, Join("t2", 2));
  ASSERT_TRUE(m.Due(0));
  // The first three that came, sorted; the last waits and is due at once.
  EXPECT_EQ(m.TakeBatch(10 * kMs), (std::vector<MemberId>{t0, t1, t3}));
  EXPECT_EQ(m.due_at(), 10 * kMs);
  EXPECT_EQ(m.TakeBatch(10 * kMs), (std::vector<MemberId>{t2}));
  EXPECT_EQ(m.due_at(), RelayMembers::kNever);
}

TEST(RelayMembersTest, TheRelayHoldsEachAgentTwiceAndAMarginThenRefuses) {
  RelayMembers m(Options(1));
  for (int i = 0; i < 18; ++i) MustJoin(m, 0, Join("a" + std::to_string(i)));
  absl::StatusOr<MemberId> more = m.Join(0, Join("b"));
  ASSERT_FALSE(more.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(more.status()));
  EXPECT_TRUE(absl::StrContains(more.status().message(), "already holds 18 joins for its 1"));
}

TEST(RelayMembersTest, AnAgentThatJoinsAgainSupersedesItsEarlierJoin) {
  RelayMembers m(Options(2));
  const MemberId first = MustJoin(m, 0, Join("a"));
  const MemberId again = MustJoin(m, 0, Join("a"));
  const MemberId b = MustJoin(m, 0, Join("b", 1));
  const std::vector<MemberId> batch = m.TakeBatch(0);
  EXPECT_EQ(batch, (std::vector<MemberId>{again, b}));
  m.WentUp(1, batch);
  EXPECT_EQ(Said(m.Event(1, "", std::nullopt)), (Lines{"push 2", "push 3"}));
  EXPECT_TRUE(Said(m.Gone(first)).empty()) << "its end is no loss";
}

TEST(RelayMembersTest, ABatchWhoseMembersAreAllGoneIsCancelledOnItsWayUp) {
  RelayMembers m(Options(2));
  const MemberId a = MustJoin(m, 0, Join("a"));
  const MemberId b = MustJoin(m, 0, Join("b", 1));
  const std::vector<MemberId> batch = m.TakeBatch(0);
  m.SendingUp(batch);
  EXPECT_TRUE(Said(m.Gone(a)).empty());
  EXPECT_FALSE(m.AllGone(batch));
  EXPECT_EQ(Said(m.Gone(b)), (Lines{"cancel sending up"}));
  EXPECT_TRUE(m.AllGone(batch));
  m.NotSendingUp();
  EXPECT_TRUE(Said(m.Failed(batch, absl::CancelledError("gone"))).empty());
  EXPECT_TRUE(m.Idle());
}

TEST(RelayMembersTest, AMemberGoneWhileItsBatchWentUpIsReportedLost) {
  RelayMembers m(Options(2));
  const MemberId a = MustJoin(m, 0, Join("a"));
  MustJoin(m, 0, Join("b", 1));
  const std::vector<MemberId> batch = m.TakeBatch(0);
  m.SendingUp(batch);
  m.Gone(a);
  m.NotSendingUp();
  EXPECT_EQ(Said(m.WentUp(1, batch)), (Lines{"lost a"}));
}

TEST(RelayMembersTest, AMemberWhoseTaskEndsWithoutAWordIsLostAndItsGroupRetiredWhenEmpty) {
  RelayMembers m(Options(2));
  const MemberId a = MustJoin(m, 0, Join("a"));
  const MemberId b = MustJoin(m, 0, Join("b", 1));
  m.WentUp(7, m.TakeBatch(0));
  EXPECT_EQ(Said(m.Gone(a)), (Lines{"lost a"}));
  // b leaves: its end is no loss, and the server ends its part; then nobody is left on the
  // stream.
  ASSERT_TRUE(m.Leave("job", "b").ok());
  EXPECT_TRUE(Said(m.Gone(b)).empty());
  EXPECT_EQ(Said(m.Event(7, "b", absl::OkStatus())), (Lines{"cancel group 7"}));
  EXPECT_TRUE(m.Idle());
  EXPECT_EQ(m.groups(), (std::vector<GroupId>{7}));
  EXPECT_TRUE(Said(m.GroupEnded(7, absl::CancelledError("retired"))).empty());
  EXPECT_TRUE(m.groups().empty());
}

TEST(RelayMembersTest, TheServersWordForOneMemberGoesToItAlone) {
  RelayMembers m(Options(2));
  MustJoin(m, 0, Join("a"));
  const MemberId b = MustJoin(m, 0, Join("b", 1));
  m.WentUp(1, m.TakeBatch(0));
  EXPECT_EQ(Said(m.Event(1, "b", std::nullopt)), (Lines{"push 2"}));
  EXPECT_TRUE(Said(m.Event(2, "b", std::nullopt)).empty()) << "another stream's";
  EXPECT_EQ(Said(m.Event(1, "b", absl::FailedPreconditionError("refused"))),
            (Lines{"end 2 FAILED_PRECONDITION: through this node's relay: refused"}));
  EXPECT_EQ(Said(m.Event(1, "", std::nullopt)), (Lines{"push 1"})) << "b has ended";
  EXPECT_EQ(Said(m.Event(1, "a", absl::AbortedError("done"))),
            (Lines{"end 1 ABORTED: through this node's relay: done", "cancel group 1"}));
  EXPECT_EQ(Said(m.Gone(b)), (Lines{"cancel group 1"})) << "no loss: the server ended it";
}

TEST(RelayMembersTest, WhenTheGroupStreamEndsEachMemberHearsItFromTheRelay) {
  struct Case {
    absl::Status ended;
    std::string heard;
  };
  for (const Case& c : std::vector<Case>{
           {absl::CancelledError("x"),
            "UNAVAILABLE: through this node's relay: it lost its stream to the server (x)"},
           {absl::NotFoundError("y"),
            "UNAVAILABLE: through this node's relay: it lost its stream to the server (y)"},
           {absl::UnavailableError("z"), "UNAVAILABLE: through this node's relay: z"},
           {absl::PermissionDeniedError("p"), "PERMISSION_DENIED: through this node's relay: p"},
           {absl::OkStatus(), "OK"},
       }) {
    RelayMembers m(Options(2));
    const MemberId a = MustJoin(m, 0, Join("a"));
    MustJoin(m, 0, Join("b", 1));
    m.WentUp(1, m.TakeBatch(0));
    m.Event(1, "b", absl::AbortedError("ended before"));
    EXPECT_EQ(Said(m.GroupEnded(1, c.ended)), (Lines{"end 1 " + c.heard}));
    EXPECT_TRUE(Said(m.Gone(a)).empty()) << "its end came from the relay";
  }
}

TEST(RelayMembersTest, ABatchThatCannotGoUpEndsItsMembersStreams) {
  RelayMembers m(Options(2));
  MustJoin(m, 0, Join("a"));
  MustJoin(m, 0, Join("b", 1));
  const std::vector<MemberId> batch = m.TakeBatch(0);
  EXPECT_EQ(Said(m.Failed(batch, absl::UnavailableError("no server"))),
            (Lines{"end 1 UNAVAILABLE: no server", "end 2 UNAVAILABLE: no server"}));
  EXPECT_FALSE(m.Idle()) << "their streams are still there";
}

TEST(RelayMembersTest, MembersOfTheRoundAlreadyUpCountTowardTheNode) {
  RelayMembers m(Options(2));
  MustJoin(m, 0, Join("a"));
  m.WentUp(1, m.TakeBatch(600 * kMs));
  MustJoin(m, 700 * kMs, Join("b", 1));
  EXPECT_TRUE(m.Due(700 * kMs)) << "a is up in the same round: the node is there";
  m.TakeBatch(700 * kMs);
  MustJoin(m, 800 * kMs, Join("c", 2, 1));
  EXPECT_FALSE(m.Due(800 * kMs)) << "a later round counts its own members only";
}

}  // namespace
}  // namespace rdzv
