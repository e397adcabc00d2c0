#include "common/core/rank_assignment.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace rdzv {
namespace {

AgentSpec Agent(std::string host, int64_t node_index, int32_t nproc, int64_t order = -1) {
  AgentSpec a;
  a.agent_id = absl::StrCat("agent-", host, "-", order);
  a.host = std::move(host);
  a.node_index = node_index;
  a.order = order;
  a.nproc = nproc;
  return a;
}

// Renders a slot, so that a mismatch shows every field.
std::string Describe(const Slot& s) {
  return absl::StrCat("rank_offset=", s.rank_offset, " group_rank=", s.group_rank,
                      " local_rank_offset=", s.local_rank_offset,
                      " local_world_size=", s.local_world_size);
}

struct AssignCase {
  std::string name;
  std::vector<AgentSpec> agents;
  std::vector<Slot> want;  // one per agent, same index
  int32_t world_size;
  int32_t group_world_size;
  int32_t master_agent;
};

class AssignRanksTest : public testing::TestWithParam<AssignCase> {};

TEST_P(AssignRanksTest, GivesEveryAgentItsSlot) {
  const AssignCase& c = GetParam();
  absl::StatusOr<RankTable> table = AssignRanks(c.agents);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->world_size, c.world_size);
  EXPECT_EQ(table->group_world_size, c.group_world_size);
  EXPECT_EQ(table->master_agent, c.master_agent);
  ASSERT_EQ(table->slots.size(), c.agents.size());
  for (size_t i = 0; i < c.agents.size(); ++i) {
    EXPECT_EQ(Describe(table->slots[i]), Describe(c.want[i])) << "agent on " << c.agents[i].host;
  }
  EXPECT_EQ(table->slots[table->master_agent].rank_offset, 0);
  // Every node's count is the local world size of its agents.
  ASSERT_EQ(table->workers_per_node.size(), static_cast<size_t>(c.group_world_size));
  for (const Slot& s : table->slots) {
    EXPECT_EQ(table->workers_per_node[s.group_rank], s.local_world_size);
  }
}

// Slot{rank_offset, group_rank, local_rank_offset, local_world_size}
INSTANTIATE_TEST_SUITE_P(
    Cases, AssignRanksTest,
    testing::Values(
        AssignCase{"Homogeneous3x2",
                   {Agent("n0", 0, 2), Agent("n1", 1, 2), Agent("n2", 2, 2)},
                   {{0, 0, 0, 2}, {2, 1, 0, 2}, {4, 2, 0, 2}},
                   6,
                   3,
                   0},
        AssignCase{"HeterogeneousWorkerCounts",
                   {Agent("n0", 0, 4), Agent("n1", 1, 2), Agent("n2", 2, 1)},
                   {{0, 0, 0, 4}, {4, 1, 0, 2}, {6, 2, 0, 1}},
                   7,
                   3,
                   0},
        AssignCase{"OrderedByNodeIndexNotInput",
                   {Agent("a", 2, 1), Agent("b", 0, 2), Agent("c", 1, 3)},
                   {{5, 2, 0, 1}, {0, 0, 0, 2}, {2, 1, 0, 3}},
                   6,
                   3,
                   1},
        AssignCase{"NodeIndexBeatsHostName",
                   {Agent("zeta", 0, 1), Agent("alpha", 1, 1)},
                   {{0, 0, 0, 1}, {1, 1, 0, 1}},
                   2,
                   2,
                   0},
        AssignCase{"OrderedByHostNameWithoutNodeIndex",
                   {Agent("gpu03", -1, 2), Agent("gpu01", -1, 2), Agent("gpu02", -1, 2)},
                   {{4, 2, 0, 2}, {0, 0, 0, 2}, {2, 1, 0, 2}},
                   6,
                   3,
                   1},
        AssignCase{"SparseNodeIndicesBecomeDense",
                   {Agent("n5", 5, 1), Agent("n0", 0, 1), Agent("n2", 2, 1)},
                   {{2, 2, 0, 1}, {0, 0, 0, 1}, {1, 1, 0, 1}},
                   3,
                   3,
                   1},
        // Per-task mode: order = SLURM_PROCID, node index = SLURM_NODEID, one worker each.
        AssignCase{"PerTaskBlock2x2",
                   {Agent("n0", 0, 1, 0), Agent("n0", 0, 1, 1), Agent("n1", 1, 1, 2),
                    Agent("n1", 1, 1, 3)},
                   {{0, 0, 0, 2}, {1, 0, 1, 2}, {2, 1, 0, 2}, {3, 1, 1, 2}},
                   4,
                   2,
                   0},
        AssignCase{"PerTaskUneven2Plus1",
                   {Agent("n1", 1, 1, 2), Agent("n0", 0, 1, 1), Agent("n0", 0, 1, 0)},
                   {{2, 1, 0, 1}, {1, 0, 1, 2}, {0, 0, 0, 2}},
                   3,
                   2,
                   2},
        AssignCase{"PerTaskCyclic",
                   {Agent("n0", 0, 1, 0), Agent("n1", 1, 1, 1), Agent("n0", 0, 1, 2),
                    Agent("n1", 1, 1, 3)},
                   {{0, 0, 0, 2}, {1, 1, 0, 2}, {2, 0, 1, 2}, {3, 1, 1, 2}},
                   4,
                   2,
                   0},
        AssignCase{"PerTaskSeveralWorkersPerTask",
                   {Agent("n0", 0, 2, 0), Agent("n0", 0, 2, 1), Agent("n1", 1, 2, 2)},
                   {{0, 0, 0, 4}, {2, 0, 2, 4}, {4, 1, 0, 2}},
                   6,
                   2,
                   0},
        AssignCase{"SingleAgent", {Agent("solo", -1, 8)}, {{0, 0, 0, 8}}, 8, 1, 0}),
    [](const testing::TestParamInfo<AssignCase>& info) { return info.param.name; });

