// WorkerGroup over a fake ProcessLauncher: which processes it starts with which environment, how
// it reports their ends, and how it stops them (SIGTERM, then SIGKILL for the stubborn).
#include "client/agent/worker_group.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <asio/io_context.hpp>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace rdzv {
namespace {

// Processes that exist only as pipes: each "runs" until the test ends it or a signal it does not
// ignore arrives.
class FakeLauncher : public ProcessLauncher {
 public:
  struct Process {
    ProcessSpec spec;
    int stdout_w = -1;
    int stderr_w = -1;
    std::vector<int> signals;
    bool ended = false;
  };

  absl::StatusOr<SpawnedProcess> Spawn(const ProcessSpec& spec) override {
    if (fail_spawn_at == static_cast<int>(processes.size())) {
      return absl::NotFoundError(absl::StrCat(spec.argv[0], ": command not found"));
    }
    int out[2], err[2];
    if (pipe(out) != 0 || pipe(err) != 0) return absl::InternalError("pipe");
    const pid_t pid = next_pid++;
    Process& p = processes[pid];
    p.spec = spec;
    p.stdout_w = out[1];
    p.stderr_w = err[1];
    return SpawnedProcess{pid, out[0], err[0]};
  }

  absl::Status SignalGroup(pid_t pid, int sig) override {
    auto it = processes.find(pid);
    if (it == processes.end()) return absl::NotFoundError("no such process");
    it->second.signals.push_back(sig);
    if (it->second.ended) return absl::NotFoundError("already gone");
    if (sig == SIGKILL || (sig == SIGTERM && !ignores_term.contains(pid))) End(pid, 0, sig);
    return absl::OkStatus();
  }

  std::vector<ProcessExit> Reap() override { return std::exchange(exits, {}); }

  // The process writes `err` to its stderr and ends.
  void End(pid_t pid, int code, int sig = 0, const std::string& err = "") {
    Process& p = processes.at(pid);
    if (p.ended) return;
    if (!err.empty()) (void)!write(p.stderr_w, err.data(), err.size());
    // A descendant that left the group keeps the pipes open; the destructor closes them.
    if (!pipes_held.contains(pid)) {
      close(p.stdout_w);
      close(p.stderr_w);
    }
    p.ended = true;
    ProcessExit e;
    e.pid = pid;
    e.exit_status = code;
    e.signal = sig;
    exits.push_back(e);
  }

  ~FakeLauncher() override {
    for (auto& [pid, p] : processes) {
      if (!p.ended || pipes_held.contains(pid)) {
        close(p.stdout_w);
        close(p.stderr_w);
      }
    }
  }

  std::map<pid_t, Process> processes;
  std::set<pid_t> ignores_term;
  std::set<pid_t> pipes_held;
  std::vector<ProcessExit> exits;
  int fail_spawn_at = -1;
  pid_t next_pid = 1000;
};

class WorkerGroupTest : public ::testing::Test {
 protected:
  WorkerGroupTest()
      : group_(io_, launcher_, Output(), absl::Milliseconds(50),
               {[this](const WorkerEnd& e) { ends_.push_back(e); }, [this] { ++all_done_; }}) {}

  static OutputOptions Output() {
    OutputOptions o;
    o.rank_prefix = true;
    return o;
  }

  static std::vector<WorkerLaunch> Launches(int n, int first_rank = 4) {
    std::vector<WorkerLaunch> out;
    for (int i = 0; i < n; ++i) {
      WorkerLaunch w;
      w.rank = first_rank + i;
      w.local_rank = i;
      w.env = {absl::StrCat("RANK=", first_rank + i), absl::StrCat("LOCAL_RANK=", i)};
      out.push_back(w);
    }
    return out;
  }

  // Runs the event loop, collecting ended workers as the agent does on SIGCHLD, until `done`
  // holds (or a generous limit passes, which fails the test).
  template <typename Pred>
  void RunUntil(Pred done) {
    const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done() && std::chrono::steady_clock::now() < limit) {
      group_.Reap();
      io_.restart();
      io_.run_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(done()) << "the worker group never got there";
  }

  asio::io_context io_;
  FakeLauncher launcher_;
  WorkerGroup group_;
  std::vector<WorkerEnd> ends_;
  int all_done_ = 0;
};

TEST_F(WorkerGroupTest, StartsOneProcessPerWorkerWithItsOwnEnvironment) {
  ASSERT_TRUE(group_.Start({"python3", "train.py"}, Launches(2)).ok());
  ASSERT_EQ(launcher_.processes.size(), 2u);
  std::set<std::string> ranks;
  for (const auto& [pid, p] : launcher_.processes) {
    EXPECT_EQ(p.spec.argv, (std::vector<std::string>{"python3", "train.py"}));
    for (const std::string& kv : p.spec.env) {
      if (absl::StartsWith(kv, "RANK=")) ranks.insert(kv);
    }
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"RANK=4", "RANK=5"}));
  for (const auto& [pid, p] : launcher_.processes) launcher_.End(pid, 0);
  RunUntil([&] { return all_done_ == 1; });
  EXPECT_EQ(ends_.size(), 2u);
}

