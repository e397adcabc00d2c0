// What the agent starts for a round, from the job's spec, the assignment and its own
// environment: ranks, the whole environment, the error file and what each guard cleans up.
#include "client/agent/core/worker_launches.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace rdzv {
namespace {

JoinSpec Spec() {
  JoinSpec spec;
  spec.job_id = "exp1";
  spec.agent.nproc = 2;
  spec.max_restarts = 3;
  return spec;
}

AssignmentEvent Assignment() {
  AssignmentEvent a;
  a.round = 2;
  a.slot.rank_offset = 6;
  a.slot.group_rank = 3;
  a.slot.local_rank_offset = 2;
  a.slot.local_world_size = 4;
  a.world_size = 16;
  a.group_world_size = 4;
  a.master_addr = "10.0.0.1";
  a.master_port = 29500;
  a.restart_count = 1;
  a.workers_per_node = "4(x2),6,2";
  return a;
}

// The value of `name` in a launch's environment, or "(unset)".
std::string Var(const WorkerLaunch& launch, const std::string& name) {
  for (const std::string& entry : launch.env) {
    if (absl::StartsWith(entry, name + "=")) return entry.substr(name.size() + 1);
  }
  return "(unset)";
}

TEST(WorkerLaunchesTest, RoundContextComesFromTheSpecAndTheAssignment) {
  const WorkerContext ctx = RoundContext(Spec(), Assignment());
  EXPECT_EQ(ctx.nproc, 2);
  EXPECT_EQ(ctx.max_restarts, 3);
  EXPECT_EQ(ctx.run_id, "exp1");
  EXPECT_EQ(ctx.assignment.slot.rank_offset, 6);
  EXPECT_EQ(ctx.rdzv_endpoint, "");
  EXPECT_EQ(ctx.error_file_dir, "");
  EXPECT_EQ(ctx.timer_file, "");
  JoinSpec unchecked = Spec();
  unchecked.max_restarts.reset();
  EXPECT_EQ(RoundContext(unchecked, Assignment()).max_restarts, 0);
}

TEST(WorkerLaunchesTest, EachWorkerGetsItsRanksEnvErrorFileAndCleanUp) {
  WorkerContext ctx = RoundContext(Spec(), Assignment());
  ctx.rdzv_endpoint = "head:29400";
  ctx.error_file_dir = "/tmp/rdzv-exp1-abc";
  ctx.timer_file = "/tmp/rdzv-exp1-abc/watchdog.fifo";
  const WorkerLaunches w = BuildWorkerLaunches(ctx, {{"PATH", "/usr/bin"}, {"RANK", "99"}});
  ASSERT_EQ(w.launches.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    const WorkerLaunch& l = w.launches[i];
    EXPECT_EQ(l.rank, 6 + i);
    EXPECT_EQ(l.local_rank, 2 + i);
    EXPECT_EQ(Var(l, "RANK"), absl::StrCat(6 + i));
    EXPECT_EQ(Var(l, "LOCAL_RANK"), absl::StrCat(2 + i));
    EXPECT_EQ(Var(l, "PATH"), "/usr/bin");
    EXPECT_EQ(Var(l, "TORCHELASTIC_RESTART_COUNT"), "1");
    EXPECT_EQ(Var(l, "RDZV_ENDPOINT"), "head:29400");
    EXPECT_EQ(Var(l, "TORCHELASTIC_TIMER_FILE"), ctx.timer_file);
    EXPECT_EQ(Var(l, "PYTHONFAULTHANDLER"), "1");
    const std::string error_file = absl::StrCat("/tmp/rdzv-exp1-abc/error-", 2 + i, ".json");
    EXPECT_EQ(l.error_file, error_file);
    EXPECT_EQ(Var(l, "TORCHELASTIC_ERROR_FILE"), error_file);
    // The files before the directory that holds them.
    EXPECT_EQ(l.remove_if_orphaned,
              (std::vector<std::string>{error_file, ctx.timer_file, ctx.error_file_dir}));
    // The whole job's layout, for the launch shape.
    EXPECT_EQ(l.workers_per_node, "4(x2),6,2");
  }
  // The replaced value is said once, not once per worker.
  ASSERT_EQ(w.notes.size(), 1u);
  EXPECT_EQ(w.notes[0], "replacing RANK=99 from the environment with 6");
}

TEST(WorkerLaunchesTest, WithoutARunDirectoryThereIsNothingToCleanUp) {
  const WorkerLaunches w = BuildWorkerLaunches(RoundContext(Spec(), Assignment()), {});
  ASSERT_EQ(w.launches.size(), 2u);
  for (const WorkerLaunch& l : w.launches) {
    EXPECT_EQ(l.error_file, "");
    EXPECT_TRUE(l.remove_if_orphaned.empty());
    EXPECT_EQ(Var(l, "TORCHELASTIC_ERROR_FILE"), "(unset)");
    EXPECT_EQ(Var(l, "TORCHELASTIC_TIMER_FILE"), "(unset)");
    EXPECT_EQ(Var(l, "RDZV_ENDPOINT"), "(unset)");
  }
  EXPECT_TRUE(w.notes.empty());
}

// A user's own timer server and faulthandler setting stay theirs, said once.
TEST(WorkerLaunchesTest, UsersOwnTimerFileAndFaulthandlerAreKept) {
  WorkerContext ctx = RoundContext(Spec(), Assignment());
  ctx.error_file_dir = "/tmp/rdzv-exp1-abc";
  ctx.timer_file = "/tmp/rdzv-exp1-abc/watchdog.fifo";
  const WorkerLaunches w = BuildWorkerLaunches(
      ctx, {{"TORCHELASTIC_TIMER_FILE", "/run/mine.fifo"}, {"PYTHONFAULTHANDLER", "0"}});
  for (const WorkerLaunch& l : w.launches) {
    EXPECT_EQ(Var(l, "TORCHELASTIC_TIMER_FILE"), "/run/mine.fifo");
    EXPECT_EQ(Var(l, "PYTHONFAULTHANDLER"), "0");
  }
  EXPECT_EQ(w.notes, (std::vector<std::string>{
                         "keeping TORCHELASTIC_TIMER_FILE=/run/mine.fifo from the environment "
                         "(default is /tmp/rdzv-exp1-abc/watchdog.fifo)",
                         "keeping PYTHONFAULTHANDLER=0 from the environment (default is 1)"}));
}

}  // namespace
}  // namespace rdzv
