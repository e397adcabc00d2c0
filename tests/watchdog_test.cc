// The watchdog under real PyTorch (gloo), two agents × two workers against a real rdzvd on
// loopback: a rank stuck inside torch's file timer, or silent after its heartbeats, fails the
// job on every node within seconds, every agent names that rank and shows the Python line it
// was stuck on, and nothing is left running; healthy jobs with timers and heartbeats succeed.
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/process_fixture.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/torch_job.h"

namespace rdzv {
namespace {

using ::rdzv::testing::Subprocess;
using ::rdzv::testing::SubprocessOptions;
using ::testing::HasSubstr;

const std::string kWorker = std::string(RDZV_SOURCE_DIR) + "/tests/watchdog_worker.py";
constexpr absl::Duration kTimeout = absl::Seconds(180);

// The line of the worker's sleep in stuck(), where a hung rank's stack points.
int StuckLine() {
  std::ifstream in(kWorker);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (absl::StrContains(line, "time.sleep(600)")) return n;
  }
  return -1;
}

// The agent's root cause in `err`: its "job ... failed:" line and the indented lines under it,
// without the workers' own output (which the agent forwards with a "[RANK]: " prefix).
std::string RootCause(const std::string& err) {
  std::vector<std::string> lines;
  bool in = false;
  for (absl::string_view line : absl::StrSplit(err, '\n')) {
    if (!in && absl::StrContains(line, " failed: rank ")) {
      in = true;
    } else if (in && !absl::StartsWith(line, "  ")) {
      break;
    }
    if (in) lines.emplace_back(line);
  }
  return absl::StrJoin(lines, "\n");
}

class WatchdogTest : public testing::TorchJobTest {
 protected:
  void TearDown() override {
    TorchJobTest::TearDown();
    EXPECT_TRUE(testing::NoProcessLeft(marker_));
  }

  SubprocessOptions Agent(const std::string& job, int node, std::vector<std::string> flags,
                          std::vector<std::string> worker_args, int nnodes = 2, int nproc = 2) {
    std::vector<std::string> worker = {kWorker, "--marker", marker_};
    worker.insert(worker.end(), worker_args.begin(), worker_args.end());
    return testing::TorchAgent({.port = port(),
                                .job = job,
                                .node = node,
                                .nnodes = nnodes,
                                .nproc = nproc,
                                .flags = std::move(flags),
                                .worker = std::move(worker)});
  }

  // Runs both agents; returns how long after the first "hung" line the last one exited.
  absl::Duration RunHung(Subprocess& node0, Subprocess& node1) {
    EXPECT_TRUE(node0.WaitForOutput(" hung: ", kTimeout) ||
                node1.WaitForOutput(" hung: ", kTimeout))
        << node0.Stderr() << node1.Stderr();
    const absl::Time found = absl::Now();
    codes_ = {node0.Wait(kTimeout), node1.Wait(kTimeout)};
    return absl::Now() - found;
  }

