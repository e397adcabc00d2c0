#include "common/core/rendezvous_state.h"

#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rdzv {
namespace {

constexpr Micros kSecond = 1'000'000;

// One agent's join. Node index -1 leaves the order to host names.
JoinSpec Spec(const std::string& job, const std::string& host, int64_t node_index, int32_t agents,
              int32_t nproc = 1) {
  JoinSpec s;
  s.job_id = job;
  s.agent.agent_id = absl::StrCat(host, "/agent");
  s.agent.host = host;
  s.agent.node_index = node_index;
  s.agent.nproc = nproc;
  s.min_agents = agents;
  s.max_agents = agents;
  s.addresses = {absl::StrCat("10.0.0.", node_index + 10), absl::StrCat(host, ".ib")};
  s.master_port = static_cast<int32_t>(30000 + node_index + 1);
  return s;
}

template <typename E>
std::map<StreamId, E> EventsOf(const Decisions& d) {
  std::map<StreamId, E> out;
  for (const Decisions::Send& s : d.sends) {
    const Event event = d.EventOf(s);
    if (const E* e = std::get_if<E>(&event)) {
      EXPECT_TRUE(out.emplace(s.stream, *e).second)
          << "two events of a kind on stream " << s.stream;
    }
  }
  return out;
}

std::map<StreamId, absl::Status> ClosesOf(const Decisions& d) {
  std::map<StreamId, absl::Status> out;
  for (const Decisions::Close& c : d.closes) {
    EXPECT_TRUE(out.emplace(c.stream, c.status).second) << "stream " << c.stream << " closed twice";
  }
  return out;
}

// Renders what a member's workers see, so that a mismatch shows every field.
std::string Describe(const AssignmentEvent& a) {
  return absl::StrCat("round=", a.round, " rank_offset=", a.slot.rank_offset,
                      " group_rank=", a.slot.group_rank,
                      " local_rank_offset=", a.slot.local_rank_offset,
                      " local_world_size=", a.slot.local_world_size, " world_size=", a.world_size,
                      " group_world_size=", a.group_world_size, " master=", a.master_addr, ":",
                      a.master_port, " restart_count=", a.restart_count, " agents=", a.agents);
}

bool IsEmpty(const Decisions& d) { return d.sends.empty() && d.closes.empty(); }

std::string Summary(const Decisions& d) {
  std::vector<std::string> parts;
  for (const Decisions::Send& s : d.sends) {
    parts.push_back(absl::StrCat("send#", s.stream, ":", d.events[s.event].index()));
  }
  for (const Decisions::Close& c : d.closes) {
    parts.push_back(absl::StrCat("close#", c.stream, ":", c.status.ToString()));
  }
  return absl::StrJoin(parts, " ");
}

class RendezvousStateTest : public testing::Test {
 protected:
  explicit RendezvousStateTest(StateOptions options = {}) : state_(options) {}

  Decisions Join(Micros now, StreamId stream, const JoinSpec& spec) {
    Decisions d;
    state_.Join(now, stream, spec, d);
    return d;
  }
  Decisions Closed(Micros now, StreamId stream) {
    Decisions d;
    state_.StreamClosed(now, stream, d);
    return d;
  }
  Decisions Tick(Micros now) {
    Decisions d;
    state_.Tick(now, d);
    return d;
  }
  // A departure that the state accepts.
  Decisions Leave(Micros now, const std::string& job, const std::string& agent_id) {
    Decisions d;
    const absl::Status left = state_.Leave(now, job, agent_id, d);
    EXPECT_TRUE(left.ok()) << left;
    return d;
  }

  // Joins `specs[i]` on stream first_stream + i; expects every join but the last to wait.
  // Returns the last join's decisions.
  Decisions JoinAll(Micros now, StreamId first_stream, const std::vector<JoinSpec>& specs) {
    for (size_t i = 0; i + 1 < specs.size(); ++i) {
      Decisions d = Join(now, first_stream + i, specs[i]);
      EXPECT_TRUE(IsEmpty(d)) << specs[i].agent.host << ": " << Summary(d);
    }
    return Join(now, first_stream + specs.size() - 1, specs.back());
  }

  // The one refusal in `d`, for `stream`.
  absl::Status RefusalOf(const Decisions& d, StreamId stream) {
    EXPECT_TRUE(d.sends.empty()) << Summary(d);
    std::map<StreamId, absl::Status> closes = ClosesOf(d);
    EXPECT_EQ(closes.size(), 1u) << Summary(d);
    auto it = closes.find(stream);
    if (it == closes.end()) return absl::UnknownError("not closed");
    return it->second;
  }

  RendezvousState state_;
};

// ---- Completing a round ----

struct RoundCase {
  std::string name;
  std::vector<JoinSpec> specs;    // in join order, on streams 1, 2, ...
  std::vector<std::string> want;  // Describe() of each stream's assignment, same order
};

class RoundTest : public RendezvousStateTest, public testing::WithParamInterface<RoundCase> {};

TEST_P(RoundTest, CompletesWhenTheLastAgentJoins) {
  const RoundCase& c = GetParam();
  const Decisions last = JoinAll(10 * kSecond, 1, c.specs);
  EXPECT_TRUE(last.closes.empty()) << Summary(last);
  const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(last);
  ASSERT_EQ(got.size(), c.specs.size()) << Summary(last);
  for (size_t i = 0; i < c.specs.size(); ++i) {
    auto it = got.find(1 + i);
    ASSERT_NE(it, got.end()) << "no assignment for " << c.specs[i].agent.host;
    EXPECT_EQ(Describe(it->second), c.want[i]) << c.specs[i].agent.host;
  }
  EXPECT_EQ(state_.job_count(), 1u);
}

std::vector<RoundCase> RoundCases() {
  std::vector<RoundCase> cases;
  cases.push_back({"ThreeNodesOfTwoJoinedOutOfOrder",
                   {Spec("j", "n2", 2, 3, 2), Spec("j", "n0", 0, 3, 2), Spec("j", "n1", 1, 3, 2)},
                   {"round=1 rank_offset=4 group_rank=2 local_rank_offset=0 local_world_size=2 "
                    "world_size=6 group_world_size=3 master=10.0.0.10:30001 restart_count=0 "
                    "agents=3",
                    "round=1 rank_offset=0 group_rank=0 local_rank_offset=0 local_world_size=2 "
                    "world_size=6 group_world_size=3 master=10.0.0.10:30001 restart_count=0 "
                    "agents=3",
                    "round=1 rank_offset=2 group_rank=1 local_rank_offset=0 local_world_size=2 "
                    "world_size=6 group_world_size=3 master=10.0.0.10:30001 restart_count=0 "
                    "agents=3"}});
  cases.push_back({"HeterogeneousWorkerCounts",
                   {Spec("j", "n1", 1, 3, 2), Spec("j", "n2", 2, 3, 1), Spec("j", "n0", 0, 3, 4)},
                   {"round=1 rank_offset=4 group_rank=1 local_rank_offset=0 local_world_size=2 "
                    "world_size=7 group_world_size=3 master=10.0.0.10:30001 restart_count=0 "
                    "agents=3",
                    "round=1 rank_offset=6 group_rank=2 local_rank_offset=0 local_world_size=1 "
                    "world_size=7 group_world_size=3 master=10.0.0.10:30001 restart_count=0 "
                    "agents=3",
                    "round=1 rank_offset=0 group_rank=0 local_rank_offset=0 local_world_size=4 "
                    "world_size=7 group_world_size=3 master=10.0.0.10:30001 restart_count=0 "
                    "agents=3"}});
  // Without node indices the host names decide: "alpha" holds rank 0 and is the master.
  JoinSpec beta = Spec("j", "beta", -1, 2);
  JoinSpec alpha = Spec("j", "alpha", -1, 2);
  alpha.addresses = {"192.168.1.5", "10.9.9.9"};
  alpha.master_port = 41000;
  cases.push_back({"OrderedByHostName",
                   {beta, alpha},
                   {"round=1 rank_offset=1 group_rank=1 local_rank_offset=0 local_world_size=1 "
                    "world_size=2 group_world_size=2 master=192.168.1.5:41000 restart_count=0 "
                    "agents=2",
                    "round=1 rank_offset=0 group_rank=0 local_rank_offset=0 local_world_size=1 "
                    "world_size=2 group_world_size=2 master=192.168.1.5:41000 restart_count=0 "
                    "agents=2"}});
  // An override from any agent (here not the master's) wins over the rank-0 agent's address.
  JoinSpec n0 = Spec("j", "n0", 0, 2);
  JoinSpec n1 = Spec("j", "n1", 1, 2);
  n1.master_addr_override = "head-ib0";
  n1.master_port_override = 12345;
  cases.push_back({"OverridesWin",
                   {n0, n1},
                   {"round=1 rank_offset=0 group_rank=0 local_rank_offset=0 local_world_size=1 "
                    "world_size=2 group_world_size=2 master=head-ib0:12345 restart_count=0 "
                    "agents=2",
                    "round=1 rank_offset=1 group_rank=1 local_rank_offset=0 local_world_size=1 "
                    "world_size=2 group_world_size=2 master=head-ib0:12345 restart_count=0 "
                    "agents=2"}});
  // Per-task mode: order = SLURM_PROCID, node index = SLURM_NODEID, cyclic distribution.
  std::vector<JoinSpec> tasks;
  for (int64_t procid : {3, 0, 2, 1}) {
    JoinSpec t = Spec("j", absl::StrCat("n", procid % 2), procid % 2, 4);
    t.agent.agent_id = absl::StrCat("task", procid);
    t.agent.order = procid;
    tasks.push_back(t);
  }
  cases.push_back({"PerTaskCyclic",
                   tasks,
                   {"round=1 rank_offset=3 group_rank=1 local_rank_offset=1 local_world_size=2 "
                    "world_size=4 group_world_size=2 master=10.0.0.10:30001 restart_count=0 "
                    "agents=4",
                    "round=1 rank_offset=0 group_rank=0 local_rank_offset=0 local_world_size=2 "
                    "world_size=4 group_world_size=2 master=10.0.0.10:30001 restart_count=0 "
                    "agents=4",
                    "round=1 rank_offset=2 group_rank=0 local_rank_offset=1 local_world_size=2 "
                    "world_size=4 group_world_size=2 master=10.0.0.10:30001 restart_count=0 "
                    "agents=4",
                    "round=1 rank_offset=1 group_rank=1 local_rank_offset=0 local_world_size=2 "
                    "world_size=4 group_world_size=2 master=10.0.0.10:30001 restart_count=0 "
                    "agents=4"}});
  JoinSpec solo = Spec("j", "solo", -1, 1, 8);
  solo.addresses.clear();
  solo.master_port = 29500;
  cases.push_back({"SingleAgentWithoutAddressesUsesLoopback",
                   {solo},
                   {"round=1 rank_offset=0 group_rank=0 local_rank_offset=0 local_world_size=8 "
                    "world_size=8 group_world_size=1 master=127.0.0.1:29500 restart_count=0 "
                    "agents=1"}});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, RoundTest, testing::ValuesIn(RoundCases()),
                         [](const testing::TestParamInfo<RoundCase>& info) {
                           return info.param.name;
                         });

// Every agent learns the whole job's layout, in node order, not only its own node's count.
TEST_F(RendezvousStateTest, EveryAgentGetsEveryNodesWorkerCount) {
  const Decisions last = JoinAll(0, 1,
                                 {Spec("j", "n1", 1, 4, 1), Spec("j", "n0", 0, 4, 2),
                                  Spec("j", "n2", 2, 4, 3), Spec("j", "n3", 3, 4, 3)});
  const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(last);
  ASSERT_EQ(got.size(), 4u) << Summary(last);
  for (const auto& [stream, a] : got) EXPECT_EQ(a.workers_per_node, "2,1,3(x2)") << stream;
}

TEST_F(RendezvousStateTest, NothingIsSentBeforeTheRoundCompletes) {
  EXPECT_TRUE(IsEmpty(Join(0, 1, Spec("j", "n0", 0, 3))));
  EXPECT_TRUE(IsEmpty(Join(kSecond, 2, Spec("j", "n1", 1, 3))));
  // Ticks within the progress interval say nothing either.
  EXPECT_TRUE(IsEmpty(Tick(kSecond)));
  EXPECT_TRUE(IsEmpty(Tick(2 * kSecond)));
  EXPECT_EQ(EventsOf<AssignmentEvent>(Join(2 * kSecond, 3, Spec("j", "n2", 2, 3))).size(), 3u);
}

TEST_F(RendezvousStateTest, RunsOnlyOnTheStreamsOfRunningAgentsThatHaveNotLeft) {
  Join(0, 1, Spec("j", "n0", 0, 2));
  EXPECT_FALSE(state_.Runs(1));  // still filling
  Join(0, 2, Spec("j", "n1", 1, 2));
  EXPECT_TRUE(state_.Runs(1));
  EXPECT_TRUE(state_.Runs(2));
  EXPECT_FALSE(state_.Runs(3));  // no such stream
  Leave(kSecond, "j", "n1/agent");
  EXPECT_FALSE(state_.Runs(2));
  Closed(kSecond, 1);  // n0 lost: the job ends
  EXPECT_FALSE(state_.Runs(1));
}

// ---- Refusals ----

TEST_F(RendezvousStateTest, LateJoinerIsRefused) {
  JoinAll(0, 1, {Spec("j", "n0", 0, 2), Spec("j", "n1", 1, 2)});
  const absl::Status s = RefusalOf(Join(kSecond, 3, Spec("j", "n9", 1, 2)), 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "too late")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "n9")) << s;
}

TEST_F(RendezvousStateTest, OneAgentTooManyIsRefused) {
  JoinAll(0, 1, {Spec("j", "a", -1, 2), Spec("j", "b", -1, 2)});
  const absl::Status s = RefusalOf(Join(kSecond, 3, Spec("j", "c", -1, 2)), 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--nnodes")) << s;
  // The running job is untouched: the refused agent's stream closing aborts nobody.
  EXPECT_TRUE(IsEmpty(Closed(2 * kSecond, 3)));
  EXPECT_EQ(state_.Status("j").at(0).state, "running");
}

TEST_F(RendezvousStateTest, DuplicateNodeRankIsRefusedNamingTheOtherHost) {
  EXPECT_TRUE(IsEmpty(Join(0, 1, Spec("j", "gpu001", 0, 2))));
  const absl::Status s = RefusalOf(Join(kSecond, 2, Spec("j", "gpu002", 0, 2)), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "gpu001")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "node rank 0")) << s;
  // The first agent still waits, and a correct second agent completes the round.
  EXPECT_EQ(EventsOf<AssignmentEvent>(Join(2 * kSecond, 3, Spec("j", "gpu002", 1, 2))).size(), 2u);
}

TEST_F(RendezvousStateTest, DifferingMasterOverridesAreRefusedNamingBothHosts) {
  JoinSpec a = Spec("j", "gpu001", 0, 3);
  a.master_addr_override = "10.1.0.1";
  a.master_port_override = 29500;
  JoinSpec b = Spec("j", "gpu002", 1, 3);
  b.master_addr_override = "10.66.6.6";
  b.master_port_override = 29500;
  EXPECT_TRUE(IsEmpty(Join(0, 1, a)));
  const absl::Status s = RefusalOf(Join(0, 2, b), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "gpu002 sets the master to 10.66.6.6:29500")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "gpu001 set 10.1.0.1:29500")) << s;
  // The same override, or none, joins; the round's master is the one override.
  JoinSpec c = Spec("j", "gpu002", 1, 3);
  c.master_addr_override = "10.1.0.1";
  EXPECT_TRUE(IsEmpty(Join(0, 3, c)));
  const auto assigned = EventsOf<AssignmentEvent>(Join(0, 4, Spec("j", "gpu003", 2, 3)));
  ASSERT_EQ(assigned.size(), 3u);
  for (const auto& [stream, a] : assigned) EXPECT_EQ(a.master_addr, "10.1.0.1");
}

