// Real processes: a real rdzvd and real rdzv-agents whose workers are small bash scripts that
// write down the environment they were started with. Asserts what a user would check: the rank
// table the workers saw, the exit codes, the error messages, and that nothing is left running.
#include <signal.h>
#include <unistd.h>

#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "tests/testing/long_wait.h"
#include "tests/testing/output.h"
#include "tests/testing/process_fixture.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tcp_proxy.h"

namespace rdzv {
namespace {

using testing::Contains;
using testing::kLongWait;
using testing::LineWith;
using testing::ScopedTempDir;
using testing::Subprocess;
using testing::SubprocessOptions;

// What "promptly" means for an agent that must give up at once.
constexpr absl::Duration kPrompt = absl::Seconds(10);

// The variables every worker writes down.
constexpr const char* kWorkerVars[] = {"RANK",
                                       "LOCAL_RANK",
                                       "WORLD_SIZE",
                                       "LOCAL_WORLD_SIZE",
                                       "GROUP_RANK",
                                       "GROUP_WORLD_SIZE",
                                       "NODE_RANK",
                                       "ROLE_RANK",
                                       "MASTER_ADDR",
                                       "MASTER_PORT",
                                       "TORCHELASTIC_RUN_ID",
                                       "TORCHELASTIC_RESTART_COUNT",
                                       "OMP_NUM_THREADS",
                                       "TORCHELASTIC_TIMER_FILE",
                                       "PYTHONFAULTHANDLER",
                                       "TEST_AGENT"};

using WorkerEnv = std::map<std::string, std::string>;

class AgentTest : public testing::ProcessTest {
 protected:
  AgentTest() {
    // Nor may a user's OMP_NUM_THREADS change what the workers see.
    unset_env_prefixes_.insert(unset_env_prefixes_.end(),
                               {"OMP_NUM_THREADS", "PYTHONFAULTHANDLER"});
  }

  // An agent of job `job` at this test's rdzvd, with `flags` and the env-writing worker.
  Subprocess& StartAgent(const std::string& name, const std::string& job, int nnodes,
                         std::vector<std::string> flags) {
    std::vector<std::string> argv = {
        RDZV_AGENT_BIN,       "--rdzv-endpoint", endpoint_, "--rdzv-id", job,   "--nnodes",
        absl::StrCat(nnodes), "--join-timeout",  "60",      "--auth",    "none"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back("--");
    for (std::string& a : WorkerCommand()) argv.push_back(std::move(a));
    return Start(std::move(argv), {{"TEST_AGENT", name}});
  }

  // A worker that writes the variables it sees to rank-$RANK.env, then runs `then` (bash).
  // The marker in its command line (and in its agent's) lets TearDown find leftovers.
  std::vector<std::string> WorkerCommand(const std::string& then = "") {
    const std::string script =
        absl::StrCat("f=", dir_.path(), "/rank-$RANK; env | grep -E '^(",
                     absl::StrJoin(kWorkerVars, "|"), ")=' > $f.tmp && mv $f.tmp $f.env; ", then);
    return {"bash", "-c", script, marker_};
  }

  // A worker that sleeps (as a training step would) until it is stopped; the sleep carries the
  // marker too, so that an orphaned sleep would be found.
  std::string SleepForever() const {
    return absl::StrCat("(exec -a ", marker_, "-sleep sleep 120) & wait");
  }

  // The agent of node `node` (host nN) of a 3-node job with --nnodes 2:3 and a long
  // --last-call: the job forms early only when a node is left out. Its options, to add to.
  std::vector<std::string> ElasticAgent(const std::string& job, int node) const {
    return {RDZV_AGENT_BIN,
            "--rdzv-endpoint",
            endpoint_,
            "--rdzv-id",
            job,
            "--nnodes",
            "2:3",
            "--join-timeout",
            "60",
            "--auth",
            "none",
            "--last-call",
            "60s",
            "--node-rank",
            absl::StrCat(node),
            "--host-name",
            absl::StrCat("n", node)};
  }

  // What worker `rank` wrote, or an empty map.
  WorkerEnv ReadWorker(int rank) const {
    WorkerEnv env;
    const std::string text =
        testing::ReadFileOrEmpty(dir_.File(absl::StrCat("rank-", rank, ".env")));
    for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
      std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
      env.insert(std::move(kv));
    }
    return env;
  }

  // Every worker of a job of `world_size` ranks; fails the test for a missing one.
  std::vector<WorkerEnv> ReadRankTable(int world_size) const {
    std::vector<WorkerEnv> table;
    for (int r = 0; r < world_size; ++r) {
      table.push_back(ReadWorker(r));
      EXPECT_FALSE(table.back().empty()) << "rank " << r << " wrote nothing";
    }
    EXPECT_TRUE(ReadWorker(world_size).empty()) << "a rank beyond the world size";
    return table;
  }

  // What every worker of one job must agree on.
  void ExpectSharedValues(const std::vector<WorkerEnv>& table, const std::string& job) {
    for (size_t r = 0; r < table.size(); ++r) {
      const WorkerEnv& w = table[r];
      EXPECT_EQ(w.at("RANK"), absl::StrCat(r));
      EXPECT_EQ(w.at("ROLE_RANK"), absl::StrCat(r));
      EXPECT_EQ(w.at("WORLD_SIZE"), absl::StrCat(table.size())) << "rank " << r;
      EXPECT_EQ(w.at("NODE_RANK"), w.at("GROUP_RANK")) << "rank " << r;
      EXPECT_EQ(w.at("MASTER_ADDR"), table[0].at("MASTER_ADDR")) << "rank " << r;
      EXPECT_EQ(w.at("MASTER_PORT"), table[0].at("MASTER_PORT")) << "rank " << r;
      EXPECT_EQ(w.at("TORCHELASTIC_RUN_ID"), job) << "rank " << r;
      EXPECT_EQ(w.at("TORCHELASTIC_RESTART_COUNT"), "0") << "rank " << r;
      // torchrun's default: one OpenMP thread per worker when a node runs several.
      if (w.at("LOCAL_WORLD_SIZE") == "1") {
        EXPECT_FALSE(w.contains("OMP_NUM_THREADS")) << "rank " << r;
      } else {
        EXPECT_EQ(w.at("OMP_NUM_THREADS"), "1") << "rank " << r;
      }
    }
    ASSERT_FALSE(table.empty());
    EXPECT_FALSE(table[0].at("MASTER_ADDR").empty());
    int port = 0;
    EXPECT_TRUE(absl::SimpleAtoi(table[0].at("MASTER_PORT"), &port));
    EXPECT_GT(port, 0);
    EXPECT_LT(port, 65536);
  }