TEST_F(WorkerGroupTest, ReportsAFailedWorkerWithItsRankCodeAndStderrTail) {
  ASSERT_TRUE(group_.Start({"train"}, Launches(2)).ok());
  launcher_.End(1001, 3, 0, "loading data\nValueError: bad shape\n");
  RunUntil([&] { return ends_.size() == 1; });
  EXPECT_EQ(ends_[0].rank, 5);
  EXPECT_EQ(ends_[0].local_rank, 1);
  EXPECT_EQ(ends_[0].exit.code(), 3);
  EXPECT_TRUE(absl::StrContains(ends_[0].stderr_tail, "ValueError: bad shape"))
      << ends_[0].stderr_tail;
  // The other worker still runs: the group is not done.
  EXPECT_EQ(all_done_, 0);
  launcher_.End(1000, 0);
  RunUntil([&] { return all_done_ == 1; });
  EXPECT_TRUE(ends_[1].stderr_tail.empty());
}

TEST_F(WorkerGroupTest, AFailedWorkerWhosePipesStayOpenIsReportedAfterTheGrace) {
  ASSERT_TRUE(group_.Start({"train"}, Launches(1)).ok());
  launcher_.pipes_held.insert(1000);
  const auto ended = std::chrono::steady_clock::now();
  launcher_.End(1000, 7, 0, "CUDA error: out of memory\n");
  RunUntil([&] { return ends_.size() == 1; });
  const auto waited = std::chrono::steady_clock::now() - ended;
  EXPECT_EQ(ends_[0].exit.code(), 7);
  EXPECT_TRUE(absl::StrContains(ends_[0].stderr_tail, "CUDA error: out of memory"))
      << ends_[0].stderr_tail;
  // Held for the grace, not for ever.
  EXPECT_GE(waited, absl::ToChronoMilliseconds(kOutputGrace) - std::chrono::milliseconds(50));
  EXPECT_EQ(all_done_, 0) << "its output has not ended";
}

TEST_F(WorkerGroupTest, StopSendsSigtermAndSigkillToWorkersThatIgnoreIt) {
  ASSERT_TRUE(group_.Start({"train"}, Launches(2)).ok());
  launcher_.ignores_term.insert(1001);
  EXPECT_EQ(group_.Stop(), 2);
  RunUntil([&] { return all_done_ == 1; });
  EXPECT_EQ(launcher_.processes.at(1000).signals.front(), SIGTERM);
  const std::vector<int>& stubborn = launcher_.processes.at(1001).signals;
  ASSERT_GE(stubborn.size(), 2u);
  EXPECT_EQ(stubborn[0], SIGTERM);
  EXPECT_EQ(stubborn[1], SIGKILL);
  ASSERT_EQ(ends_.size(), 2u);
  EXPECT_EQ(ends_[0].exit.signal + ends_[1].exit.signal, SIGTERM + SIGKILL);
}

TEST_F(WorkerGroupTest, WorkersThatStopOnSigtermGetNoSigkill) {
  ASSERT_TRUE(group_.Start({"train"}, Launches(1)).ok());
  EXPECT_EQ(group_.Stop(), 1);
  RunUntil([&] { return all_done_ == 1; });
  // Longer than the term timeout: a kill timer left armed would fire now.
  io_.restart();
  io_.run_for(std::chrono::milliseconds(120));
  // The group kills the ended worker's process group once, as it reaps it; never before.
  const std::vector<int>& sigs = launcher_.processes.at(1000).signals;
  EXPECT_EQ(sigs.front(), SIGTERM);
  EXPECT_LE(absl::c_count(sigs, SIGKILL), 1);
}

TEST_F(WorkerGroupTest, SpawnFailureLeavesTheStartedWorkersToBeStopped) {
  launcher_.fail_spawn_at = 1;
  const absl::Status status = group_.Start({"python9"}, Launches(3));
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(status.message(), "python9: command not found"));
  EXPECT_EQ(launcher_.processes.size(), 1u);
  EXPECT_EQ(group_.Stop(), 1);
  RunUntil([&] { return all_done_ == 1; });
  ASSERT_EQ(ends_.size(), 1u);
  EXPECT_EQ(ends_[0].rank, 4);
}

