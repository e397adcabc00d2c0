// Failures across real processes: a real rdzvd, real rdzv-agents, and workers that are small
// bash scripts (one a Python script with torch's @record). A worker that fails, an agent that is
// killed or signalled, user signals, restarts, elastic node counts, where worker output goes, and a
// primary rdzvd lost to its backup.
// Asserts what a user would check: the exit codes, how soon every agent gives up, the root-cause
// report, what the workers of each round saw, and that no process is left running.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "rdzv/v1/rdzv.grpc.pb.h"
#include "tests/testing/long_wait.h"
#include "tests/testing/output.h"
#include "tests/testing/process_fixture.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tcp_proxy.h"
#include "tests/testing/two_hosts.h"

namespace rdzv {
namespace {

using testing::Contains;
using testing::Describe;
using testing::kLongWait;
using testing::LacksText;
using testing::LineWith;
using testing::ScopedTempDir;
using testing::Subprocess;
using testing::SubprocessOptions;

// How soon every agent must have ended once the job has failed: the workers stop on SIGTERM at
// once (the default --term-timeout of 3s is the worst case), plus a margin for a loaded machine.
constexpr absl::Duration kPrompt = absl::Seconds(10);

// The variables every worker writes down.
constexpr const char* kWorkerVars[] = {"RANK",
                                       "LOCAL_RANK",
                                       "WORLD_SIZE",
                                       "LOCAL_WORLD_SIZE",
                                       "GROUP_RANK",
                                       "GROUP_WORLD_SIZE",
                                       "TORCHELASTIC_RUN_ID",
                                       "TORCHELASTIC_RESTART_COUNT",
                                       "TORCHELASTIC_MAX_RESTARTS",
                                       "RDZV_ENDPOINT",
                                       "TEST_AGENT"};

using WorkerEnv = std::map<std::string, std::string>;

bool ProcessAlive(pid_t pid) {
  const std::string stat = testing::ReadFileOrEmpty(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z' &&
         stat[paren + 2] != 'X';
}

class FailureTest : public testing::ProcessTest {
 protected:
  void SetUp() override {
    std::filesystem::create_directory(TmpDir());
    env_.emplace_back("TMPDIR", TmpDir());
  }

  void TearDown() override {
    ProcessTest::TearDown();
    // Nor any agent's private directory (the workers' error files), however the agent ended.
    std::vector<std::string> left;
    std::error_code ec;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(TmpDir(), ec)) {
      left.push_back(entry.path().string());
    }
    EXPECT_EQ(absl::StrJoin(left, " "), "") << "left in the agents' TMPDIR";
  }

  // The agents' TMPDIR.
  std::string TmpDir() const { return absl::StrCat(dir_.path(), "/tmp"); }

  // The agent of node `node` (host name "n<node>") of job `job` at this test's rdzvd. Its
  // workers run Worker(then, first).
  Subprocess& StartAgent(const std::string& job, int node, const std::string& nnodes,
                         std::vector<std::string> flags, const std::string& then,
                         const std::string& first = "") {
    const std::string host = absl::StrCat("n", node);
    std::vector<std::string> argv = {RDZV_AGENT_BIN,
                                     "--auth",
                                     "none",
                                     "--rdzv-endpoint",
                                     endpoint_,
                                     "--rdzv-id",
                                     job,
                                     "--nnodes",
                                     nnodes,
                                     "--node-rank",
                                     absl::StrCat(node),
                                     "--host-name",
                                     host,
                                     "--join-timeout",
                                     "60"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back("--");
    for (std::string& a : Worker(then, first)) argv.push_back(std::move(a));
    return Start(std::move(argv), {{"TEST_AGENT", host}});
  }

  // Agents of nodes 0..count-1, in that order.
  std::vector<Subprocess*> StartAgents(int count, const std::string& job, const std::string& nnodes,
                                       const std::vector<std::string>& flags,
                                       const std::string& then, const std::string& first = "") {
    std::vector<Subprocess*> agents;
    for (int node = 0; node < count; ++node) {
      agents.push_back(&StartAgent(job, node, nnodes, flags, then, first));
    }
    return agents;
  }

  // A worker (bash) that first runs `first` (e.g. installs traps), then writes the variables it
  // sees and its pid to r<restart>-<host>-<local rank>.env in the test's directory (so a written
  // file means the worker is up and its traps are in place), then runs `then`. The marker in its
  // command line (and in its agent's) lets the test find leftovers.
  std::vector<std::string> Worker(const std::string& then, const std::string& first) const {
    const std::string script =
        absl::StrCat("d=", dir_.path(), "; ", first,
                     "f=$d/r${TORCHELASTIC_RESTART_COUNT}-${TEST_AGENT}-${LOCAL_RANK}; ",
                     "{ env | grep -E '^(", absl::StrJoin(kWorkerVars, "|"),
                     ")='; echo PID=$$; } > $f.tmp && mv $f.tmp $f.env; ", then);
    return {"bash", "-c", script, marker_};
  }

  // Bash that sleeps (as a training step would) until the worker is stopped; the sleep carries
  // the marker too, so that an orphaned sleep would be found.
  std::string SleepLong() const {
    return absl::StrCat("(exec -a ", marker_, "-sleep sleep 60) & wait; exit 0");
  }

  // Bash that waits (at most 20 s) until `n` workers of round `restart` have written their file,
  // so that a failure comes after every agent has started its workers.
  static std::string AwaitWorkers(int restart, int n) {
    return absl::StrCat("i=0; while [ $((i += 1)) -le 400 ]; do [ $(ls $d/r", restart,
                        "-*.env 2>/dev/null | wc -l) -ge ", n, " ] && break; sleep 0.05; done; ");
  }

  // The workers of round `restart` that have written their file, sorted by RANK.
  std::vector<WorkerEnv> ReadWorkers(int restart) const {
    std::vector<WorkerEnv> workers;
    const std::string prefix = absl::StrCat("r", restart, "-");
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir_.path(), ec)) {
      const std::string name = entry.path().filename().string();
      if (!absl::StartsWith(name, prefix) || !absl::EndsWith(name, ".env")) continue;
      WorkerEnv env;
      const std::string text = testing::ReadFileOrEmpty(entry.path().string());
      for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
        std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
        env.insert(std::move(kv));
      }
      workers.push_back(std::move(env));
    }
    std::sort(workers.begin(), workers.end(), [](const WorkerEnv& a, const WorkerEnv& b) {
      int ra = -1, rb = -1;
      if (a.contains("RANK")) (void)absl::SimpleAtoi(a.at("RANK"), &ra);
      if (b.contains("RANK")) (void)absl::SimpleAtoi(b.at("RANK"), &rb);
      return ra < rb;
    });
    return workers;
  }

  // Waits until `n` workers of round `restart` are up; returns what they wrote.
  std::vector<WorkerEnv> WaitForWorkers(int restart, size_t n) const {
    const absl::Time deadline = absl::Now() + kLongWait;
    std::vector<WorkerEnv> workers = ReadWorkers(restart);
    while (workers.size() < n && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
      workers = ReadWorkers(restart);
    }
    EXPECT_EQ(workers.size(), n) << "workers of round " << restart << " that started";
    return workers;
  }

  // Waits until `job` has `joined` agents at this test's rdzvd.
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

  void ExpectNothingLeft() { EXPECT_TRUE(testing::NoProcessLeft(marker_)); }

  ScopedTempDir dir_;
};

// Waits for every agent; returns how long until the last one had ended.
absl::Duration WaitAll(const std::vector<Subprocess*>& agents, std::vector<int>& codes) {
  const absl::Time start = absl::Now();
  codes.clear();
  for (Subprocess* a : agents) codes.push_back(a->Wait(kLongWait));
  return absl::Now() - start;
}