  // Waits until `job` has `joined` agents at this test's rdzvd (so that the next agent surely
  // arrives after them).
  void WaitForJoined(const std::string& job, int joined) {
    ClientOptions options;
    options.endpoint = endpoint_;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    const absl::Time deadline = absl::Now() + kLongWait;
    while (absl::Now() < deadline) {
      absl::StatusOr<std::vector<JobStatusView>> jobs = (*client)->Status(job);
      if (jobs.ok() && jobs->size() == 1 && jobs->front().joined == joined) return;
      absl::SleepFor(absl::Milliseconds(20));
    }
    FAIL() << "job " << job << " never had " << joined << " agents";
  }

  ScopedTempDir dir_;
};

int WaitOk(Subprocess& p) {
  const int code = p.Wait(kLongWait);
  EXPECT_EQ(code, 0) << p.CommandLine() << "\n--- stderr:\n" << p.Stderr();
  return code;
}

TEST_F(AgentTest, RanksFollowNodeRankNotArrival) {
  StartRdzvd();
  // Node rank 2 arrives first and node rank 0 last; host names sort the other way round too.
  const std::vector<std::pair<int, std::string>> nodes = {{2, "a"}, {1, "b"}, {0, "c"}};
  std::vector<Subprocess*> agents;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto& [node, host] = nodes[i];
    agents.push_back(&StartAgent(
        host, "order", 3,
        {"--node-rank", absl::StrCat(node), "--host-name", host, "--nproc-per-node", "2"}));
    if (i + 1 < nodes.size()) {
      ASSERT_NO_FATAL_FAILURE(WaitForJoined("order", static_cast<int>(i + 1)));
    }
  }
  for (Subprocess* a : agents) WaitOk(*a);

  const std::vector<WorkerEnv> table = ReadRankTable(6);
  ExpectSharedValues(table, "order");
  const std::map<std::string, int> node_of_host = {{"a", 2}, {"b", 1}, {"c", 0}};
  for (int r = 0; r < 6; ++r) {
    const WorkerEnv& w = table[r];
    EXPECT_EQ(w.at("GROUP_RANK"), absl::StrCat(r / 2)) << "rank " << r;
    EXPECT_EQ(node_of_host.at(w.at("TEST_AGENT")), r / 2) << "rank " << r;
    EXPECT_EQ(w.at("LOCAL_RANK"), absl::StrCat(r % 2)) << "rank " << r;
    EXPECT_EQ(w.at("LOCAL_WORLD_SIZE"), "2") << "rank " << r;
    EXPECT_EQ(w.at("GROUP_WORLD_SIZE"), "3") << "rank " << r;
  }
}

TEST_F(AgentTest, HeterogeneousNodesGetPrefixSums) {
  StartRdzvd();
  const int nproc[] = {3, 1, 2};
  std::vector<Subprocess*> agents;
  for (int node = 0; node < 3; ++node) {
    agents.push_back(&StartAgent(
        absl::StrCat("n", node), "hetero", 3,
        {"--node-rank", absl::StrCat(node), "--nproc-per-node", absl::StrCat(nproc[node])}));
  }
  for (Subprocess* a : agents) WaitOk(*a);

  const std::vector<WorkerEnv> table = ReadRankTable(6);
  ExpectSharedValues(table, "hetero");
  // rank -> (node, local rank): 0 1 2 | 3 | 4 5
  const int node_of_rank[] = {0, 0, 0, 1, 2, 2};
  const int local_of_rank[] = {0, 1, 2, 0, 0, 1};
  for (int r = 0; r < 6; ++r) {
    const WorkerEnv& w = table[r];
    const int node = node_of_rank[r];
    EXPECT_EQ(w.at("GROUP_RANK"), absl::StrCat(node)) << "rank " << r;
    EXPECT_EQ(w.at("TEST_AGENT"), absl::StrCat("n", node)) << "rank " << r;
    EXPECT_EQ(w.at("LOCAL_RANK"), absl::StrCat(local_of_rank[r])) << "rank " << r;
    EXPECT_EQ(w.at("LOCAL_WORLD_SIZE"), absl::StrCat(nproc[node])) << "rank " << r;
    EXPECT_EQ(w.at("GROUP_WORLD_SIZE"), "3") << "rank " << r;
  }
}

TEST_F(AgentTest, WithoutNodeRankNodesAreOrderedByHostName) {
  StartRdzvd();
  std::vector<Subprocess*> agents;
  for (const char* host : {"c", "a", "b"}) {
    agents.push_back(&StartAgent(host, "byname", 3, {"--host-name", host}));
  }
  for (Subprocess* a : agents) WaitOk(*a);

  const std::vector<WorkerEnv> table = ReadRankTable(3);
  ExpectSharedValues(table, "byname");
  const char* host_of_rank[] = {"a", "b", "c"};
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(table[r].at("TEST_AGENT"), host_of_rank[r]) << "rank " << r;
    EXPECT_EQ(table[r].at("GROUP_RANK"), absl::StrCat(r)) << "rank " << r;
    EXPECT_EQ(table[r].at("LOCAL_RANK"), "0") << "rank " << r;
    EXPECT_EQ(table[r].at("LOCAL_WORLD_SIZE"), "1") << "rank " << r;
  }
}