// What Python's faulthandler writes on SIGABRT for a thread stuck `depth` calls deep: innermost
// frame first, then the extension modules.
std::string FaulthandlerDump(int depth) {
  std::string dump =
      "Fatal Python error: Aborted\n\nCurrent thread 0x00007f228de9d040 (most recent call "
      "first):\n  File \"train.py\", line 4 in stuck\n";
  for (int i = 0; i < depth; ++i) absl::StrAppend(&dump, "  File \"train.py\", line 7 in deep\n");
  absl::StrAppend(&dump,
                  "  File \"train.py\", line 12 in <module>\n\nExtension modules: torch._C, ",
                  "numpy.core._multiarray_umath (total: 2)\n");
  return dump;
}

TEST_F(WorkerGroupTest, AbortedWorkersStackIsKeptFromItsFirstLine) {
  ASSERT_TRUE(group_.Start({"train"}, Launches(2)).ok());
  group_.Abort(5);
  EXPECT_EQ(launcher_.processes.at(1001).signals, std::vector<int>{SIGABRT});
  launcher_.End(1001, 0, SIGABRT, "epoch 3\n" + FaulthandlerDump(30));
  RunUntil([&] { return ends_.size() == 1; });
  const std::string& stack = ends_[0].stderr_tail;
  EXPECT_TRUE(absl::StartsWith(stack, "Fatal Python error: Aborted\n\nCurrent thread 0x")) << stack;
  EXPECT_TRUE(absl::StrContains(stack, "line 4 in stuck")) << stack;
  EXPECT_TRUE(absl::StrContains(stack, "line 12 in <module>")) << stack;
  EXPECT_TRUE(absl::StrContains(stack, "Extension modules: torch._C")) << stack;
  EXPECT_FALSE(absl::StrContains(stack, "epoch 3")) << stack;
  group_.Kill();
}

TEST_F(WorkerGroupTest, StackOverTheServersLimitKeepsItsInnermostFrames) {
  ASSERT_TRUE(group_.Start({"train"}, Launches(1)).ok());
  group_.Abort(4);
  // About 30 KiB, twice what a failure report keeps.
  launcher_.End(1000, 0, SIGABRT, FaulthandlerDump(1000));
  RunUntil([&] { return ends_.size() == 1; });
  const std::string& stack = ends_[0].stderr_tail;
  EXPECT_LE(stack.size(), kMaxStackBytes);
  EXPECT_GT(stack.size(), kMaxStackBytes - 100);
  EXPECT_TRUE(absl::StrContains(stack, "line 4 in stuck")) << stack.substr(0, 300);
  EXPECT_TRUE(absl::EndsWith(stack, " more lines cut]")) << stack.substr(stack.size() - 300);
  EXPECT_FALSE(absl::StrContains(stack, "<module>"));
}

TEST_F(WorkerGroupTest, StderrBeforeAnAbortOrWithoutAStackKeepsItsLastLines) {
  ASSERT_TRUE(group_.Start({"train"}, Launches(2)).ok());
  // Not aborted: a dump of its own (faulthandler.dump_traceback) is no hang's stack.
  launcher_.End(1000, 1, 0, FaulthandlerDump(30) + "ValueError: bad shape\n");
  // Aborted, but Python's faulthandler is off.
  group_.Abort(5);
  std::string lines;
  for (int i = 0; i < 30; ++i) absl::StrAppend(&lines, "line ", i, "\n");
  launcher_.End(1001, 0, SIGABRT, lines);
  RunUntil([&] { return ends_.size() == 2; });
  for (const WorkerEnd& end : ends_) {
    SCOPED_TRACE(end.rank);
    EXPECT_FALSE(absl::StartsWith(end.stderr_tail, "Fatal Python error")) << end.stderr_tail;
    EXPECT_EQ(absl::StrContains(end.stderr_tail, "ValueError: bad shape"), end.rank == 4);
    EXPECT_EQ(absl::StrContains(end.stderr_tail, "line 29"), end.rank == 5);
    EXPECT_FALSE(absl::StrContains(end.stderr_tail, "line 9\n"));
  }
}

TEST_F(WorkerGroupTest, SignalsReachOnlyRunningWorkers) {
  ASSERT_TRUE(group_.Start({"train"}, Launches(3)).ok());
  launcher_.End(1002, 0);
  RunUntil([&] { return ends_.size() == 1; });
  EXPECT_EQ(group_.Signal(SIGUSR1), 2);
  EXPECT_EQ(launcher_.processes.at(1000).signals, std::vector<int>{SIGUSR1});
  group_.Kill();
  RunUntil([&] { return all_done_ == 1; });
  EXPECT_EQ(ends_.size(), 3u);
}

}  // namespace
}  // namespace rdzv