// Waits for `agents`, which must all fail job `job` for having lost the agent on `host`; returns
// how long until the last one had ended.
absl::Duration WaitForLostContact(const std::vector<Subprocess*>& agents, const std::string& job,
                                  const std::string& host) {
  std::vector<int> codes;
  const absl::Duration took = WaitAll(agents, codes);
  for (Subprocess* a : agents) {
    EXPECT_NE(a->exit_code().value_or(0), 0) << Describe(*a);
    EXPECT_TRUE(Contains(LineWith(a->Stderr(), absl::StrCat("job ", job, " failed")),
                         absl::StrCat("lost contact with the agent on ", host)))
        << Describe(*a);
  }
  return took;
}

TEST_F(FailureTest, WorkerFailureStopsEveryAgentWithItsExitCode) {
  ASSERT_NO_FATAL_FAILURE(StartRdzvd());
  // Rank 3 (node 1, local rank 1) fails once all six workers are up; the others would sleep.
  const std::vector<Subprocess*> agents =
      StartAgents(3, "fail", "3", {"--nproc-per-node", "2"},
                  absl::StrCat("if [ $RANK = 3 ]; then ", AwaitWorkers(0, 6),
                               "echo 'rank 3: out of memory' >&2; exit 3; fi; ", SleepLong()));
  WaitForWorkers(0, 6);
  std::vector<int> codes;
  const absl::Duration took = WaitAll(agents, codes);
  for (size_t i = 0; i < agents.size(); ++i) {
    EXPECT_EQ(codes[i], 3) << Describe(*agents[i]);
  }
  EXPECT_LT(took, kPrompt) << "the other agents were not told promptly";
  for (Subprocess* a : agents) {
    const std::string err = a->Stderr();
    EXPECT_TRUE(
        Contains(LineWith(err, "job fail failed"),
                 "job fail failed: rank 3 (local rank 1, node 1) on n1 exited with code 3"));
    // The failing worker's last stderr lines follow, on every node.
    EXPECT_TRUE(Contains(err, "last lines of rank 3's stderr:"));
    EXPECT_TRUE(Contains(err, "    rank 3: out of memory"));
  }
  ExpectNothingLeft();
}

TEST_F(FailureTest, WorkerKilledBySigsegvGives139AndNamesTheSignal) {
  ASSERT_NO_FATAL_FAILURE(StartRdzvd());
  const std::vector<Subprocess*> agents =
      StartAgents(2, "segv", "2", {"--nproc-per-node", "2"},
                  absl::StrCat("if [ $RANK = 2 ]; then ", AwaitWorkers(0, 4),
                               "ulimit -c 0; kill -SEGV $$; fi; ", SleepLong()));
  WaitForWorkers(0, 4);
  std::vector<int> codes;
  const absl::Duration took = WaitAll(agents, codes);
  for (size_t i = 0; i < agents.size(); ++i) {
    EXPECT_EQ(codes[i], 128 + SIGSEGV) << Describe(*agents[i]);
  }
  EXPECT_LT(took, kPrompt);
  for (Subprocess* a : agents) {
    EXPECT_TRUE(Contains(LineWith(a->Stderr(), "job segv failed"),
                         "rank 2 (local rank 0, node 1) on n1 was killed by SIGSEGV "
                         "(exit code 139)"));
  }
  ExpectNothingLeft();
}