TEST_F(AgentTest, FailingWorkerStopsTheWholeJobWithItsExitCode) {
  StartRdzvd();
  // Rank 3 (node 1) fails; every other worker would run for two minutes. The short pause puts
  // the failure after every agent has started its workers, the common case; an abort racing an
  // agent's own assignment is not what this test is about.
  std::vector<Subprocess*> agents;
  for (int node = 0; node < 3; ++node) {
    std::vector<std::string> argv = {RDZV_AGENT_BIN,
                                     "--auth",
                                     "none",
                                     "--rdzv-endpoint",
                                     endpoint_,
                                     "--rdzv-id",
                                     "failfast",
                                     "--nnodes",
                                     "3",
                                     "--node-rank",
                                     absl::StrCat(node),
                                     "--nproc-per-node",
                                     "2",
                                     "--join-timeout",
                                     "60",
                                     "--"};
    for (std::string& a : WorkerCommand(absl::StrCat(
             "if [ $RANK = 3 ]; then sleep 0.3; echo 'rank 3 gives up' >&2; exit 3; fi; ",
             SleepForever()))) {
      argv.push_back(std::move(a));
    }
    agents.push_back(&Start(std::move(argv), {{"TEST_AGENT", absl::StrCat("n", node)}}));
  }
  const absl::Time start = absl::Now();
  for (Subprocess* a : agents) {
    EXPECT_EQ(a->Wait(kLongWait), 3) << a->CommandLine() << "\n--- stderr:\n" << a->Stderr();
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "the other agents were not told";
  // The failing agent and the others all name the root cause.
  for (Subprocess* a : agents) {
    const std::string line = LineWith(a->Stderr(), "job failfast failed");
    EXPECT_TRUE(Contains(line, "rank 3")) << a->Stderr();
  }
  EXPECT_TRUE(Contains(agents[1]->Stderr(), "rank 3 gives up"));
  EXPECT_TRUE(Contains(agents[1]->Stderr(), "exited with code 3"));
  EXPECT_TRUE(testing::NoProcessLeft(marker_));
}

TEST_F(AgentTest, WorkerKilledBySignalGives128PlusSignal) {
  StartRdzvd();
  std::vector<Subprocess*> agents;
  for (int node = 0; node < 2; ++node) {
    std::vector<std::string> argv = {
        RDZV_AGENT_BIN, "--auth",   "none", "--rdzv-endpoint", endpoint_,          "--rdzv-id",
        "segv",         "--nnodes", "2",    "--node-rank",     absl::StrCat(node), "--"};
    for (std::string& a : WorkerCommand(
             absl::StrCat("if [ $RANK = 1 ]; then sleep 0.3; ulimit -c 0; kill -SEGV $$; fi; ",
                          SleepForever()))) {
      argv.push_back(std::move(a));
    }
    agents.push_back(&Start(std::move(argv)));
  }
  for (Subprocess* a : agents) {
    EXPECT_EQ(a->Wait(kLongWait), 128 + SIGSEGV) << a->CommandLine() << "\n--- stderr:\n"
                                                 << a->Stderr();
  }
  // Both agents name the root cause, the signal included.
  for (Subprocess* a : agents) {
    EXPECT_TRUE(Contains(LineWith(a->Stderr(), "job segv failed"), "rank 1")) << a->Stderr();
    EXPECT_TRUE(Contains(LineWith(a->Stderr(), "job segv failed"), "SIGSEGV")) << a->Stderr();
  }
  EXPECT_TRUE(testing::NoProcessLeft(marker_));
}

TEST_F(AgentTest, UnreachableEndpointFailsAfterTheJoinTimeout) {
  const std::string endpoint = absl::StrCat("127.0.0.1:", testing::FreeLoopbackPort());
  Subprocess& agent =
      Start({RDZV_AGENT_BIN, "--auth", "none", "--rdzv-endpoint", endpoint, "--rdzv-id", "nobody",
             "--nnodes", "1", "--join-timeout", "2", "--", "true", marker_});
  const absl::Time start = absl::Now();
  EXPECT_NE(agent.Wait(kLongWait), 0);
  const absl::Duration took = absl::Now() - start;
  // The client gives up once its next backoff delay would pass the deadline: possibly well
  // before the full two seconds, but never at once.
  EXPECT_GE(took, absl::Milliseconds(500)) << "it should retry before giving up";
  EXPECT_LT(took, kPrompt);
  const std::string line = LineWith(agent.Stderr(), endpoint);
  EXPECT_TRUE(Contains(line, "cannot reach")) << agent.Stderr();
}

TEST_F(AgentTest, MissingNnodesWithEndpointIsAUsageError) {
  Subprocess& agent = Start(
      {RDZV_AGENT_BIN, "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-id", "j", "--", "true", marker_});
  EXPECT_EQ(agent.Wait(kPrompt), 2);
  const std::string err = agent.Stderr();
  EXPECT_TRUE(Contains(err, "rdzv-agent: "));
  EXPECT_TRUE(Contains(LineWith(err, "rdzv-agent"), "--nnodes"));
}

TEST_F(AgentTest, UnknownFlagIsAUsageError) {
  Subprocess& agent = Start({RDZV_AGENT_BIN, "--bogus-flag", "--", "true", marker_});
  EXPECT_EQ(agent.Wait(kPrompt), 2);
  EXPECT_TRUE(Contains(agent.Stderr(), "unknown flag --bogus-flag"));
}

TEST_F(AgentTest, NoCommandIsAUsageError) {
  Subprocess& agent = Start({RDZV_AGENT_BIN, "--standalone", "--"});
  EXPECT_EQ(agent.Wait(kPrompt), 2);
  EXPECT_TRUE(Contains(agent.Stderr(), "no training command"));
}

TEST_F(AgentTest, NnodesDisagreementIsRefused) {
  StartRdzvd();
  Subprocess& first = StartAgent("first", "disagree", 2, {"--node-rank", "0"});
  ASSERT_NO_FATAL_FAILURE(WaitForJoined("disagree", 1));
  Subprocess& second = StartAgent("second", "disagree", 3, {"--node-rank", "1"});
  EXPECT_NE(second.Wait(kPrompt), 0);
  const std::string line = LineWith(second.Stderr(), "--nnodes 3");
  EXPECT_TRUE(Contains(line, "--nnodes 2")) << second.Stderr();
  EXPECT_TRUE(Contains(line, "disagree")) << second.Stderr();

  // The first agent still waits for its round; SIGTERM ends it at once.
  EXPECT_TRUE(first.Running());
  first.Signal(SIGTERM);
  EXPECT_EQ(first.Wait(kPrompt), 128 + SIGTERM) << first.Stderr();
}

TEST_F(AgentTest, MaxRestartsDisagreementIsRefused) {
  StartRdzvd();
  Subprocess& first =
      StartAgent("first", "restarts", 2, {"--node-rank", "0", "--max-restarts", "2"});
  ASSERT_NO_FATAL_FAILURE(WaitForJoined("restarts", 1));
  Subprocess& second = StartAgent("second", "restarts", 2, {"--node-rank", "1"});
  EXPECT_NE(second.Wait(kPrompt), 0);
  EXPECT_TRUE(Contains(LineWith(second.Stderr(), "--max-restarts 0"),
                       "job restarts was started with --max-restarts 2"))
      << second.Stderr();

  EXPECT_TRUE(first.Running());
  first.Signal(SIGTERM);
  EXPECT_EQ(first.Wait(kPrompt), 128 + SIGTERM) << first.Stderr();
}

TEST_F(AgentTest, SecondAgentWithTheSameNodeRankIsRefused) {
  StartRdzvd();
  Subprocess& first = StartAgent("first", "dup", 2, {"--node-rank", "0", "--host-name", "first"});
  ASSERT_NO_FATAL_FAILURE(WaitForJoined("dup", 1));
  Subprocess& second =
      StartAgent("second", "dup", 2, {"--node-rank", "0", "--host-name", "second"});
  EXPECT_NE(second.Wait(kPrompt), 0);
  const std::string line = LineWith(second.Stderr(), "already taken");
  EXPECT_TRUE(Contains(line, "node rank 0")) << second.Stderr();
  EXPECT_TRUE(Contains(line, "first")) << second.Stderr();

  EXPECT_TRUE(first.Running());
  first.Signal(SIGTERM);
  EXPECT_EQ(first.Wait(kPrompt), 128 + SIGTERM) << first.Stderr();
}

TEST_F(AgentTest, StandaloneNeedsNoServer) {
  std::vector<std::string> argv = {RDZV_AGENT_BIN, "--standalone", "--nproc-per-node", "2", "--"};
  for (std::string& a : WorkerCommand()) argv.push_back(std::move(a));
  Subprocess& agent = Start(std::move(argv), {{"TEST_AGENT", "solo"}});
  WaitOk(agent);

  const std::vector<WorkerEnv> table = ReadRankTable(2);
  ASSERT_EQ(table.size(), 2u);
  ASSERT_FALSE(table[0].empty());
  ExpectSharedValues(table, table[0].at("TORCHELASTIC_RUN_ID"));
  EXPECT_FALSE(table[0].at("TORCHELASTIC_RUN_ID").empty());
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(table[r].at("LOCAL_RANK"), absl::StrCat(r));
    EXPECT_EQ(table[r].at("LOCAL_WORLD_SIZE"), "2");
    EXPECT_EQ(table[r].at("GROUP_RANK"), "0");
    EXPECT_EQ(table[r].at("GROUP_WORLD_SIZE"), "1");
  }
}