// The result for each agent must not depend on the order in which the agents arrived.
TEST(AssignRanksOrderTest, EveryInputOrderGivesTheSameSlots) {
  const std::vector<std::vector<AgentSpec>> jobs = {
      {Agent("n0", 0, 4), Agent("n1", 1, 2), Agent("n2", 2, 1), Agent("n3", 3, 3)},
      {Agent("d", -1, 1), Agent("b", -1, 2), Agent("a", -1, 3), Agent("c", -1, 4)},
      {Agent("n0", 0, 1, 0), Agent("n1", 1, 1, 1), Agent("n0", 0, 1, 2), Agent("n1", 1, 1, 3)},
  };
  for (const std::vector<AgentSpec>& job : jobs) {
    absl::StatusOr<RankTable> reference = AssignRanks(job);
    ASSERT_TRUE(reference.ok()) << reference.status();
    std::map<std::string, std::string> want;
    for (size_t i = 0; i < job.size(); ++i) {
      want[job[i].agent_id] = Describe(reference->slots[i]);
    }
    const std::string master = job[reference->master_agent].agent_id;

    std::vector<size_t> perm(job.size());
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = i;
    int orders = 0;
    do {
      std::vector<AgentSpec> shuffled;
      for (size_t i : perm) shuffled.push_back(job[i]);
      absl::StatusOr<RankTable> table = AssignRanks(shuffled);
      ASSERT_TRUE(table.ok()) << table.status();
      EXPECT_EQ(table->world_size, reference->world_size);
      EXPECT_EQ(table->group_world_size, reference->group_world_size);
      EXPECT_EQ(shuffled[table->master_agent].agent_id, master);
      for (size_t i = 0; i < shuffled.size(); ++i) {
        EXPECT_EQ(Describe(table->slots[i]), want[shuffled[i].agent_id])
            << "agent " << shuffled[i].agent_id << " in input order " << orders;
      }
      ++orders;
    } while (std::next_permutation(perm.begin(), perm.end()));
    EXPECT_EQ(orders, 24);
  }
}

// Every global rank 0..world_size-1 is held by exactly one worker, and every local rank
// 0..local_world_size-1 on a node by exactly one worker there.
TEST(AssignRanksOrderTest, RanksAreAPartition) {
  const std::vector<AgentSpec> agents = {Agent("n1", 1, 3, 5), Agent("n0", 0, 2, 0),
                                         Agent("n1", 1, 1, 2), Agent("n0", 0, 4, 3),
                                         Agent("n2", 2, 2, 4), Agent("n0", 0, 1, 1)};
  absl::StatusOr<RankTable> table = AssignRanks(agents);
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->world_size, 13);
  std::vector<int> global(table->world_size, 0);
  std::map<int32_t, std::vector<int>> local;  // group rank -> count per local rank
  for (size_t i = 0; i < agents.size(); ++i) {
    const Slot& s = table->slots[i];
    std::vector<int>& on_node = local[s.group_rank];
    on_node.resize(s.local_world_size, 0);
    for (int32_t w = 0; w < agents[i].nproc; ++w) {
      ASSERT_LT(s.rank_offset + w, table->world_size);
      ++global[s.rank_offset + w];
      ASSERT_LT(s.local_rank_offset + w, s.local_world_size);
      ++on_node[s.local_rank_offset + w];
    }
  }
  EXPECT_EQ(std::count(global.begin(), global.end(), 1), table->world_size);
  ASSERT_EQ(local.size(), 3u);
  EXPECT_EQ(local[0], std::vector<int>(7, 1));
  EXPECT_EQ(local[1], std::vector<int>(4, 1));
  EXPECT_EQ(local[2], std::vector<int>(2, 1));
}