TEST_F(FailureTest, LostAgentEndsTheJobForTheOthers) {
  ASSERT_NO_FATAL_FAILURE(StartRdzvd());
  const std::vector<Subprocess*> agents =
      StartAgents(3, "lost", "3", {"--nproc-per-node", "2"}, SleepLong());
  const std::vector<WorkerEnv> workers = WaitForWorkers(0, 6);
  agents[1]->Signal(SIGKILL);
  EXPECT_EQ(agents[1]->Wait(kLongWait), 128 + SIGKILL);

  std::vector<int> codes;
  const absl::Duration took = WaitAll({agents[0], agents[2]}, codes);
  EXPECT_LT(took, kPrompt);
  for (int i : {0, 2}) {
    Subprocess& a = *agents[i];
    EXPECT_NE(a.exit_code().value_or(0), 0) << Describe(a);
    EXPECT_NE(a.exit_code().value_or(0), Subprocess::kTimedOut);
    EXPECT_TRUE(
        Contains(LineWith(a.Stderr(), "job lost failed"), "lost contact with the agent on n1"));
  }
  // The killed agent's own workers went with it, even though it could not stop them.
  for (const WorkerEnv& w : workers) {
    int pid = 0;
    ASSERT_TRUE(absl::SimpleAtoi(w.at("PID"), &pid));
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (ProcessAlive(pid) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
    EXPECT_FALSE(ProcessAlive(pid)) << "rank " << w.at("RANK") << " of " << w.at("TEST_AGENT");
  }
  ExpectNothingLeft();
}

// An agent frozen on a live host (SIGSTOP): its host's kernel still answers for its connection,
// but the agent answers no ping of rdzvd's, and the job ends for the others within the ping
// interval (1 s here; --ping-ms) plus its timeout (1 s).
TEST_F(FailureTest, SilentAgentIsNoticedAndEndsTheJob) {
  ASSERT_NO_FATAL_FAILURE(StartRdzvd({"--ping-ms", "1000"}));
  const std::vector<Subprocess*> agents =
      StartAgents(3, "silent", "3", {"--nproc-per-node", "1"}, SleepLong());
  WaitForWorkers(0, 3);
  agents[1]->Signal(SIGSTOP);

  const absl::Duration took = WaitForLostContact({agents[0], agents[2]}, "silent", "n1");
  EXPECT_LT(took, absl::Seconds(8)) << "2 s of pings, and room for a loaded machine";
  agents[1]->Signal(SIGKILL);
  EXPECT_EQ(agents[1]->Wait(kLongWait), 128 + SIGKILL);
  ExpectNothingLeft();
}

// rdzvd dies mid-job and comes back on the same address (systemd restarts it): the agents keep
// their workers running, rejoin, and the job ends as it would have.
TEST_F(FailureTest, RestartedRdzvdTakesTheRunningJobBack) {
  ASSERT_NO_FATAL_FAILURE(StartRdzvd());
  const std::string finish = "while [ ! -e $d/go ]; do sleep 0.05; done; exit 0";
  const std::vector<Subprocess*> agents =
      StartAgents(2, "comeback", "2", {"--nproc-per-node", "2"}, finish);
  const std::vector<WorkerEnv> before = WaitForWorkers(0, 4);

  rdzvd_->Kill();
  const std::vector<std::string> argv = {RDZVD_BIN, "--auth", "none", "--listen", endpoint_};
  Subprocess& again = Start(argv);
  ASSERT_TRUE(testing::WaitForLoopbackPort(port_, kLongWait) && again.Running()) << again.Stderr();
  ASSERT_NO_FATAL_FAILURE(WaitForJoined("comeback", 2));
  // Counted in rdzv_failovers_total as any takeover is, though this rdzvd has no --peers.
  EXPECT_TRUE(again.WaitForOutput("job comeback: taken up from its resuming agents", kLongWait))
      << again.Stderr();
  for (Subprocess* a : agents) {
    EXPECT_TRUE(a->WaitForOutput("back in touch with the rendezvous server", kLongWait))
        << Describe(*a);
    EXPECT_TRUE(a->Running()) << Describe(*a);
  }

  std::ofstream(absl::StrCat(dir_.path(), "/go")).put('\n');
  std::vector<int> codes;
  WaitAll(agents, codes);
  EXPECT_EQ(codes, std::vector<int>({0, 0})) << Describe(*agents[0]) << Describe(*agents[1]);
  // The same workers ran throughout: none was restarted.
  EXPECT_EQ(ReadWorkers(0).size(), before.size());
  EXPECT_TRUE(ReadWorkers(1).empty());
  ExpectNothingLeft();
}

// rdzvd dies and stays away: past --reconnect-timeout every agent stops its workers and says so.
TEST_F(FailureTest, AgentsGiveUpWhenTheServerStaysAway) {
  ASSERT_NO_FATAL_FAILURE(StartRdzvd());
  const std::vector<Subprocess*> agents = StartAgents(
      2, "gone", "2", {"--nproc-per-node", "1", "--reconnect-timeout", "2s"}, SleepLong());
  WaitForWorkers(0, 2);
  rdzvd_->Kill();

  std::vector<int> codes;
  const absl::Duration took = WaitAll(agents, codes);
  EXPECT_LT(took, kPrompt);
  for (Subprocess* a : agents) {
    EXPECT_EQ(a->exit_code().value_or(0), 1) << Describe(*a);
    EXPECT_TRUE(Contains(LineWith(a->Stderr(), "job gone failed"), "could not rejoin within 2s"));
  }
  ExpectNothingLeft();
}

TEST_F(FailureTest, SigtermToOneAgentStopsEveryAgent) {
  ASSERT_NO_FATAL_FAILURE(StartRdzvd());
  const std::vector<Subprocess*> agents =
      StartAgents(3, "term", "3", {"--nproc-per-node", "2"}, SleepLong());
  WaitForWorkers(0, 6);
  agents[1]->Signal(SIGTERM);
  std::vector<int> codes;
  const absl::Duration took = WaitAll(agents, codes);
  EXPECT_LT(took, kPrompt);
  EXPECT_EQ(codes[1], 128 + SIGTERM) << Describe(*agents[1]);
  for (int i : {0, 2}) {
    EXPECT_NE(codes[i], 0) << Describe(*agents[i]);
    EXPECT_NE(codes[i], Subprocess::kTimedOut);
  }
  for (Subprocess* a : agents) {
    EXPECT_TRUE(Contains(LineWith(a->Stderr(), "job term failed"),
                         "the agent on n1 (node 1) received "
                         "SIGTERM"));
  }
  ExpectNothingLeft();
}

TEST_F(FailureTest, UserSignalsReachEveryWorkerAndAreNoFailure) {
  ASSERT_NO_FATAL_FAILURE(StartRdzvd());
  // Each worker notes the signals it receives, and ends once it has seen SIGUSR2 (at most 20 s).
  // The signals go to the worker's whole process group, so its loop counts in bash: a `seq` in
  // the group would die of SIGUSR1 and cut the loop short.
  const std::vector<Subprocess*> agents = StartAgents(
      2, "usr", "2", {"--nproc-per-node", "2"},
      "i=0; while [ $((i += 1)) -le 400 ]; do grep -q USR2 $d/sig-$RANK && exit 0; sleep 0.05; "
      "done 2>/dev/null; exit 9",
      "trap 'echo USR1 >> $d/sig-$RANK' USR1; trap 'echo USR2 >> $d/sig-$RANK' USR2; ");
  // The traps are armed before a worker writes its file: signal only once all have.
  WaitForWorkers(0, 4);
  for (Subprocess* a : agents) a->Signal(SIGUSR1);
  const auto seen = [this](int rank, absl::string_view sig) {
    return absl::StrContains(testing::ReadFileOrEmpty(dir_.File(absl::StrCat("sig-", rank))), sig);
  };
  const auto all_seen = [&seen](absl::string_view sig) {
    for (int r = 0; r < 4; ++r) {
      if (!seen(r, sig)) return false;
    }
    return true;
  };
  for (absl::Time deadline = absl::Now() + kPrompt; !all_seen("USR1") && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(seen(r, "USR1")) << "rank " << r;
  for (Subprocess* a : agents) {
    EXPECT_TRUE(a->Running()) << "SIGUSR1 ended the agent\n" << Describe(*a);
  }

  for (Subprocess* a : agents) a->Signal(SIGUSR2);
  std::vector<int> codes;
  WaitAll(agents, codes);
  for (size_t i = 0; i < agents.size(); ++i) {
    EXPECT_EQ(codes[i], 0) << Describe(*agents[i]);
    EXPECT_TRUE(Contains(agents[i]->Stderr(), "forwarded SIGUSR1 to 2 workers"));
    EXPECT_TRUE(Contains(agents[i]->Stderr(), "forwarded SIGUSR2 to 2 workers"));
  }
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(testing::ReadFileOrEmpty(dir_.File(absl::StrCat("sig-", r))), "USR1\nUSR2\n")
        << "rank " << r;
  }
  ExpectNothingLeft();
}

TEST_F(FailureTest, MaxRestartsRestartsWithTheSameRanks) {
  ASSERT_NO_FATAL_FAILURE(StartRdzvd());
  // Rank 1 fails in the first round only; the others would sleep through it.
  const std::vector<Subprocess*> agents = StartAgents(
      2, "again", "2", {"--nproc-per-node", "2", "--max-restarts", "2"},
      absl::StrCat("if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then if [ $RANK = 1 ]; then ",
                   AwaitWorkers(0, 4), "exit 5; fi; ", SleepLong(), "; fi; exit 0"));
  std::vector<int> codes;
  WaitAll(agents, codes);
  for (size_t i = 0; i < agents.size(); ++i) {
    EXPECT_EQ(codes[i], 0) << Describe(*agents[i]);
    EXPECT_TRUE(Contains(agents[i]->Stderr(), "restarting the workers (restart 1 of 2)"));
    EXPECT_TRUE(LacksText(agents[i]->Stderr(), "restart 2 of 2"));
  }
  const std::vector<WorkerEnv> first = ReadWorkers(0);
  const std::vector<WorkerEnv> second = ReadWorkers(1);
  ASSERT_EQ(first.size(), 4u);
  ASSERT_EQ(second.size(), 4u);
  EXPECT_TRUE(ReadWorkers(2).empty()) << "a third round";
  for (size_t i = 0; i < 4; ++i) {
    // The same agent and local rank hold the same global rank in both rounds.
    EXPECT_EQ(second[i].at("RANK"), absl::StrCat(i));
    EXPECT_EQ(second[i].at("RANK"), first[i].at("RANK"));
    EXPECT_EQ(second[i].at("TEST_AGENT"), first[i].at("TEST_AGENT")) << "rank " << i;
    EXPECT_EQ(second[i].at("LOCAL_RANK"), first[i].at("LOCAL_RANK")) << "rank " << i;
    EXPECT_EQ(second[i].at("GROUP_RANK"), first[i].at("GROUP_RANK")) << "rank " << i;
    EXPECT_EQ(second[i].at("WORLD_SIZE"), "4") << "rank " << i;
    EXPECT_EQ(first[i].at("TORCHELASTIC_RESTART_COUNT"), "0") << "rank " << i;
    EXPECT_EQ(second[i].at("TORCHELASTIC_RESTART_COUNT"), "1") << "rank " << i;
    EXPECT_EQ(second[i].at("TORCHELASTIC_MAX_RESTARTS"), "2") << "rank " << i;
  }
  ExpectNothingLeft();
}

// A restart that would need a node whose workers already succeeded (its agent has left) cannot
// be whole: every remaining agent ends at once with the failing rank's code, naming both the
// failure and the node that had finished, instead of waiting for it until the join timeout.
TEST_F(FailureTest, ARestartThatNeedsAFinishedNodeEndsAtOnce) {
  ASSERT_NO_FATAL_FAILURE(StartRdzvd());
  // Node 0 succeeds at once; once its agent is gone, rank 1 fails (as in a crash at exit) and
  // notes when; rank 2 would sleep.
  const std::vector<Subprocess*> agents = StartAgents(
      3, "finished", "3", {"--max-restarts", "1", "--join-timeout", "60"},
      absl::StrCat("[ $RANK = 0 ] && exit 0; ",
                   "if [ $RANK = 1 ]; then while [ ! -e $d/go ]; do sleep 0.02; done; ",
                   "date +%s.%N > $d/failed-at; echo 'Segmentation fault' >&2; exit 3; fi; ",
                   SleepLong()));
  WaitForWorkers(0, 3);
  ASSERT_EQ(agents[0]->Wait(kLongWait), 0) << Describe(*agents[0]);
  std::ofstream(absl::StrCat(dir_.path(), "/go")).put('\n');
  std::vector<int> codes;
  WaitAll({agents[1], agents[2]}, codes);
  const absl::Time ended = absl::Now();
  double failed_at = 0;
  ASSERT_TRUE(absl::SimpleAtod(
      absl::StripAsciiWhitespace(testing::ReadFileOrEmpty(absl::StrCat(dir_.path(), "/failed-at"))),
      &failed_at));
  const absl::Duration took = ended - absl::FromUnixNanos(static_cast<int64_t>(failed_at * 1e9));
  std::cout << "from rank 1's failure to the last agent's exit: " << took << std::endl;
  EXPECT_LT(took, kPrompt) << "the restart waited for the node that had finished";
  for (int i : {1, 2}) {
    Subprocess& a = *agents[i];
    EXPECT_EQ(codes[i - 1], 3) << Describe(a);
    const std::string last = LineWith(a.Stderr(), "job finished failed");
    EXPECT_TRUE(Contains(last, "rank 1 (local rank 0, node 1) on n1 exited with code 3"))
        << Describe(a);
    EXPECT_TRUE(Contains(last, "n0 (node 0) had already finished")) << Describe(a);
    EXPECT_TRUE(LacksText(a.Stderr(), "waiting for 1 of 3 nodes")) << Describe(a);
  }
  EXPECT_TRUE(ReadWorkers(1).empty()) << "a restart ran without node 0";
  ExpectNothingLeft();
}

// --standalone keeps its rendezvous in-process; restarts and the root cause work as with a server.
TEST_F(FailureTest, StandaloneRestartsThenReportsTheFailure) {
  std::vector<std::string> argv = {RDZV_AGENT_BIN,
                                   "--standalone",
                                   "--nproc-per-node",
                                   "2",
                                   "--max-restarts",
                                   "1",
                                   "--host-name",
                                   "solo",
                                   "--"};
  // Rank 1 fails in every round: one restart, then the job fails with its code.
  for (std::string& a : Worker(absl::StrCat("if [ $RANK = 1 ]; then ", AwaitWorkers(0, 2),
                                            "echo broke >&2; exit 5; fi; ", SleepLong()),
                               "")) {
    argv.push_back(std::move(a));
  }
  Subprocess& agent = Start(std::move(argv), {{"TEST_AGENT", "solo"}});
  EXPECT_EQ(agent.Wait(kLongWait), 5) << Describe(agent);
  EXPECT_TRUE(Contains(agent.Stderr(), "restarting the workers (restart 1 of 1)"));
  EXPECT_TRUE(Contains(LineWith(agent.Stderr(), "failed:"),
                       "rank 1 (local rank 1, node 0) on solo exited with code 5"));
  const std::vector<WorkerEnv> first = ReadWorkers(0);
  const std::vector<WorkerEnv> second = ReadWorkers(1);
  ASSERT_EQ(first.size(), 2u);
  ASSERT_EQ(second.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(second[i].at("RANK"), first[i].at("RANK"));
    EXPECT_EQ(second[i].at("WORLD_SIZE"), "2");
    EXPECT_EQ(second[i].at("TORCHELASTIC_RESTART_COUNT"), "1");
  }
  ExpectNothingLeft();
}

TEST_F(FailureTest, ElasticJobGoesOnWithoutALostNode) {
  ASSERT_NO_FATAL_FAILURE(StartRdzvd());
  // Three of at most three agents start the job at once; node 1 is then lost. The first round
  // sleeps; the second writes its file and ends.
  const std::vector<Subprocess*> agents = StartAgents(
      3, "elastic", "2:3", {"--nproc-per-node", "2", "--max-restarts", "1", "--last-call", "1"},
      absl::StrCat("if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then ", SleepLong(), "; fi; exit 0"));
  const std::vector<WorkerEnv> first = WaitForWorkers(0, 6);
  for (const WorkerEnv& w : first) EXPECT_EQ(w.at("WORLD_SIZE"), "6");
  agents[1]->Signal(SIGKILL);
  EXPECT_EQ(agents[1]->Wait(kLongWait), 128 + SIGKILL);

  std::vector<int> codes;
  WaitAll({agents[0], agents[2]}, codes);
  for (int i : {0, 2}) {
    EXPECT_EQ(agents[i]->exit_code().value_or(-1), 0) << Describe(*agents[i]);
    EXPECT_TRUE(Contains(agents[i]->Stderr(), "lost contact with the agent on n1"));
  }
  const std::vector<WorkerEnv> second = ReadWorkers(1);
  ASSERT_EQ(second.size(), 4u);
  // The survivors, n0 and n2, are group ranks 0 and 1 of 2 now, with ranks 0-3 between them.
  const char* agent_of_rank[] = {"n0", "n0", "n2", "n2"};
  for (size_t r = 0; r < 4; ++r) {
    const WorkerEnv& w = second[r];
    EXPECT_EQ(w.at("RANK"), absl::StrCat(r));
    EXPECT_EQ(w.at("TEST_AGENT"), agent_of_rank[r]) << "rank " << r;
    EXPECT_EQ(w.at("WORLD_SIZE"), "4") << "rank " << r;
    EXPECT_EQ(w.at("GROUP_RANK"), absl::StrCat(r / 2)) << "rank " << r;
    EXPECT_EQ(w.at("GROUP_WORLD_SIZE"), "2") << "rank " << r;
    EXPECT_EQ(w.at("LOCAL_RANK"), absl::StrCat(r % 2)) << "rank " << r;
    EXPECT_EQ(w.at("TORCHELASTIC_RESTART_COUNT"), "1") << "rank " << r;
  }
  ExpectNothingLeft();
}

TEST_F(FailureTest, ElasticRoundCompletesAtMinAfterLastCall) {
  ASSERT_NO_FATAL_FAILURE(StartRdzvd());
  const absl::Duration last_call = absl::Seconds(2);
  const std::vector<Subprocess*> agents =
      StartAgents(2, "fewer", "2:3", {"--nproc-per-node", "2", "--last-call", "2"}, "exit 0");
  ASSERT_NO_FATAL_FAILURE(WaitForJoined("fewer", 2));
  const absl::Time min_reached = absl::Now();
  const std::vector<WorkerEnv> workers = WaitForWorkers(0, 4);
  // Polling adds a little on both sides; the round must not have completed at once.
  EXPECT_GE(absl::Now() - min_reached, last_call - absl::Milliseconds(500));
  std::vector<int> codes;
  WaitAll(agents, codes);
  for (size_t i = 0; i < agents.size(); ++i) EXPECT_EQ(codes[i], 0) << Describe(*agents[i]);
  ASSERT_EQ(workers.size(), 4u);
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_EQ(workers[r].at("RANK"), absl::StrCat(r));
    EXPECT_EQ(workers[r].at("WORLD_SIZE"), "4") << "rank " << r;
    EXPECT_EQ(workers[r].at("GROUP_WORLD_SIZE"), "2") << "rank " << r;
    EXPECT_EQ(workers[r].at("GROUP_RANK"), absl::StrCat(r / 2)) << "rank " << r;
  }
  ExpectNothingLeft();
}