// By default the workers get the agent's watchdog FIFO and faulthandler on (a hung worker's
// SIGABRT prints its stack). A user's own timer server and faulthandler setting stay theirs, and
// as heartbeats then go to that server, the agent says once that --hang-timeout cannot apply.
TEST_F(AgentTest, UsersOwnTimerFileAndFaulthandlerAreKept) {
  std::vector<std::string> argv = {
      RDZV_AGENT_BIN, "--standalone", "--nproc-per-node", "2", "--hang-timeout", "5s", "--"};
  for (std::string& a : WorkerCommand()) argv.push_back(std::move(a));
  Subprocess& ours = Start(argv);
  WaitOk(ours);
  for (int r = 0; r < 2; ++r) {
    const WorkerEnv w = ReadWorker(r);
    ASSERT_TRUE(w.contains("TORCHELASTIC_TIMER_FILE")) << "rank " << r;
    EXPECT_TRUE(absl::EndsWith(w.at("TORCHELASTIC_TIMER_FILE"), "/watchdog.fifo"));
    EXPECT_EQ(w.at("PYTHONFAULTHANDLER"), "1") << "rank " << r;
  }
  EXPECT_FALSE(Contains(ours.Stderr(), "TORCHELASTIC_TIMER_FILE")) << ours.Stderr();

  Subprocess& no_faulthandler = Start(argv, {{"PYTHONFAULTHANDLER", "0"}});
  WaitOk(no_faulthandler);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(ReadWorker(r).at("PYTHONFAULTHANDLER"), "0");
  EXPECT_TRUE(Contains(no_faulthandler.Stderr(),
                       "keeping PYTHONFAULTHANDLER=0 from the environment (default is 1)"))
      << no_faulthandler.Stderr();

  const std::string own = dir_.File("my-timer.fifo");
  Subprocess& theirs = Start(argv, {{"TORCHELASTIC_TIMER_FILE", own}});
  WaitOk(theirs);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ReadWorker(r).at("TORCHELASTIC_TIMER_FILE"), own) << "rank " << r;
  }
  const std::string err = theirs.Stderr();
  std::vector<absl::string_view> said = absl::StrSplit(err, "heartbeats are not watched");
  EXPECT_EQ(said.size(), 2u) << "said once:\n" << err;
  EXPECT_TRUE(Contains(LineWith(err, "heartbeats are not watched"),
                       absl::StrCat("TORCHELASTIC_TIMER_FILE=", own)))
      << err;

  // Without --hang-timeout there is nothing to say.
  argv.erase(argv.begin() + 4, argv.begin() + 6);
  Subprocess& timers_only = Start(argv, {{"TORCHELASTIC_TIMER_FILE", own}});
  WaitOk(timers_only);
  EXPECT_FALSE(Contains(timers_only.Stderr(), "heartbeats are not watched"))
      << timers_only.Stderr();
}

