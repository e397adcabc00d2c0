#include "client/agent/core/slurm_worker_env.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/core/env.h"
#include "common/core/slurm_env.h"

namespace rdzv {
namespace {

std::map<std::string, std::string> AsMap(const EnvList& vars) {
  return std::map<std::string, std::string>(vars.begin(), vars.end());
}

struct Case {
  const char* name;
  SlurmWorkerPlace place;
  std::vector<std::string> agent_nodes;  // the agent's step node list
  std::string agent_node;                // the agent's SLURMD_NODENAME
  std::map<std::string, std::string> expected;
};

// What srun sets for the same layout (see the header): the workers of per-node agents must see
// these exact values.
const Case kCases[] = {
    {"two nodes of two, rank 3",
     {3, 1, 1, 4, 2, {2, 2}, {}},
     {"n1", "n2"},
     "n2",
     {{"SLURM_PROCID", "3"},
      {"SLURM_LOCALID", "1"},
      {"SLURM_NODEID", "1"},
      {"SLURM_GTIDS", "2,3"},
      {"SLURM_NTASKS", "4"},
      {"SLURM_NPROCS", "4"},
      {"SLURM_STEP_NUM_TASKS", "4"},
      {"SLURM_NTASKS_PER_NODE", "2"},
      {"SLURM_TASKS_PER_NODE", "2(x2)"},
      {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
      {"SLURM_NNODES", "2"},
      {"SLURM_STEP_NUM_NODES", "2"},
      {"SLURM_NODELIST", "n[1-2]"},
      {"SLURM_STEP_NODELIST", "n[1-2]"}}},
    {"srun -N3 -n7, task 4: uneven, no SLURM_NTASKS_PER_NODE",
     {4, 1, 1, 7, 3, {3, 2, 2}, {}},
     {"n1", "n2", "n3"},
     "n2",
     {{"SLURM_PROCID", "4"},
      {"SLURM_LOCALID", "1"},
      {"SLURM_NODEID", "1"},
      {"SLURM_GTIDS", "3,4"},
      {"SLURM_NTASKS", "7"},
      {"SLURM_NPROCS", "7"},
      {"SLURM_STEP_NUM_TASKS", "7"},
      {"SLURM_TASKS_PER_NODE", "3,2(x2)"},
      {"SLURM_STEP_TASKS_PER_NODE", "3,2(x2)"},
      {"SLURM_NNODES", "3"},
      {"SLURM_STEP_NUM_NODES", "3"},
      {"SLURM_NODELIST", "n[1-3]"},
      {"SLURM_STEP_NODELIST", "n[1-3]"}}},
    {"nodes running 2, 1 and 3 workers, node 0",
     {1, 1, 0, 6, 3, {2, 1, 3}, {}},
     {"n1", "n2", "n3"},
     "n1",
     {{"SLURM_PROCID", "1"},
      {"SLURM_LOCALID", "1"},
      {"SLURM_NODEID", "0"},
      {"SLURM_GTIDS", "0,1"},
      {"SLURM_NTASKS", "6"},
      {"SLURM_NPROCS", "6"},
      {"SLURM_STEP_NUM_TASKS", "6"},
      {"SLURM_TASKS_PER_NODE", "2,1,3"},
      {"SLURM_STEP_TASKS_PER_NODE", "2,1,3"},
      {"SLURM_NNODES", "3"},
      {"SLURM_STEP_NUM_NODES", "3"},
      {"SLURM_NODELIST", "n[1-3]"},
      {"SLURM_STEP_NODELIST", "n[1-3]"}}},
    {"standalone: three workers on this one node",
     {2, 2, 0, 3, 1, {3}, {"n2"}},
     {"n1", "n2", "n3"},
     "n2",
     {{"SLURM_PROCID", "2"},
      {"SLURM_LOCALID", "2"},
      {"SLURM_NODEID", "0"},
      {"SLURM_GTIDS", "0,1,2"},
      {"SLURM_NTASKS", "3"},
      {"SLURM_NPROCS", "3"},
      {"SLURM_STEP_NUM_TASKS", "3"},
      {"SLURM_NTASKS_PER_NODE", "3"},
      {"SLURM_TASKS_PER_NODE", "3"},
      {"SLURM_STEP_TASKS_PER_NODE", "3"},
      {"SLURM_NNODES", "1"},
      {"SLURM_STEP_NUM_NODES", "1"},
      {"SLURM_NODELIST", "n2"},
      {"SLURM_STEP_NODELIST", "n2"}}},
    {"a job on other nodes than the step: no node list",
     {0, 0, 0, 6, 3, {2, 2, 2}, {}},
     {"n1"},
     "n1",
     {{"SLURM_PROCID", "0"},
      {"SLURM_LOCALID", "0"},
      {"SLURM_NODEID", "0"},
      {"SLURM_GTIDS", "0,1"},
      {"SLURM_NTASKS", "6"},
      {"SLURM_NPROCS", "6"},
      {"SLURM_STEP_NUM_TASKS", "6"},
      {"SLURM_NTASKS_PER_NODE", "2"},
      {"SLURM_TASKS_PER_NODE", "2(x3)"},
      {"SLURM_STEP_TASKS_PER_NODE", "2(x3)"},
      {"SLURM_NNODES", "3"},
      {"SLURM_STEP_NUM_NODES", "3"}}},
    {"nodes ordered otherwise than the list (--node-rank, mpirun): no node list",
     {0, 0, 0, 2, 2, {1, 1}, {}},
     {"n1", "n2"},
     "n2",
     {{"SLURM_PROCID", "0"},
      {"SLURM_LOCALID", "0"},
      {"SLURM_NODEID", "0"},
      {"SLURM_GTIDS", "0"},
      {"SLURM_NTASKS", "2"},
      {"SLURM_NPROCS", "2"},
      {"SLURM_STEP_NUM_TASKS", "2"},
      {"SLURM_NTASKS_PER_NODE", "1"},
      {"SLURM_TASKS_PER_NODE", "1(x2)"},
      {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
      {"SLURM_NNODES", "2"},
      {"SLURM_STEP_NUM_NODES", "2"}}},
    {"this node unknown (an salloc shell off the nodes): no node list",
     {1, 1, 0, 2, 1, {2}, {}},
     {"n1"},
     "",
     {{"SLURM_PROCID", "1"},
      {"SLURM_LOCALID", "1"},
      {"SLURM_NODEID", "0"},
      {"SLURM_GTIDS", "0,1"},
      {"SLURM_NTASKS", "2"},
      {"SLURM_NPROCS", "2"},
      {"SLURM_STEP_NUM_TASKS", "2"},
      {"SLURM_NTASKS_PER_NODE", "2"},
      {"SLURM_TASKS_PER_NODE", "2"},
      {"SLURM_STEP_TASKS_PER_NODE", "2"},
      {"SLURM_NNODES", "1"},
      {"SLURM_STEP_NUM_NODES", "1"}}},
    {"named nodes win over the step's",
     {5, 1, 2, 6, 3, {2, 2, 2}, {"a1", "b7", "a2"}},
     {"n1"},
     "a2",
     {{"SLURM_PROCID", "5"},
      {"SLURM_LOCALID", "1"},
      {"SLURM_NODEID", "2"},
      {"SLURM_GTIDS", "4,5"},
      {"SLURM_NTASKS", "6"},
      {"SLURM_NPROCS", "6"},
      {"SLURM_STEP_NUM_TASKS", "6"},
      {"SLURM_NTASKS_PER_NODE", "2"},
      {"SLURM_TASKS_PER_NODE", "2(x3)"},
      {"SLURM_STEP_TASKS_PER_NODE", "2(x3)"},
      {"SLURM_NNODES", "3"},
      {"SLURM_STEP_NUM_NODES", "3"},
      {"SLURM_NODELIST", "a1,b7,a2"},
      {"SLURM_STEP_NODELIST", "a1,b7,a2"}}},
    {"unknown per-node counts: ranks and sizes only",
     {2, 0, 1, 5, 2, {}, {}},
     {},
     "n2",
     {{"SLURM_PROCID", "2"},
      {"SLURM_LOCALID", "0"},
      {"SLURM_NODEID", "1"},
      {"SLURM_NTASKS", "5"},
      {"SLURM_NPROCS", "5"},
      {"SLURM_STEP_NUM_TASKS", "5"},
      {"SLURM_NNODES", "2"},
      {"SLURM_STEP_NUM_NODES", "2"}}},
};

TEST(SlurmWorkerVariablesTest, MatchWhatSrunSets) {
  for (const Case& c : kCases) {
    SlurmEnv agent;
    agent.nodes = c.agent_nodes;
    agent.node_name = c.agent_node;
    absl::StatusOr<EnvList> vars = SlurmWorkerVariables(c.place, agent);
    ASSERT_TRUE(vars.ok()) << c.name << ": " << vars.status();
    EXPECT_EQ(AsMap(*vars), c.expected) << c.name;
    for (const auto& [name, value] : *vars) {
      bool listed = false;
      for (std::string_view v : kSlurmTaskLayoutVariables) listed = listed || v == name;
      EXPECT_TRUE(listed) << name << " is set but not in kSlurmTaskLayoutVariables";
    }
  }
}

TEST(SlurmWorkerVariablesTest, ParseBackToTheWorkersRanks) {
  // Every worker of a 3-node job with 3, 1 and 2 workers: Slurm's own parser reads its ranks.
  const std::vector<int> counts = {3, 1, 2};
  int rank = 0;
  for (int node = 0; node < 3; ++node) {
    for (int local = 0; local < counts[node]; ++local, ++rank) {
      SlurmEnv agent;
      agent.nodes = {"n1", "n2", "n3"};
      agent.node_name = agent.nodes[node];
      absl::StatusOr<EnvList> vars =
          SlurmWorkerVariables({rank, local, node, 6, 3, counts, {}}, agent);
      ASSERT_TRUE(vars.ok()) << vars.status();
      EnvList env = *vars;
      env.emplace_back("SLURM_JOB_ID", "7");
      env.emplace_back("SLURM_STEP_ID", "0");
      absl::StatusOr<std::optional<SlurmEnv>> parsed = ParseSlurmEnv(EnvFromList(env));
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      ASSERT_TRUE(parsed->has_value());
      EXPECT_EQ((*parsed)->proc_id, rank);
      EXPECT_EQ((*parsed)->local_id, local);
      EXPECT_EQ((*parsed)->node_id, node);
      EXPECT_EQ((*parsed)->num_tasks, 6);
      EXPECT_EQ((*parsed)->tasks_per_node, counts);
    }
  }
}

TEST(SlurmWorkerVariablesTest, RejectsInconsistentPlaces) {
  const struct {
    SlurmWorkerPlace place;
    const char* why;
  } bad[] = {
      {{0, 0, 0, 0, 1, {1}, {}}, "at least one node and one worker"},
      {{0, 0, 0, 2, 1, {1, 1}, {}}, "2 worker counts for 1 nodes"},
      {{0, 0, 2, 2, 2, {1, 1}, {}}, "node index is outside"},
      {{0, 0, 0, 3, 2, {1, 1}, {}}, "run 2 workers in all"},
      {{2, 1, 1, 4, 2, {2, 2}, {}}, "start at 2, so local rank 1 is rank 3"},
      {{3, 2, 1, 4, 2, {2, 2}, {}}, "local rank is outside"},
      {{0, 0, 0, 2, 2, {1, 1}, {"n1"}}, "1 node names for 2 nodes"},
      {{5, 0, 0, 4, 2, {}, {}}, "rank is outside the world"},
  };
  for (const auto& b : bad) {
    absl::StatusOr<EnvList> vars = SlurmWorkerVariables(b.place, SlurmEnv{});
    ASSERT_FALSE(vars.ok()) << b.why;
    EXPECT_NE(vars.status().message().find(b.why), std::string::npos) << vars.status();
  }
}

EnvList Torchrun(int rank, int local, int group, int world, int groups, int local_world) {
  return {{"RANK", absl::StrCat(rank)},
          {"LOCAL_RANK", absl::StrCat(local)},
          {"GROUP_RANK", absl::StrCat(group)},
          {"WORLD_SIZE", absl::StrCat(world)},
          {"GROUP_WORLD_SIZE", absl::StrCat(groups)},
          {"LOCAL_WORLD_SIZE", absl::StrCat(local_world)}};
}

TEST(PlaceFromWorkerVariablesTest, TakesCountsFromTheAssignmentElseTheStep) {
  const struct {
    const char* name;
    EnvList vars;
    std::string assigned;         // the round's workers_per_node
    std::vector<int> step_tasks;  // the agent's step's tasks per node
    bool in_step;
    std::vector<int> expected;
  } cases[] = {
      {"per-node, even", Torchrun(3, 1, 1, 4, 2, 2), "2(x2)", {1, 1}, true, {2, 2}},
      {"2, 1 and 3 workers, node 0",
       Torchrun(1, 1, 0, 6, 3, 2),
       "2,1,3",
       {1, 1, 1},
       true,
       {2, 1, 3}},
      {"2, 1 and 3 workers, node 2",
       Torchrun(5, 2, 2, 6, 3, 3),
       "2,1,3",
       {1, 1, 1},
       true,
       {2, 1, 3}},
      // Node 0 of 2, 1 and 3 workers looks like 2 on every node: not guessed.
      {"uneven and unknown", Torchrun(1, 1, 0, 6, 3, 2), "", {1, 1, 1}, true, {}},
      {"per-task srun -N2 -n3, from the assignment",
       Torchrun(2, 0, 1, 3, 2, 1),
       "2,1",
       {2, 1},
       true,
       {2, 1}},
      {"per-task srun -N2 -n3, from the step",
       Torchrun(2, 0, 1, 3, 2, 1),
       "",
       {2, 1},
       true,
       {2, 1}},
      {"a batch script's counts are the allocation's",
       Torchrun(2, 0, 1, 3, 2, 1),
       "",
       {2, 1},
       false,
       {}},
      {"counts that disagree with the ranks",
       Torchrun(3, 0, 1, 4, 2, 1),
       "2(x2)",
       {1, 1},
       true,
       {}},
      {"malformed counts", Torchrun(3, 1, 1, 4, 2, 2), "2(x", {}, true, {}},
  };
  for (const auto& c : cases) {
    SlurmEnv agent;
    agent.tasks_per_node = c.step_tasks;
    if (c.in_step) {
      agent.step_id = "0";
      agent.proc_id = 0;
    }
    absl::StatusOr<SlurmWorkerPlace> place = PlaceFromWorkerVariables(c.vars, agent, c.assigned);
    ASSERT_TRUE(place.ok()) << c.name << ": " << place.status();
    EXPECT_EQ(place->workers_per_node, c.expected) << c.name;
    EXPECT_TRUE(SlurmWorkerVariables(*place, agent).ok()) << c.name;
  }
}

TEST(PlaceFromWorkerVariablesTest, NamesAMissingVariable) {
  EnvList vars = Torchrun(0, 0, 0, 1, 1, 1);
  vars.erase(vars.begin() + 1);
  EXPECT_EQ(PlaceFromWorkerVariables(vars, SlurmEnv{}, "").status().message(),
            "LOCAL_RANK is not set");
  vars = Torchrun(0, 0, 0, 1, 1, 1);
  vars[0].second = "x";
  EXPECT_EQ(PlaceFromWorkerVariables(vars, SlurmEnv{}, "").status().message(),
            "RANK=\"x\" is not a number");
}

}  // namespace
}  // namespace rdzv
