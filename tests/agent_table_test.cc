#include "common/core/agent_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace rdzv {
namespace {

AgentSpec Agent(std::string id, std::string host, int64_t node_index = -1, int64_t order = -1,
                int32_t nproc = 1) {
  AgentSpec a;
  a.agent_id = std::move(id);
  a.host = std::move(host);
  a.node_index = node_index;
  a.order = order;
  a.nproc = nproc;
  return a;
}

// Renders a spec, so that a mismatch shows every field.
std::string Describe(const AgentSpec& a) {
  return absl::StrCat("id=", a.agent_id, " host=", a.host, " node=", a.node_index,
                      " order=", a.order, " nproc=", a.nproc);
}

std::vector<AgentTable::Index> Indices(const AgentTable& table) {
  return std::vector<AgentTable::Index>(table.begin(), table.end());
}

TEST(AgentTableTest, RecordIsFortyEightBytes) { EXPECT_EQ(sizeof(AgentRecord), 48u); }

struct RoundTripCase {
  std::string name;
  AgentSpec agent;
};

class AgentTableRoundTripTest : public testing::TestWithParam<RoundTripCase> {};

TEST_P(AgentTableRoundTripTest, GivesBackTheSpecItWasGiven) {
  const AgentSpec& agent = GetParam().agent;
  AgentTable table;
  // Neighbours on both sides: a name must not run into the next.
  table.Add(Agent("before", "b"));
  const AgentTable::Index i = table.Add(agent);
  table.Add(Agent("after", "a"));
  EXPECT_EQ(Describe(table.Spec(i)), Describe(agent));
  EXPECT_EQ(table.agent_id(i), agent.agent_id);
  EXPECT_EQ(table.host(i), agent.host);
  EXPECT_EQ(table.Find(agent.agent_id), i);
  EXPECT_EQ(table[i].node_index, agent.node_index);
  EXPECT_EQ(table[i].order, agent.order);
  EXPECT_EQ(table[i].nproc, agent.nproc);
  // A fresh record: attached nowhere, no place yet, gone nowhere.
  EXPECT_EQ(table[i].stream, 0u);
  EXPECT_EQ(table[i].slot, Slot{});
  EXPECT_FALSE(table[i].left || table[i].finished || table[i].lost || table[i].spare ||
               table[i].unranked || table[i].gave_master_addr || table[i].gave_master_port);
}

INSTANTIATE_TEST_SUITE_P(
    Agents, AgentTableRoundTripTest,
    testing::Values(
        RoundTripCase{"PerNode", Agent("gpu-node-01234:123456:deadbeef", "gpu-node-01234", 1234)},
        RoundTripCase{"PerTask", Agent("n7:99:0badf00d", "n7", 7, 56, 1)},
        RoundTripCase{"NoIndex", Agent("a", "h")}, RoundTripCase{"Empty", Agent("", "")},
        RoundTripCase{"EmptyHost", Agent("x", "")},
        // A length of 127 takes one byte, 128 two, 16,384 three.
        RoundTripCase{"Long127", Agent(std::string(127, 'i'), std::string(127, 'h'), 0)},
        RoundTripCase{"Long128", Agent(std::string(128, 'i'), std::string(128, 'h'), 0)},
        RoundTripCase{"Long16384", Agent(std::string(16384, 'i'), std::string(300, 'h'), 0)},
        RoundTripCase{"Binary", Agent(std::string("a\0b\x80\xff", 5), std::string("\x7f\x80", 2))},
        RoundTripCase{"Largest", Agent("big", "big", 2'147'483'646, 2'147'483'646, 4096)}),
    [](const testing::TestParamInfo<RoundTripCase>& info) { return info.param.name; });

TEST(AgentTableTest, FindsOnlyWhatItHolds) {
  AgentTable table;
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(table.Find("a"), AgentTable::kNone);
  const AgentTable::Index a = table.Add(Agent("a", "h1"));
  const AgentTable::Index b = table.Add(Agent("b", "h1"));
  EXPECT_NE(a, b);
  EXPECT_EQ(table.size(), 2u);
  EXPECT_TRUE(table.contains("a"));
  EXPECT_FALSE(table.contains("h1")) << "a host name is not an agent id";
  EXPECT_FALSE(table.contains("ab"));
  EXPECT_FALSE(table.contains(""));
}

TEST(AgentTableTest, ErasedIndicesAreReusedAndSkipped) {
  AgentTable table;
  for (int i = 0; i < 5; ++i) table.Add(Agent(absl::StrCat("agent-", i), "h", i));
  table[2].stream = 77;
  table[2].left = true;
  table.Erase(2);
  EXPECT_EQ(table.size(), 4u);
  EXPECT_EQ(table.Find("agent-2"), AgentTable::kNone);
  EXPECT_EQ(Indices(table), (std::vector<AgentTable::Index>{0, 1, 3, 4}));
  // The next agent takes the free index, with a record of its own, not the erased one's.
  const AgentTable::Index again = table.Add(Agent("newcomer", "h2", 9));
  EXPECT_EQ(again, 2u);
  EXPECT_EQ(table[again].stream, 0u);
  EXPECT_FALSE(table[again].left);
  EXPECT_EQ(Describe(table.Spec(again)), Describe(Agent("newcomer", "h2", 9)));
  EXPECT_EQ(table.Find("agent-3"), 3u);
}

TEST(AgentTableTest, ErasingWhileIteratingVisitsEachOnce) {
  AgentTable table;
  for (int i = 0; i < 10; ++i) table.Add(Agent(absl::StrCat("agent-", i), "h", i));
  std::vector<AgentTable::Index> seen;
  for (AgentTable::Index i : table) {
    seen.push_back(i);
    if (i % 3 == 0) table.Erase(i);
  }
  EXPECT_EQ(seen.size(), 10u);
  EXPECT_EQ(Indices(table), (std::vector<AgentTable::Index>{1, 2, 4, 5, 7, 8}));
}

TEST(AgentTableTest, ErasingTheLastEmptiesIt) {
  AgentTable table;
  const AgentTable::Index a = table.Add(Agent("a", "h"));
  table.Erase(a);
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(table.begin(), table.end());
  EXPECT_EQ(table.Add(Agent("b", "h")), 0u);
}

TEST(AgentTableTest, MovingKeepsIndicesAndNames) {
  AgentTable table;
  for (int i = 0; i < 100; ++i) table.Add(Agent(absl::StrCat("agent-", i), "h", i));
  table[42].slot.rank_offset = 42;
  AgentTable moved = std::move(table);
  EXPECT_EQ(moved.size(), 100u);
  EXPECT_EQ(moved.Find("agent-42"), 42u);
  EXPECT_EQ(moved[42].slot.rank_offset, 42);
  moved.Add(Agent("one-more", "h"));  // the index's functions read the moved store
  EXPECT_EQ(moved.Find("one-more"), 100u);
  table = AgentTable();
  EXPECT_TRUE(table.empty());
}

// Joins, departures and rejoins in random order against a plain map: every agent the map holds
// is found at its index with its names, and no other, however often the pool was compacted.
TEST(AgentTableTest, RandomChurnMatchesAMap) {
  std::mt19937 random(40);
  AgentTable table;
  std::map<std::string, std::pair<AgentTable::Index, AgentSpec>> want;
  for (int step = 0; step < 20000; ++step) {
    const std::string id = absl::StrCat("agent-", random() % 600, std::string(random() % 40, 'x'));
    auto it = want.find(id);
    if (it == want.end()) {
      AgentSpec spec = Agent(id, absl::StrCat("host-", random() % 50), random() % 1000);
      const AgentTable::Index i = table.Add(spec);
      table[i].slot.rank_offset = step;
      want[id] = {i, spec};
    } else {
      table.Erase(it->second.first);
      want.erase(it);
    }
  }
  ASSERT_EQ(table.size(), want.size());
  for (const auto& [id, entry] : want) {
    ASSERT_EQ(table.Find(id), entry.first) << id;
    EXPECT_EQ(Describe(table.Spec(entry.first)), Describe(entry.second));
  }
  EXPECT_EQ(Indices(table).size(), want.size());
}

TEST(AgentTableTest, HoldsAHundredThousandAgentsInAboutAHundredBytesEach) {
  AgentTable table;
  constexpr int kAgents = 100'000;
  for (int i = 0; i < kAgents; ++i) {
    // rdzv-agent's own ids (HOST:PID:RANDOM) and Slurm-like host names.
    table.Add(Agent(absl::StrCat("gpu-node-", 10000 + i, ":123456:deadbeef"),
                    absl::StrCat("gpu-node-", 10000 + i), i));
  }
  EXPECT_EQ(table.Find("gpu-node-77777:123456:deadbeef"), 67777u);
  table.ShrinkToFit();  // as a round that formed does
  EXPECT_EQ(table.Find("gpu-node-77777:123456:deadbeef"), 67777u);
  const double per_agent = static_cast<double>(table.held_bytes()) / kAgents;
  EXPECT_LT(per_agent, 110.0);
  RecordProperty("bytes_per_agent", std::to_string(per_agent));
}

}  // namespace
}  // namespace rdzv