TEST_F(AgentTest, RdzvdStopsOnSigterm) {
  ASSERT_NO_FATAL_FAILURE(StartRdzvd());
  Subprocess& rdzvd = *rdzvd_;
  // With an agent waiting on it, too.
  Subprocess& agent = StartAgent("waiter", "stopping", 2, {});
  ASSERT_NO_FATAL_FAILURE(WaitForJoined("stopping", 1));
  const absl::Time start = absl::Now();
  rdzvd.Signal(SIGTERM);
  EXPECT_EQ(rdzvd.Wait(kLongWait), 0) << rdzvd.Stderr();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  agent.Signal(SIGTERM);
  EXPECT_EQ(agent.Wait(kPrompt), 128 + SIGTERM) << agent.Stderr();
}

// scancel's SIGTERM while rdzvd does not answer (its host froze): the agent stops its workers and
// exits without waiting out a whole call deadline (10 s) for its report, and another for its
// departure.
TEST_F(AgentTest, AStoppedAgentDoesNotWaitLongForAFrozenServer) {
  ASSERT_NO_FATAL_FAILURE(StartRdzvd());
  std::vector<std::string> argv = {RDZV_AGENT_BIN,
                                   "--rdzv-endpoint",
                                   endpoint_,
                                   "--rdzv-id",
                                   "frozen",
                                   "--nnodes",
                                   "1",
                                   "--auth",
                                   "none",
                                   "--"};
  for (std::string& a : WorkerCommand(SleepForever())) argv.push_back(std::move(a));
  Subprocess& agent = Start(std::move(argv));
  const absl::Time deadline = absl::Now() + kLongWait;
  while (ReadWorker(0).empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_FALSE(ReadWorker(0).empty()) << agent.Stderr();
  rdzvd_->Signal(SIGSTOP);
  agent.Signal(SIGTERM);
  EXPECT_EQ(agent.Wait(absl::Seconds(8)), 128 + SIGTERM) << agent.Stderr();
  rdzvd_->Signal(SIGCONT);
  EXPECT_TRUE(
      Contains(LineWith(agent.Stderr(), "could not report the failure"), "no answer within 2s"))
      << agent.Stderr();
  EXPECT_TRUE(Contains(LineWith(agent.Stderr(), "failed"), "received SIGTERM")) << agent.Stderr();
}

TEST_F(AgentTest, RdzvdOnAPortInUseFails) {
  // A plain listening socket holds the port.
  testing::SilentListener taken;
  ASSERT_NE(taken.port(), 0);
  const std::string listen_at = absl::StrCat("127.0.0.1:", taken.port());

  Subprocess& rdzvd = Start({RDZVD_BIN, "--auth", "none", "--listen", listen_at});
  EXPECT_EQ(rdzvd.Wait(kPrompt), 1);
  const std::string line = LineWith(rdzvd.Stderr(), listen_at);
  EXPECT_TRUE(Contains(line, "rdzvd: cannot listen on")) << rdzvd.Stderr();
}

// gRPC shares ports (SO_REUSEPORT) unless told not to; two servers would split a job.
TEST_F(AgentTest, SecondRdzvdOnTheSamePortFails) {
  StartRdzvd();
  Subprocess& second = Start({RDZVD_BIN, "--auth", "none", "--listen", endpoint_});
  EXPECT_EQ(second.Wait(kPrompt), 1);
  EXPECT_TRUE(Contains(LineWith(second.Stderr(), endpoint_), "cannot listen on"));
}

// The helper itself: what the tests above rely on to never hang and never leak.

// Waits until `n` processes carry `marker`.
// ---- Health checks ----

TEST_F(AgentTest, AJobOfFixedSizeEndsAtOnceWhenANodeFailsItsHealthCheck) {
  StartRdzvd();
  std::vector<Subprocess*> agents;
  for (int node = 0; node < 3; ++node) {
    std::vector<std::string> flags = {"--node-rank", absl::StrCat(node), "--host-name",
                                      absl::StrCat("n", node)};
    if (node == 1) {
      flags.insert(flags.end(),
                   {"--health-check",
                    absl::StrCat("echo checking /scratch; echo '/scratch is read-only' >&2; "
                                 "exit 1 # ",
                                 marker_)});
    }
    agents.push_back(&StartAgent(absl::StrCat("n", node), "sick", 3, flags));
  }
  const absl::Time start = absl::Now();
  for (Subprocess* a : agents) {
    EXPECT_EQ(a->Wait(kLongWait), kExitNodeUnhealthy) << a->CommandLine() << "\n--- stderr:\n"
                                                      << a->Stderr();
  }
  // Nobody waits for the join timeout (60 s) for a node that will not come.
  EXPECT_LT(absl::Now() - start, kPrompt);
  EXPECT_TRUE(
      Contains(agents[1]->Stderr(), "n1: health check failed: /scratch is read-only (exit code 1)"))
      << agents[1]->Stderr();
  for (Subprocess* a : {agents[0], agents[2]}) {
    const std::string line = LineWith(a->Stderr(), "job sick failed");
    EXPECT_TRUE(Contains(line, "n1 (node 1): health check failed: /scratch is read-only")) << line;
    EXPECT_TRUE(Contains(line, "sbatch --exclude=n1")) << line;
  }
  EXPECT_TRUE(ReadWorker(0).empty()) << "a worker started";
  EXPECT_TRUE(testing::NoProcessLeft(marker_));
}

TEST_F(AgentTest, AnElasticJobFormsWithoutTheNodeThatFailedItsHealthCheck) {
  StartRdzvd();
  // --nnodes 2:3, and a long --last-call: the job forms because the node is left out, not
  // because time passed.
  std::vector<Subprocess*> agents;
  for (int node = 0; node < 3; ++node) {
    std::vector<std::string> argv = ElasticAgent("elastic-sick", node);
    if (node == 1) {
      argv.insert(argv.end(), {"--health-check", "echo 'ECC errors on GPU 2'; false"});
    }
    argv.push_back("--");
    for (std::string& a : WorkerCommand("sleep 2")) argv.push_back(std::move(a));
    agents.push_back(&Start(std::move(argv), {{"TEST_AGENT", absl::StrCat("n", node)}}));
  }
  const absl::Time start = absl::Now();
  EXPECT_EQ(agents[1]->Wait(kLongWait), kExitNodeUnhealthy) << agents[1]->Stderr();
  // While the job runs, the server shows which node was left out, and why.
  ClientOptions options;
  options.endpoint = endpoint_;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<ExcludedNode> excluded;
  for (absl::Time until = absl::Now() + kPrompt; excluded.empty() && absl::Now() < until;) {
    absl::StatusOr<std::vector<JobStatusView>> jobs = (*client)->Status("elastic-sick");
    if (jobs.ok() && jobs->size() == 1 && jobs->front().state == "running") {
      excluded = jobs->front().excluded;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(excluded.size(), 1u);
  EXPECT_EQ(excluded[0].host, "n1");
  EXPECT_EQ(excluded[0].why.kind, ExclusionKind::kHealthCheckFailed);
  WaitOk(*agents[0]);
  WaitOk(*agents[2]);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "the job waited for --last-call";
  const std::vector<WorkerEnv> table = ReadRankTable(2);
  ExpectSharedValues(table, "elastic-sick");
  EXPECT_EQ(table[0].at("TEST_AGENT"), "n0");
  EXPECT_EQ(table[1].at("TEST_AGENT"), "n2");
  EXPECT_TRUE(Contains(agents[0]->Stderr(),
                       "n1 is left out of the job: n1 (node 1): health check failed: ECC errors "
                       "on GPU 2 (exit code 1)"))
      << agents[0]->Stderr();
  EXPECT_TRUE(testing::NoProcessLeft(marker_));
}

// A rank that finds its node bad says so on the watchdog FIFO and fails: the job restarts
// without that node, and every surviving agent says why.
TEST_F(AgentTest, ARankThatAsksItsNodeOutRestartsTheJobWithoutIt) {
  StartRdzvd();
  std::vector<Subprocess*> agents;
  const std::string round0 = absl::StrCat(
      "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then "
      "if [ $TEST_AGENT = n1 ]; then printf '{\"version\": 1, \"pid\": %d, \"exclude_node\": "
      "\"ECC errors on GPU 0\"}\\n' $$ > \"$TORCHELASTIC_TIMER_FILE\"; exit 1; fi; ",
      SleepForever(), "; fi");
  for (int node = 0; node < 3; ++node) {
    std::vector<std::string> argv = ElasticAgent("asked-out", node);
    argv.insert(argv.end(), {"--max-restarts", "1", "--"});
    for (std::string& a : WorkerCommand(round0)) argv.push_back(std::move(a));
    agents.push_back(&Start(std::move(argv), {{"TEST_AGENT", absl::StrCat("n", node)}}));
  }
  const absl::Time start = absl::Now();
  EXPECT_EQ(agents[1]->Wait(kLongWait), kExitNodeUnhealthy) << agents[1]->Stderr();
  EXPECT_TRUE(Contains(agents[1]->Stderr(),
                       "this node is left out of the job: n1: a rank asked "
                       "for it: rank 1: ECC errors on GPU 0"))
      << agents[1]->Stderr();
  WaitOk(*agents[0]);
  WaitOk(*agents[2]);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "the restart waited for --last-call";
  // The restarted job: nodes 0 and 2, ranks 0 and 1 (rank 2's file is the first round's).
  const std::vector<WorkerEnv> table = {ReadWorker(0), ReadWorker(1)};
  ASSERT_FALSE(table[0].empty() || table[1].empty());
  EXPECT_EQ(table[0].at("TEST_AGENT"), "n0");
  EXPECT_EQ(table[1].at("TEST_AGENT"), "n2");
  EXPECT_EQ(table[1].at("WORLD_SIZE"), "2");
  EXPECT_EQ(table[1].at("TORCHELASTIC_RESTART_COUNT"), "1");
  for (int node : {0, 2}) {
    EXPECT_TRUE(Contains(agents[node]->Stderr(),
                         "it asked for its node to be left out: ECC "
                         "errors on GPU 0"))
        << agents[node]->Stderr();
    EXPECT_TRUE(Contains(agents[node]->Stderr(),
                         "n1 is left out of the job: n1 (node 1): a rank "
                         "asked for it: rank 1: ECC errors on GPU 0"))
        << agents[node]->Stderr();
  }
  EXPECT_TRUE(testing::NoProcessLeft(marker_));
}

// Four nodes, one of them a spare: n1's agent dies (SIGKILL) while the job runs, and the spare
// takes n1's node rank and ranks in the restart; n0 and n2 keep theirs.
TEST_F(AgentTest, ASpareTakesALostNodesRanksAndTheOthersKeepTheirs) {
  StartRdzvd();
  std::vector<Subprocess*> agents;
  // Each worker keeps a copy of what it saw in each run; the first run's sleep until stopped.
  const std::string then =
      absl::StrCat("cp $f.env $f.run$TORCHELASTIC_RESTART_COUNT; ",
                   "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then ", SleepForever(), "; fi");
  for (int node = 0; node < 4; ++node) {
    std::vector<std::string> argv = {RDZV_AGENT_BIN,
                                     "--rdzv-endpoint",
                                     endpoint_,
                                     "--rdzv-id",
                                     "spared",
                                     "--nnodes",
                                     "4",
                                     "--nproc-per-node",
                                     "2",
                                     "--spare-nodes",
                                     "1",
                                     "--max-restarts",
                                     "1",
                                     "--join-timeout",
                                     "60",
                                     "--auth",
                                     "none",
                                     "--node-rank",
                                     absl::StrCat(node),
                                     "--host-name",
                                     absl::StrCat("n", node),
                                     "--"};
    for (std::string& a : WorkerCommand(then)) argv.push_back(std::move(a));
    agents.push_back(&Start(std::move(argv), {{"TEST_AGENT", absl::StrCat("n", node)}}));
  }
  const auto run_file = [&](int rank, int run) {
    return dir_.File(absl::StrCat("rank-", rank, ".run", run));
  };
  const auto all_started = [&](int run) {
    for (int rank = 0; rank < 6; ++rank) {
      if (testing::ReadFileOrEmpty(run_file(rank, run)).empty()) return false;
    }
    return true;
  };
  absl::Time deadline = absl::Now() + kLongWait;
  while (!all_started(0) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_TRUE(all_started(0)) << agents[0]->Stderr();
  EXPECT_TRUE(agents[3]->WaitForOutput("n3 is a spare", kLongWait)) << agents[3]->Stderr();
  EXPECT_TRUE(testing::ReadFileOrEmpty(run_file(6, 0)).empty()) << "the spare ran a worker";
  const std::map<int, std::string> first_run = {{0, "n0"}, {1, "n0"}, {2, "n1"},
                                                {3, "n1"}, {4, "n2"}, {5, "n2"}};
  for (const auto& [rank, host] : first_run) {
    EXPECT_TRUE(Contains(testing::ReadFileOrEmpty(run_file(rank, 0)), "TEST_AGENT=" + host))
        << "rank " << rank;
  }

  const absl::Time killed = absl::Now();
  agents[1]->Signal(SIGKILL);
  EXPECT_EQ(agents[1]->Wait(kLongWait), 128 + SIGKILL);
  deadline = absl::Now() + kLongWait;
  while (!all_started(1) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  const absl::Duration healed = absl::Now() - killed;
  ASSERT_TRUE(all_started(1)) << agents[0]->Stderr() << agents[3]->Stderr();
  for (int node : {0, 2, 3}) WaitOk(*agents[node]);
  std::cout << "[ figure ] agent SIGKILL to every worker of the healed job started: "
            << absl::FormatDuration(healed) << "\n";

  // The healed job: the spare n3 runs node 1 with ranks 2-3; n0 and n2 keep their places.
  const std::map<int, std::pair<std::string, std::string>> healed_run = {
      {0, {"n0", "0"}}, {1, {"n0", "0"}}, {2, {"n3", "1"}},
      {3, {"n3", "1"}}, {4, {"n2", "2"}}, {5, {"n2", "2"}}};
  for (const auto& [rank, where] : healed_run) {
    const std::string env = testing::ReadFileOrEmpty(run_file(rank, 1));
    EXPECT_TRUE(Contains(env, "TEST_AGENT=" + where.first)) << "rank " << rank << ": " << env;
    EXPECT_TRUE(Contains(env, "GROUP_RANK=" + where.second)) << "rank " << rank << ": " << env;
    EXPECT_TRUE(Contains(env, "WORLD_SIZE=6")) << "rank " << rank << ": " << env;
    EXPECT_TRUE(Contains(env, "TORCHELASTIC_RESTART_COUNT=1")) << "rank " << rank;
  }
  EXPECT_TRUE(Contains(agents[0]->Stderr(), "lost contact with the agent on n1"))
      << agents[0]->Stderr();
  for (int node : {0, 2, 3}) {
    EXPECT_TRUE(Contains(agents[node]->Stderr(),
                         "job spared left out n1 (node 1): lost while the job ran; next time: "
                         "sbatch --exclude=n1"))
        << agents[node]->Stderr();
  }
  EXPECT_TRUE(testing::NoProcessLeft(marker_));
}

// A spare that is not needed ends with the job, successfully.
TEST_F(AgentTest, AnUnneededSpareEndsWithTheJob) {
  StartRdzvd();
  std::vector<Subprocess*> agents;
  for (int node = 0; node < 3; ++node) {
    agents.push_back(&StartAgent(absl::StrCat("n", node), "spare-idle", 3,
                                 {"--spare-nodes", "1", "--max-restarts", "1", "--node-rank",
                                  absl::StrCat(node), "--host-name", absl::StrCat("n", node)}));
  }
  for (Subprocess* agent : agents) WaitOk(*agent);
  EXPECT_TRUE(Contains(agents[2]->Stderr(), "done without needing n2, a spare"))
      << agents[2]->Stderr();
  const std::vector<WorkerEnv> table = ReadRankTable(2);
  EXPECT_EQ(table[1].at("TEST_AGENT"), "n1");
  EXPECT_TRUE(testing::NoProcessLeft(marker_));
}

// A rank whose error is its own exits 84: the job ends at once, with restarts left.
TEST_F(AgentTest, ARankThatExits84EndsTheJobDespiteItsRestarts) {
  StartRdzvd();
  std::vector<Subprocess*> agents;
  for (int node = 0; node < 2; ++node) {
    std::vector<std::string> argv = {RDZV_AGENT_BIN,
                                     "--rdzv-endpoint",
                                     endpoint_,
                                     "--rdzv-id",
                                     "mine",
                                     "--nnodes",
                                     "2",
                                     "--auth",
                                     "none",
                                     "--max-restarts",
                                     "3",
                                     "--node-rank",
                                     absl::StrCat(node),
                                     "--host-name",
                                     absl::StrCat("n", node),
                                     "--"};
    for (std::string& a : WorkerCommand(absl::StrCat(
             "if [ $RANK = 1 ]; then echo 'no dataset named in the config' >&2; exit 84; fi; ",
             SleepForever()))) {
      argv.push_back(std::move(a));
    }
    agents.push_back(&Start(std::move(argv), {{"TEST_AGENT", absl::StrCat("n", node)}}));
  }
  for (Subprocess* agent : agents) {
    EXPECT_EQ(agent->Wait(kLongWait), kWorkerExitNoRestart) << agent->Stderr();
    EXPECT_TRUE(Contains(agent->Stderr(),
                         "rank 1 (local rank 0, node 1) on n1 exited with code "
                         "84; it asked that the job not restart"))
        << agent->Stderr();
    EXPECT_FALSE(Contains(agent->Stderr(), "restarting the workers")) << agent->Stderr();
  }
  EXPECT_TRUE(testing::NoProcessLeft(marker_));
}

TEST_F(AgentTest, AHealthCheckThatHangsIsKilledAtItsTimeout) {
  StartRdzvd();
  Subprocess& healthy = StartAgent("n0", "hang-check", 2, {"--node-rank", "0"});
  Subprocess& stuck =
      StartAgent("n1", "hang-check", 2,
                 {"--node-rank", "1", "--health-check-timeout", "1s", "--health-check",
                  absl::StrCat("exec bash -c '(exec -a ", marker_,
                               "-bg sleep 120) & echo probing the fabric; exec -a ", marker_,
                               "-check sleep 120'")});
  EXPECT_EQ(stuck.Wait(kLongWait), kExitNodeUnhealthy) << stuck.Stderr();
  EXPECT_EQ(healthy.Wait(kLongWait), kExitNodeUnhealthy) << healthy.Stderr();
  EXPECT_TRUE(Contains(stuck.Stderr(),
                       "health check timed out: probing the fabric (did not finish within 1s)"))
      << stuck.Stderr();
  // The check's whole process group went with it.
  EXPECT_TRUE(testing::NoProcessLeft(marker_));
}

bool WaitForMatches(const std::string& marker, size_t n) {
  const absl::Time deadline = absl::Now() + kLongWait;
  while (testing::ProcessesMatching(marker).size() < n) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

TEST(SubprocessTest, CapturesOutputAndExitCode) {
  Subprocess p(
      {.argv = {"bash", "-c", "echo out; echo err >&2; exit $CODE"}, .env = {{"CODE", "7"}}});
  EXPECT_EQ(p.Wait(kLongWait), 7);
  EXPECT_EQ(p.Stdout(), "out\n");
  EXPECT_EQ(p.Stderr(), "err\n");
}

TEST(SubprocessTest, SignalsGive128PlusSignal) {
  Subprocess p({.argv = {"sleep", "120"}});
  EXPECT_TRUE(p.Running());
  p.Signal(SIGTERM);
  EXPECT_EQ(p.Wait(kLongWait), 128 + SIGTERM);
}

TEST(SubprocessTest, TimeoutKillsTheGroupAndFails) {
  const std::string marker = testing::UniqueMarker();
  std::optional<Subprocess> p;
  p.emplace(SubprocessOptions{
      .argv = {"bash", "-c", absl::StrCat("(exec -a ", marker, "-child sleep 120) & wait"),
               marker}});
  ASSERT_TRUE(WaitForMatches(marker, 2)) << "the shell and its child";
  EXPECT_NONFATAL_FAILURE(EXPECT_EQ(p->Wait(absl::Milliseconds(300)), Subprocess::kTimedOut),
                          "did not exit within");
  EXPECT_TRUE(testing::NoProcessLeft(marker));
}

TEST(SubprocessTest, DestructorKillsTheGroupAndNothingIsLeft) {
  const std::string marker = testing::UniqueMarker();
  {
    Subprocess p({.argv = {"bash", "-c",
                           absl::StrCat("(exec -a ", marker, "-child sleep 120) & wait"), marker}});
    ASSERT_TRUE(WaitForMatches(marker, 2)) << "the shell and its child";
  }
  EXPECT_TRUE(testing::NoProcessLeft(marker));
}

TEST(SubprocessTest, MissingProgramFailsTheTest) {
  std::optional<Subprocess> p;
  EXPECT_NONFATAL_FAILURE(p.emplace(SubprocessOptions{.argv = {"/no/such/program"}}),
                          "cannot find an executable");
  EXPECT_EQ(p->Wait(kLongWait), 127);
}

}  // namespace
}  // namespace rdzv
