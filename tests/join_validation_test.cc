#include "common/core/join_validation.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"

namespace rdzv {
namespace {

JoinSpec Spec(int32_t min_agents, int32_t max_agents, int32_t spare_nodes = 0) {
  JoinSpec s;
  s.job_id = "j";
  s.agent = AgentSpec{"a", "n7", 1, -1, 4};
  s.min_agents = min_agents;
  s.max_agents = max_agents;
  s.spare_nodes = spare_nodes;
  return s;
}

// A refusal names what to change; an agreement is OK.
struct Case {
  const char* name;
  absl::Status status;
  const char* says;  // nullptr: OK
};

void Check(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    if (c.says == nullptr) {
      EXPECT_TRUE(c.status.ok()) << c.status;
      continue;
    }
    EXPECT_EQ(c.status.code(), absl::StatusCode::kFailedPrecondition) << c.status;
    EXPECT_TRUE(absl::StrContains(c.status.message(), c.says)) << c.status;
  }
}

TEST(JoinValidationTest, AJoinAgreesWithTheTermsTheFirstAgentSet) {
  const JobTerms terms{2, 4, 0, 3};
  JoinSpec restarts = Spec(2, 4);
  restarts.max_restarts = 5;
  JoinSpec unstated = Spec(2, 4);
  Check({
      {"same", SameSizes("j", terms, Spec(2, 4)), nullptr},
      {"nnodes", SameSizes("j", terms, Spec(4, 4)),
       "expects --nnodes 4 but job j was started "
       "with --nnodes 2:4"},
      {"spares", SameSizes("j", terms, Spec(2, 4, 1)), "--spare-nodes 1 but job j"},
      {"restarts", SameMaxRestarts("j", terms, restarts),
       "--max-restarts 5 but job j was "
       "started with --max-restarts 3"},
      {"unstated", SameMaxRestarts("j", terms, unstated), nullptr},
      {"none held", SameMaxRestarts("j", JobTerms{2, 4, 0, {}}, restarts), nullptr},
  });
}

TEST(JoinValidationTest, ANewcomerRanksAsTheOthersDo) {
  const AgentSpec ranked{"a", "n7", 1, -1, 4};
  const AgentSpec unranked{"a", "n7", -1, -1, 4};
  const AgentSpec per_task{"a", "n7", 1, 3, 4};
  const AgentSpec wider{"a", "n7", 1, -1, 8};
  const RankInput other{"b", "n0", 0, -1, 4};
  Check({
      {"same", SameRanking("j", 0, other, ranked), nullptr},
      {"node rank", SameRanking("j", 0, other, unranked), "pass --node-rank to every agent"},
      {"mode", SameRanking("j", 0, other, per_task), "in the same --mode"},
      {"workers", SameRanking("j", 0, other, wider), nullptr},
      {"workers with spares", SameRanking("j", 1, other, wider),
       "runs 8 workers but the agent "
       "on n0"},
  });
}

TEST(JoinValidationTest, AnAgentKeepsItsShapeAndARoundItsPlaces) {
  AgentRecord held;
  held.nproc = 4;
  held.node_index = 1;
  Check({
      {"same", SameShape("j", "a", held, AgentSpec{"a", "n7", 1, -1, 4}), nullptr},
      {"nproc", SameShape("j", "a", held, AgentSpec{"a", "n7", 1, -1, 2}),
       "--nproc-per-node 4 and now asks for 2"},
      {"node rank", SameShape("j", "a", held, AgentSpec{"a", "n7", 2, -1, 4}),
       "--node-rank 1 and now asks for 2"},
      {"claim", ClaimTaken("j", AgentSpec{"a", "n7", 1, -1, 4}, 1, "n1"),
       "node rank 1 of job j is already taken by the agent on n1"},
      {"position", ClaimTaken("j", AgentSpec{"a", "n7", 1, 5, 4}, 5, "n1"),
       "global position 5 of job j"},
      {"too many", OneTooMany("j", 4, "n7"), "already has all 4 agents"},
      {"too late", TooLate("j", 2, 4, "n7"), "already started (round 2, 4 agents)"},
  });
  JoinSpec master = Spec(2, 4);
  master.master_addr_override = "10.0.0.1";
  master.master_port_override = 29500;
  Check({{"master", MasterDiffers(master, "n0", "10.0.0.2", 29500),
          "sets the master to 10.0.0.1:29500 but the agent on n0 set 10.0.0.2:29500"}});
}

TEST(JoinValidationTest, AResumingAgentRunsTheJobsRound) {
  AssignmentEvent runs;
  runs.round = 3;
  runs.master_addr = "10.0.0.1";
  runs.master_port = 29500;
  runs.group_world_size = 2;
  runs.agents = 2;
  AssignmentEvent other_master = runs;
  other_master.master_port = 29501;
  AssignmentEvent restarted = runs;
  restarted.restart_count = 1;
  AgentRecord member;
  member.slot.rank_offset = 4;
  AssignmentEvent held = runs;
  held.slot.rank_offset = 4;
  AssignmentEvent moved = runs;
  moved.slot.rank_offset = 0;
  AssignmentEvent spare = runs;
  spare.spare = true;
  spare.slot = Slot{};
  Check({
      {"same", SameRun("j", runs, held, "n1"), nullptr},
      {"master", SameRun("j", runs, other_master, "n1"),
       "with master 10.0.0.1:29501, but the job runs with master 10.0.0.1:29500"},
      {"restart", SameRun("j", runs, restarted, "n1"), "restart count 1"},
      {"ranks", SameRanks("j", member, held, "n1"), nullptr},
      {"other ranks", SameRanks("j", member, moved, "n1"),
       "with rank 0, but the job gave it rank 4"},
      {"a spare's", SameRanks("j", member, spare, "n1"), "with no ranks (a spare)"},
  });
}

}  // namespace
}  // namespace rdzv
