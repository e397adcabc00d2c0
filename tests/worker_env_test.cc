#include "client/agent/core/worker_env.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/core/host_port.h"

namespace rdzv {
namespace {

using Vars = std::map<std::string, std::string>;

// The variables as a map; a name set twice is a failure (the worker would see only one).
Vars ToMap(const EnvList& list) {
  Vars out;
  for (const auto& [name, value] : list) {
    EXPECT_TRUE(out.emplace(name, value).second) << name << " is set twice";
  }
  return out;
}

Vars EntriesToMap(const std::vector<std::string>& entries) {
  Vars out;
  for (const std::string& e : entries) {
    const size_t eq = e.find('=');
    EXPECT_NE(eq, std::string::npos) << "entry without '=': " << e;
    if (eq == std::string::npos) continue;
    EXPECT_TRUE(out.emplace(e.substr(0, eq), e.substr(eq + 1)).second)
        << e.substr(0, eq) << " appears twice in the merged environment";
  }
  return out;
}

// Node 1 of 3 in a job of 7 workers, running ranks 4 and 5 (the case of nproc {4,2,1}).
WorkerContext SecondNode() {
  WorkerContext ctx;
  ctx.assignment.slot.rank_offset = 4;
  ctx.assignment.world_size = 7;
  ctx.assignment.slot.group_rank = 1;
  ctx.assignment.group_world_size = 3;
  ctx.assignment.slot.local_rank_offset = 0;
  ctx.assignment.slot.local_world_size = 2;
  ctx.nproc = 2;
  ctx.assignment.master_addr = "10.1.0.7";
  ctx.assignment.master_port = 29517;
  ctx.assignment.restart_count = 2;
  ctx.max_restarts = 3;
  ctx.assignment.round = 3;
  ctx.run_id = "job-42";
  ctx.role = "trainer";
  ctx.rdzv_endpoint = "head:29400";
  return ctx;
}

// The second of two tasks on a node in per-task mode: one worker, local rank 1.
WorkerContext SecondTaskOnNode() {
  WorkerContext ctx;
  ctx.assignment.slot.rank_offset = 3;
  ctx.assignment.world_size = 4;
  ctx.assignment.slot.group_rank = 1;
  ctx.assignment.group_world_size = 2;
  ctx.assignment.slot.local_rank_offset = 1;
  ctx.assignment.slot.local_world_size = 2;
  ctx.nproc = 1;
  ctx.assignment.master_addr = "gpu001";
  ctx.assignment.master_port = 40000;
  ctx.run_id = "77.0";
  return ctx;
}

struct VariablesCase {
  std::string name;
  WorkerContext ctx;
  int32_t local_index;
  Vars want;
};

class WorkerVariablesTest : public testing::TestWithParam<VariablesCase> {};

TEST_P(WorkerVariablesTest, SetsEveryTorchrunVariable) {
  const VariablesCase& c = GetParam();
  const Vars got = ToMap(WorkerVariables(c.ctx, c.local_index));
  for (const auto& [name, value] : c.want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name << " is not set";
    EXPECT_EQ(it->second, value) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, WorkerVariablesTest,
                         testing::Values(VariablesCase{"FirstWorkerOfNode",
                                                       SecondNode(),
                                                       0,
                                                       {{"RANK", "4"},
                                                        {"LOCAL_RANK", "0"},
                                                        {"WORLD_SIZE", "7"},
                                                        {"LOCAL_WORLD_SIZE", "2"},
                                                        {"GROUP_RANK", "1"},
                                                        {"GROUP_WORLD_SIZE", "3"},
                                                        {"ROLE_RANK", "4"},
                                                        {"ROLE_WORLD_SIZE", "7"},
                                                        {"ROLE_NAME", "trainer"},
                                                        {"NODE_RANK", "1"},
                                                        {"MASTER_ADDR", "10.1.0.7"},
                                                        {"MASTER_PORT", "29517"},
                                                        {"TORCHELASTIC_RUN_ID", "job-42"},
                                                        {"TORCHELASTIC_RESTART_COUNT", "2"},
                                                        {"TORCHELASTIC_MAX_RESTARTS", "3"},
                                                        {"OMP_NUM_THREADS", "1"}}},
                                         VariablesCase{"SecondWorkerOfNode",
                                                       SecondNode(),
                                                       1,
                                                       {{"RANK", "5"},
                                                        {"LOCAL_RANK", "1"},
                                                        {"WORLD_SIZE", "7"},
                                                        {"LOCAL_WORLD_SIZE", "2"},
                                                        {"GROUP_RANK", "1"},
                                                        {"GROUP_WORLD_SIZE", "3"},
                                                        {"ROLE_RANK", "5"},
                                                        {"ROLE_WORLD_SIZE", "7"},
                                                        {"ROLE_NAME", "trainer"},
                                                        {"NODE_RANK", "1"},
                                                        {"MASTER_ADDR", "10.1.0.7"},
                                                        {"MASTER_PORT", "29517"},
                                                        {"TORCHELASTIC_RUN_ID", "job-42"},
                                                        {"TORCHELASTIC_RESTART_COUNT", "2"},
                                                        {"TORCHELASTIC_MAX_RESTARTS", "3"},
                                                        {"OMP_NUM_THREADS", "1"}}},
                                         VariablesCase{"PerTaskWorkerKeepsItsLocalRank",
                                                       SecondTaskOnNode(),
                                                       0,
                                                       {{"RANK", "3"},
                                                        {"LOCAL_RANK", "1"},
                                                        {"WORLD_SIZE", "4"},
                                                        {"LOCAL_WORLD_SIZE", "2"},
                                                        {"GROUP_RANK", "1"},
                                                        {"GROUP_WORLD_SIZE", "2"},
                                                        {"ROLE_RANK", "3"},
                                                        {"ROLE_WORLD_SIZE", "4"},
                                                        {"ROLE_NAME", "default"},
                                                        {"NODE_RANK", "1"},
                                                        {"MASTER_ADDR", "gpu001"},
                                                        {"MASTER_PORT", "40000"},
                                                        {"TORCHELASTIC_RUN_ID", "77.0"},
                                                        {"TORCHELASTIC_RESTART_COUNT", "0"},
                                                        {"TORCHELASTIC_MAX_RESTARTS", "0"},
                                                        {"OMP_NUM_THREADS", "1"}}}),
                         [](const testing::TestParamInfo<VariablesCase>& info) {
                           return info.param.name;
                         });

TEST(WorkerVariablesTest, OmpNumThreadsOnlyWhenTheNodeRunsSeveralWorkers) {
  WorkerContext alone;
  alone.assignment.slot.local_world_size = 1;
  alone.nproc = 1;
  EXPECT_FALSE(ToMap(WorkerVariables(alone, 0)).contains("OMP_NUM_THREADS"));

  WorkerContext shared = alone;
  shared.assignment.slot.local_world_size = 4;
  shared.nproc = 4;
  for (int32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(ToMap(WorkerVariables(shared, i))["OMP_NUM_THREADS"], "1") << "local index " << i;
  }
}

TEST(WorkerVariablesTest, HowTheAgentReachesTheRendezvousIsPassedOn) {
  WorkerContext ctx = SecondNode();
  Vars got = ToMap(WorkerVariables(ctx, 0));
  EXPECT_EQ(got["RDZV_ENDPOINT"], "head:29400");
  EXPECT_EQ(got["RDZV_RUN_ID"], "job-42");
  for (const char* name :
       {"RDZV_TOKEN_FILE", "RDZV_MUNGE_SOCKET", "RDZV_TLS_CA", "RDZV_TLS_SERVER_NAME"}) {
    EXPECT_FALSE(got.contains(name)) << name;
  }
  ctx.token_file = "/home/u/.rdzv/token";
  ctx.munge_socket = "/run/munge2/munge.socket";
  ctx.tls_ca = "/etc/rdzv/ca.pem";
  ctx.tls_server_name = "head.cluster";
  got = ToMap(WorkerVariables(ctx, 1));
  EXPECT_EQ(got["RDZV_TOKEN_FILE"], "/home/u/.rdzv/token");
  EXPECT_EQ(got["RDZV_MUNGE_SOCKET"], "/run/munge2/munge.socket");
  EXPECT_EQ(got["RDZV_TLS_CA"], "/etc/rdzv/ca.pem");
  EXPECT_EQ(got["RDZV_TLS_SERVER_NAME"], "head.cluster");
  // With a backup: the server in use first, then the rest of the list in its order.
  ctx.rdzv_endpoint = "head2:29400";
  ctx.other_endpoints = {"head:29400", "head2:29400", "head3:29400"};
  EXPECT_EQ(ToMap(WorkerVariables(ctx, 0))["RDZV_ENDPOINT"], "head2:29400,head:29400,head3:29400");
  ctx.other_endpoints.clear();
  for (int i = 0; i < 20; ++i) ctx.other_endpoints.push_back(absl::StrCat("h", i, ":1"));
  const std::vector<std::string> capped =
      absl::StrSplit(ToMap(WorkerVariables(ctx, 0))["RDZV_ENDPOINT"], ',');
  EXPECT_EQ(capped.size(), kMaxServerList) << "a list that a worker's client takes";
  // Without a server (--standalone) there is nothing to reach.
  ctx.rdzv_endpoint.clear();
  got = ToMap(WorkerVariables(ctx, 0));
  EXPECT_FALSE(got.contains("RDZV_ENDPOINT"));
  EXPECT_FALSE(got.contains("RDZV_TOKEN_FILE"));
}

struct MergeCase {
  std::string name;
  EnvList base;
  EnvList vars;
  Vars want;                               // a subset of the merged environment
  std::vector<std::string> notes_mention;  // one note per entry, each naming these words
};

class MergeWorkerEnvTest : public testing::TestWithParam<MergeCase> {};

TEST_P(MergeWorkerEnvTest, MergesOverTheAgentsEnvironment) {
  const MergeCase& c = GetParam();
  const MergedEnv merged = MergeWorkerEnv(c.base, c.vars);
  const Vars got = EntriesToMap(merged.entries);
  for (const auto& [name, value] : c.want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name << " is missing";
    EXPECT_EQ(it->second, value) << name;
  }
  ASSERT_EQ(merged.notes.size(), c.notes_mention.size())
      << "notes: " << absl::StrJoin(merged.notes, " | ");
  for (size_t i = 0; i < c.notes_mention.size(); ++i) {
    for (absl::string_view word : absl::StrSplit(c.notes_mention[i], ' ')) {
      EXPECT_TRUE(absl::StrContains(merged.notes[i], word))
          << "note \"" << merged.notes[i] << "\" does not mention " << word;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MergeWorkerEnvTest,
    testing::Values(MergeCase{"UserOmpNumThreadsIsKept",
                              {{"OMP_NUM_THREADS", "8"}},
                              {{"RANK", "0"}, {"OMP_NUM_THREADS", "1"}},
                              {{"OMP_NUM_THREADS", "8"}, {"RANK", "0"}},
                              {"keeping OMP_NUM_THREADS 8"}},
                    MergeCase{"UserRankIsReplaced",
                              {{"RANK", "99"}},
                              {{"RANK", "3"}},
                              {{"RANK", "3"}},
                              {"replacing RANK 99 3"}},
                    MergeCase{"UserMasterAddrIsReplaced",
                              {{"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "29500"}},
                              {{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "41234"}},
                              {{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "41234"}},
                              {"replacing MASTER_ADDR localhost 10.0.0.1",
                               "replacing MASTER_PORT 29500 41234"}},
                    MergeCase{"IdenticalValuesNeedNoNote",
                              {{"WORLD_SIZE", "4"}, {"OMP_NUM_THREADS", "1"}},
                              {{"WORLD_SIZE", "4"}, {"OMP_NUM_THREADS", "1"}},
                              {{"WORLD_SIZE", "4"}, {"OMP_NUM_THREADS", "1"}},
                              {}},
                    MergeCase{"UnrelatedVariablesArePreserved",
                              {{"PATH", "/usr/bin:/bin"},
                               {"HOME", "/home/u"},
                               {"CUDA_VISIBLE_DEVICES", "0,1"},
                               {"EMPTY", ""},
                               {"WITH_EQUALS", "a=b"}},
                              {{"RANK", "1"}},
                              {{"PATH", "/usr/bin:/bin"},
                               {"HOME", "/home/u"},
                               {"CUDA_VISIBLE_DEVICES", "0,1"},
                               {"EMPTY", ""},
                               {"WITH_EQUALS", "a=b"},
                               {"RANK", "1"}},
                              {}},
                    MergeCase{"DuplicatesInBaseResolvedToTheLast",
                              {{"FOO", "first"}, {"RANK", "7"}, {"FOO", "second"}, {"RANK", "8"}},
                              {{"RANK", "2"}},
                              {{"FOO", "second"}, {"RANK", "2"}},
                              {"replacing RANK 8 2"}}),
    [](const testing::TestParamInfo<MergeCase>& info) { return info.param.name; });

TEST(MergeWorkerEnvTest, EveryWorkerVariableReachesTheWorker) {
  const WorkerContext ctx = SecondNode();
  const EnvList vars = WorkerVariables(ctx, 1);
  const EnvList base = {{"PATH", "/bin"}, {"RANK", "0"}, {"LOCAL_RANK", "0"}};
  const Vars got = EntriesToMap(MergeWorkerEnv(base, vars).entries);
  for (const auto& [name, value] : vars) EXPECT_EQ(got.at(name), value) << name;
  EXPECT_EQ(got.at("PATH"), "/bin");
  EXPECT_EQ(got.size(), ToMap(vars).size() + 1);
}

}  // namespace
}  // namespace rdzv