TEST(AssignRanksOrderTest, NoAgentsIsAnEmptyTable) {
  absl::StatusOr<RankTable> table = AssignRanks(std::vector<AgentSpec>{});
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->world_size, 0);
  EXPECT_TRUE(table->slots.empty());
}

struct ErrorCase {
  std::string name;
  std::vector<AgentSpec> agents;
  std::vector<std::string> message_has;
};

class AssignRanksErrorTest : public testing::TestWithParam<ErrorCase> {};

TEST_P(AssignRanksErrorTest, RefusesWithAClearMessage) {
  const ErrorCase& c = GetParam();
  absl::StatusOr<RankTable> table = AssignRanks(c.agents);
  ASSERT_FALSE(table.ok());
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument) << table.status();
  for (const std::string& part : c.message_has) {
    EXPECT_TRUE(absl::StrContains(table.status().message(), part))
        << "missing \"" << part << "\" in: " << table.status().message();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AssignRanksErrorTest,
    testing::Values(
        ErrorCase{"DuplicateNodeIndex",
                  {Agent("n0", 0, 1), Agent("n1", 1, 1), Agent("other", 1, 1)},
                  {"node rank 1", "n1", "other", "--node-rank"}},
        ErrorCase{"DuplicateOrder",
                  {Agent("n0", 0, 1, 0), Agent("n1", 1, 1, 1), Agent("n2", 1, 1, 1)},
                  {"global position 1", "n1", "n2"}},
        ErrorCase{"MixedGivenAndMissingNodeIndex",
                  {Agent("n0", 0, 1), Agent("loose", -1, 1)},
                  {"n0", "loose", "--node-rank"}},
        ErrorCase{"MixedGivenAndMissingOrder",
                  {Agent("n0", 0, 1, 0), Agent("loose", 1, 1)},
                  {"n0", "loose", "global order"}},
        ErrorCase{"ZeroWorkers", {Agent("n0", 0, 2), Agent("idle", 1, 0)}, {"idle", "0 workers"}},
        ErrorCase{"NegativeWorkers", {Agent("neg", -1, -3)}, {"neg", "-3 workers"}},
        ErrorCase{"WorkersBeyond32BitRanks",
                  {Agent("n0", 0, std::numeric_limits<int32_t>::max()), Agent("n1", 1, 1)},
                  {"the 2 agents run 2147483648 workers in all, over the limit of 2147483647 "
                   "ranks; lower --nnodes or --nproc-per-node"}}),
    [](const testing::TestParamInfo<ErrorCase>& info) { return info.param.name; });

// As many agents as it takes, each with as many workers as an agent may run, to pass the ranks
// that 32 bits hold; one fewer fits exactly up to the last rank.
TEST(AssignRanksLimitTest, ManyAgentsOfTheMostWorkersPassThe32BitRanks) {
  constexpr int32_t kWorkers = 4096;
  constexpr int64_t kFit = std::numeric_limits<int32_t>::max() / kWorkers;  // 524287
  std::vector<AgentSpec> agents;
  agents.reserve(kFit + 1);
  for (int64_t i = 0; i < kFit; ++i) agents.push_back(Agent(absl::StrCat("n", i), i, kWorkers));
  absl::StatusOr<RankTable> fits = AssignRanks(agents);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(fits->world_size, kFit * kWorkers);
  EXPECT_EQ(fits->slots.back().rank_offset, (kFit - 1) * kWorkers);

  agents.push_back(Agent("one-more", kFit, kWorkers));
  absl::StatusOr<RankTable> over = AssignRanks(agents);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(over.status().message(),
            "the 524288 agents run 2147483648 workers in all, over the limit of 2147483647 ranks; "
            "lower --nnodes or --nproc-per-node");
}

}  // namespace
}  // namespace rdzv