  const std::string marker_ = testing::UniqueMarker();
  std::vector<int> codes_;
};

TEST_F(WatchdogTest, RankStuckInTimerFailsEveryNodeWithItsStack) {
  Subprocess node0(Agent("wd-timer", 0, {}, {"--hang-rank", "3"}));
  Subprocess node1(Agent("wd-timer", 1, {}, {"--hang-rank", "3"}));
  const absl::Duration after = RunHung(node0, node1);
  // The stack, then the job's end everywhere: well within the term timeout (3 s) and a margin.
  EXPECT_LT(after, absl::Seconds(8));
  EXPECT_EQ(codes_, std::vector<int>({128 + SIGABRT, 128 + SIGABRT}));
  for (Subprocess* node : {&node0, &node1}) {
    const std::string err = node->Stderr();
    EXPECT_THAT(err, HasSubstr("failed: rank 3 hung: timer \"step\" expired")) << err;
    EXPECT_THAT(err, HasSubstr("local rank 1, node 1")) << err;
    EXPECT_THAT(err, HasSubstr("rank 3's stderr (its stack)")) << err;
    EXPECT_THAT(err,
                HasSubstr(absl::StrCat("watchdog_worker.py\", line ", StuckLine(), " in stuck")))
        << err;
  }
}

// The stack Python prints starts at the innermost frame, where the rank is stuck, and goes on
// for as many frames as the rank is deep and more (the extension modules): the root cause shows
// it from its first line, not its last lines.
TEST_F(WatchdogTest, RankStuckDeepShowsTheLineItIsStuckOn) {
  const std::vector<std::string> args = {"--hang-rank", "3", "--depth", "30"};
  Subprocess node0(Agent("wd-deep", 0, {}, args));
  Subprocess node1(Agent("wd-deep", 1, {}, args));
  RunHung(node0, node1);
  EXPECT_EQ(codes_, std::vector<int>({128 + SIGABRT, 128 + SIGABRT}));
  for (Subprocess* node : {&node0, &node1}) {
    const std::string cause = RootCause(node->Stderr());
    EXPECT_THAT(cause, HasSubstr("failed: rank 3 hung: timer \"step\" expired")) << cause;
    EXPECT_THAT(cause, HasSubstr("rank 3's stderr (its stack):\n    Fatal Python error: Aborted"))
        << cause;
    EXPECT_THAT(cause,
                HasSubstr(absl::StrCat("watchdog_worker.py\", line ", StuckLine(), " in stuck")))
        << cause;
    std::vector<absl::string_view> frames = absl::StrSplit(cause, " in deep\n");
    EXPECT_GE(frames.size(), 31u) << cause;
  }
}

// Agents check their workers every 100 ms, each at its own moment. Here rank 3's deadline passes
// 20 ms before those of the other ranks (blocked in all_reduce behind it), so another node's agent
// often finds its own rank overdue first, and the job's abort reaches rank 3's agent before that
// agent's own check has found rank 3. Whichever agent looks first, the job names rank 3, the rank
// that hung first, with the line it is stuck on.
TEST_F(WatchdogTest, RankThatHungFirstIsNamedWhicheverAgentLooksFirst) {
  const std::vector<std::string> args = {"--hang-rank", "3", "--race-lag", "0.001"};
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int node = 0; node < 4; ++node) {
    nodes.push_back(std::make_unique<Subprocess>(Agent("wd-race", node, {}, args, 4, 1)));
  }
  int others_first = 0;
  for (std::unique_ptr<Subprocess>& node : nodes) {
    EXPECT_EQ(node->Wait(kTimeout), 128 + SIGABRT) << node->Stderr();
    const std::string err = node->Stderr();
    const std::string cause = RootCause(err);
    EXPECT_THAT(cause, HasSubstr("failed: rank 3 hung: timer \"step\" expired")) << err;
    EXPECT_THAT(cause, HasSubstr("(local rank 0, node 3 on ")) << err;
    EXPECT_THAT(cause,
                HasSubstr(absl::StrCat("watchdog_worker.py\", line ", StuckLine(), " in stuck")))
        << err;
    for (int victim = 0; victim < 3; ++victim) {
      if (absl::StrContains(err, absl::StrCat("rank ", victim, " hung: timer"))) ++others_first;
    }
  }
  // Not asserted, as it depends on timing: how often the others looked first.
  std::printf("agents that found their own rank overdue besides rank 3's: %d\n", others_first);
}

TEST_F(WatchdogTest, SilentHeartbeatFailsTheJob) {
  const std::vector<std::string> flags = {"--hang-timeout", "5s"};
  const std::vector<std::string> args = {"--hang-rank", "1", "--heartbeat"};
  Subprocess node0(Agent("wd-beat", 0, flags, args));
  Subprocess node1(Agent("wd-beat", 1, flags, args));
  const absl::Duration after = RunHung(node0, node1);
  EXPECT_LT(after, absl::Seconds(8));
  EXPECT_EQ(codes_, std::vector<int>({128 + SIGABRT, 128 + SIGABRT}));
  for (Subprocess* node : {&node0, &node1}) {
    const std::string err = node->Stderr();
    // Rank 1 went silent first; the others' heartbeats stopped later, in all_reduce.
    EXPECT_THAT(err, HasSubstr("failed: rank 1 hung: no heartbeat for")) << err;
    EXPECT_THAT(err, HasSubstr("(timeout 5s)")) << err;
    EXPECT_THAT(err, HasSubstr("in stuck")) << err;
  }
}