TEST_F(FailureTest, TorchRecordErrorIsTheRootCause) {
  ASSERT_NO_FATAL_FAILURE(StartRdzvd());
  const std::string script = dir_.File("train.py");
  {
    std::ofstream f(script);
    f << "from torch.distributed.elastic.multiprocessing.errors import record\n"
         "\n"
         "\n"
         "@record\n"
         "def main():\n"
         "    raise ValueError(\"some message\")\n"
         "\n"
         "\n"
         "if __name__ == \"__main__\":\n"
         "    main()\n";
  }
  // Rank 1 runs the script (its command line keeps the marker); rank 0 would sleep.
  const std::vector<Subprocess*> agents =
      StartAgents(2, "record", "2", {},
                  absl::StrCat("if [ $RANK = 1 ]; then exec ", RDZV_TORCH_PYTHON, " ", script, " ",
                               marker_, "; fi; ", SleepLong()));
  std::vector<int> codes;
  WaitAll(agents, codes);
  for (size_t i = 0; i < agents.size(); ++i) {
    EXPECT_EQ(codes[i], 1) << Describe(*agents[i]);
    const std::string err = agents[i]->Stderr();
    EXPECT_TRUE(Contains(LineWith(err, "job record failed"),
                         "rank 1 (local rank 0, node 1) on n1 exited with code 1"));
    // The error file's message and traceback, not the stderr tail.
    EXPECT_TRUE(Contains(err, "rank 1's error:"));
    EXPECT_TRUE(Contains(err, "    ValueError: some message"));
    EXPECT_TRUE(Contains(err, "raise ValueError(\"some message\")"));
  }
  ExpectNothingLeft();
}