TEST_F(RendezvousStateTest, AMasterOverrideLeavesWithTheLastAgentThatGaveIt) {
  JoinSpec a = Spec("j", "gpu001", 0, 3);
  a.master_addr_override = "10.1.0.1";
  JoinSpec a2 = Spec("j", "gpu002", 1, 3);
  a2.master_addr_override = "10.1.0.1";
  JoinSpec b = Spec("j", "gpu002", 1, 3);
  b.agent.agent_id = "gpu002-again";
  b.master_addr_override = "10.2.0.2";
  EXPECT_TRUE(IsEmpty(Join(0, 1, a)));
  EXPECT_TRUE(IsEmpty(Join(0, 2, a2)));
  // One of the two that gave it gave up: the other still holds the round to it.
  Closed(kSecond, 1);
  EXPECT_TRUE(
      absl::StrContains(RefusalOf(Join(kSecond, 3, b), 3).message(), "gpu002 set 10.1.0.1"));
  // Once nobody in the round gives it, another one may be given.
  Closed(kSecond, 2);
  EXPECT_TRUE(IsEmpty(Join(kSecond, 4, b)));
  JoinSpec c = Spec("j", "gpu001", 0, 3);
  c.master_addr_override = "10.2.0.2";
  EXPECT_TRUE(IsEmpty(Join(kSecond, 5, c)));
  const auto assigned = EventsOf<AssignmentEvent>(Join(kSecond, 6, Spec("j", "gpu003", 2, 3)));
  ASSERT_EQ(assigned.size(), 3u);
  for (const auto& [stream, e] : assigned) EXPECT_EQ(e.master_addr, "10.2.0.2");
}

TEST_F(RendezvousStateTest, DuplicateGlobalPositionIsRefused) {
  JoinSpec a = Spec("j", "n0", 0, 2);
  a.agent.agent_id = "task0";
  a.agent.order = 0;
  JoinSpec b = Spec("j", "n1", 1, 2);
  b.agent.agent_id = "task0-again";
  b.agent.order = 0;
  EXPECT_TRUE(IsEmpty(Join(0, 1, a)));
  const absl::Status s = RefusalOf(Join(0, 2, b), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "global position 0")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "n0")) << s;
}

struct NnodesCase {
  std::string name;
  int32_t first_min, first_max;
  int32_t second_min, second_max;
  std::string second_text, first_text;
};

class NnodesMismatchTest : public RendezvousStateTest,
                           public testing::WithParamInterface<NnodesCase> {};

TEST_P(NnodesMismatchTest, IsRefusedMentioningNnodes) {
  const NnodesCase& c = GetParam();
  JoinSpec first = Spec("j", "n0", 0, 1);
  first.min_agents = c.first_min;
  first.max_agents = c.first_max;
  JoinSpec second = Spec("j", "n1", 1, 1);
  second.min_agents = c.second_min;
  second.max_agents = c.second_max;
  EXPECT_TRUE(IsEmpty(Join(0, 1, first)));
  const absl::Status s = RefusalOf(Join(0, 2, second), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat("expects --nnodes ", c.second_text)))
      << s;
  EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat("started with --nnodes ", c.first_text)))
      << s;
  EXPECT_EQ(state_.Status("j").at(0).joined, 1);
}

// Agents that disagree on --max-restarts would part ways at the first failure: some restart and
// wait for the others, which have exited. The disagreement is refused when it joins.
TEST_F(RendezvousStateTest, MaxRestartsMismatchIsRefused) {
  JoinSpec first = Spec("j", "n0", 0, 3);
  first.max_restarts = 2;
  JoinSpec unstated = Spec("j", "n1", 1, 3);  // an older client: not checked
  JoinSpec second = Spec("j", "n2", 2, 3);
  second.max_restarts = 0;
  EXPECT_TRUE(IsEmpty(Join(0, 1, first)));
  EXPECT_TRUE(IsEmpty(Join(0, 2, unstated)));
  const absl::Status s = RefusalOf(Join(0, 3, second), 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(),
            "this agent has --max-restarts 0 but job j was started with --max-restarts 2; give "
            "every agent the same --max-restarts");
  second.max_restarts = 2;
  EXPECT_EQ(EventsOf<AssignmentEvent>(Join(0, 4, second)).size(), 3u);
}

INSTANTIATE_TEST_SUITE_P(Cases, NnodesMismatchTest,
                         testing::Values(NnodesCase{"Fixed", 3, 3, 2, 2, "2", "3"},
                                         NnodesCase{"ElasticMax", 2, 4, 2, 3, "2:3", "2:4"},
                                         NnodesCase{"ElasticMin", 2, 4, 1, 4, "1:4", "2:4"},
                                         NnodesCase{"ElasticVsFixed", 2, 2, 2, 3, "2:3", "2"}),
                         [](const testing::TestParamInfo<NnodesCase>& info) {
                           return info.param.name;
                         });

struct InvalidCase {
  std::string name;
  JoinSpec spec;
  std::string message_has;
};

class InvalidSpecTest : public RendezvousStateTest,
                        public testing::WithParamInterface<InvalidCase> {};

TEST_P(InvalidSpecTest, IsRefusedAsInvalidArgument) {
  const InvalidCase& c = GetParam();
  const absl::Status s = RefusalOf(Join(0, 7, c.spec), 7);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), c.message_has)) << s;
  EXPECT_EQ(state_.job_count(), 0u);
}

std::vector<InvalidCase> InvalidCases() {
  std::vector<InvalidCase> cases;
  JoinSpec s = Spec("j", "n0", 0, 2, 0);
  cases.push_back({"NoWorkers", s, "--nproc-per-node is 0"});
  s = Spec("j", "n0", 0, 2, -4);
  cases.push_back({"NegativeWorkers", s, "--nproc-per-node is -4"});
  s = Spec("", "n0", 0, 2);
  cases.push_back({"EmptyJobId", s, "--rdzv-id"});
  s = Spec("j", "n0", 0, 2);
  s.agent.agent_id.clear();
  cases.push_back({"EmptyAgentId", s, "agent id"});
  s = Spec("j", "n2", 2, 2);
  cases.push_back({"NodeRankEqualToNnodes", s, "--node-rank 2 is out of range"});
  s = Spec("j", "n9", 9, 2);
  cases.push_back({"NodeRankAboveNnodes", s, "expected 0..1"});
  s = Spec("j", "n0", 0, 2);
  s.agent.order = 2;
  cases.push_back({"GlobalPositionOutOfRange", s, "global position 2"});
  s = Spec("j", "n0", 0, 0);
  cases.push_back({"ZeroAgents", s, "--nnodes"});
  s = Spec("j", "n0", 0, 3);
  s.max_agents = 2;
  cases.push_back({"MinAboveMax", s, "--nnodes 3:2"});

  // Numbers from the wire at the ends of their types.
  constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
  constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
  constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();
  constexpr int32_t kInt32Min = std::numeric_limits<int32_t>::min();
  s = Spec("j", "n0", 0, 2, 4097);
  cases.push_back(
      {"MoreWorkersThanAnAgentRuns", s, "--nproc-per-node is 4097; expected 1 to 4096"});
  s = Spec("j", "n0", 0, 2, kInt32Max);
  cases.push_back({"Int32MaxWorkers", s, "--nproc-per-node is 2147483647"});
  s = Spec("j", "n0", 0, 2, kInt32Min);
  cases.push_back({"Int32MinWorkers", s, "--nproc-per-node is -2147483648"});
  s = Spec("j", "n0", 0, 1'000'000, 4096);
  cases.push_back({"WorldBeyond32BitRanks", s,
                   "1000000 agents of 4096 workers each make 4096000000 ranks, over the limit of "
                   "2147483647"});
  s = Spec("j", "n0", 0, kInt32Max);
  s.min_agents = kInt32Min;
  cases.push_back({"NegativeMinAgents", s, "--nnodes -2147483648:2147483647"});
  s = Spec("j", "n0", 0, 2);
  s.agent.node_index = -2;
  cases.push_back({"NodeRankBelowMinusOne", s, "--node-rank -2 is out of range"});
  s.agent.node_index = kInt64Min;
  cases.push_back({"NodeRankInt64Min", s, "--node-rank -9223372036854775808 is out of range"});
  s.agent.node_index = kInt64Max;
  cases.push_back({"NodeRankInt64Max", s, "--node-rank 9223372036854775807 is out of range"});
  s = Spec("j", "n0", 0, 2);
  s.agent.order = kInt64Min;
  cases.push_back({"GlobalPositionInt64Min", s, "global position -9223372036854775808"});
  s.agent.order = kInt64Max;
  cases.push_back({"GlobalPositionInt64Max", s, "global position 9223372036854775807"});
  s = Spec("j", "n0", 0, 2);
  s.last_call = -1;
  cases.push_back({"NegativeLastCall", s, "--last-call (last_call_ms) is -1us"});
  s.last_call = kInt64Max;
  cases.push_back({"Int64MaxLastCall", s, "expected 0 to 365 days"});
  s.last_call = kMaxJoinSpan + 1;
  cases.push_back({"LastCallJustOverAYear", s, "--last-call (last_call_ms) is 8760h0.000001s"});
  s = Spec("j", "n0", 0, 2);
  s.master_port = 65536;
  cases.push_back({"MasterPortOver65535", s, "the master port is 65536"});
  s.master_port = kInt32Min;
  cases.push_back({"NegativeMasterPort", s, "the master port is -2147483648"});
  s = Spec("j", "n0", 0, 2);
  s.master_port_override = kInt32Max;
  cases.push_back({"MasterPortOverrideInt32Max", s, "--master-port is 2147483647"});
  s = Spec("j", "n0", 0, 2);
  s.restart_count = -1;
  cases.push_back({"NegativeRestartCount", s, "the restart count is -1"});
  s = Spec("j", "n0", 0, 2);
  s.max_restarts = kInt32Min;
  cases.push_back({"NegativeMaxRestarts", s, "--max-restarts is -2147483648"});
  s = Spec("j", "n0", 0, 2);
  s.longest_heartbeat_interval = kInt64Min;
  cases.push_back({"NegativeHeartbeatInterval", s, "the longest heartbeat interval is"});
  s.longest_heartbeat_interval = kInt64Max;
  cases.push_back({"Int64MaxHeartbeatInterval", s, "expected 0 to 365 days"});

  // Resumed assignments that no rendezvous hands out.
  const auto resuming = [](void (*change)(AssignmentEvent&)) {
    JoinSpec r = Spec("j", "n1", 1, 2, 2);
    AssignmentEvent a;
    a.round = 1;
    a.world_size = 4;
    a.group_world_size = 2;
    a.agents = 2;
    a.slot = {2, 1, 0, 2};
    a.master_addr = "10.0.0.10";
    a.master_port = 30001;
    change(a);
    r.resume = a;
    return r;
  };
  cases.push_back(
      {"ResumedRoundZero", resuming([](AssignmentEvent& a) { a.round = 0; }), "(round 0)"});
  cases.push_back({"ResumedRanksBeyondTheWorld",
                   resuming([](AssignmentEvent& a) { a.slot.rank_offset = kInt32Max; }),
                   "(ranks 2147483647-2147483648 of world size 4)"});
  cases.push_back({"ResumedNegativeRanks",
                   resuming([](AssignmentEvent& a) { a.slot.rank_offset = -1; }),
                   "(ranks -1-0 of world size 4)"});
  cases.push_back({"ResumedMoreAgentsThanNnodes",
                   resuming([](AssignmentEvent& a) { a.agents = kInt32Max; }),
                   "(2147483647 agents where --nnodes allows 2)"});
  cases.push_back({"ResumedNodeOutsideTheNodes",
                   resuming([](AssignmentEvent& a) { a.slot.group_rank = kInt32Min; }),
                   "(node -2147483648 of 2)"});
  cases.push_back({"ResumedLocalRanksBeyondTheNode",
                   resuming([](AssignmentEvent& a) { a.slot.local_rank_offset = 1; }),
                   "(local ranks 1-2 of 2 on its node)"});
  cases.push_back({"ResumedMasterPortOver65535",
                   resuming([](AssignmentEvent& a) { a.master_port = 65536; }),
                   "(master port 65536)"});
  cases.push_back({"ResumedNegativeRestartCount",
                   resuming([](AssignmentEvent& a) { a.restart_count = -1; }),
                   "(restart count -1)"});
  cases.push_back({"ResumedNegativeHeartbeatInterval",
                   resuming([](AssignmentEvent& a) { a.longest_heartbeat_interval = kInt64Min; }),
                   "(a heartbeat interval of -9223372036854775808 us)"});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, InvalidSpecTest, testing::ValuesIn(InvalidCases()),
                         [](const testing::TestParamInfo<InvalidCase>& info) {
                           return info.param.name;
                         });

// Agents that disagree on whether --node-rank is given cannot be ranked together. The newcomer
// that differs from the agents already waiting is refused at once, saying what differs and what
// to do; the others go on waiting, and a correct agent completes their round.
TEST_F(RendezvousStateTest, MixedNodeRanksRefuseTheNewcomerAndTheRoundGoesOn) {
  EXPECT_TRUE(IsEmpty(Join(0, 1, Spec("j", "n0", 0, 2))));
  const absl::Status s = RefusalOf(Join(kSecond, 2, Spec("j", "loose", -1, 2)), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(),
            "the agent on loose gives no --node-rank, but the agent on n0, already in job j, "
            "gives --node-rank 0; pass --node-rank to every agent of the job or to none");
  EXPECT_EQ(state_.Status("j").at(0).joined, 1);
  const std::map<StreamId, AssignmentEvent> assigned =
      EventsOf<AssignmentEvent>(Join(2 * kSecond, 3, Spec("j", "n1", 1, 2)));
  ASSERT_EQ(assigned.size(), 2u);
  EXPECT_EQ(assigned.at(1).world_size, 2);
  EXPECT_EQ(assigned.at(3).slot.rank_offset, 1);
}

TEST_F(RendezvousStateTest, NodeRankAmongAgentsWithoutOneIsRefusedTheSameWay) {
  EXPECT_TRUE(IsEmpty(Join(0, 1, Spec("j", "loose", -1, 2))));
  const absl::Status s = RefusalOf(Join(kSecond, 2, Spec("j", "n1", 1, 2)), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(),
            "the agent on n1 gives --node-rank 1, but the agent on loose, already in job j, "
            "gives no --node-rank; pass --node-rank to every agent of the job or to none");
  EXPECT_EQ(EventsOf<AssignmentEvent>(Join(2 * kSecond, 3, Spec("j", "other", -1, 2))).size(), 2u);
}

TEST_F(RendezvousStateTest, MixedGlobalPositionsRefuseTheNewcomer) {
  JoinSpec task = Spec("j", "n0", 0, 2);
  task.agent.order = 0;
  EXPECT_TRUE(IsEmpty(Join(0, 1, task)));
  const absl::Status s = RefusalOf(Join(kSecond, 2, Spec("j", "n1", 1, 2)), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(),
            "the agent on n1 has no global position (one agent per node), but the agent on n0, "
            "already in job j, has a global position (one agent per task); run every agent of "
            "the job in the same --mode");
  JoinSpec second = Spec("j", "n1", 1, 2);
  second.agent.order = 1;
  EXPECT_EQ(EventsOf<AssignmentEvent>(Join(2 * kSecond, 3, second)).size(), 2u);
}

