// Group joins (JoinRequest.members) against rdzvd's service in this process over loopback: a
// relay joins its node's tasks through one stream, each task is an agent of its own (ranks,
// refusals, losses), its events come tagged with its agent id, and the stream's end, or a
// member_lost report, loses the members as their own streams' ends would have.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "guard/request_limits.h"
#include "rdzv/v1/rdzv.grpc.pb.h"
#include "server/server.h"
#include "tests/testing/wire.h"

namespace rdzv {
namespace {

using testing::Joined;
using testing::JoinOf;
using v1::JoinEvent;

constexpr int kTasksPerNode = 4;

// The join that task `order` of a per-task job of `tasks` tasks would make itself: one worker, its
// node (and host "n<node>") from kTasksPerNode tasks per node.
v1::JoinRequest TaskJoin(const std::string& job, int order, int tasks) {
  const int node = order / kTasksPerNode;
  v1::JoinRequest r = JoinOf(job, absl::StrCat("t", order), tasks, node);
  r.set_host(absl::StrCat("n", node));
  r.set_order(order);
  return r;
}

// A relay's join of the tasks first .. first + count - 1.
v1::JoinRequest GroupJoin(const std::string& job, int first, int count, int tasks) {
  v1::JoinRequest r;
  r.set_job_id(job);
  for (int i = first; i < first + count; ++i) *r.add_members() = TaskJoin(job, i, tasks);
  return r;
}

// The deadline of every call and stream here: a test that fails does not hang.
std::chrono::system_clock::time_point Soon(int seconds = 20) {
  return std::chrono::system_clock::now() + std::chrono::seconds(seconds);
}

// A group stream read one event at a time, batches taken apart, as a relay reads it: an abort
// for every member still on the stream comes once, untagged, and is each member's.
struct GroupStream {
  Joined joined;
  std::deque<JoinEvent> pending;
  int messages = 0;                 // messages read so far
  int shared_aborts = 0;            // untagged aborts read so far
  std::set<std::string> on_stream;  // the members still on it

  // Member `agent` is off the stream without a member_end (its loss was reported).
  void Forget(const std::string& agent) { on_stream.erase(agent); }

  // The next event; false once the stream has ended. `message` is the message it came in.
  bool Next(JoinEvent* event, int* message = nullptr) {
    while (pending.empty()) {
      JoinEvent m;
      if (!joined.reader->Read(&m)) return false;
      ++messages;
      if (!m.has_batch()) {
        Take(std::move(m));
        continue;
      }
      EXPECT_TRUE(m.agent_id().empty()) << m.ShortDebugString();
      for (const JoinEvent& e : m.batch().events()) Take(e);
    }
    *event = std::move(pending.front());
    pending.pop_front();
    if (message != nullptr) *message = messages;
    // Progress is for every waiting member at once; everything else names its member.
    EXPECT_FALSE(event->has_batch()) << event->ShortDebugString();
    EXPECT_EQ(event->has_progress(), event->agent_id().empty()) << event->ShortDebugString();
    return true;
  }

  void Take(JoinEvent e) {
    if (e.has_member_end()) on_stream.erase(e.agent_id());
    if (!e.has_abort() || !e.agent_id().empty()) {
      pending.push_back(std::move(e));
      return;
    }
    ++shared_aborts;
    for (const std::string& agent : on_stream) {
      pending.push_back(e);
      pending.back().set_agent_id(agent);
    }
  }

  // Reads until `n` members have had an event of `kind`: the last of each, by agent id (fewer
  // when the stream ends first). `messages_seen` receives how many messages they came in.
  std::map<std::string, JoinEvent> Each(JoinEvent::EventCase kind, size_t n,
                                        size_t* messages_seen = nullptr) {
    std::map<std::string, JoinEvent> got;
    std::set<int> in;
    JoinEvent e;
    int message;
    while (got.size() < n && Next(&e, &message)) {
      if (e.event_case() != kind) continue;
      in.insert(message);
      got[e.agent_id()] = e;
    }
    if (messages_seen != nullptr) *messages_seen = in.size();
    return got;
  }