// Each worker prints one line to stdout and one to stderr.
constexpr char kTalk[] = "echo \"out of rank $RANK\"; echo \"err of rank $RANK\" >&2; exit 0";

TEST_F(FailureTest, LogDirGetsOneFilePerRankAndTheConsoleStaysQuiet) {
  ASSERT_NO_FATAL_FAILURE(StartRdzvd());
  const std::string logs = dir_.File("logs");
  std::vector<Subprocess*> agents =
      StartAgents(2, "logs", "2", {"--nproc-per-node", "2", "--log-dir", logs}, kTalk);
  std::vector<int> codes;
  WaitAll(agents, codes);
  for (size_t i = 0; i < agents.size(); ++i) {
    EXPECT_EQ(codes[i], 0) << Describe(*agents[i]);
    EXPECT_TRUE(LacksText(agents[i]->Stdout(), "of rank"));
    EXPECT_TRUE(LacksText(agents[i]->Stderr(), "of rank"));
  }
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(logs, ec)) {
    files.push_back(entry.path().filename().string());
  }
  std::sort(files.begin(), files.end());
  EXPECT_EQ(absl::StrJoin(files, " "), "rank-0.log rank-1.log rank-2.log rank-3.log");
  for (int r = 0; r < 4; ++r) {
    const std::string text = testing::ReadFileOrEmpty(absl::StrCat(logs, "/rank-", r, ".log"));
    // Exactly this rank's two lines, in either order (two pipes).
    EXPECT_TRUE(Contains(text, absl::StrCat("out of rank ", r, "\n"))) << "rank " << r;
    EXPECT_TRUE(Contains(text, absl::StrCat("err of rank ", r, "\n"))) << "rank " << r;
    EXPECT_EQ(text.size(), absl::StrCat("out of rank ", r, "\nerr of rank ", r, "\n").size())
        << text;
  }
}

TEST_F(FailureTest, LogDirWithTeeAlsoShowsTheConsole) {
  ASSERT_NO_FATAL_FAILURE(StartRdzvd());
  const std::string logs = dir_.File("logs");
  std::vector<Subprocess*> agents =
      StartAgents(2, "tee", "2", {"--nproc-per-node", "2", "--log-dir", logs, "--tee"}, kTalk);
  std::vector<int> codes;
  WaitAll(agents, codes);
  for (size_t i = 0; i < agents.size(); ++i) {
    EXPECT_EQ(codes[i], 0) << Describe(*agents[i]);
    for (int local = 0; local < 2; ++local) {
      const int r = static_cast<int>(i) * 2 + local;
      EXPECT_TRUE(Contains(agents[i]->Stdout(), absl::StrCat("[", r, "]: out of rank ", r, "\n")));
      EXPECT_TRUE(Contains(agents[i]->Stderr(), absl::StrCat("[", r, "]: err of rank ", r, "\n")));
      EXPECT_TRUE(Contains(testing::ReadFileOrEmpty(absl::StrCat(logs, "/rank-", r, ".log")),
                           absl::StrCat("out of rank ", r, "\n")));
    }
  }
}

TEST_F(FailureTest, LocalRanksFilterShowsOnlyLocalRankZero) {
  ASSERT_NO_FATAL_FAILURE(StartRdzvd());
  std::vector<Subprocess*> agents =
      StartAgents(2, "filter", "2", {"--nproc-per-node", "2", "--local-ranks-filter", "0"}, kTalk);
  std::vector<int> codes;
  WaitAll(agents, codes);
  for (size_t i = 0; i < agents.size(); ++i) {
    EXPECT_EQ(codes[i], 0) << Describe(*agents[i]);
    const int shown = static_cast<int>(i) * 2, hidden = shown + 1;
    const std::string out = agents[i]->Stdout(), err = agents[i]->Stderr();
    EXPECT_TRUE(Contains(out, absl::StrCat("[", shown, "]: out of rank ", shown, "\n")));
    EXPECT_TRUE(Contains(err, absl::StrCat("[", shown, "]: err of rank ", shown, "\n")));
    EXPECT_TRUE(LacksText(out, absl::StrCat("of rank ", hidden)));
    EXPECT_TRUE(LacksText(err, absl::StrCat("of rank ", hidden)));
  }
}

TEST_F(FailureTest, RankPrefixCanBeTurnedOff) {
  ASSERT_NO_FATAL_FAILURE(StartRdzvd());
  std::vector<Subprocess*> agents =
      StartAgents(1, "plain", "1", {"--nproc-per-node", "2", "--rank-prefix=false"}, kTalk);
  std::vector<int> codes;
  WaitAll(agents, codes);
  EXPECT_EQ(codes[0], 0) << Describe(*agents[0]);
  const std::string out = agents[0]->Stdout();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(LineWith(out, absl::StrCat("out of rank ", r)), absl::StrCat("out of rank ", r));
  }
  EXPECT_TRUE(LacksText(out, "]: "));
}

// A primary rdzvd and its backup (--peers each other), and agents given both (--rdzv-endpoint
// primary,backup). The primary dies (SIGKILL) while a job runs, while it fills, before a restart;
// a partition keeps the agents from the primary while the backup still reaches it; the primary
// comes back. Asserts where each job is served, what the agents did and said, and that a job is
// never split between the two.
class FailoverTest : public FailureTest {
 protected:
  // The two servers: a_ the primary (on a_port_ when it is set), b_ the backup; endpoint_ lists
  // them (the primary through `primary_via` when given: a port that forwards to it).
  // With `one_list`, both are given the whole list, each its own address included.
  void StartPair(int primary_via = 0, bool one_list = false) {
    if (a_port_ == 0) a_port_ = testing::FreeLoopbackPort();
    b_port_ = testing::FreeLoopbackPort();
    ASSERT_NE(a_port_, b_port_);
    const std::string list = absl::StrCat("127.0.0.1:", a_port_, ",127.0.0.1:", b_port_);
    ASSERT_NO_FATAL_FAILURE(
        a_ = &StartServer(a_port_, one_list ? list : absl::StrCat("127.0.0.1:", b_port_)));
    ASSERT_NO_FATAL_FAILURE(
        b_ = &StartServer(b_port_, one_list ? list : absl::StrCat("127.0.0.1:", a_port_)));
    endpoint_ = absl::StrCat("127.0.0.1:", primary_via != 0 ? primary_via : a_port_,
                             ",127.0.0.1:", b_port_);
  }

  Subprocess& StartServer(int port, const std::string& peers) {
    Subprocess& s = Start({RDZVD_BIN, "--auth", "none", "--listen",
                           absl::StrCat("127.0.0.1:", port), "--peers", peers});
    EXPECT_TRUE(testing::WaitForLoopbackPort(port, kLongWait) && s.Running()) << s.Stderr();
    return s;
  }