// In an elastic round the mixed newcomer is refused at join too, so that the round completes
// at the last call with the agents that agree.
TEST_F(RendezvousStateTest, MixedNodeRanksInAnElasticRoundRefuseTheNewcomer) {
  JoinSpec n0 = Spec("j", "n0", 0, 3);
  JoinSpec loose = Spec("j", "loose", -1, 3);
  JoinSpec n1 = Spec("j", "n1", 1, 3);
  for (JoinSpec* s : {&n0, &loose, &n1}) {
    s->min_agents = 2;
    s->last_call = kSecond;
  }
  EXPECT_TRUE(IsEmpty(Join(0, 1, n0)));
  EXPECT_EQ(RefusalOf(Join(0, 2, loose), 2).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(IsEmpty(Join(0, 3, n1)));
  const Decisions d = Tick(kSecond);
  EXPECT_TRUE(d.closes.empty()) << Summary(d);
  const std::map<StreamId, AssignmentEvent> assigned = EventsOf<AssignmentEvent>(d);
  ASSERT_EQ(assigned.size(), 2u) << Summary(d);
  EXPECT_EQ(assigned.at(3).world_size, 2);
  EXPECT_EQ(state_.Status("j").at(0).state, "running");
}

// ---- Waiters coming and going ----

TEST_F(RendezvousStateTest, WaiterThatGivesUpIsRemoved) {
  EXPECT_TRUE(IsEmpty(Join(0, 1, Spec("j", "n0", 0, 3))));
  EXPECT_TRUE(IsEmpty(Join(0, 2, Spec("j", "n1", 1, 3))));
  EXPECT_TRUE(IsEmpty(Closed(kSecond, 1)));
  EXPECT_EQ(state_.Status("j").at(0).joined, 1);

  // Another agent may take node rank 0 now, and the round still needs all three.
  EXPECT_TRUE(IsEmpty(Join(2 * kSecond, 3, Spec("j", "n0-spare", 0, 3))));
  const Decisions d = Join(3 * kSecond, 4, Spec("j", "n2", 2, 3));
  const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(d);
  ASSERT_EQ(got.size(), 3u) << Summary(d);
  EXPECT_FALSE(got.contains(1));
  EXPECT_EQ(got.at(3).slot.rank_offset, 0);
  EXPECT_EQ(got.at(2).slot.rank_offset, 1);
  EXPECT_EQ(got.at(4).slot.rank_offset, 2);
  EXPECT_EQ(got.at(3).world_size, 3);
}

TEST_F(RendezvousStateTest, LastWaiterGivingUpForgetsTheJob) {
  EXPECT_TRUE(IsEmpty(Join(0, 1, Spec("j", "n0", 0, 2))));
  EXPECT_EQ(state_.job_count(), 1u);
  EXPECT_TRUE(IsEmpty(Closed(kSecond, 1)));
  EXPECT_EQ(state_.job_count(), 0u);
}

TEST_F(RendezvousStateTest, RetriedJoinReplacesTheOldStreamAndCountsOnce) {
  const JoinSpec n0 = Spec("j", "n0", 0, 2);
  EXPECT_TRUE(IsEmpty(Join(0, 1, n0)));
  const absl::Status s = RefusalOf(Join(kSecond, 2, n0), 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_EQ(state_.Status("j").at(0).joined, 1);

  // The replaced stream closing later does not remove the agent.
  EXPECT_TRUE(IsEmpty(Closed(2 * kSecond, 1)));
  const Decisions d = Join(3 * kSecond, 3, Spec("j", "n1", 1, 2));
  const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(d);
  ASSERT_EQ(got.size(), 2u) << Summary(d);
  EXPECT_TRUE(got.contains(2));
  EXPECT_TRUE(got.contains(3));
  EXPECT_EQ(got.at(2).world_size, 2);
}

TEST_F(RendezvousStateTest, ReattachAfterCompletionResendsTheSameAssignment) {
  const JoinSpec n1 = Spec("j", "n1", 1, 3, 2);
  const Decisions first = JoinAll(0, 1, {Spec("j", "n0", 0, 3, 2), n1, Spec("j", "n2", 2, 3, 2)});
  const AssignmentEvent original = EventsOf<AssignmentEvent>(first).at(2);

  const Decisions again = Join(5 * kSecond, 10, n1);
  const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(again);
  ASSERT_EQ(got.size(), 1u) << Summary(again);
  EXPECT_EQ(Describe(got.at(10)), Describe(original));
  EXPECT_TRUE(EventsOf<AbortEvent>(again).empty()) << Summary(again);
  const std::map<StreamId, absl::Status> closes = ClosesOf(again);
  ASSERT_EQ(closes.size(), 1u) << Summary(again);
  EXPECT_EQ(closes.at(2).code(), absl::StatusCode::kAborted);

  // The old stream going away is not a lost agent.
  EXPECT_TRUE(IsEmpty(Closed(6 * kSecond, 2)));
  EXPECT_EQ(state_.Status("j").at(0).state, "running");
}

// A join under an agent id the job already has, but with another shape: it would take the
// member's place (and its ranks) with a different number of workers or another node rank.
struct ReshapeCase {
  std::string name;
  bool running;  // the round has completed before the rejoin
  void (*change)(AgentSpec&);
  std::string message;
};

class ReshapedRejoinTest : public RendezvousStateTest,
                           public testing::WithParamInterface<ReshapeCase> {};

TEST_P(ReshapedRejoinTest, RefusedAndTheMemberStays) {
  const ReshapeCase& c = GetParam();
  JoinSpec n0 = Spec("j", "n0", 0, 2, 2);
  n0.agent.order = 0;
  JoinSpec n1 = Spec("j", "n1", 1, 2, 2);
  n1.agent.order = 1;
  std::optional<AssignmentEvent> held;
  if (c.running) {
    const Decisions d = JoinAll(0, 1, {n0, n1});
    ASSERT_EQ(EventsOf<AssignmentEvent>(d).size(), 2u) << Summary(d);
    held = EventsOf<AssignmentEvent>(d).at(2);
  } else {
    ASSERT_TRUE(IsEmpty(Join(0, 2, n1)));
  }

  JoinSpec reshaped = n1;
  c.change(reshaped.agent);
  const absl::Status s = RefusalOf(Join(kSecond, 9, reshaped), 9);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(), c.message);

  // The member's own stream is untouched, and the same join again still gets its place.
  EXPECT_TRUE(IsEmpty(Closed(2 * kSecond, 9)));
  EXPECT_EQ(state_.Status("j").at(0).state, c.running ? "running" : "filling");
  const Decisions again = c.running ? Join(3 * kSecond, 10, n1) : Join(3 * kSecond, 1, n0);
  const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(again);
  ASSERT_TRUE(got.contains(10) || got.contains(2)) << Summary(again);
  const AssignmentEvent& n1_got = got.contains(10) ? got.at(10) : got.at(2);
  EXPECT_EQ(n1_got.world_size, 4);
  EXPECT_EQ(n1_got.slot.rank_offset, 2);
  if (held) {
    EXPECT_EQ(Describe(n1_got), Describe(*held));
  }
}

std::vector<ReshapeCase> ReshapeCases() {
  std::vector<ReshapeCase> cases;
  for (const bool running : {false, true}) {
    const std::string phase = running ? "Running" : "Filling";
    cases.push_back(
        {"Nproc" + phase, running, [](AgentSpec& a) { a.nproc = 4; },
         "agent n1/agent already joined job j with --nproc-per-node 2 and now asks for 4; rejoin "
         "with --nproc-per-node 2, or give a launcher of another shape its own agent id"});
    cases.push_back(
        {"NodeRank" + phase, running, [](AgentSpec& a) { a.node_index = 0; },
         "agent n1/agent already joined job j with --node-rank 1 and now asks for 0; rejoin "
         "with --node-rank 1, or give a launcher of another shape its own agent id"});
    cases.push_back(
        {"GlobalPosition" + phase, running, [](AgentSpec& a) { a.order = 0; },
         "agent n1/agent already joined job j with global position 1 and now asks for 0; rejoin "
         "with global position 1, or give a launcher of another shape its own agent id"});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, ReshapedRejoinTest, testing::ValuesIn(ReshapeCases()),
                         [](const testing::TestParamInfo<ReshapeCase>& info) {
                           return info.param.name;
                         });

// ---- Elastic rounds ----

class ElasticTest : public RendezvousStateTest {
 protected:
  static JoinSpec Elastic(const std::string& host, int64_t node_index) {
    JoinSpec s = Spec("e", host, node_index, 3);
    s.min_agents = 2;
    s.last_call = kSecond;
    return s;
  }
};

TEST_F(ElasticTest, CompletesWithMinAgentsOnceLastCallPasses) {
  EXPECT_TRUE(IsEmpty(Join(0, 1, Elastic("n0", 0))));
  EXPECT_TRUE(IsEmpty(Join(0, 2, Elastic("n1", 1))));
  EXPECT_TRUE(IsEmpty(Tick(kSecond / 2)));
  const Decisions d = Tick(kSecond);
  const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(d);
  ASSERT_EQ(got.size(), 2u) << Summary(d);
  EXPECT_EQ(got.at(1).agents, 2);
  EXPECT_EQ(got.at(1).world_size, 2);
  EXPECT_EQ(got.at(2).group_world_size, 2);
  EXPECT_EQ(got.at(2).slot.rank_offset, 1);

  const absl::Status late = RefusalOf(Join(2 * kSecond, 3, Elastic("n2", 2)), 3);
  EXPECT_TRUE(absl::StrContains(late.message(), "too late")) << late;
}

TEST_F(ElasticTest, LastCallCountsFromTheLatestJoin) {
  EXPECT_TRUE(IsEmpty(Join(0, 1, Elastic("n0", 0))));
  EXPECT_TRUE(IsEmpty(Join(kSecond * 4 / 10, 2, Elastic("n1", 1))));
  EXPECT_TRUE(IsEmpty(Tick(kSecond)));
  EXPECT_TRUE(IsEmpty(Tick(kSecond * 13 / 10)));
  EXPECT_EQ(EventsOf<AssignmentEvent>(Tick(kSecond * 14 / 10)).size(), 2u);
}

TEST_F(ElasticTest, NeverCompletesBelowMinAgents) {
  EXPECT_TRUE(IsEmpty(Join(0, 1, Elastic("n0", 0))));
  for (Micros t = kSecond; t <= 20 * kSecond; t += kSecond) {
    EXPECT_TRUE(EventsOf<AssignmentEvent>(Tick(t)).empty()) << "at " << t;
  }
}

TEST_F(ElasticTest, CompletesAtOnceWithMaxAgents) {
  EXPECT_TRUE(IsEmpty(Join(0, 1, Elastic("n0", 0))));
  EXPECT_TRUE(IsEmpty(Join(0, 2, Elastic("n1", 1))));
  const Decisions d = Join(kSecond / 10, 3, Elastic("n2", 2));
  EXPECT_EQ(EventsOf<AssignmentEvent>(d).size(), 3u) << Summary(d);
}

// ---- Progress ----

TEST_F(RendezvousStateTest, ProgressGoesToWaitersOnly) {
  EXPECT_TRUE(IsEmpty(Join(0, 1, Spec("wait", "n0", 0, 4))));
  EXPECT_TRUE(IsEmpty(Join(0, 2, Spec("wait", "n2", 2, 4))));
  JoinAll(0, 10, {Spec("run", "m0", 0, 2), Spec("run", "m1", 1, 2)});

  const Micros interval = StateOptions{}.progress_interval;
  EXPECT_TRUE(IsEmpty(Tick(interval - 1)));
  const Decisions d = Tick(interval);
  EXPECT_TRUE(d.closes.empty()) << Summary(d);
  const std::map<StreamId, ProgressEvent> got = EventsOf<ProgressEvent>(d);
  ASSERT_EQ(got.size(), 2u) << Summary(d);
  EXPECT_EQ(d.sends.size(), 2u) << Summary(d);
  for (StreamId s : {1, 2}) {
    const ProgressEvent& p = got.at(s);
    EXPECT_EQ(p.joined, 2);
    EXPECT_EQ(p.expected, 4);
    EXPECT_EQ(p.missing_node_indices, (std::vector<int64_t>{1, 3}));
    EXPECT_EQ(p.joined_hosts, (std::vector<std::string>{"n0", "n2"}));
  }
  // Not again until another interval has passed.
  EXPECT_TRUE(IsEmpty(Tick(interval + interval / 2)));
  EXPECT_EQ(EventsOf<ProgressEvent>(Tick(2 * interval)).size(), 2u);
}

TEST_F(RendezvousStateTest, ProgressWithoutNodeIndicesListsNoMissingOnes) {
  EXPECT_TRUE(IsEmpty(Join(0, 1, Spec("j", "b", -1, 3))));
  const std::map<StreamId, ProgressEvent> got =
      EventsOf<ProgressEvent>(Tick(StateOptions{}.progress_interval));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got.at(1).joined, 1);
  EXPECT_EQ(got.at(1).expected, 3);
  EXPECT_TRUE(got.at(1).missing_node_indices.empty());
  EXPECT_EQ(got.at(1).joined_hosts, std::vector<std::string>{"b"});
}

// ---- Failures ----

class RunningJobTest : public RendezvousStateTest {
 protected:
  void SetUp() override {
    const Decisions d = JoinAll(
        0, 1, {Spec("j", "n0", 0, 3, 2), Spec("j", "n1", 1, 3, 2), Spec("j", "n2", 2, 3, 2)});
    ASSERT_EQ(EventsOf<AssignmentEvent>(d).size(), 3u) << Summary(d);
  }

  static FailureInfo Failure(const std::string& host, int32_t rank, int32_t exit_code) {
    FailureInfo f;
    f.host = host;
    f.rank = rank;
    f.local_rank = rank % 2;
    f.group_rank = rank / 2;
    f.exit_code = exit_code;
    f.stderr_tail = "Traceback: boom";
    return f;
  }
};

TEST_F(RunningJobTest, FailureAbortsEveryOtherMember) {
  Decisions d;
  absl::StatusOr<AbortEvent> first =
      state_.ReportFailure(5 * kSecond, "j", "n1/agent", Failure("n1", 3, 7), d);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(first->first_failure.has_value());
  EXPECT_EQ(first->first_failure->host, "n1");
  EXPECT_EQ(first->first_failure->rank, 3);
  EXPECT_EQ(first->exit_code, 7);

  const std::map<StreamId, AbortEvent> aborts = EventsOf<AbortEvent>(d);
  for (StreamId other : {1, 3}) {
    ASSERT_TRUE(aborts.contains(other)) << Summary(d);
    const AbortEvent& a = aborts.at(other);
    ASSERT_TRUE(a.first_failure.has_value());
    EXPECT_EQ(a.first_failure->host, "n1");
    EXPECT_EQ(a.first_failure->rank, 3);
    EXPECT_EQ(a.first_failure->exit_code, 7);
    EXPECT_EQ(a.first_failure->stderr_tail, "Traceback: boom");
    EXPECT_EQ(a.exit_code, 7);
    EXPECT_TRUE(absl::StrContains(a.reason, "n1")) << a.reason;
    EXPECT_EQ(a.cause, AbortCause::kWorkerFailed) << a.reason;
  }
  EXPECT_TRUE(EventsOf<AssignmentEvent>(d).empty());
  EXPECT_EQ(state_.Status("j").at(0).state, "ended");
}

TEST_F(RunningJobTest, SecondFailureGetsTheFirstOne) {
  Decisions d;
  ASSERT_TRUE(state_.ReportFailure(5 * kSecond, "j", "n1/agent", Failure("n1", 3, 7), d).ok());
  Decisions later;
  absl::StatusOr<AbortEvent> second =
      state_.ReportFailure(6 * kSecond, "j", "n2/agent", Failure("n2", 4, -9), later);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(second->first_failure.has_value());
  EXPECT_EQ(second->first_failure->host, "n1");
  EXPECT_EQ(second->first_failure->exit_code, 7);
  EXPECT_EQ(second->exit_code, 7);
  EXPECT_TRUE(EventsOf<AbortEvent>(later).empty()) << "aborted twice: " << Summary(later);
}

TEST_F(RunningJobTest, FailureFromAStrangerIsNotFound) {
  Decisions d;
  absl::StatusOr<AbortEvent> unknown_job =
      state_.ReportFailure(kSecond, "other", "n1/agent", Failure("n1", 3, 1), d);
  EXPECT_EQ(unknown_job.status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<AbortEvent> unknown_agent =
      state_.ReportFailure(kSecond, "j", "n7/agent", Failure("n7", 3, 1), d);
  EXPECT_EQ(unknown_agent.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(IsEmpty(d)) << Summary(d);
  EXPECT_EQ(state_.Status("j").at(0).state, "running");
}

TEST_F(RunningJobTest, LostAgentAbortsTheOthersNamingItsHost) {
  const Decisions d = Closed(5 * kSecond, 2);
  const std::map<StreamId, AbortEvent> aborts = EventsOf<AbortEvent>(d);
  ASSERT_EQ(aborts.size(), 2u) << Summary(d);
  for (StreamId other : {1, 3}) {
    const AbortEvent& a = aborts.at(other);
    EXPECT_TRUE(absl::StrContains(a.reason, "n1")) << a.reason;
    EXPECT_FALSE(a.first_failure.has_value());
    EXPECT_NE(a.exit_code, 0);
    EXPECT_EQ(a.cause, AbortCause::kAgentLost) << a.reason;
  }
  // A failure reported afterwards learns how the job ended.
  Decisions later;
  absl::StatusOr<AbortEvent> report =
      state_.ReportFailure(6 * kSecond, "j", "n2/agent", Failure("n2", 5, 3), later);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(absl::StrContains(report->reason, "n1")) << report->reason;
  EXPECT_TRUE(EventsOf<AbortEvent>(later).empty()) << Summary(later);
}

TEST_F(RunningJobTest, LeaveByEveryMemberForgetsTheJob) {
  Decisions d = Leave(5 * kSecond, "j", "n0/agent");
  ASSERT_EQ(ClosesOf(d).size(), 1u) << Summary(d);
  EXPECT_TRUE(ClosesOf(d).at(1).ok());
  EXPECT_TRUE(d.sends.empty()) << Summary(d);
  // A member that left disconnecting afterwards aborts nobody.
  EXPECT_TRUE(IsEmpty(Closed(5 * kSecond, 1)));
  EXPECT_EQ(state_.Status("j").at(0).state, "running");

  Leave(6 * kSecond, "j", "n1/agent");
  EXPECT_EQ(state_.job_count(), 1u);
  d = Leave(7 * kSecond, "j", "n2/agent");
  EXPECT_TRUE(ClosesOf(d).at(3).ok());
  EXPECT_EQ(state_.job_count(), 0u);
}

// A member whose stream broke before its assignment reached it joins again: it hears how the
// job ended, and then its join ends, so that its agent exits with the root cause at once.
TEST_F(RunningJobTest, MemberReconnectingAfterTheEndHearsHowItEndedAndIsClosed) {
  Decisions d;
  ASSERT_TRUE(state_.ReportFailure(5 * kSecond, "j", "n1/agent", Failure("n1", 3, 7), d).ok());
  EXPECT_TRUE(IsEmpty(Closed(6 * kSecond, 3)));
  const Decisions again = Join(7 * kSecond, 30, Spec("j", "n2", 2, 3, 2));
  const std::map<StreamId, AbortEvent> aborts = EventsOf<AbortEvent>(again);
  ASSERT_EQ(aborts.size(), 1u) << Summary(again);
  ASSERT_TRUE(aborts.at(30).first_failure.has_value());
  EXPECT_EQ(aborts.at(30).first_failure->host, "n1");
  EXPECT_EQ(aborts.at(30).exit_code, 7);
  const std::map<StreamId, absl::Status> closes = ClosesOf(again);
  ASSERT_EQ(closes.size(), 1u) << Summary(again);
  EXPECT_TRUE(closes.at(30).ok()) << closes.at(30);
  // Nothing holds the ended job open: its TTL runs from that last contact.
  EXPECT_EQ(state_.Status("j").at(0).state, "ended");
  EXPECT_TRUE(IsEmpty(Closed(7 * kSecond, 30)));
}

// ---- Departures ----

TEST_F(RunningJobTest, LeaveOfAJobOrAgentTheStateDoesNotKnowIsNotFound) {
  Decisions d;
  absl::Status s = state_.Leave(kSecond, "other", "n1/agent", d);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_EQ(s.message(), "job other has no agent n1/agent to leave (did the server restart?)");
  s = state_.Leave(kSecond, "j", "n7/agent", d);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(IsEmpty(d)) << Summary(d);
  EXPECT_EQ(state_.Status("j").at(0).state, "running");
  EXPECT_EQ(state_.Status("j").at(0).agents.at(0).state, "attached");
}

TEST_F(RunningJobTest, LeavingTwiceIsFineWhileTheJobIsKept) {
  EXPECT_TRUE(ClosesOf(Leave(5 * kSecond, "j", "n0/agent")).at(1).ok());
  EXPECT_TRUE(IsEmpty(Leave(6 * kSecond, "j", "n0/agent")));
  EXPECT_EQ(state_.Status("j").at(0).state, "running");
}

TEST_F(RendezvousStateTest, WaiterThatLeftIsNoLongerAMember) {
  EXPECT_TRUE(IsEmpty(Join(0, 1, Spec("j", "n0", 0, 3))));
  EXPECT_TRUE(IsEmpty(Join(0, 2, Spec("j", "n1", 1, 3))));
  EXPECT_TRUE(ClosesOf(Leave(kSecond, "j", "n0/agent")).at(1).ok());
  Decisions d;
  EXPECT_EQ(state_.Leave(2 * kSecond, "j", "n0/agent", d).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(IsEmpty(d)) << Summary(d);
  EXPECT_EQ(state_.Status("j").at(0).joined, 1);
}

// ---- The operator's abort ----

TEST_F(RunningJobTest, OperatorAbortReachesEveryMemberAndIsHowTheJobEnded) {
  AbortEvent stop;
  stop.cause = AbortCause::kAgentSignalled;
  stop.reason = "aborted with rdzvctl: maintenance";
  stop.exit_code = 143;
  Decisions d;
  absl::StatusOr<AbortEvent> ended = state_.Abort(5 * kSecond, "j", stop, d);
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(*ended, stop);
  const std::map<StreamId, AbortEvent> aborts = EventsOf<AbortEvent>(d);
  ASSERT_EQ(aborts.size(), 3u) << Summary(d);
  for (const auto& [stream, a] : aborts) EXPECT_EQ(a, stop) << stream;
  EXPECT_TRUE(d.closes.empty()) << Summary(d);
  // Whoever asks later hears the same words: a failure report, and a member back after the end.
  Decisions later;
  absl::StatusOr<AbortEvent> report =
      state_.ReportFailure(6 * kSecond, "j", "n2/agent", Failure("n2", 5, 3), later);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(*report, stop);
  EXPECT_TRUE(IsEmpty(Closed(6 * kSecond, 2)));
  EXPECT_EQ(EventsOf<AbortEvent>(Join(7 * kSecond, 20, Spec("j", "n1", 1, 3, 2))).at(20), stop);
  // A second abort changes nothing.
  AbortEvent again = stop;
  again.reason = "aborted with rdzvctl: again";
  Decisions none;
  EXPECT_EQ(*state_.Abort(8 * kSecond, "j", again, none), stop);
  EXPECT_TRUE(IsEmpty(none)) << Summary(none);
  EXPECT_EQ(state_.Abort(8 * kSecond, "nosuchjob", stop, none).status().code(),
            absl::StatusCode::kNotFound);
}

// Waiters of a round that ends before it completes hear why, and their joins end.
TEST_F(RendezvousStateTest, OperatorAbortOfAFillingJobEndsEveryWaitersJoin) {
  EXPECT_TRUE(IsEmpty(Join(0, 1, Spec("j", "n0", 0, 3))));
  EXPECT_TRUE(IsEmpty(Join(0, 2, Spec("j", "n1", 1, 3))));
  AbortEvent stop;
  stop.cause = AbortCause::kAgentSignalled;
  stop.reason = "aborted with rdzvctl: wrong size";
  stop.exit_code = 143;
  Decisions d;
  ASSERT_TRUE(state_.Abort(kSecond, "j", stop, d).ok());
  EXPECT_EQ(EventsOf<AbortEvent>(d).size(), 2u) << Summary(d);
  const std::map<StreamId, absl::Status> closes = ClosesOf(d);
  ASSERT_EQ(closes.size(), 2u) << Summary(d);
  EXPECT_TRUE(closes.at(1).ok() && closes.at(2).ok()) << Summary(d);
  EXPECT_EQ(state_.Status("j").at(0).state, "ended");
  // Their streams closing afterwards changes nothing.
  EXPECT_TRUE(IsEmpty(Closed(2 * kSecond, 1)));
}

// ---- Ended jobs: forgetting, restarting, requeueing ----

TEST_F(RunningJobTest, EndedJobIsForgottenAfterTheTtlOnceNothingIsAttached) {
  const Micros ttl = StateOptions{}.ended_job_ttl;
  Decisions d;
  ASSERT_TRUE(state_.ReportFailure(10 * kSecond, "j", "n1/agent", Failure("n1", 3, 7), d).ok());
  Closed(10 * kSecond, 1);
  Closed(10 * kSecond, 2);
  Closed(12 * kSecond, 3);
  // An agent reconnecting within the TTL of the last detach still learns how the job ended.
  Tick(12 * kSecond + ttl - 1);
  EXPECT_EQ(state_.job_count(), 1u);
  EXPECT_EQ(state_.Status("j").at(0).state, "ended");
  Tick(12 * kSecond + ttl);
  EXPECT_EQ(state_.job_count(), 0u);
}

TEST_F(RunningJobTest, StreamHeldOpenAfterTheEndIsClosedAndTheJobForgotten) {
  const Micros ttl = StateOptions{}.ended_job_ttl;
  Decisions d;
  ASSERT_TRUE(state_.ReportFailure(10 * kSecond, "j", "n1/agent", Failure("n1", 3, 7), d).ok());
  Closed(10 * kSecond, 1);
  Closed(10 * kSecond, 2);
  // n2 heard the abort but keeps its stream open: it cannot keep the job (and its id) forever.
  EXPECT_TRUE(IsEmpty(Tick(10 * kSecond + ttl - 1)));
  EXPECT_EQ(state_.job_count(), 1u);
  const Decisions end = Tick(10 * kSecond + ttl);
  ASSERT_EQ(ClosesOf(end).size(), 1u) << Summary(end);
  EXPECT_EQ(ClosesOf(end).at(3).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(absl::StrContains(ClosesOf(end).at(3).message(), "n1")) << ClosesOf(end).at(3);
  EXPECT_EQ(state_.job_count(), 0u);
  // Its late close changes nothing, and the job id is free for a requeued job.
  EXPECT_TRUE(IsEmpty(Closed(10 * kSecond + ttl + 1, 3)));
  JoinSpec a = Spec("j", "m0", 0, 1);
  a.agent.agent_id = "requeued-0";
  EXPECT_EQ(EventsOf<AssignmentEvent>(Join(10 * kSecond + ttl + 2, 40, a)).size(), 1u);
}

TEST_F(RunningJobTest, EndedJobWithNothingAttachedIsForgottenAfterTheTtl) {
  const Micros ttl = StateOptions{}.ended_job_ttl;
  Closed(10 * kSecond, 1);
  Closed(10 * kSecond, 2);
  Closed(10 * kSecond, 3);
  Tick(10 * kSecond + ttl - 1);
  EXPECT_EQ(state_.job_count(), 1u);
  Tick(10 * kSecond + ttl);
  EXPECT_EQ(state_.job_count(), 0u);
}

TEST_F(RunningJobTest, RestartOpensTheNextRound) {
  Decisions d;
  ASSERT_TRUE(state_.ReportFailure(5 * kSecond, "j", "n1/agent", Failure("n1", 3, 7), d).ok());

  std::vector<JoinSpec> next = {Spec("j", "n1", 1, 3, 2), Spec("j", "n0", 0, 3, 2),
                                Spec("j", "n2", 2, 3, 2)};
  for (JoinSpec& s : next) s.restart_count = 1;
  // The first agent back opens round 2 and its old stream ends; the others keep theirs until
  // they come back (should one end without a word, its agent is not coming).
  const Decisions opened = Join(6 * kSecond, 21, next[0]);
  EXPECT_TRUE(opened.sends.empty()) << Summary(opened);
  ASSERT_EQ(ClosesOf(opened).size(), 1u) << Summary(opened);
  EXPECT_EQ(ClosesOf(opened).at(2).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(state_.Status("j").at(0).state, "filling");
  EXPECT_EQ(state_.Status("j").at(0).round, 2);

  const Decisions second = Join(6 * kSecond, 22, next[1]);
  EXPECT_TRUE(second.sends.empty()) << Summary(second);
  EXPECT_EQ(ClosesOf(second).size(), 1u) << Summary(second);  // n0's old stream
  const Decisions done = Join(7 * kSecond, 23, next[2]);
  const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(done);
  ASSERT_EQ(got.size(), 3u) << Summary(done);
  for (const auto& [stream, a] : got) {
    EXPECT_EQ(a.round, 2) << stream;
    EXPECT_EQ(a.restart_count, 1) << stream;
    EXPECT_EQ(a.world_size, 6) << stream;
  }
  EXPECT_EQ(got.at(22).slot.rank_offset, 0);

  // The old round's streams are no longer members: closing them aborts nobody.
  EXPECT_TRUE(IsEmpty(Closed(8 * kSecond, 1)));
  EXPECT_TRUE(IsEmpty(Closed(8 * kSecond, 3)));
  EXPECT_EQ(state_.Status("j").at(0).state, "running");
}

TEST_F(RunningJobTest, NewAgentsStartAfreshOnceTheEndedJobIsDetached) {
  Decisions d;
  ASSERT_TRUE(state_.ReportFailure(5 * kSecond, "j", "n1/agent", Failure("n1", 3, 7), d).ok());
  // A requeued job: same job id, new agents, nobody from the old run attached any more.
  for (StreamId s : {1, 2, 3}) Closed(6 * kSecond, s);
  JoinSpec a = Spec("j", "m0", 0, 2);
  a.agent.agent_id = "requeued-0";
  JoinSpec b = Spec("j", "m1", 1, 2);
  b.agent.agent_id = "requeued-1";
  const Decisions done = JoinAll(7 * kSecond, 40, {a, b});
  const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(done);
  ASSERT_EQ(got.size(), 2u) << Summary(done);
  EXPECT_EQ(got.at(40).world_size, 2);
  EXPECT_EQ(got.at(40).agents, 2);
  EXPECT_EQ(got.at(40).master_addr, "10.0.0.10");
  EXPECT_EQ(got.at(40).restart_count, 0);
  EXPECT_EQ(state_.Status("j").at(0).agents.size(), 2u);
}

TEST_F(RunningJobTest, NewAgentIsToldToRetryWhileTheEndedJobHasMembersAttached) {
  Decisions d;
  ASSERT_TRUE(state_.ReportFailure(5 * kSecond, "j", "n1/agent", Failure("n1", 3, 7), d).ok());
  JoinSpec stranger = Spec("j", "m0", 0, 3);
  stranger.agent.agent_id = "requeued-0";
  const absl::Status s = RefusalOf(Join(6 * kSecond, 40, stranger), 40);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(state_.Status("j").at(0).state, "ended");
  EXPECT_EQ(state_.Status("j").at(0).round, 1);
}

// ---- Several jobs ----

TEST_F(RendezvousStateTest, JobsNeverMix) {
  EXPECT_TRUE(IsEmpty(Join(0, 1, Spec("a", "a0", 0, 2, 2))));
  EXPECT_TRUE(IsEmpty(Join(0, 2, Spec("b", "b0", 0, 2, 3))));
  const Decisions b_done = Join(0, 3, Spec("b", "b1", 1, 2, 3));
  const std::map<StreamId, AssignmentEvent> b = EventsOf<AssignmentEvent>(b_done);
  ASSERT_EQ(b.size(), 2u) << Summary(b_done);
  EXPECT_TRUE(b.contains(2));
  EXPECT_TRUE(b.contains(3));
  EXPECT_EQ(b.at(2).world_size, 6);
  EXPECT_EQ(b.at(3).master_addr, "10.0.0.10");
  EXPECT_EQ(b.at(3).master_port, 30001);

  const Decisions a_done = Join(0, 4, Spec("a", "a1", 1, 2, 2));
  const std::map<StreamId, AssignmentEvent> a = EventsOf<AssignmentEvent>(a_done);
  ASSERT_EQ(a.size(), 2u) << Summary(a_done);
  EXPECT_TRUE(a.contains(1));
  EXPECT_TRUE(a.contains(4));
  EXPECT_EQ(a.at(4).world_size, 4);
  EXPECT_EQ(a.at(4).slot.rank_offset, 2);
  EXPECT_EQ(state_.job_count(), 2u);

  // A failure in one job leaves the other running.
  Decisions d;
  ASSERT_TRUE(state_.ReportFailure(kSecond, "a", "a0/agent", FailureInfo{}, d).ok());
  EXPECT_TRUE(EventsOf<AbortEvent>(d).contains(4)) << Summary(d);
  for (const Decisions::Send& s : d.sends) {
    EXPECT_TRUE(s.stream != 2 && s.stream != 3) << "job b heard of job a: " << Summary(d);
  }
  EXPECT_EQ(state_.Status("a").at(0).state, "ended");
  EXPECT_EQ(state_.Status("b").at(0).state, "running");
}

// ---- A job of 100,000 agents ----

// One round of 100,000 agents, one per node, as a large job's tree brings them: every agent gets
// its node's rank from one event the round decides once, status lists every agent, and losing
// one of them ends the job for all the others, again with one event.
TEST_F(RendezvousStateTest, AHundredThousandAgentsFormOneRound) {
  constexpr int32_t kAgents = 100'000;
  Decisions formed;
  for (int32_t i = 0; i < kAgents; ++i) {
    JoinSpec spec = Spec("big", absl::StrCat("gpu-node-", i), i, kAgents);
    spec.master_port = 29500;  // every node offers the same port
    Decisions d = Join(0, 1 + i, spec);
    if (i + 1 < kAgents) {
      ASSERT_TRUE(IsEmpty(d)) << i << ": " << Summary(d);
    } else {
      formed = std::move(d);
    }
  }
  ASSERT_EQ(formed.sends.size(), static_cast<size_t>(kAgents));
  EXPECT_EQ(formed.events.size(), 1u) << "the round's shared part is decided once";
  for (const Decisions::Send& s : formed.sends) {
    const auto node = static_cast<int32_t>(s.stream - 1);
    ASSERT_EQ(s.slot.rank_offset, node);
    ASSERT_EQ(s.slot.group_rank, node);
  }
  const AssignmentEvent a = std::get<AssignmentEvent>(formed.EventOf(formed.sends.back()));
  EXPECT_EQ(a.world_size, kAgents);
  EXPECT_EQ(a.slot.rank_offset, kAgents - 1);
  EXPECT_EQ(a.master_addr, "10.0.0.10") << "node 0's first address";
  EXPECT_EQ(a.workers_per_node, "1(x100000)");

  const std::vector<JobStatusView> status = state_.Status("big");
  ASSERT_EQ(status.size(), 1u);
  ASSERT_EQ(status[0].agents.size(), static_cast<size_t>(kAgents));
  EXPECT_EQ(status[0].agents[77'777].host, "gpu-node-77777");
  EXPECT_EQ(status[0].agents[77'777].rank_offset, 77'777);
  EXPECT_EQ(status[0].agents[77'777].state, "attached");

  const Decisions lost = Closed(kSecond, 1 + 4242);
  ASSERT_EQ(lost.sends.size(), static_cast<size_t>(kAgents - 1));
  ASSERT_EQ(lost.events.size(), 1u);
  const auto& abort = std::get<AbortEvent>(lost.events[0]);
  EXPECT_EQ(abort.cause, AbortCause::kAgentLost);
  EXPECT_TRUE(absl::StrContains(abort.reason, "gpu-node-4242 (node 4242, ranks 4242-4242)"))
      << abort.reason;
}

// ---- Status ----

TEST_F(RendezvousStateTest, StatusShowsEachJob) {
  EXPECT_TRUE(IsEmpty(Join(0, 1, Spec("waiting", "w1", 1, 3, 4))));
  JoinAll(0, 10, {Spec("busy", "b1", 1, 2, 4), Spec("busy", "b0", 0, 2, 2)});
  Leave(kSecond, "busy", "b1/agent");

  const std::vector<JobStatusView> all = state_.Status("");
  ASSERT_EQ(all.size(), 2u);
  const JobStatusView& busy = all[0];
  EXPECT_EQ(busy.job_id, "busy");
  EXPECT_EQ(busy.state, "running");
  EXPECT_EQ(busy.round, 1);
  EXPECT_EQ(busy.joined, 2);
  EXPECT_EQ(busy.min_agents, 2);
  EXPECT_EQ(busy.max_agents, 2);
  EXPECT_EQ(busy.world_size, 6);
  ASSERT_EQ(busy.agents.size(), 2u);
  EXPECT_EQ(busy.agents[0].host, "b0");
  EXPECT_EQ(busy.agents[0].rank_offset, 0);
  EXPECT_EQ(busy.agents[0].nproc, 2);
  EXPECT_EQ(busy.agents[0].node_index, 0);
  EXPECT_EQ(busy.agents[0].state, "attached");
  EXPECT_EQ(busy.agents[1].host, "b1");
  EXPECT_EQ(busy.agents[1].rank_offset, 2);
  EXPECT_EQ(busy.agents[1].state, "left");

  const JobStatusView& waiting = all[1];
  EXPECT_EQ(waiting.job_id, "waiting");
  EXPECT_EQ(waiting.state, "filling");
  EXPECT_EQ(waiting.joined, 1);
  EXPECT_EQ(waiting.max_agents, 3);
  EXPECT_EQ(waiting.world_size, 0);
  ASSERT_EQ(waiting.agents.size(), 1u);
  EXPECT_EQ(waiting.agents[0].agent_id, "w1/agent");
  EXPECT_EQ(waiting.agents[0].rank_offset, -1);
  EXPECT_EQ(waiting.agents[0].state, "attached");

  const std::vector<JobStatusView> one = state_.Status("waiting");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].job_id, "waiting");
  EXPECT_TRUE(state_.Status("nope").empty());
}

TEST_F(RendezvousStateTest, StatusKeepsTheFirstNodeListGivenOverRounds) {
  std::vector<JoinSpec> specs = {Spec("j", "n0", 0, 3), Spec("j", "n1", 1, 3),
                                 Spec("j", "n2", 2, 3)};
  specs[1].node_list = "n[0-2]";  // the first agent knows none
  specs[2].node_list = "x[1-3]";
  for (JoinSpec& s : specs) s.max_restarts = 1;
  EXPECT_TRUE(IsEmpty(Join(0, 1, specs[0])));
  EXPECT_EQ(state_.Status("j").at(0).node_list, "");
  EXPECT_TRUE(IsEmpty(Join(0, 2, specs[1])));
  EXPECT_EQ(state_.Status("j").at(0).node_list, "n[0-2]");
  ASSERT_EQ(EventsOf<AssignmentEvent>(Join(0, 3, specs[2])).size(), 3u);
  EXPECT_EQ(state_.Status("j").at(0).node_list, "n[0-2]");

  // A restart opens round 2 with agents that bring another list: the job keeps its first.
  FailureInfo failure;
  failure.host = "n1";
  Decisions d;
  ASSERT_TRUE(state_.ReportFailure(kSecond, "j", "n1/agent", failure, d).ok());
  for (JoinSpec& s : specs) {
    s.restart_count = 1;
    s.node_list = "y[1-3]";
  }
  // The first agent back opens round 2 (closing the old streams); the last completes it.
  Join(2 * kSecond, 11, specs[0]);
  Join(2 * kSecond, 12, specs[1]);
  EXPECT_EQ(EventsOf<AssignmentEvent>(Join(2 * kSecond, 13, specs[2])).size(), 3u);
  EXPECT_EQ(state_.Status("j").at(0).round, 2);
  EXPECT_EQ(state_.Status("j").at(0).node_list, "n[0-2]");
}

TEST_F(RunningJobTest, StatusShowsDetachedMembersOfAnEndedJob) {
  Closed(5 * kSecond, 2);
  const std::vector<JobStatusView> views = state_.Status("j");
  ASSERT_EQ(views.size(), 1u);
  EXPECT_EQ(views[0].state, "ended");
  ASSERT_EQ(views[0].agents.size(), 3u);
  EXPECT_EQ(views[0].agents[1].host, "n1");
  EXPECT_EQ(views[0].agents[1].state, "detached");
  EXPECT_EQ(views[0].agents[0].state, "attached");
}

// A server restarts while a job of three agents runs: each agent that notices comes back with
// the assignment its workers run under, and the new server rebuilds the round from them.
class ResumeTest : public RendezvousStateTest {
 protected:
  ResumeTest() : RendezvousStateTest(Options()) {}
  static StateOptions Options() {
    StateOptions o;
    o.resume_window = 10 * kSecond;
    return o;
  }

  void SetUp() override {
    RendezvousState before;
    specs_ = {Spec("j", "n0", 0, 3, 2), Spec("j", "n1", 1, 3, 2), Spec("j", "n2", 2, 3, 2)};
    Decisions d;
    for (size_t i = 0; i < specs_.size(); ++i) before.Join(0, 1 + i, specs_[i], d);
    const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(d);
    ASSERT_EQ(got.size(), 3u) << Summary(d);
    for (size_t i = 0; i < specs_.size(); ++i) held_.push_back(got.at(1 + i));
  }

  JoinSpec Resuming(size_t i) const {
    JoinSpec s = specs_[i];
    s.resume = held_[i];
    return s;
  }

  std::vector<JoinSpec> specs_;
  std::vector<AssignmentEvent> held_;
};

TEST_F(ResumeTest, RestartedServerRebuildsTheRoundFromReturningAgents) {
  for (size_t i = 0; i < 3; ++i) {
    const Decisions d = Join(kSecond, 10 + i, Resuming(i));
    const std::map<StreamId, AssignmentEvent> back = EventsOf<AssignmentEvent>(d);
    ASSERT_EQ(back.size(), 1u) << Summary(d);
    EXPECT_EQ(Describe(back.at(10 + i)), Describe(held_[i]));
    EXPECT_TRUE(d.closes.empty()) << Summary(d);
  }
  // Everyone is back: the window passes without an abort, and the job runs on as before.
  EXPECT_TRUE(IsEmpty(Tick(20 * kSecond)));
  const std::vector<JobStatusView> views = state_.Status("j");
  ASSERT_EQ(views.size(), 1u);
  EXPECT_EQ(views[0].state, "running");
  EXPECT_EQ(views[0].world_size, 6);

  // A lost agent still ends it, as in any running job.
  const Decisions lost = Closed(21 * kSecond, 11);
  const std::map<StreamId, AbortEvent> aborts = EventsOf<AbortEvent>(lost);
  EXPECT_EQ(aborts.size(), 2u) << Summary(lost);
  EXPECT_TRUE(absl::StrContains(aborts.begin()->second.reason, "n1"))
      << aborts.begin()->second.reason;
}

TEST_F(ResumeTest, AgentsThatDoNotComeBackInTimeEndTheJob) {
  ASSERT_EQ(EventsOf<AssignmentEvent>(Join(kSecond, 10, Resuming(0))).size(), 1u);
  ASSERT_EQ(EventsOf<AssignmentEvent>(Join(2 * kSecond, 12, Resuming(2))).size(), 1u);
  EXPECT_TRUE(IsEmpty(Tick(10 * kSecond)));  // the window runs from the first return

  const Decisions d = Tick(11 * kSecond);
  const std::map<StreamId, AbortEvent> aborts = EventsOf<AbortEvent>(d);
  ASSERT_EQ(aborts.size(), 2u) << Summary(d);
  EXPECT_EQ(aborts.at(10).reason,
            "1 of 3 agents did not come back within 10s after the rendezvous server restarted "
            "or the job moved to this one");
  EXPECT_EQ(aborts.at(12).exit_code, 1);
  // The cause says so, for agents and metrics that do not read the words.
  for (const auto& [stream, abort] : aborts) {
    EXPECT_EQ(abort.cause, AbortCause::kResumeTimedOut) << stream;
    EXPECT_FALSE(abort.first_failure.has_value()) << stream;
  }

  // The straggler learns how the job ended instead of starting anything.
  const Decisions late = Join(12 * kSecond, 11, Resuming(1));
  ASSERT_EQ(EventsOf<AbortEvent>(late).size(), 1u) << Summary(late);
  EXPECT_EQ(ClosesOf(late).size(), 1u);
}

TEST_F(ResumeTest, SameServerAnswersWithTheAbortOfAJobThatEndedMeanwhile) {
  // The server saw the agent's stream drop, which ended the job.
  RendezvousState same;
  Decisions d;
  for (size_t i = 0; i < specs_.size(); ++i) same.Join(0, 1 + i, specs_[i], d);
  Decisions lost;
  same.StreamClosed(kSecond, 2, lost);
  Decisions back;
  same.Join(2 * kSecond, 7, Resuming(1), back);
  const std::map<StreamId, AbortEvent> aborts = EventsOf<AbortEvent>(back);
  ASSERT_EQ(aborts.size(), 1u) << Summary(back);
  EXPECT_TRUE(absl::StrContains(aborts.at(7).reason, "lost contact with the agent on n1"))
      << aborts.at(7).reason;
  EXPECT_TRUE(EventsOf<AssignmentEvent>(back).empty());
}

TEST_F(ResumeTest, NeverJoinsAnotherRound) {
  // The others restarted their workers: round 2 is filling without this agent.
  JoinSpec next = specs_[0];
  next.restart_count = 1;
  ASSERT_TRUE(IsEmpty(Join(kSecond, 20, next)));
  const absl::Status refused = RefusalOf(Join(2 * kSecond, 21, Resuming(1)), 21);
  EXPECT_EQ(refused.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(absl::StrContains(refused.message(), "without this agent")) << refused;
}

TEST_F(ResumeTest, RefusesTwoAgentsHoldingTheSameRanks) {
  ASSERT_EQ(EventsOf<AssignmentEvent>(Join(kSecond, 10, Resuming(0))).size(), 1u);
  JoinSpec impostor = Resuming(0);
  impostor.agent.agent_id = "other/agent";
  impostor.agent.host = "other";
  const absl::Status refused = RefusalOf(Join(kSecond, 11, impostor), 11);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.message(), "already held by the agent on n0")) << refused;

  JoinSpec other_world = Resuming(1);
  other_world.resume->world_size = 8;
  EXPECT_EQ(RefusalOf(Join(kSecond, 12, other_world), 12).code(), absl::StatusCode::kAborted);
}

TEST_F(ResumeTest, RefusesAMemberBackWithOtherRanksThanItHolds) {
  ASSERT_EQ(EventsOf<AssignmentEvent>(Join(kSecond, 10, Resuming(0))).size(), 1u);
  // n0 comes back once more, claiming n1's ranks.
  JoinSpec swapped = Resuming(0);
  swapped.resume = held_[1];
  const absl::Status refused = RefusalOf(Join(2 * kSecond, 11, swapped), 11);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "with rank 2, but the job gave it rank 0"))
      << refused;
  // With its own ranks it is taken back.
  EXPECT_EQ(EventsOf<AssignmentEvent>(Join(3 * kSecond, 12, Resuming(0))).size(), 1u);
}

TEST_F(ResumeTest, RefusesAReturningAgentWithAnotherNproc) {
  ASSERT_EQ(EventsOf<AssignmentEvent>(Join(kSecond, 10, Resuming(0))).size(), 1u);
  // (More workers than its node held would be no assignment at all: InvalidSpecTest.)
  JoinSpec reshaped = Resuming(0);
  reshaped.agent.nproc = 1;
  const absl::Status refused = RefusalOf(Join(2 * kSecond, 11, reshaped), 11);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.message(), "with --nproc-per-node 2 and now asks for 1"))
      << refused;
}

// The first agent back brings the round for everyone; a later claim that disagrees with it (a
// stale agent of another run, or a hostile one) is refused naming both values, and the job goes
// on as the first one set it.
TEST_F(ResumeTest, RefusesAClaimThatDisagreesWithTheJobAndLeavesTheJobAlone) {
  ASSERT_EQ(EventsOf<AssignmentEvent>(Join(kSecond, 10, Resuming(0))).size(), 1u);
  struct Case {
    void (*change)(AssignmentEvent&);
    std::string claimed, held;
  };
  const Case cases[] = {
      {[](AssignmentEvent& a) { a.master_addr = "10.9.9.9"; }, "master 10.9.9.9:30001",
       "master 10.0.0.10:30001"},
      {[](AssignmentEvent& a) { a.master_port = 29500; }, "master 10.0.0.10:29500",
       "master 10.0.0.10:30001"},
      {[](AssignmentEvent& a) { a.restart_count = 2; }, "restart count 2", "restart count 0"},
      {[](AssignmentEvent& a) {
         a.group_world_size = 2;
         a.agents = 2;
       },
       "2 nodes of 2 agents", "3 nodes of 3 agents"},
  };
  StreamId stream = 20;
  for (const Case& c : cases) {
    JoinSpec claim = Resuming(1);
    c.change(*claim.resume);
    const absl::Status refused = RefusalOf(Join(2 * kSecond, stream, claim), stream);
    ++stream;
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
    EXPECT_EQ(refused.message(),
              absl::StrCat("the agent on n1 rejoins round 1 of job j with ", c.claimed,
                           ", but the job runs with ", c.held,
                           "; its workers are not this job's: stop it, or restart the job"));
  }
  // The honest agents come back to the job as it was, and it runs on.
  for (size_t i = 1; i < 3; ++i) {
    const std::map<StreamId, AssignmentEvent> back =
        EventsOf<AssignmentEvent>(Join(3 * kSecond, 30 + i, Resuming(i)));
    ASSERT_EQ(back.size(), 1u);
    EXPECT_EQ(Describe(back.at(30 + i)), Describe(held_[i]));
  }
  EXPECT_TRUE(IsEmpty(Tick(20 * kSecond)));
  EXPECT_EQ(state_.Status("j").at(0).state, "running");
  EXPECT_EQ(state_.Status("j").at(0).joined, 3);
}

// The same server, which never lost the job, holds its members to the same round.
TEST_F(ResumeTest, SameServerRefusesAClaimOfAnotherMaster) {
  RendezvousState same;
  Decisions d;
  for (size_t i = 0; i < specs_.size(); ++i) same.Join(0, 1 + i, specs_[i], d);
  JoinSpec claim = Resuming(2);
  claim.resume->master_port = 1;
  Decisions back;
  same.Join(kSecond, 9, claim, back);
  ASSERT_EQ(ClosesOf(back).size(), 1u) << Summary(back);
  EXPECT_EQ(ClosesOf(back).at(9).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(back.sends.empty()) << Summary(back);
  EXPECT_EQ(same.Status("j").at(0).state, "running");
}

// ---- Nodes left out (a failed health check) ----

JoinSpec Unwell(JoinSpec spec, std::string detail,
                ExclusionKind kind = ExclusionKind::kHealthCheckFailed) {
  spec.unhealthy = Unhealthy{kind, std::move(detail)};
  return spec;
}

JoinSpec Elastic(JoinSpec spec, int32_t min_agents) {
  spec.min_agents = min_agents;
  return spec;
}

TEST_F(RendezvousStateTest, AnUnhealthyNodeEndsAJobOfFixedSizeAtOnce) {
  EXPECT_TRUE(IsEmpty(Join(0, 1, Spec("j", "n1", 0, 3))));
  const Decisions d = Join(kSecond, 2, Unwell(Spec("j", "n2", 1, 3), "GPU 3 has fallen off"));
  const std::map<StreamId, absl::Status> closes = ClosesOf(d);
  ASSERT_TRUE(closes.contains(2)) << Summary(d);
  EXPECT_EQ(closes.at(2).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(closes.at(2).message(), "left out of job j")) << closes.at(2);
  // The waiting agent hears why and its join ends: it does not wait for its join timeout.
  const std::map<StreamId, AbortEvent> aborts = EventsOf<AbortEvent>(d);
  ASSERT_TRUE(aborts.contains(1)) << Summary(d);
  const AbortEvent& abort = aborts.at(1);
  EXPECT_EQ(abort.cause, AbortCause::kNodeUnhealthy);
  EXPECT_EQ(abort.exit_code, kExitNodeUnhealthy);
  EXPECT_TRUE(absl::StrContains(abort.reason,
                                "n2 (node 1): health check failed: GPU 3 has "
                                "fallen off"))
      << abort.reason;
  EXPECT_TRUE(absl::StrContains(abort.reason, "sbatch --exclude=n2")) << abort.reason;
  EXPECT_TRUE(closes.contains(1) && closes.at(1).ok()) << Summary(d);

  // A peer that comes later hears the same, instead of opening a round that waits for n2.
  const Decisions late = Join(2 * kSecond, 3, Spec("j", "n3", 2, 3));
  ASSERT_EQ(EventsOf<AbortEvent>(late).count(3), 1u) << Summary(late);
  EXPECT_EQ(EventsOf<AbortEvent>(late).at(3).cause, AbortCause::kNodeUnhealthy);
  EXPECT_TRUE(ClosesOf(late).at(3).ok());
  const std::vector<JobStatusView> status = state_.Status("j");
  ASSERT_EQ(status.size(), 1u);
  EXPECT_EQ(status[0].state, "ended");
  ASSERT_EQ(status[0].excluded.size(), 1u);
  EXPECT_EQ(status[0].excluded[0].host, "n2");
  EXPECT_EQ(status[0].excluded[0].why.detail, "GPU 3 has fallen off");
}

TEST_F(RendezvousStateTest, TheFirstAgentMayBeTheUnhealthyOne) {
  const Decisions d = Join(0, 1, Unwell(Spec("j", "n0", 0, 2), "", ExclusionKind::kRunDir));
  EXPECT_EQ(ClosesOf(d).at(1).code(), absl::StatusCode::kFailedPrecondition);
  // The job is remembered as ended, so the other agent is told at once.
  const Decisions other = Join(kSecond, 2, Spec("j", "n1", 1, 2));
  ASSERT_EQ(EventsOf<AbortEvent>(other).count(2), 1u) << Summary(other);
  EXPECT_TRUE(absl::StrContains(EventsOf<AbortEvent>(other).at(2).reason,
                                "n0 (node 0): run directory unusable"));
}

TEST_F(RendezvousStateTest, AnElasticJobFormsWithoutItsUnhealthyNode) {
  EXPECT_TRUE(IsEmpty(Join(0, 1, Elastic(Spec("j", "n0", 0, 3), 2))));
  const Decisions d = Join(kSecond, 2, Unwell(Elastic(Spec("j", "n1", 1, 3), 2), "ECC errors"));
  // The waiting agent is told which node is out and why, at once.
  const std::map<StreamId, ProgressEvent> progress = EventsOf<ProgressEvent>(d);
  ASSERT_TRUE(progress.contains(1)) << Summary(d);
  EXPECT_EQ(progress.at(1).expected, 2);
  ASSERT_EQ(progress.at(1).excluded.size(), 1u);
  EXPECT_EQ(DescribeExcluded(progress.at(1).excluded[0]),
            "n1 (node 1): health check failed: ECC errors");
  // The last agent it can still have completes the round, without waiting for --last-call; it
  // hears of the node left out before it came.
  const Decisions last = Join(kSecond, 3, Elastic(Spec("j", "n2", 2, 3), 2));
  ASSERT_EQ(EventsOf<ProgressEvent>(last).count(3), 1u) << Summary(last);
  EXPECT_EQ(EventsOf<ProgressEvent>(last).at(3).excluded.size(), 1u);
  const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(last);
  ASSERT_EQ(got.size(), 2u) << Summary(last);
  EXPECT_EQ(got.at(1).world_size, 2);
  EXPECT_EQ(got.at(3).slot.group_rank, 1);
}

TEST_F(RendezvousStateTest, AReportCompletesARoundThatWaitedOnlyForThatNode) {
  EXPECT_TRUE(IsEmpty(Join(0, 1, Elastic(Spec("j", "n0", 0, 3), 2))));
  EXPECT_TRUE(IsEmpty(Join(0, 3, Elastic(Spec("j", "n2", 2, 3), 2))));
  const Decisions d = Join(kSecond, 2, Unwell(Elastic(Spec("j", "n1", 1, 3), 2), "no IB"));
  EXPECT_EQ(EventsOf<AssignmentEvent>(d).size(), 2u) << Summary(d);
}

TEST_F(RendezvousStateTest, ALeftOutNodeDoesNotRejoinTheJob) {
  JoinSpec n1 = Elastic(Spec("j", "n1", 1, 3), 2);
  Join(0, 1, Elastic(Spec("j", "n0", 0, 3), 2));
  Join(0, 2, Unwell(n1, "ECC errors"));
  // Its agent, started again, passes its check this time: the node stays out.
  n1.agent.agent_id = "n1/agent-2";
  const absl::Status back = RefusalOf(Join(kSecond, 3, n1), 3);
  EXPECT_EQ(back.code(), absl::StatusCode::kFailedPrecondition) << back;
  EXPECT_TRUE(absl::StrContains(back.message(), "ECC errors")) << back;
  // Reporting twice takes it out once: the job still forms from the two others.
  Join(kSecond, 4, Unwell(n1, "ECC errors"));
  EXPECT_EQ(EventsOf<AssignmentEvent>(Join(kSecond, 5, Elastic(Spec("j", "n2", 2, 3), 2))).size(),
            2u);
  // A restart leaves it out too, and forms from the others again.
  Decisions d;
  ASSERT_TRUE(
      state_.Abort(2 * kSecond, "j", AbortEvent{AbortCause::kWorkerFailed, {}, "boom", 1}, d).ok());
  JoinSpec r0 = Elastic(Spec("j", "n0", 0, 3), 2);
  JoinSpec r1 = n1;
  JoinSpec r2 = Elastic(Spec("j", "n2", 2, 3), 2);
  r0.restart_count = r1.restart_count = r2.restart_count = 1;
  EXPECT_TRUE(EventsOf<AssignmentEvent>(Join(3 * kSecond, 6, r0)).empty());
  EXPECT_EQ(RefusalOf(Join(3 * kSecond, 7, r1), 7).code(), absl::StatusCode::kFailedPrecondition);
  const Decisions restarted = Join(3 * kSecond, 8, r2);
  const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(restarted);
  ASSERT_EQ(got.size(), 2u) << Summary(restarted);
  EXPECT_EQ(got.at(6).restart_count, 1);
}

TEST_F(RendezvousStateTest, AJobThatRanWithoutItsLeftOutNodeIsForgottenOnceAllLeave) {
  Join(0, 1, Elastic(Spec("j", "n0", 0, 3), 2));
  Join(0, 2, Unwell(Elastic(Spec("j", "n1", 1, 3), 2), "bad"));
  Join(0, 3, Elastic(Spec("j", "n2", 2, 3), 2));
  ASSERT_EQ(state_.Status("j").at(0).state, "running");
  Leave(kSecond, "j", "n0/agent");
  Leave(kSecond, "j", "n2/agent");
  // Gone, as any job whose agents all left: the same id may start afresh (a requeue).
  EXPECT_TRUE(state_.Status("j").empty());
}

TEST_F(RendezvousStateTest, AJobOfOnlyItsLeftOutNodeIsKeptForTheTtlThenForgotten) {
  Join(0, 1, Unwell(Elastic(Spec("j", "n0", 0, 3), 1), "bad"));
  ASSERT_EQ(state_.Status("j").size(), 1u);
  EXPECT_EQ(state_.Status("j")[0].state, "filling");
  const Micros ttl = StateOptions{}.ended_job_ttl;
  Tick(ttl - 1);
  EXPECT_EQ(state_.Status("j").size(), 1u);
  Tick(ttl);
  EXPECT_TRUE(state_.Status("j").empty());
}

TEST_F(RendezvousStateTest, WaitersHearOfABurstOfLeftOutNodesOnceAnInterval) {
  const Micros interval = StateOptions{}.progress_interval;
  JoinSpec n0 = Elastic(Spec("j", "n0", 0, 10), 2);
  n0.last_call = 100 * interval;  // the round waits for its last node, or for this
  JoinSpec n9 = Elastic(Spec("j", "n9", 9, 10), 2);
  n9.last_call = n0.last_call;
  Join(0, 1, n0);
  Join(0, 2, n9);
  // The first is told at once, with the nodes left out and nothing else to build.
  const Decisions first = Join(1, 10, Unwell(Elastic(Spec("j", "n1", 1, 10), 2), "a"));
  std::map<StreamId, ProgressEvent> told = EventsOf<ProgressEvent>(first);
  ASSERT_EQ(told.size(), 2u) << Summary(first);
  EXPECT_EQ(told.at(1).excluded.size(), 1u);
  EXPECT_EQ(told.at(1).expected, 9);
  EXPECT_TRUE(told.at(1).joined_hosts.empty());
  // The rest of the burst waits for the next progress: no message to every waiter per report.
  for (int i = 2; i <= 4; ++i) {
    const Decisions d =
        Join(i, 10 + i, Unwell(Elastic(Spec("j", absl::StrCat("n", i), i, 10), 2), "b"));
    EXPECT_TRUE(EventsOf<ProgressEvent>(d).empty()) << i << ": " << Summary(d);
  }
  EXPECT_TRUE(EventsOf<ProgressEvent>(Tick(interval - 1)).empty());
  const Decisions later = Tick(interval);
  told = EventsOf<ProgressEvent>(later);
  ASSERT_EQ(told.size(), 2u) << Summary(later);
  EXPECT_EQ(told.at(2).excluded.size(), 4u);
  EXPECT_EQ(told.at(2).expected, 6);
  // The next report is told at once again (an interval passed since the first).
  const Decisions again = Join(interval + 1, 16, Unwell(Elastic(Spec("j", "n5", 5, 10), 2), "d"));
  EXPECT_EQ(EventsOf<ProgressEvent>(again).size(), 2u) << Summary(again);
  // A report that completes the round is told before the ranks, whatever the interval.
  Join(interval + 2, 20, Elastic(Spec("j", "n6", 6, 10), 2));
  Join(interval + 2, 21, Elastic(Spec("j", "n7", 7, 10), 2));
  const Decisions done = Join(interval + 3, 22, Unwell(Elastic(Spec("j", "n8", 8, 10), 2), "c"));
  told = EventsOf<ProgressEvent>(done);
  ASSERT_EQ(told.count(1), 1u) << Summary(done);
  EXPECT_EQ(told.at(1).excluded.size(), 6u);
  EXPECT_EQ(EventsOf<AssignmentEvent>(done).size(), 4u) << Summary(done);
}

TEST_F(RendezvousStateTest, AJobKeepsAtMostSoManyLeftOutAgentsThenEndsItsRound) {
  const int32_t nodes = 2 * kMaxExcludedAgents;
  ASSERT_TRUE(IsEmpty(Join(0, 1, Elastic(Spec("j", "last", nodes - 1, nodes), 1))));
  for (int32_t i = 0; i < kMaxExcludedAgents; ++i) {
    const std::string host = absl::StrCat("n", i);
    const Decisions d = Join(kSecond, 100 + i, Unwell(Elastic(Spec("j", host, i, nodes), 1), "x"));
    ASSERT_TRUE(EventsOf<AbortEvent>(d).empty()) << i << ": " << Summary(d);
  }
  EXPECT_EQ(state_.excluded_agents(), kMaxExcludedAgents);
  // One more ends the round: so many failures point at the check, not at the nodes.
  const Decisions d =
      Join(2 * kSecond, 99, Unwell(Elastic(Spec("j", "m", nodes - 2, nodes), 1), "x"));
  ASSERT_EQ(EventsOf<AbortEvent>(d).count(1), 1u) << Summary(d);
  const AbortEvent abort = EventsOf<AbortEvent>(d).at(1);
  EXPECT_EQ(abort.cause, AbortCause::kNodeUnhealthy);
  EXPECT_TRUE(absl::StrContains(abort.reason,
                                absl::StrCat(kMaxExcludedAgents, " agents of job j were left out")))
      << abort.reason;
  EXPECT_TRUE(absl::StrContains(abort.reason, "--health-check")) << abort.reason;
  EXPECT_EQ(ClosesOf(d).at(99).code(), absl::StatusCode::kFailedPrecondition);
  // Later reports are refused without a record.
  Join(2 * kSecond, 98, Unwell(Elastic(Spec("j", "o", nodes - 3, nodes), 1), "x"));
  EXPECT_EQ(state_.excluded_agents(), kMaxExcludedAgents);
  // Forgotten with its job.
  Tick(2 * kSecond + StateOptions{}.ended_job_ttl);
  EXPECT_TRUE(state_.Status("j").empty());
  EXPECT_EQ(state_.excluded_agents(), 0);
}

TEST_F(RendezvousStateTest, AnUnhealthyReportIsRangeChecked) {
  JoinSpec long_line =
      Unwell(Spec("j", "n0", 0, 2), std::string(kMaxUnhealthyDetailBytes + 1, 'x'));
  EXPECT_EQ(ValidateJoinSpec(long_line).code(), absl::StatusCode::kInvalidArgument);
  JoinSpec odd_kind = Unwell(Spec("j", "n0", 0, 2), "x", static_cast<ExclusionKind>(99));
  EXPECT_EQ(ValidateJoinSpec(odd_kind).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateJoinSpec(Unwell(Spec("j", "n0", 0, 2), "red \x1b[31m")).code(),
            absl::StatusCode::kInvalidArgument);
  // Only the server says that another agent of a node was left out.
  JoinSpec claimed = Unwell(Spec("j", "n0", 0, 2), "x", ExclusionKind::kNodeLeftOut);
  EXPECT_EQ(ValidateJoinSpec(claimed).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateJoinSpec(Unwell(Spec("j", "n0", 0, 2), "x")).ok());
}

}  // namespace
}  // namespace rdzv

// ---- Hot spares, and nodes lost while the job runs ----

namespace rdzv {
namespace {

JoinSpec WithSpares(JoinSpec spec, int32_t spares, int32_t restart_count = 0) {
  spec.spare_nodes = spares;
  spec.restart_count = restart_count;
  spec.max_restarts = 3;
  return spec;
}

// Nodes n0..n{count-1} of 2 workers each, with `spares` of them spare.
std::vector<JoinSpec> SpareJob(int32_t count, int32_t spares, int32_t restart_count = 0) {
  std::vector<JoinSpec> specs;
  for (int32_t i = 0; i < count; ++i) {
    specs.push_back(
        WithSpares(Spec("j", absl::StrCat("n", i), i, count, 2), spares, restart_count));
  }
  return specs;
}

std::string Ranks(const AssignmentEvent& a) {
  if (a.spare) return "spare";
  return absl::StrCat("node ", a.slot.group_rank, "/", a.group_world_size, " ranks ",
                      a.slot.rank_offset, "-", a.slot.rank_offset + 1, "/", a.world_size);
}

TEST_F(RendezvousStateTest, ASpareWaitsThenTakesALostNodesPlaceAndTheOthersKeepTheirRanks) {
  const Decisions first = JoinAll(0, 1, SpareJob(4, 1));
  std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(first);
  ASSERT_EQ(got.size(), 4u) << Summary(first);
  EXPECT_EQ(Ranks(got.at(1)), "node 0/3 ranks 0-1/6");
  EXPECT_EQ(Ranks(got.at(2)), "node 1/3 ranks 2-3/6");
  EXPECT_EQ(Ranks(got.at(3)), "node 2/3 ranks 4-5/6");
  EXPECT_EQ(Ranks(got.at(4)), "spare");
  EXPECT_EQ(got.at(1).agents, 3);
  std::vector<JobStatusView> status = state_.Status("j");
  ASSERT_EQ(status.size(), 1u);
  EXPECT_EQ(status[0].world_size, 6);
  ASSERT_EQ(status[0].agents.size(), 4u);
  EXPECT_EQ(status[0].agents[0].host, "n3");  // no ranks: sorted first
  EXPECT_EQ(status[0].agents[0].state, "spare");
  EXPECT_EQ(status[0].agents[0].rank_offset, -1);

  // n1's agent is lost (SIGKILL, a dead node): everyone attached hears it, the spare too.
  const Decisions lost = Closed(kSecond, 2);
  const std::map<StreamId, AbortEvent> aborts = EventsOf<AbortEvent>(lost);
  ASSERT_EQ(aborts.size(), 3u) << Summary(lost);
  EXPECT_EQ(aborts.at(4).cause, AbortCause::kAgentLost);
  status = state_.Status("j");
  ASSERT_EQ(status[0].excluded.size(), 1u);
  EXPECT_EQ(DescribeExcluded(status[0].excluded[0]), "n1 (node 1): lost while the job ran");

  // The restart forms as soon as the three that are left are back (the spare first): n1's ranks
  // go to the spare, n0 and n2 keep theirs.
  const std::vector<JoinSpec> again = SpareJob(4, 1, 1);
  EXPECT_TRUE(EventsOf<AssignmentEvent>(Join(2 * kSecond, 14, again[3])).empty());
  // Each agent back hears which node the job lost.
  const Decisions second = Join(2 * kSecond, 13, again[2]);
  ASSERT_EQ(EventsOf<ProgressEvent>(second).count(13), 1u) << Summary(second);
  const ProgressEvent heard = EventsOf<ProgressEvent>(second).at(13);
  ASSERT_EQ(heard.excluded.size(), 1u);
  EXPECT_EQ(heard.excluded[0].why.kind, ExclusionKind::kNodeLost);
  EXPECT_EQ(heard.expected, 3);
  const Decisions restarted = Join(2 * kSecond, 11, again[0]);
  got = EventsOf<AssignmentEvent>(restarted);
  ASSERT_EQ(got.size(), 3u) << Summary(restarted);
  EXPECT_EQ(Ranks(got.at(11)), "node 0/3 ranks 0-1/6");
  EXPECT_EQ(Ranks(got.at(14)), "node 1/3 ranks 2-3/6");
  EXPECT_EQ(Ranks(got.at(13)), "node 2/3 ranks 4-5/6");
  EXPECT_EQ(got.at(11).restart_count, 1);

  // n1's agent, started again, is not taken back.
  JoinSpec back = again[1];
  back.agent.agent_id = "n1/agent-2";
  const absl::Status refused = RefusalOf(Join(3 * kSecond, 12, back), 12);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "lost while the job ran")) << refused;
}

TEST_F(RendezvousStateTest, ASpareThatJoinsAgainHearsItIsStillASpare) {
  JoinAll(0, 1, SpareJob(4, 1));
  // The spare's stream broke and its agent retried the join: it has no ranks to run.
  const Decisions again = Join(kSecond, 14, SpareJob(4, 1)[3]);
  const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(again);
  ASSERT_EQ(got.size(), 1u) << Summary(again);
  EXPECT_EQ(Ranks(got.at(14)), "spare");
  // A seated node that joins again keeps its ranks.
  const Decisions seated = Join(kSecond, 12, SpareJob(4, 1)[1]);
  ASSERT_EQ(EventsOf<AssignmentEvent>(seated).size(), 1u) << Summary(seated);
  EXPECT_EQ(Ranks(EventsOf<AssignmentEvent>(seated).at(12)), "node 1/3 ranks 2-3/6");
}

TEST_F(RendezvousStateTest, ASpareThatClaimsRanksIsRefused) {
  const Decisions first = JoinAll(0, 1, SpareJob(4, 1));
  const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(first);
  ASSERT_EQ(got.size(), 4u) << Summary(first);
  // The spare comes back claiming node 1's ranks (an assignment of an earlier run of the id).
  JoinSpec claim = SpareJob(4, 1)[3];
  claim.resume = got.at(2);
  const absl::Status refused = RefusalOf(Join(kSecond, 14, claim), 14);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "no ranks (a spare)")) << refused;
  // The job runs on, its spare still attached.
  EXPECT_EQ(state_.Status("j").at(0).state, "running");
}

TEST_F(RendezvousStateTest, ASpareTakesThePlaceOfANodeARankAskedOut) {
  JoinAll(0, 1, SpareJob(4, 1));
  Decisions d;
  ASSERT_TRUE(
      state_.Abort(kSecond, "j", AbortEvent{AbortCause::kWorkerFailed, {}, "boom", 1}, d).ok());
  std::vector<JoinSpec> again = SpareJob(4, 1, 1);
  // n1 does not rejoin: a rank asked it out (or its health check failed).
  again[1].unhealthy = Unhealthy{ExclusionKind::kRankRequested, "rank 2: ECC errors"};
  Join(2 * kSecond, 11, again[0]);
  Join(2 * kSecond, 12, again[1]);
  Join(2 * kSecond, 14, again[3]);
  const Decisions restarted = Join(2 * kSecond, 13, again[2]);
  const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(restarted);
  ASSERT_EQ(got.size(), 3u) << Summary(restarted);
  EXPECT_EQ(Ranks(got.at(11)), "node 0/3 ranks 0-1/6");
  EXPECT_EQ(Ranks(got.at(14)), "node 1/3 ranks 2-3/6");
  EXPECT_EQ(Ranks(got.at(13)), "node 2/3 ranks 4-5/6");
}

TEST_F(RendezvousStateTest, SparesAreLetGoWhenTheJobCompletes) {
  JoinAll(0, 1, SpareJob(3, 1));
  Leave(kSecond, "j", "n0/agent");
  const Decisions last = Leave(kSecond, "j", "n1/agent");
  const std::map<StreamId, absl::Status> closes = ClosesOf(last);
  // n1's own stream, and the spare's: cleanly, with no abort.
  ASSERT_EQ(closes.size(), 2u) << Summary(last);
  EXPECT_TRUE(closes.at(3).ok()) << closes.at(3);
  EXPECT_TRUE(last.sends.empty()) << Summary(last);
  // Everyone is gone: the job is forgotten.
  EXPECT_TRUE(state_.Status("j").empty());
}

TEST_F(RendezvousStateTest, ALostSpareLeavesTheJobRunningOneSpareShort) {
  JoinAll(0, 1, SpareJob(4, 2));
  const Decisions lost = Closed(kSecond, 4);  // n3, a spare
  EXPECT_TRUE(IsEmpty(lost)) << Summary(lost);
  std::vector<JobStatusView> status = state_.Status("j");
  EXPECT_EQ(status[0].state, "running");
  ASSERT_EQ(status[0].excluded.size(), 1u);
  EXPECT_EQ(status[0].excluded[0].host, "n3");

  // n0 is lost next: n2, the spare that is left, takes its place.
  Closed(2 * kSecond, 1);
  const std::vector<JoinSpec> again = SpareJob(4, 2, 1);
  Join(3 * kSecond, 12, again[1]);
  const Decisions restarted = Join(3 * kSecond, 13, again[2]);
  const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(restarted);
  ASSERT_EQ(got.size(), 2u) << Summary(restarted);
  EXPECT_EQ(Ranks(got.at(13)), "node 0/2 ranks 0-1/4");
  EXPECT_EQ(Ranks(got.at(12)), "node 1/2 ranks 2-3/4");
}

TEST_F(RendezvousStateTest, WithNoSpareLeftAJobTooSmallEndsNamingEveryLostNode) {
  JoinAll(0, 1, SpareJob(3, 1));
  Closed(kSecond, 2);  // n1: the spare n2 takes its place
  const std::vector<JoinSpec> again = SpareJob(3, 1, 1);
  Join(2 * kSecond, 11, again[0]);
  ASSERT_EQ(EventsOf<AssignmentEvent>(Join(2 * kSecond, 13, again[2])).size(), 2u);
  Closed(3 * kSecond, 11);  // n0: no spare left, and the job runs on 2 nodes
  const std::vector<JoinSpec> third = SpareJob(3, 1, 2);
  const Decisions d = Join(4 * kSecond, 23, third[2]);
  const std::map<StreamId, AbortEvent> aborts = EventsOf<AbortEvent>(d);
  ASSERT_EQ(aborts.count(23), 1u) << Summary(d);
  EXPECT_EQ(aborts.at(23).cause, AbortCause::kNodeUnhealthy);
  EXPECT_EQ(aborts.at(23).exit_code, kExitNodeUnhealthy);
  EXPECT_TRUE(absl::StrContains(aborts.at(23).reason, "needs 2 agents and can now have at most 1"))
      << aborts.at(23).reason;
  EXPECT_TRUE(absl::StrContains(aborts.at(23).reason, "sbatch --exclude=n1,n0"))
      << aborts.at(23).reason;
  EXPECT_TRUE(ClosesOf(d).at(23).ok());
}

TEST_F(RendezvousStateTest, AnElasticJobRestartsAtOnceWithoutANodeItLost) {
  std::vector<JoinSpec> specs;
  for (int i = 0; i < 3; ++i) {
    JoinSpec s = Elastic(Spec("j", absl::StrCat("n", i), i, 3), 2);
    s.last_call = 60 * kSecond;
    specs.push_back(s);
  }
  JoinAll(0, 1, specs);
  Closed(kSecond, 2);
  for (JoinSpec& s : specs) s.restart_count = 1;
  EXPECT_TRUE(EventsOf<AssignmentEvent>(Join(2 * kSecond, 11, specs[0])).empty());
  // No wait for --last-call: the lost node is not coming back to this job.
  const Decisions d = Join(2 * kSecond, 13, specs[2]);
  const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(d);
  ASSERT_EQ(got.size(), 2u) << Summary(d);
  EXPECT_EQ(got.at(13).world_size, 2);
}

TEST_F(RendezvousStateTest, ARequeuedJobForgetsTheNodesItsLastRunLost) {
  std::vector<JoinSpec> specs = {Spec("j", "n0", 0, 2), Spec("j", "n1", 1, 2)};
  JoinAll(0, 1, specs);
  Closed(kSecond, 2);  // the job ends
  Closed(kSecond, 1);
  // The same job id starts over (new agents, restart count 0): n1 is welcome again.
  for (JoinSpec& s : specs) s.agent.agent_id += "-requeued";
  EXPECT_TRUE(IsEmpty(Join(2 * kSecond, 11, specs[1])));
  EXPECT_EQ(EventsOf<AssignmentEvent>(Join(2 * kSecond, 12, specs[0])).size(), 2u);
  EXPECT_TRUE(state_.Status("j").at(0).excluded.empty());
}

TEST_F(RendezvousStateTest, SparesAreRangeCheckedAndTheSameForEveryAgent) {
  JoinSpec all = WithSpares(Spec("j", "n0", 0, 3), 3);
  EXPECT_EQ(ValidateJoinSpec(all).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateJoinSpec(WithSpares(Spec("j", "n0", 0, 3), -1)).code(),
            absl::StatusCode::kInvalidArgument);
  JoinSpec unranked = WithSpares(Spec("j", "n0", -1, 3), 1);
  EXPECT_TRUE(absl::StrContains(ValidateJoinSpec(unranked).message(), "--node-rank"));
  JoinSpec per_task = WithSpares(Spec("j", "n0", 0, 3), 1);
  per_task.agent.order = 0;
  EXPECT_EQ(ValidateJoinSpec(per_task).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateJoinSpec(WithSpares(Spec("j", "n0", 0, 3), 2)).ok());

  // A spare's assignment has no ranks to resume.
  JoinSpec resume = WithSpares(Spec("j", "n2", 2, 3), 1);
  AssignmentEvent held;
  held.round = 1;
  held.agents = 2;
  held.group_world_size = 2;
  held.world_size = 2;
  held.slot.local_world_size = 1;
  held.spare = true;
  resume.resume = held;
  EXPECT_EQ(ValidateJoinSpec(resume).code(), absl::StatusCode::kInvalidArgument);

  EXPECT_TRUE(IsEmpty(Join(0, 1, WithSpares(Spec("j", "n0", 0, 3), 1))));
  const absl::Status other = RefusalOf(Join(0, 2, WithSpares(Spec("j", "n1", 1, 3), 0)), 2);
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(other.message(), "--spare-nodes 0")) << other;
  // A spare takes a lost node's ranks one for one: every node runs as many workers.
  JoinSpec wider = WithSpares(Spec("j", "n2", 2, 3, 4), 1);
  const absl::Status uneven = RefusalOf(Join(0, 3, wider), 3);
  EXPECT_EQ(uneven.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(uneven.message(), "every node runs the same --nproc-per-node"))
      << uneven;
  // Only the server says a node was lost.
  EXPECT_EQ(ValidateJoinSpec(Unwell(Spec("j", "n0", 0, 2), "x", ExclusionKind::kNodeLost)).code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- A restart that needs an agent that already left ----

// Nodes n0..n{count-1} of one worker each, the job's --nnodes `min`:`count`, a minute of
// --last-call (so that an elastic round that forms at once shows it did not wait for it).
std::vector<JoinSpec> Nodes(int32_t count, int32_t min, int32_t restart_count = 0) {
  std::vector<JoinSpec> specs;
  for (int32_t i = 0; i < count; ++i) {
    JoinSpec s = Spec("j", absl::StrCat("n", i), i, count);
    s.min_agents = min;
    s.last_call = 60 * kSecond;
    s.restart_count = restart_count;
    s.max_restarts = 1;
    specs.push_back(s);
  }
  return specs;
}

FailureInfo RankFailed(const std::string& host, int32_t rank, int32_t exit_code) {
  FailureInfo f;
  f.host = host;
  f.rank = rank;
  f.group_rank = rank;
  f.exit_code = exit_code;
  f.stderr_tail = "Segmentation fault";
  return f;
}

class GoneTest : public RendezvousStateTest {
 protected:
  // Forms round 1 of `specs` on streams 1.., then `finished` leave while it runs and `failed`
  // (a node index) reports its rank's exit code 3.
  void Run(const std::vector<JoinSpec>& specs, const std::vector<int>& finished, int failed) {
    for (size_t i = 0; i < specs.size(); ++i) Join(0, 1 + i, specs[i]);
    ASSERT_EQ(state_.Status("j").at(0).state, "running");
    for (int f : finished) Leave(kSecond, "j", specs[f].agent.agent_id);
    Decisions d;
    ASSERT_TRUE(state_
                    .ReportFailure(3 * kSecond, "j", specs[failed].agent.agent_id,
                                   RankFailed(specs[failed].agent.host, failed, 3), d)
                    .ok());
  }

  // The one abort `d` sends to `stream`, which it then closes cleanly.
  AbortEvent EndOf(const Decisions& d, StreamId stream) {
    const std::map<StreamId, AbortEvent> aborts = EventsOf<AbortEvent>(d);
    EXPECT_EQ(aborts.count(stream), 1u) << Summary(d);
    const std::map<StreamId, absl::Status> closes = ClosesOf(d);
    EXPECT_TRUE(closes.contains(stream) && closes.at(stream).ok()) << Summary(d);
    EXPECT_TRUE(EventsOf<AssignmentEvent>(d).empty()) << Summary(d);
    return aborts.contains(stream) ? aborts.at(stream) : AbortEvent{};
  }
};

TEST_F(GoneTest, ARestartThatNeedsAFinishedNodeEndsAtOnceNamingTheFailureAndTheNode) {
  Run(Nodes(2, 2), {0}, 1);
  // n1 restarts: its round could only wait for n0, whose agent has gone.
  const AbortEvent end = EndOf(Join(4 * kSecond, 11, Nodes(2, 2, 1)[1]), 11);
  EXPECT_EQ(end.exit_code, 3);
  EXPECT_EQ(end.cause, AbortCause::kWorkerFailed);
  ASSERT_TRUE(end.first_failure.has_value());
  EXPECT_EQ(end.first_failure->stderr_tail, "Segmentation fault");
  EXPECT_TRUE(absl::StrContains(end.reason,
                                "rank 1 (local rank 0, node 1) on n1 exited with "
                                "code 3"))
      << end.reason;
  EXPECT_TRUE(absl::StrContains(end.reason, "n0 (node 0) had already finished")) << end.reason;
  EXPECT_TRUE(absl::StrContains(end.reason, "needs 2 agents but can now have at most 1"))
      << end.reason;
  EXPECT_EQ(state_.Status("j").at(0).state, "ended");
  // Nothing is left waiting, and the ended job goes after its TTL.
  Tick(4 * kSecond + StateOptions{}.ended_job_ttl);
  EXPECT_EQ(state_.job_count(), 0u);
}

TEST_F(GoneTest, EveryOtherRestartingAgentHearsTheSameEnd) {
  Run(Nodes(3, 3), {0}, 1);
  const std::vector<JoinSpec> again = Nodes(3, 3, 1);
  const AbortEvent first = EndOf(Join(4 * kSecond, 12, again[2]), 12);
  const AbortEvent second = EndOf(Join(4 * kSecond, 11, again[1]), 11);
  EXPECT_EQ(first, second);
  EXPECT_EQ(second.exit_code, 3);
}

TEST_F(GoneTest, AnAgentThatLeavesAfterTheFailureEndsTheRestartWaitingForIt) {
  Run(Nodes(2, 2), {}, 1);
  // n1 restarts first; n0, which heard the abort as its own workers succeeded, leaves.
  EXPECT_TRUE(Join(4 * kSecond, 11, Nodes(2, 2, 1)[1]).sends.empty());
  EXPECT_EQ(state_.Status("j").at(0).state, "filling");
  const AbortEvent end = EndOf(Leave(5 * kSecond, "j", "n0/agent"), 11);
  EXPECT_EQ(end.exit_code, 3);
  EXPECT_TRUE(absl::StrContains(end.reason, "n0 (node 0) had already left the job")) << end.reason;
  EXPECT_TRUE(absl::StrContains(end.reason, "on n1 exited with code 3")) << end.reason;
}

TEST_F(GoneTest, AnAgentThatLeftAfterTheEndIsNotWaitedFor) {
  Run(Nodes(2, 2), {}, 1);
  Leave(4 * kSecond, "j", "n0/agent");  // before n1's restart opens the next round
  const AbortEvent end = EndOf(Join(5 * kSecond, 11, Nodes(2, 2, 1)[1]), 11);
  EXPECT_TRUE(absl::StrContains(end.reason, "n0 (node 0) had already left the job")) << end.reason;
}

TEST_F(GoneTest, AnElasticRestartFormsAtOnceWithoutTheFinishedNode) {
  Run(Nodes(3, 2), {0}, 1);
  const std::vector<JoinSpec> again = Nodes(3, 2, 1);
  EXPECT_TRUE(Join(4 * kSecond, 11, again[1]).sends.empty());
  // No wait for --last-call: n0 is not coming back.
  const Decisions d = Join(4 * kSecond, 12, again[2]);
  const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(d);
  ASSERT_EQ(got.size(), 2u) << Summary(d);
  EXPECT_EQ(got.at(11).world_size, 2);
  EXPECT_EQ(got.at(11).restart_count, 1);
}

TEST_F(GoneTest, AnElasticRestartBelowItsMinimumEndsAtOnce) {
  Run(Nodes(3, 2), {0, 1}, 2);
  const AbortEvent end = EndOf(Join(4 * kSecond, 13, Nodes(3, 2, 1)[2]), 13);
  EXPECT_EQ(end.exit_code, 3);
  EXPECT_TRUE(absl::StrContains(end.reason,
                                "had already finished (its workers succeeded and its "
                                "agent left) (and 1 more agents)"))
      << end.reason;
  EXPECT_TRUE(absl::StrContains(end.reason, "needs 2 agents but can now have at most 1"))
      << end.reason;
}

TEST_F(GoneTest, AWaitingRestartNamesOnlyTheNodesStillToCome) {
  Run(Nodes(4, 2), {0}, 1);
  EXPECT_TRUE(Join(4 * kSecond, 11, Nodes(4, 2, 1)[1]).sends.empty());
  const std::map<StreamId, ProgressEvent> p =
      EventsOf<ProgressEvent>(Tick(4 * kSecond + StateOptions{}.progress_interval));
  ASSERT_EQ(p.count(11), 1u);
  EXPECT_EQ(p.at(11).expected, 3);
  EXPECT_EQ(p.at(11).missing_node_indices, (std::vector<int64_t>{2, 3}));
}

TEST_F(GoneTest, ASpareTakesTheFinishedNodesSeat) {
  std::vector<JoinSpec> specs = SpareJob(3, 1);
  for (JoinSpec& s : specs) s.max_restarts = 1;
  Run(specs, {0}, 1);
  std::vector<JoinSpec> again = SpareJob(3, 1, 1);
  for (JoinSpec& s : again) s.max_restarts = 1;
  EXPECT_TRUE(Join(4 * kSecond, 11, again[1]).sends.empty());
  const Decisions d = Join(4 * kSecond, 12, again[2]);
  const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(d);
  ASSERT_EQ(got.size(), 2u) << Summary(d);
  EXPECT_FALSE(got.at(12).spare);
  EXPECT_EQ(got.at(12).world_size, 4);
}

TEST_F(GoneTest, ARequeuedJobForgetsTheAgentsItsLastRunLostToFinishing) {
  Run(Nodes(2, 2), {0}, 1);
  EndOf(Join(4 * kSecond, 11, Nodes(2, 2, 1)[1]), 11);
  // The same job id again, afresh (new agents, restart count 0): both nodes are welcome.
  std::vector<JoinSpec> requeued = Nodes(2, 2);
  for (JoinSpec& s : requeued) s.agent.agent_id += "-requeued";
  EXPECT_TRUE(IsEmpty(Join(5 * kSecond, 21, requeued[0])));
  EXPECT_EQ(EventsOf<AssignmentEvent>(Join(5 * kSecond, 22, requeued[1])).size(), 2u);
}

// ---- A round whose assignments were lost with its server ----

// An agent whose assignment never reached it (the server was lost just after the round formed)
// joins afresh while the others resume: wherever its join lands first, it gets the ranks the
// round gave it once every agent is back.
TEST_F(ResumeTest, AnAgentThatLostItsAssignmentGetsItsRanksWhenEveryoneIsBack) {
  ASSERT_EQ(EventsOf<AssignmentEvent>(Join(kSecond, 10, Resuming(0))).size(), 1u);
  // n1 joins afresh: it waits, as the round is not whole yet.
  EXPECT_TRUE(IsEmpty(Join(kSecond, 11, specs_[1])));
  EXPECT_EQ(state_.Status("j").at(0).agents.size(), 2u);
  const Decisions d = Join(2 * kSecond, 12, Resuming(2));
  const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(d);
  ASSERT_EQ(got.size(), 2u) << Summary(d);
  EXPECT_EQ(Describe(got.at(11)), Describe(held_[1]));
  EXPECT_EQ(Describe(got.at(12)), Describe(held_[2]));
  EXPECT_TRUE(IsEmpty(Tick(20 * kSecond)));  // no one is missing
  EXPECT_EQ(state_.Status("j").at(0).state, "running");
}

TEST_F(ResumeTest, AFreshJoinThatCameFirstJoinsTheRoundTheOthersBringBack) {
  // n1's fresh join reaches this server before anyone resumes: a round opens for it here...
  Decisions first = Join(kSecond, 11, specs_[1]);
  EXPECT_TRUE(IsEmpty(first)) << Summary(first);
  EXPECT_EQ(state_.Status("j").at(0).state, "filling");
  // ...which is the round the others ran, once the first of them is back.
  const Decisions d0 = Join(2 * kSecond, 10, Resuming(0));
  EXPECT_EQ(EventsOf<AssignmentEvent>(d0).size(), 1u) << Summary(d0);
  EXPECT_TRUE(d0.closes.empty()) << Summary(d0);
  EXPECT_EQ(d0.taken_up, std::vector<std::string>{"j"});
  const Decisions d2 = Join(2 * kSecond, 12, Resuming(2));
  const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(d2);
  ASSERT_EQ(got.size(), 2u) << Summary(d2);
  EXPECT_EQ(Describe(got.at(11)), Describe(held_[1]));
  EXPECT_EQ(state_.Status("j").at(0).world_size, 6);
}

TEST_F(ResumeTest, AFreshJoinerThatNeverGetsItsRanksHearsWhyTheJobEnded) {
  ASSERT_EQ(EventsOf<AssignmentEvent>(Join(kSecond, 10, Resuming(0))).size(), 1u);
  EXPECT_TRUE(IsEmpty(Join(kSecond, 11, specs_[1])));
  // n2 never comes back: at the window's end everyone here hears it, the fresh joiner too.
  const Decisions d = Tick(11 * kSecond);
  const std::map<StreamId, AbortEvent> aborts = EventsOf<AbortEvent>(d);
  ASSERT_EQ(aborts.size(), 2u) << Summary(d);
  EXPECT_TRUE(absl::StrContains(aborts.at(11).reason, "1 of 3 agents did not come back"))
      << aborts.at(11).reason;
}

TEST_F(ResumeTest, AFreshJoinerOfAnotherShapeEndsTheRebuiltJob) {
  ASSERT_EQ(EventsOf<AssignmentEvent>(Join(kSecond, 10, Resuming(0))).size(), 1u);
  ASSERT_EQ(EventsOf<AssignmentEvent>(Join(kSecond, 11, Resuming(1))).size(), 1u);
  // n2 comes back afresh with one worker where the round gave it two: the round it ran cannot
  // be worked out again, and no one waits out the window for it.
  JoinSpec odd = specs_[2];
  odd.agent.nproc = 1;
  const Decisions d = Join(kSecond, 12, odd);
  const std::map<StreamId, AbortEvent> aborts = EventsOf<AbortEvent>(d);
  ASSERT_EQ(aborts.size(), 3u) << Summary(d);
  EXPECT_TRUE(absl::StrContains(aborts.at(12).reason, "rank differently than the round they ran"))
      << aborts.at(12).reason;
  EXPECT_EQ(state_.Status("j").at(0).state, "ended");
}

TEST_F(ResumeTest, EveryJobTakenUpIsSaidOnce) {
  const Decisions d0 = Join(kSecond, 10, Resuming(0));
  EXPECT_EQ(d0.taken_up, std::vector<std::string>{"j"});
  const Decisions d1 = Join(kSecond, 11, Resuming(1));
  EXPECT_TRUE(d1.taken_up.empty());
}

TEST_F(RendezvousStateTest, ASpareFollowsItsJobToAnotherServerAndStaysASpare) {
  RendezvousState before;
  const std::vector<JoinSpec> specs = SpareJob(3, 1);
  Decisions d;
  for (size_t i = 0; i < specs.size(); ++i) before.Join(0, 1 + i, specs[i], d);
  const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(d);
  ASSERT_EQ(got.size(), 3u) << Summary(d);
  ASSERT_TRUE(got.at(3).spare);
  // This server takes the job up: the spare first, then the two nodes.
  std::vector<JoinSpec> back = specs;
  for (size_t i = 0; i < back.size(); ++i) back[i].resume = got.at(1 + i);
  const Decisions spare = Join(kSecond, 13, back[2]);
  ASSERT_EQ(EventsOf<AssignmentEvent>(spare).size(), 1u) << Summary(spare);
  EXPECT_TRUE(EventsOf<AssignmentEvent>(spare).at(13).spare);
  Join(kSecond, 11, back[0]);
  Join(kSecond, 12, back[1]);
  EXPECT_TRUE(IsEmpty(Tick(60 * kSecond)));  // everyone is back; a spare is not awaited
  const JobStatusView view = state_.Status("j").at(0);
  EXPECT_EQ(view.state, "running");
  EXPECT_EQ(view.agents.at(0).state, "spare");
  // A node lost now: the spare takes its place in the restart, as before the move.
  Closed(61 * kSecond, 11);
  std::vector<JoinSpec> again = SpareJob(3, 1, 1);
  Join(62 * kSecond, 23, again[2]);
  const Decisions restarted = Join(62 * kSecond, 22, again[1]);
  const std::map<StreamId, AssignmentEvent> ranks = EventsOf<AssignmentEvent>(restarted);
  ASSERT_EQ(ranks.size(), 2u) << Summary(restarted);
  EXPECT_FALSE(ranks.at(23).spare);
  EXPECT_EQ(ranks.at(23).slot.group_rank, 0);  // n0's seat
  EXPECT_EQ(ranks.at(22).slot.group_rank, 1);
}

TEST_F(RendezvousStateTest, ASpareResumingWithRanksOrWithoutSparesIsRefused) {
  JoinSpec s = SpareJob(3, 1)[2];
  AssignmentEvent held;
  held.round = 1;
  held.agents = 2;
  held.group_world_size = 2;
  held.world_size = 4;
  held.spare = true;
  held.slot.rank_offset = 2;
  s.resume = held;
  EXPECT_EQ(ValidateJoinSpec(s).code(), absl::StatusCode::kInvalidArgument);
  held.slot = Slot{};
  s.resume = held;
  EXPECT_TRUE(ValidateJoinSpec(s).ok()) << ValidateJoinSpec(s);
  s.spare_nodes = 0;
  EXPECT_EQ(ValidateJoinSpec(s).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(GoneTest, AnAgentLostAfterTheFailureIsNotWaitedFor) {
  Run(Nodes(3, 3), {}, 1);
  // n2's agent dies while the others stop their workers: its stream ends without a word.
  EXPECT_TRUE(state_.Awaits(3));
  EXPECT_TRUE(IsEmpty(Closed(3 * kSecond, 3)));
  const AbortEvent end = EndOf(Join(4 * kSecond, 11, Nodes(3, 3, 1)[1]), 11);
  EXPECT_EQ(end.exit_code, 3);
  EXPECT_TRUE(absl::StrContains(end.reason, "n2 (node 2) had already been lost")) << end.reason;
}

TEST_F(GoneTest, AnAwaitedAgentWhoseStreamEndsEndsTheRestartWaitingForIt) {
  Run(Nodes(3, 3), {}, 1);
  const std::vector<JoinSpec> again = Nodes(3, 3, 1);
  EXPECT_TRUE(Join(4 * kSecond, 11, again[1]).sends.empty());
  // n0 comes back; n2 is still stopping its workers on its old stream, then dies.
  EXPECT_TRUE(Join(4 * kSecond, 10, again[0]).sends.empty());
  EXPECT_TRUE(state_.Awaits(3));
  EXPECT_FALSE(state_.Awaits(1));  // n0's old stream ended as it came back
  const Decisions d = Closed(5 * kSecond, 3);
  const AbortEvent end = EndOf(d, 11);
  EXPECT_EQ(EndOf(d, 10), end);
  EXPECT_TRUE(absl::StrContains(end.reason, "n2 (node 2) had already been lost")) << end.reason;
}

TEST_F(GoneTest, AnAwaitedAgentThatComesBackIsNotLostWhenItsOldStreamEnds) {
  Run(Nodes(2, 2), {}, 1);
  const std::vector<JoinSpec> again = Nodes(2, 2, 1);
  EXPECT_TRUE(Join(4 * kSecond, 11, again[1]).sends.empty());
  // n0 rejoins on a new stream before its old one (1) ends: the old one's end changes nothing.
  const Decisions d = Join(4 * kSecond, 10, again[0]);
  EXPECT_EQ(EventsOf<AssignmentEvent>(d).size(), 2u) << Summary(d);
  EXPECT_TRUE(IsEmpty(Closed(4 * kSecond, 1)));
  EXPECT_EQ(state_.Status("j").at(0).state, "running");
}

TEST_F(GoneTest, AnElasticRestartFormsWithoutAnAgentLostMeanwhile) {
  Run(Nodes(3, 2), {}, 1);
  const std::vector<JoinSpec> again = Nodes(3, 2, 1);
  EXPECT_TRUE(Join(4 * kSecond, 11, again[1]).sends.empty());
  EXPECT_TRUE(Join(4 * kSecond, 10, again[0]).sends.empty());
  // n2 dies before coming back: the two others form the round at once, not after --last-call.
  const Decisions d = Closed(5 * kSecond, 3);
  const std::map<StreamId, AssignmentEvent> got = EventsOf<AssignmentEvent>(d);
  ASSERT_EQ(got.size(), 2u) << Summary(d);
  EXPECT_EQ(got.at(10).world_size, 2);
}

}  // namespace
}  // namespace rdzv