// --hang-timeout auto: no timeout is given; after the warm-up the agent has learned one from the
// heartbeats (0.5 s apart, so the floor of 3 s given here is what applies) and a rank that goes
// silent at step 8 is caught by it.
TEST_F(WatchdogTest, LearnedHeartbeatTimeoutFindsTheSilentRank) {
  const std::vector<std::string> flags = {"--hang-timeout", "auto", "--hang-timeout-min", "3s"};
  const std::vector<std::string> args = {"--hang-rank", "1",  "--hang-step", "8",
                                         "--steps",     "12", "--heartbeat"};
  Subprocess node0(Agent("wd-auto", 0, flags, args));
  Subprocess node1(Agent("wd-auto", 1, flags, args));
  const absl::Duration after = RunHung(node0, node1);
  EXPECT_LT(after, absl::Seconds(8));
  EXPECT_EQ(codes_, std::vector<int>({128 + SIGABRT, 128 + SIGABRT}));
  for (Subprocess* node : {&node0, &node1}) {
    const std::string err = node->Stderr();
    EXPECT_THAT(err, HasSubstr("failed: rank 1 hung: no heartbeat for")) << err;
    EXPECT_THAT(err, HasSubstr(", learned)")) << err;
    EXPECT_THAT(err, HasSubstr("in stuck")) << err;
  }
  // Rank 1 went silent after step 7: it had not hung before the warm-up ended.
  EXPECT_THAT(node0.Stdout() + node1.Stdout(), ::testing::Not(HasSubstr("finished")));
}

TEST_F(WatchdogTest, HealthyJobWithTimersAndHeartbeatsSucceeds) {
  // Longer than a step, or a worker's exit after its last heartbeat, takes on a busy machine.
  const std::vector<std::string> flags = {"--hang-timeout", "10s"};
  // Node 1's workers also write a malformed line and an expired timer of init (pid 1), which
  // the agent must ignore.
  Subprocess node0(Agent("wd-ok", 0, flags, {"--heartbeat"}));
  Subprocess node1(Agent("wd-ok", 1, flags, {"--heartbeat", "--noise"}));
  ASSERT_EQ(node0.Wait(kTimeout), 0) << node0.Stderr();
  ASSERT_EQ(node1.Wait(kTimeout), 0) << node1.Stderr();
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_THAT(node0.Stdout() + node1.Stdout(),
                HasSubstr(absl::StrCat("rank ", rank, " finished 5 steps")));
  }
  EXPECT_THAT(node0.Stderr(), ::testing::Not(HasSubstr("watchdog FIFO")));
  EXPECT_THAT(node1.Stderr(), HasSubstr("watchdog FIFO: ignoring a malformed request"));
  EXPECT_THAT(node1.Stderr(), HasSubstr("from pid 1, which is not one of this agent's workers"));
  EXPECT_THAT(node1.Stderr(), HasSubstr("ignored 2 malformed requests and 2 from other processes"));
}

TEST_F(WatchdogTest, HangIsRestartedAndTheSecondAttemptSucceeds) {
  const std::vector<std::string> flags = {"--max-restarts", "1"};
  const std::vector<std::string> args = {"--hang-rank", "2", "--first-attempt-only"};
  Subprocess node0(Agent("wd-restart", 0, flags, args));
  Subprocess node1(Agent("wd-restart", 1, flags, args));
  ASSERT_EQ(node0.Wait(kTimeout), 0) << node0.Stderr();
  ASSERT_EQ(node1.Wait(kTimeout), 0) << node1.Stderr();
  EXPECT_THAT(node0.Stderr(),
              HasSubstr("restarting the workers (restart 1 of 1) after: rank 2 hung"));
  EXPECT_THAT(node0.Stdout() + node1.Stdout(), HasSubstr("rank 2 finished 5 steps"));
}

}  // namespace
}  // namespace rdzv