  // `job` as the server on `port` has it; nullopt when it does not know it.
  static std::optional<JobStatusView> JobOn(int port, const std::string& job) {
    ClientOptions options;
    options.endpoint = absl::StrCat("127.0.0.1:", port);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
    if (!client.ok()) return std::nullopt;
    absl::StatusOr<std::vector<JobStatusView>> jobs = (*client)->Status(job);
    if (!jobs.ok() || jobs->size() != 1) return std::nullopt;
    return jobs->front();
  }

  // Waits until the server on `port` runs `job` with `agents` agents attached.
  static bool WaitForRunning(int port, const std::string& job, int agents) {
    const absl::Time deadline = absl::Now() + kLongWait;
    while (absl::Now() < deadline) {
      std::optional<JobStatusView> j = JobOn(port, job);
      if (j && j->state == "running" && j->joined == agents) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  std::string Backup() const { return absl::StrCat("127.0.0.1:", b_port_); }
  void Touch(const std::string& name) const {
    std::ofstream(absl::StrCat(dir_.path(), "/", name)).put('\n');
  }
  // Bash that waits until the test touches `name`.
  static std::string AwaitFile(const std::string& name) {
    return absl::StrCat("while [ ! -e $d/", name, " ]; do sleep 0.02; done; ");
  }

  Subprocess* a_ = nullptr;
  Subprocess* b_ = nullptr;
  int a_port_ = 0;
  int b_port_ = 0;
};

TEST_F(FailoverTest, PrimaryKilledWhileRunningThenAWorkerFails) {
  ASSERT_NO_FATAL_FAILURE(StartPair());
  const std::vector<Subprocess*> agents =
      StartAgents(3, "fo-run", "3", {"--nproc-per-node", "1", "--failover-timeout", "1s"},
                  absl::StrCat("if [ $RANK = 1 ]; then ", AwaitFile("fail"),
                               "echo 'rank 1: NaN loss' >&2; exit 3; fi; ", SleepLong()));
  WaitForWorkers(0, 3);
  ASSERT_TRUE(JobOn(a_port_, "fo-run").has_value());

  a_->Kill();
  ASSERT_TRUE(WaitForRunning(b_port_, "fo-run", 3)) << Describe(*b_);
  for (Subprocess* a : agents) {
    EXPECT_TRUE(a->WaitForOutput(
        absl::StrCat("back in touch with the rendezvous server at ", Backup()), kLongWait))
        << Describe(*a);
  }
  EXPECT_TRUE(Contains(b_->Stderr(), "job fo-run: taken up from its resuming agents"));

  // Fail-fast on the backup as on the primary.
  const absl::Time failed = absl::Now();
  Touch("fail");
  std::vector<int> codes;
  WaitAll(agents, codes);
  const absl::Duration took = absl::Now() - failed;
  std::cout << "every agent ended " << took << " after the worker failed, on the backup\n";
  EXPECT_LT(took, kPrompt);
  for (size_t i = 0; i < agents.size(); ++i) {
    EXPECT_EQ(codes[i], 3) << Describe(*agents[i]);
    EXPECT_TRUE(Contains(LineWith(agents[i]->Stderr(), "job fo-run failed"),
                         "rank 1 (local rank 0, node 1) on n1 exited with code 3"))
        << Describe(*agents[i]);
  }
  // The same workers ran throughout.
  EXPECT_TRUE(ReadWorkers(1).empty());
  ExpectNothingLeft();
}

// The primary is lost just after a round formed, before one agent's assignment reached it (its
// replies are dropped on the way, as a relay that had not passed them on yet). That agent joins
// afresh, and its join reaches the backup before the others resume there: the backup holds it
// in the round the others bring back and gives it its ranks once all are back. Before, the
// backup opened a new round for it, refused the resuming agents (which then failed) and left
// this one waiting until its join timeout.
TEST_F(FailoverTest, AnAgentWhoseAssignmentWasLostWithThePrimaryGetsItsRanksOnTheBackup) {
  ASSERT_NO_FATAL_FAILURE(StartPair());
  testing::TcpProxy proxy(a_port_);
  const std::vector<std::string> flags = {"--nproc-per-node", "1", "--failover-timeout", "1s",
                                          "--join-timeout",   "60"};
  const std::string finish = absl::StrCat(AwaitFile("go"), "exit 0");
  // Node 2 reaches the primary through the proxy, and is in the round first.
  const std::string list = endpoint_;
  endpoint_ = absl::StrCat("127.0.0.1:", proxy.port(), ",", Backup());
  Subprocess& late = StartAgent("fo-lost", 2, "3", flags, finish);
  endpoint_ = list;
  const absl::Time deadline = absl::Now() + kLongWait;
  while (absl::Now() < deadline) {
    std::optional<JobStatusView> j = JobOn(a_port_, "fo-lost");
    if (j && j->joined == 1) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  proxy.DropReplies();
  std::vector<Subprocess*> agents = StartAgents(2, "fo-lost", "3", flags, finish);
  agents.push_back(&late);
  WaitForWorkers(0, 2);
  ASSERT_TRUE(ReadWorkers(0).size() == 2) << "node 2 started its workers: its replies arrived";
  a_->Kill();

  const std::vector<WorkerEnv> workers = WaitForWorkers(0, 3);
  ASSERT_EQ(workers.size(), 3u) << Describe(late) << Describe(*b_);
  EXPECT_EQ(workers[2].at("TEST_AGENT"), "n2");
  EXPECT_EQ(workers[2].at("WORLD_SIZE"), "3");
  Touch("go");
  std::vector<int> codes;
  WaitAll(agents, codes);
  for (size_t i = 0; i < agents.size(); ++i) EXPECT_EQ(codes[i], 0) << Describe(*agents[i]);
  EXPECT_TRUE(Contains(b_->Stderr(), "job fo-lost: taken up from its resuming agents"));
  EXPECT_TRUE(ReadWorkers(1).empty());
  ExpectNothingLeft();
}

// A spare follows its job to the backup and stays a spare there; a node lost afterwards is
// replaced by it, as on the primary.
TEST_F(FailoverTest, ASpareFollowsItsJobToTheBackupAndTakesALostNodesPlace) {
  ASSERT_NO_FATAL_FAILURE(StartPair());
  const std::vector<Subprocess*> agents = StartAgents(
      3, "fo-spare", "3",
      {"--nproc-per-node", "1", "--spare-nodes", "1", "--max-restarts", "1", "--failover-timeout",
       "1s"},
      absl::StrCat("if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then ", SleepLong(), "; fi; exit 0"));
  WaitForWorkers(0, 2);
  a_->Kill();
  ASSERT_TRUE(WaitForRunning(b_port_, "fo-spare", 3)) << Describe(*b_);
  EXPECT_TRUE(agents[2]->WaitForOutput(
      absl::StrCat("back in touch with the rendezvous server at ", Backup()), kLongWait))
      << Describe(*agents[2]);
  std::optional<JobStatusView> job = JobOn(b_port_, "fo-spare");
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(std::count_if(job->agents.begin(), job->agents.end(),
                          [](const AgentStatusView& a) { return a.state == "spare"; }),
            1)
      << "on the backup";
  // Node 0 is lost: the spare (n2) takes its place in the restart, on the backup.
  agents[0]->Signal(SIGKILL);
  EXPECT_EQ(agents[0]->Wait(kLongWait), 128 + SIGKILL);
  std::vector<int> codes;
  WaitAll({agents[1], agents[2]}, codes);
  EXPECT_EQ(codes, std::vector<int>({0, 0})) << Describe(*agents[1]) << Describe(*agents[2]);
  const std::vector<WorkerEnv> second = ReadWorkers(1);
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[0].at("TEST_AGENT"), "n2");  // node 0's seat, rank 0
  EXPECT_EQ(second[1].at("TEST_AGENT"), "n1");
  ExpectNothingLeft();
}

TEST_F(FailoverTest, PrimaryKilledDuringAJoinTheJobFormsOnTheBackup) {
  ASSERT_NO_FATAL_FAILURE(StartPair());
  std::vector<Subprocess*> agents = {
      &StartAgent("fo-join", 0, "2", {"--nproc-per-node", "1"}, "exit 0")};
  const absl::Time deadline = absl::Now() + kLongWait;
  while (absl::Now() < deadline) {
    std::optional<JobStatusView> j = JobOn(a_port_, "fo-join");
    if (j && j->joined == 1) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(JobOn(a_port_, "fo-join").has_value()) << Describe(*a_);

  a_->Kill();
  agents.push_back(&StartAgent("fo-join", 1, "2", {"--nproc-per-node", "1"}, "exit 0"));
  std::vector<int> codes;
  WaitAll(agents, codes);
  EXPECT_EQ(codes, std::vector<int>({0, 0})) << Describe(*agents[0]) << Describe(*agents[1]);
  const std::vector<WorkerEnv> workers = ReadWorkers(0);
  ASSERT_EQ(workers.size(), 2u);
  for (size_t r = 0; r < workers.size(); ++r) {
    EXPECT_EQ(workers[r].at("WORLD_SIZE"), "2");
    EXPECT_EQ(workers[r].at("TEST_AGENT"), absl::StrCat("n", r)) << "ranks follow the nodes";
  }
  EXPECT_TRUE(Contains(b_->Stderr(), "serving on")) << Describe(*b_);
  ExpectNothingLeft();
}

// Each agent lists the servers in another order, so that both servers are asked to take up the
// same new job at about the same moment: they settle it between them, and the job forms whole on
// one of them.
TEST_F(FailoverTest, AJobJoinedAtBothServersAtOnceFormsOnOne) {
  ASSERT_NO_FATAL_FAILURE(StartPair());
  const std::string a = absl::StrCat("127.0.0.1:", a_port_);
  std::vector<Subprocess*> agents;
  for (int round = 0; round < 3; ++round) {
    const std::string job = absl::StrCat("fo-both-", round);
    agents.clear();
    for (int node = 0; node < 4; ++node) {
      endpoint_ = node % 2 == 0 ? absl::StrCat(a, ",", Backup()) : absl::StrCat(Backup(), ",", a);
      agents.push_back(&StartAgent(job, node, "4", {"--nproc-per-node", "1"},
                                   absl::StrCat(AwaitFile(absl::StrCat("go-", round)), "exit 0")));
    }
    const auto running = [&](int port) {
      std::optional<JobStatusView> j = JobOn(port, job);
      return j && j->state == "running" && j->joined == 4;
    };
    const absl::Time deadline = absl::Now() + kLongWait;
    while (!running(a_port_) && !running(b_port_) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_TRUE(running(a_port_) || running(b_port_)) << Describe(*a_) << Describe(*b_);
    EXPECT_NE(JobOn(a_port_, job).has_value(), JobOn(b_port_, job).has_value())
        << job << " is known to both servers";
    Touch(absl::StrCat("go-", round));
    std::vector<int> codes;
    WaitAll(agents, codes);
    EXPECT_EQ(codes, std::vector<int>({0, 0, 0, 0})) << Describe(*agents[1]);
  }
  ExpectNothingLeft();
}

// A peer's question about a job it does not serve leaves the asked server free to take the job up
// when its own agents come: only a server that is itself asking yields the job. Were every "no" a
// concession, two servers asked in turn by agents that list them in other orders could keep
// refusing one job between them.
TEST_F(FailoverTest, AQuestionFromAPeerDoesNotKeepTheAskedServerFromTheJob) {
  ASSERT_NO_FATAL_FAILURE(StartPair());
  std::unique_ptr<v1::Rendezvous::Stub> backup =
      v1::Rendezvous::NewStub(grpc::CreateChannel(Backup(), grpc::InsecureChannelCredentials()));
  v1::HoldsJobRequest question;
  question.set_job_id("fo-asked");
  question.set_owner("anyone");  // the owner of every job under --auth none
  question.set_asker(0);         // the lowest instance number: it would win any tie
  question.set_nonce("n");
  v1::HoldsJobResponse answer;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  const grpc::Status asked = backup->HoldsJob(&context, question, &answer);
  ASSERT_TRUE(asked.ok()) << asked.error_message();
  EXPECT_FALSE(answer.holds());

  endpoint_ = Backup();
  const std::vector<Subprocess*> agents =
      StartAgents(2, "fo-asked", "2", {"--nproc-per-node", "1"}, "exit 0");
  std::vector<int> codes;
  WaitAll(agents, codes);
  EXPECT_EQ(codes, std::vector<int>({0, 0})) << Describe(*agents[0]) << Describe(*agents[1]);
  EXPECT_FALSE(Contains(b_->Stderr(), "refused a join")) << Describe(*b_);
  EXPECT_EQ(ReadWorkers(0).size(), 2u);
  ExpectNothingLeft();
}

// Both servers given one list, each its own address included (one /etc/default/rdzvd for both
// hosts): a server's question to itself is answered no, so jobs form, and failover still works.
TEST_F(FailoverTest, BothServersMayBeGivenTheSameList) {
  ASSERT_NO_FATAL_FAILURE(StartPair(0, /*one_list=*/true));
  const std::vector<Subprocess*> agents =
      StartAgents(2, "fo-one", "2", {"--nproc-per-node", "1", "--failover-timeout", "1s"},
                  absl::StrCat(AwaitFile("go"), "exit 0"));
  WaitForWorkers(0, 2);
  ASSERT_TRUE(JobOn(a_port_, "fo-one").has_value()) << Describe(*a_);
  EXPECT_FALSE(Contains(a_->Stderr(), "refused a join")) << Describe(*a_);

  a_->Kill();
  ASSERT_TRUE(WaitForRunning(b_port_, "fo-one", 2)) << Describe(*b_);
  Touch("go");
  std::vector<int> codes;
  WaitAll(agents, codes);
  EXPECT_EQ(codes, std::vector<int>({0, 0})) << Describe(*agents[0]) << Describe(*agents[1]);
  ExpectNothingLeft();
}

TEST_F(FailoverTest, RestartAfterFailoverKeepsTheRanks) {
  ASSERT_NO_FATAL_FAILURE(StartPair());
  const std::vector<Subprocess*> agents = StartAgents(
      2, "fo-again", "2",
      {"--nproc-per-node", "2", "--max-restarts", "1", "--failover-timeout", "1s"},
      absl::StrCat("if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then if [ $RANK = 2 ]; then ",
                   AwaitFile("fail"), "exit 5; fi; ", SleepLong(), "; fi; exit 0"));
  const std::vector<WorkerEnv> first = WaitForWorkers(0, 4);
  a_->Kill();
  ASSERT_TRUE(WaitForRunning(b_port_, "fo-again", 2)) << Describe(*b_);
  Touch("fail");

  std::vector<int> codes;
  WaitAll(agents, codes);
  EXPECT_EQ(codes, std::vector<int>({0, 0})) << Describe(*agents[0]) << Describe(*agents[1]);
  for (Subprocess* a : agents) {
    EXPECT_TRUE(Contains(a->Stderr(), "restarting the workers (restart 1 of 1)")) << Describe(*a);
  }
  const std::vector<WorkerEnv> second = ReadWorkers(1);
  ASSERT_EQ(second.size(), 4u);
  const std::string primary = absl::StrCat("127.0.0.1:", a_port_);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(second[i].at("RANK"), first[i].at("RANK"));
    EXPECT_EQ(second[i].at("TEST_AGENT"), first[i].at("TEST_AGENT")) << "rank " << i;
    // The whole list for a worker's own client, the server in use first.
    EXPECT_EQ(first[i].at("RDZV_ENDPOINT"), absl::StrCat(primary, ",", Backup()));
    EXPECT_EQ(second[i].at("RDZV_ENDPOINT"), absl::StrCat(Backup(), ",", primary));
  }
  ExpectNothingLeft();
}

TEST_F(FailoverTest, AgentsCutOffFromALivePrimaryAreRefusedByTheBackup) {
  // The agents reach the primary through a proxy; the backup reaches it directly.
  a_port_ = testing::FreeLoopbackPort();
  testing::TcpProxy proxy(a_port_);
  ASSERT_NO_FATAL_FAILURE(StartPair(proxy.port()));
  const std::vector<Subprocess*> agents = StartAgents(
      2, "fo-cut", "2",
      {"--nproc-per-node", "1", "--failover-timeout", "1s", "--reconnect-timeout", "6s"},
      SleepLong());
  WaitForWorkers(0, 2);

  proxy.Cut();
  std::vector<int> codes;
  WaitAll(agents, codes);
  for (Subprocess* a : agents) {
    EXPECT_NE(a->exit_code().value_or(0), 0) << Describe(*a);
    EXPECT_TRUE(Contains(LineWith(a->Stderr(), "job fo-cut failed"), "could not rejoin within 6s"))
        << Describe(*a);
  }
  // The backup asked the primary, which has the job (ended: it lost its agents), and took none of
  // it: the job was never split between the two.
  EXPECT_TRUE(Contains(b_->Stderr(),
                       absl::StrCat("job fo-cut is served by the rdzvd at 127.0.0.1:", a_port_)))
      << Describe(*b_);
  EXPECT_FALSE(JobOn(b_port_, "fo-cut").has_value());
  std::optional<JobStatusView> on_primary = JobOn(a_port_, "fo-cut");
  ASSERT_TRUE(on_primary.has_value());
  EXPECT_EQ(on_primary->state, "ended");
  EXPECT_TRUE(Contains(LineWith(agents[0]->Stderr(), "job fo-cut failed"),
                       "job fo-cut is served by the rdzvd at"))
      << Describe(*agents[0]);
  ExpectNothingLeft();
}

TEST_F(FailoverTest, ThePrimaryComesBackRunningJobsStayNewJobsGoToIt) {
  ASSERT_NO_FATAL_FAILURE(StartPair());
  const std::vector<Subprocess*> old_job =
      StartAgents(2, "fo-old", "2", {"--nproc-per-node", "1", "--failover-timeout", "1s"},
                  absl::StrCat(AwaitFile("go"), "exit 0"));
  WaitForWorkers(0, 2);
  a_->Kill();
  ASSERT_TRUE(WaitForRunning(b_port_, "fo-old", 2)) << Describe(*b_);

  ASSERT_NO_FATAL_FAILURE(a_ = &StartServer(a_port_, Backup()));
  std::vector<Subprocess*> new_job;
  for (int node = 0; node < 2; ++node) {
    new_job.push_back(&StartAgent("fo-new", node, "2", {"--nproc-per-node", "1"},
                                  absl::StrCat(AwaitFile("go"), "exit 0")));
  }
  ASSERT_TRUE(WaitForRunning(a_port_, "fo-new", 2)) << Describe(*a_);
  EXPECT_FALSE(JobOn(b_port_, "fo-new").has_value());
  EXPECT_FALSE(JobOn(a_port_, "fo-old").has_value()) << "the running job moved back";
  EXPECT_TRUE(WaitForRunning(b_port_, "fo-old", 2));

  // rdzvctl over the list shows each job once, with the server that holds it.
  Subprocess& ctl = Start({RDZVCTL_BIN, "--rdzv-endpoint", endpoint_, "status"});
  EXPECT_EQ(ctl.Wait(kLongWait), 0) << Describe(ctl);
  const std::string table = ctl.Stdout();
  EXPECT_TRUE(Contains(LineWith(table, "fo-old"), Backup())) << table;
  EXPECT_TRUE(Contains(LineWith(table, "fo-new"), absl::StrCat("127.0.0.1:", a_port_))) << table;

  Touch("go");
  std::vector<int> codes;
  WaitAll(old_job, codes);
  EXPECT_EQ(codes, std::vector<int>({0, 0})) << Describe(*old_job[0]) << Describe(*old_job[1]);
  WaitAll(new_job, codes);
  EXPECT_EQ(codes, std::vector<int>({0, 0})) << Describe(*new_job[0]) << Describe(*new_job[1]);
  ExpectNothingLeft();
}

// A node whose host vanishes (power, a cable) leaves its connection open and silent, and its
// agent cannot say a word. Two hosts: rdzvd and nodes 0 and 2 on A, node 1 on B, whose cable is
// pulled once every worker runs. rdzvd's pings are off, so only the kernel's probes
// (--keepalive-ms, 1 s + 1 s by default) can find the lost host; the job ends for the others.
class LostHostTest : public testing::ProcessTest {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
    const absl::Status made = hosts_.Create();
    ASSERT_TRUE(made.ok()) << made;
    token_ = absl::StrCat(dir_.path(), "/token");
    std::ofstream(token_) << "lost-host-secret-0123456789abcdef\n";
    std::filesystem::permissions(
        token_, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  }

  Subprocess& StartAgent(int node) {
    const std::string host = absl::StrCat("n", node);
    const std::string worker =
        absl::StrCat("touch ", dir_.path(), "/up-", host, "; exec -a ", marker_, " sleep 60");
    std::vector<std::string> argv = {RDZV_AGENT_BIN,
                                     "--rdzv-token-file",
                                     token_,
                                     "--rdzv-endpoint",
                                     endpoint_,
                                     "--rdzv-id",
                                     "lost-host",
                                     "--nnodes",
                                     "3",
                                     "--node-rank",
                                     absl::StrCat(node),
                                     "--host-name",
                                     host,
                                     "--nproc-per-node",
                                     "1",
                                     "--join-timeout",
                                     "60",
                                     "--",
                                     "bash",
                                     "-c",
                                     worker};
    return Start(node == 1 ? hosts_.OnB(argv).argv : hosts_.OnA(argv).argv);
  }

  testing::TwoHosts hosts_;
  ScopedTempDir dir_;
  std::string token_;
  const std::string endpoint_ = absl::StrCat(testing::TwoHosts::kAddrA, ":29400");
};

TEST_F(LostHostTest, AHostThatVanishesIsNoticedByTheKernelsProbesAndEndsTheJob) {
  Subprocess& rdzvd = Start(
      hosts_.OnA({RDZVD_BIN, "--auth", "token", "--listen", endpoint_, "--ping-ms", "0"}).argv);
  std::vector<Subprocess*> agents;
  for (int node = 0; node < 3; ++node) agents.push_back(&StartAgent(node));
  const absl::Time deadline = absl::Now() + kLongWait;
  const auto all_up = [&] {
    for (const char* host : {"n0", "n1", "n2"}) {
      if (!std::filesystem::exists(absl::StrCat(dir_.path(), "/up-", host))) return false;
    }
    return true;
  };
  while (!all_up() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(all_up()) << Describe(*agents[0]) << Describe(rdzvd);

  const absl::Status cut = hosts_.CutB();
  ASSERT_TRUE(cut.ok()) << cut;
  const absl::Duration took = WaitForLostContact({agents[0], agents[2]}, "lost-host", "n1");
  EXPECT_LT(took, absl::Seconds(10)) << "2 s of probes, and room for a loaded machine";
  // Node 1's host is gone as far as the job knows; its agent goes with its worker.
  agents[1]->Signal(SIGKILL);
  EXPECT_EQ(agents[1]->Wait(kLongWait), 128 + SIGKILL);
  rdzvd.Signal(SIGTERM);
  EXPECT_EQ(rdzvd.Wait(kLongWait), 0) << Describe(rdzvd);
}

}  // namespace
}  // namespace rdzv