  // How the stream ends, after any events.
  grpc::Status End() {
    JoinEvent e;
    while (Next(&e)) {
    }
    return joined.reader->Finish();
  }
};

class GroupJoinTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = testing::StartLoopbackServer(testing::LoopbackServerOptions());
    ASSERT_NE(server_, nullptr);
    wire_.emplace(server_->port());
  }

  // Opens a group stream, on a connection of its own, that ends at `deadline` at the latest.
  GroupStream Open(const v1::JoinRequest& request,
                   std::chrono::system_clock::time_point deadline = Soon()) {
    GroupStream g;
    g.joined.stub = wire_->Stub();
    g.joined.context->set_deadline(deadline);
    g.joined.reader = g.joined.stub->Join(g.joined.context.get(), request);
    for (const v1::JoinRequest& m : request.members()) g.on_stream.insert(m.agent_id());
    return g;
  }

  // Waits until the server holds `n` join streams; false if it never does.
  bool StreamsBecome(size_t n) {
    for (int i = 0; i < 500 && server_->open_streams() != n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return server_->open_streams() == n;
  }

  grpc::Status MemberLost(const std::string& job, const std::string& agent) {
    v1::ReportExitRequest request;
    request.set_job_id(job);
    request.set_agent_id(agent);
    request.set_member_lost(true);
    v1::ReportExitResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(Soon());
    return wire_->Stub()->ReportExit(&ctx, request, &response);
  }

  grpc::Status Leave(const std::string& job, const std::string& agent) {
    v1::LeaveRequest request;
    request.set_job_id(job);
    request.set_agent_id(agent);
    v1::LeaveResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(Soon());
    return wire_->Stub()->Leave(&ctx, request, &response);
  }

  // `got` holds the assignments of tasks first .. first + count - 1 of `tasks`, as the per-task
  // layout gives them: rank = order, local ranks 0..3 on each node.
  static void ExpectTaskRanks(const std::map<std::string, JoinEvent>& got, int first, int count,
                              int tasks) {
    ASSERT_EQ(got.size(), static_cast<size_t>(count));
    for (int order = first; order < first + count; ++order) {
      const auto it = got.find(absl::StrCat("t", order));
      ASSERT_NE(it, got.end()) << "no assignment for t" << order;
      const v1::Assignment& a = it->second.assignment();
      EXPECT_EQ(a.rank_offset(), order);
      EXPECT_EQ(a.world_size(), tasks);
      EXPECT_EQ(a.group_rank(), order / kTasksPerNode);
      EXPECT_EQ(a.local_rank_offset(), order % kTasksPerNode);
      EXPECT_EQ(a.local_world_size(), kTasksPerNode);
    }
  }

  static void Close(GroupStream& g) {
    g.joined.context->TryCancel();
    g.End();
  }

  std::unique_ptr<Server> server_;
  std::optional<testing::WireClient> wire_;
};

TEST_F(GroupJoinTest, TwoNodesOfFourTasksGetPerTaskRanksOnTwoStreams) {
  GroupStream a = Open(GroupJoin("j", 0, 4, 8));
  // A member may leave the job id to its group.
  v1::JoinRequest second = GroupJoin("j", 4, 4, 8);
  for (v1::JoinRequest& m : *second.mutable_members()) m.clear_job_id();
  GroupStream b = Open(second);
  size_t messages = 0;
  ExpectTaskRanks(a.Each(JoinEvent::kAssignment, 4, &messages), 0, 4, 8);
  EXPECT_EQ(messages, 1u) << "a group's assignments come as one batch";
  ExpectTaskRanks(b.Each(JoinEvent::kAssignment, 4), 4, 4, 8);
  EXPECT_EQ(server_->open_streams(), 2u);
  Close(a);
  Close(b);
  EXPECT_TRUE(StreamsBecome(0));
}

TEST_F(GroupJoinTest, GroupAndSingleAgentJoinsMeetInOneJob) {
  GroupStream group = Open(GroupJoin("j", 0, 4, 8));
  std::vector<Joined> single;
  for (int order = 4; order < 8; ++order) single.push_back(wire_->Join(TaskJoin("j", order, 8)));
  ExpectTaskRanks(group.Each(JoinEvent::kAssignment, 4), 0, 4, 8);
  std::map<std::string, JoinEvent> got;
  for (int i = 0; i < 4; ++i) {
    JoinEvent e;
    ASSERT_TRUE(testing::ReadUntil(single[i], JoinEvent::kAssignment, &e));
    EXPECT_TRUE(e.agent_id().empty()) << "an agent's own stream carries no agent id";
    got[absl::StrCat("t", 4 + i)] = e;
  }
  ExpectTaskRanks(got, 4, 4, 8);
  EXPECT_EQ(server_->open_streams(), 5u);
  Close(group);
  for (Joined& j : single) j.context->TryCancel();
  for (Joined& j : single) testing::End(j);
}

TEST_F(GroupJoinTest, CancelledGroupStreamAbortsTheJobForTheOtherGroup) {
  GroupStream a = Open(GroupJoin("j", 0, 4, 8));
  GroupStream b = Open(GroupJoin("j", 4, 4, 8));
  ASSERT_EQ(a.Each(JoinEvent::kAssignment, 4).size(), 4u);
  ASSERT_EQ(b.Each(JoinEvent::kAssignment, 4).size(), 4u);
  a.joined.context->TryCancel();
  EXPECT_EQ(a.End().error_code(), grpc::StatusCode::CANCELLED);

  const std::map<std::string, JoinEvent> aborts = b.Each(JoinEvent::kAbort, 4);
  ASSERT_EQ(aborts.size(), 4u);
  for (int order = 4; order < 8; ++order) {
    const v1::Abort& abort = aborts.at(absl::StrCat("t", order)).abort();
    EXPECT_EQ(abort.cause(), v1::ABORT_CAUSE_AGENT_LOST);
    EXPECT_NE(abort.exit_code(), 0);
    EXPECT_TRUE(absl::StrContains(abort.reason(), "agent on n0")) << abort.reason();
  }
  Close(b);
  EXPECT_TRUE(StreamsBecome(0));
}

TEST_F(GroupJoinTest, MemberLostAbortsTheJobForEveryOtherMember) {
  GroupStream a = Open(GroupJoin("j", 0, 4, 8));
  GroupStream b = Open(GroupJoin("j", 4, 4, 8));
  ASSERT_EQ(a.Each(JoinEvent::kAssignment, 4).size(), 4u);
  ASSERT_EQ(b.Each(JoinEvent::kAssignment, 4).size(), 4u);

  grpc::Status s = MemberLost("j", "t6");
  ASSERT_TRUE(s.ok()) << s.error_message();
  b.Forget("t6");
  std::map<std::string, JoinEvent> aborts = a.Each(JoinEvent::kAbort, 4);
  std::map<std::string, JoinEvent> on_b = b.Each(JoinEvent::kAbort, 3);
  EXPECT_EQ(on_b.size(), 3u);
  EXPECT_FALSE(on_b.contains("t6")) << "the lost member hears nothing more";
  // The job's abort, the same for each member, goes once per group.
  EXPECT_EQ(a.shared_aborts, 1);
  EXPECT_EQ(b.shared_aborts, 1);
  aborts.merge(on_b);
  ASSERT_EQ(aborts.size(), 7u);
  for (const auto& [agent, e] : aborts) {
    EXPECT_EQ(e.abort().cause(), v1::ABORT_CAUSE_AGENT_LOST) << agent;
    EXPECT_EQ(e.abort().reason(), "lost contact with the agent on n1 (node 1, ranks 6-6)") << agent;
  }
  // The group stream stays open for the members still on it.
  EXPECT_EQ(server_->open_streams(), 2u);

  s = MemberLost("j", "t6");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << "lost already: " << s.error_message();
  s = MemberLost("j", "nobody");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  s = MemberLost("other-job", "t0");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  Close(a);
  Close(b);
}

// The last member of a group lost by member_lost leaves the stream with no member: it ends OK.
TEST_F(GroupJoinTest, MemberLostForTheLastMemberEndsTheGroupStream) {
  GroupStream a = Open(GroupJoin("j", 0, 1, 2), Soon(5));
  ASSERT_TRUE(StreamsBecome(1));
  ASSERT_TRUE(MemberLost("j", "t0").ok());
  const grpc::Status s = a.End();
  EXPECT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
  EXPECT_TRUE(StreamsBecome(0));
}

TEST_F(GroupJoinTest, MalformedGroupsAreRefusedWhole) {
  struct Case {
    const char* name;
    v1::JoinRequest request;
    const char* message;
  };
  std::vector<Case> cases;
  cases.push_back({"over the limit",
                   GroupJoin("j", 0, static_cast<int>(kMaxGroupMembers) + 1, 1024),
                   "a group join holds 513 agents, over rdzvd's limit of 512"});
  v1::JoinRequest nested = GroupJoin("j", 0, 2, 8);
  *nested.mutable_members(1)->add_members() = TaskJoin("j", 2, 8);
  cases.push_back({"nested", nested, "a member of a group join has members of its own"});
  v1::JoinRequest other_job = GroupJoin("j", 0, 2, 8);
  other_job.mutable_members(1)->set_job_id("k");
  cases.push_back({"another job", other_job, "names another job than the group's"});
  for (Case& c : cases) {
    GroupStream g = Open(c.request);
    const grpc::Status s = g.End();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name;
    EXPECT_TRUE(absl::StrContains(s.error_message(), c.message))
        << c.name << ": " << s.error_message();
  }
  EXPECT_EQ(server_->open_streams(), 0u);
}

TEST_F(GroupJoinTest, GroupAtTheLimitCompletesItsRound) {
  const int limit = static_cast<int>(kMaxGroupMembers);
  GroupStream g = Open(GroupJoin("j", 0, limit, limit));
  const std::map<std::string, JoinEvent> got = g.Each(JoinEvent::kAssignment, kMaxGroupMembers);
  ASSERT_EQ(got.size(), kMaxGroupMembers);
  EXPECT_EQ(got.at("t511").assignment().rank_offset(), 511);
  EXPECT_EQ(got.at("t511").assignment().world_size(), 512);
  EXPECT_EQ(server_->open_streams(), 1u);
  Close(g);
}

TEST_F(GroupJoinTest, InvalidMemberIsRefusedAloneAndTheOthersGoOn) {
  v1::JoinRequest request = GroupJoin("j", 0, 3, 3);
  v1::JoinRequest* bad = request.add_members();
  *bad = TaskJoin("j", 3, 3);
  bad->set_nproc(0);
  GroupStream g = Open(request);
  std::map<std::string, JoinEvent> assignments;
  std::optional<JoinEvent> end;
  JoinEvent e;
  while ((assignments.size() < 3 || !end) && g.Next(&e)) {
    if (e.has_assignment()) assignments[e.agent_id()] = e;
    if (e.has_member_end()) end = e;
  }
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->agent_id(), "t3");
  EXPECT_EQ(end->member_end().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(end->member_end().message(), "--nproc-per-node"))
      << end->member_end().message();
  ASSERT_EQ(assignments.size(), 3u);
  for (const auto& [agent, a] : assignments) EXPECT_EQ(a.assignment().world_size(), 3) << agent;
  EXPECT_EQ(server_->open_streams(), 1u);
  Close(g);
}

TEST_F(GroupJoinTest, LeaveOfEveryMemberEndsTheGroupStreamOk) {
  GroupStream g = Open(GroupJoin("j", 0, 4, 4));
  ASSERT_EQ(g.Each(JoinEvent::kAssignment, 4).size(), 4u);
  for (int order = 0; order < 4; ++order) {
    const grpc::Status s = Leave("j", absl::StrCat("t", order));
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  const std::map<std::string, JoinEvent> ends = g.Each(JoinEvent::kMemberEnd, 4);
  ASSERT_EQ(ends.size(), 4u);
  for (const auto& [agent, e] : ends) EXPECT_EQ(e.member_end().code(), 0) << agent;
  const grpc::Status s = g.End();
  EXPECT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
  EXPECT_TRUE(StreamsBecome(0));
}

}  // namespace
}  // namespace rdzv
