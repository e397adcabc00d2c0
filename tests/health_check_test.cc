// The node's health checks: the built-in ones against directories the test makes, and the
// user's command as a real /bin/sh process.
#include "client/agent/health_check.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <future>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace rdzv {
namespace {

using testing::ScopedTempDir;

HealthCheckTarget Target(const ScopedTempDir& dir) {
  HealthCheckTarget t;
  t.addresses = {"10.0.0.7"};
  t.run_parent = dir.path();
  t.dev_dir = dir.path();
  return t;
}

void Touch(const std::string& path) { std::ofstream(path) << ""; }

// Runs the checks to their end.
std::optional<Unhealthy> RunToEnd(HealthCheckOptions options, HealthCheckTarget target) {
  std::promise<std::optional<Unhealthy>> verdict;
  HealthCheck check(std::move(options), std::move(target),
                    [&](std::optional<Unhealthy> v) { verdict.set_value(std::move(v)); });
  return verdict.get_future().get();
}

TEST(HealthCheckTest, TheLastLineIsKeptPrintableAndShort) {
  EXPECT_EQ(LastOutputLine("checking\nGPU 3: \x1b[31mECC\x1b[0m\terrors\n\n  \n"),
            "GPU 3: ?[31mECC?[0m errors");
  EXPECT_EQ(LastOutputLine("progress 10%\rprogress 100%\r"), "progress 100%");
  EXPECT_EQ(LastOutputLine(""), "");
  EXPECT_EQ(LastOutputLine(std::string(5000, 'x')).size(), kMaxUnhealthyDetailBytes);
}

TEST(HealthCheckTest, AHealthyNodePassesTheBuiltInChecks) {
  ScopedTempDir dir;
  EXPECT_FALSE(BuiltInHealthChecks({}, Target(dir)).has_value());
}

TEST(HealthCheckTest, ANodeWithoutAnAddressIsUnhealthy) {
  ScopedTempDir dir;
  HealthCheckTarget t = Target(dir);
  t.addresses.clear();
  const std::optional<Unhealthy> v = BuiltInHealthChecks({}, t);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->kind, ExclusionKind::kAddress);
}

TEST(HealthCheckTest, ARunDirectoryThatCannotBeWrittenIsUnhealthy) {
  ScopedTempDir dir;
  HealthCheckTarget t = Target(dir);
  t.run_parent = dir.File("missing");
  const std::optional<Unhealthy> v = BuiltInHealthChecks({}, t);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->kind, ExclusionKind::kRunDir);
  EXPECT_TRUE(absl::StrContains(v->detail, "cannot create a file in")) << v->detail;
}

TEST(HealthCheckTest, MissingGpusAreFoundWhereTheDriverIsThere) {
  ScopedTempDir dir;
  HealthCheckOptions o;
  o.gpus = 4;
  // No driver on this node: nothing to compare against.
  EXPECT_FALSE(BuiltInHealthChecks(o, Target(dir)).has_value());
  Touch(dir.File("nvidiactl"));
  for (const char* name : {"nvidia0", "nvidia1", "nvidia2", "nvidia-uvm", "nvidia-caps"}) {
    Touch(dir.File(name));
  }
  const std::optional<Unhealthy> v = BuiltInHealthChecks(o, Target(dir));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->kind, ExclusionKind::kGpusMissing);
  EXPECT_TRUE(absl::StrContains(v->detail, "relies on 4 GPUs but")) << v->detail;
  EXPECT_TRUE(absl::StrContains(v->detail, "has 3")) << v->detail;
  Touch(dir.File("nvidia3"));
  EXPECT_FALSE(BuiltInHealthChecks(o, Target(dir)).has_value());
}

TEST(HealthCheckTest, TheCommandsExitAndLastLineAreTheVerdict) {
  ScopedTempDir dir;
  HealthCheckOptions o;
  o.command = "true";
  EXPECT_FALSE(RunToEnd(o, Target(dir)).has_value());
  o.command = "echo checking; echo 'no InfiniBand port is up' >&2; exit 7";
  std::optional<Unhealthy> v = RunToEnd(o, Target(dir));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->kind, ExclusionKind::kHealthCheckFailed);
  EXPECT_EQ(v->detail, "no InfiniBand port is up (exit code 7)");
  o.command = "kill -9 $$";
  v = RunToEnd(o, Target(dir));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->detail, "killed by SIGKILL");
}

// A descriptor the agent opened without O_CLOEXEC (or that another thread's fork caught before
// its FD_CLOEXEC) does not reach what the launcher starts: a worker or a check never holds the
// agent's sockets. The descriptors the process started with (its launcher's) still do.
TEST(HealthCheckTest, TheCommandGetsNoDescriptorTheAgentOpened) {
  ScopedTempDir dir;
  const int leaky = socket(AF_UNIX, SOCK_STREAM, 0);  // no SOCK_CLOEXEC
  ASSERT_GE(leaky, 3);
  const int also = dup(leaky);  // nor O_CLOEXEC
  ASSERT_GT(also, leaky);
  HealthCheckOptions o;
  o.command = absl::StrCat("for fd in ", leaky, " ", also,
                           "; do [ -e /proc/$$/fd/$fd ] && echo \"inherited $fd\"; done; exit 3");
  std::optional<Unhealthy> v = RunToEnd(o, Target(dir));
  close(leaky);
  close(also);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->detail, "exit code 3");
}

// Whether the process whose pid `pid_file` holds is gone (or a zombie its new parent has yet to
// reap), waiting a little for it.
void ExpectGone(const std::string& pid_file) {
  std::ifstream in(pid_file);
  pid_t bg = 0;
  ASSERT_TRUE(in >> bg) << pid_file;
  for (int i = 0; i < 100 && kill(bg, 0) == 0; ++i) usleep(10'000);
  std::ifstream stat(absl::StrCat("/proc/", bg, "/stat"));
  std::string line;
  std::getline(stat, line);
  EXPECT_TRUE(line.empty() || absl::StrContains(line, ") Z ")) << line;
  if (!line.empty() && !absl::StrContains(line, ") Z ")) kill(bg, SIGKILL);
}

TEST(HealthCheckTest, ACommandPastItsTimeoutIsKilledWithWhatItStarted) {
  ScopedTempDir dir;
  HealthCheckOptions o;
  const std::string pid_file = dir.File("bg.pid");
  o.command = absl::StrCat("sleep 60 & echo $! > ", pid_file, "; echo waiting for the GPUs; wait");
  o.timeout = absl::Milliseconds(300);
  const std::optional<Unhealthy> v = RunToEnd(o, Target(dir));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->kind, ExclusionKind::kHealthCheckTimedOut);
  EXPECT_TRUE(absl::StartsWith(v->detail, "waiting for the GPUs (did not finish within"))
      << v->detail;
  ExpectGone(pid_file);
}

TEST(HealthCheckTest, WhatACommandStartsInASessionOfItsOwnGoesWithIt) {
  ScopedTempDir dir;
  HealthCheckOptions o;
  // Out of the command's process group: only the guard, whose orphans they become, finds them.
  const std::string ended = dir.File("ended.pid");
  o.command = absl::StrCat("setsid sleep 60 & echo $! > ", ended, "; echo ok; exit 0");
  EXPECT_FALSE(RunToEnd(o, Target(dir)).has_value());
  ExpectGone(ended);
  const std::string timed_out = dir.File("timed_out.pid");
  o.command = absl::StrCat("setsid sleep 60 & echo $! > ", timed_out, "; sleep 60");
  o.timeout = absl::Milliseconds(300);
  const std::optional<Unhealthy> v = RunToEnd(o, Target(dir));
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->kind, ExclusionKind::kHealthCheckTimedOut);
  ExpectGone(timed_out);
}

pid_t StartSleep(const char* seconds) {
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sleep", "sleep", seconds, static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

TEST(HealthCheckTest, ARestartWaitsForTheLastRunsWorkersToBeGone) {
  ScopedTempDir dir;
  // One that ends during the wait (a zombie until reaped: its devices are closed) passes.
  HealthCheckTarget t = Target(dir);
  const pid_t ending = StartSleep("0.3");
  t.previous_workers = {ending};
  t.previous_wait = absl::Seconds(20);
  const absl::Time start = absl::Now();
  EXPECT_FALSE(RunToEnd(HealthCheckOptions{}, t).has_value());
  const absl::Duration waited = absl::Now() - start;
  EXPECT_GE(waited, absl::Milliseconds(250));
  EXPECT_LT(waited, absl::Seconds(10));
  waitpid(ending, nullptr, 0);

  // One that does not end within the bound leaves the node out, naming it.
  const pid_t stuck = StartSleep("60");
  t.previous_workers = {ending, stuck};
  t.previous_wait = absl::Milliseconds(200);
  const std::optional<Unhealthy> v = RunToEnd(HealthCheckOptions{}, t);
  kill(stuck, SIGKILL);
  waitpid(stuck, nullptr, 0);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->kind, ExclusionKind::kWorkersStuck);
  EXPECT_EQ(v->detail, absl::StrCat("1 of its processes (pid ", stuck,
                                    ") still there 200ms after the run ended"));
  // Gone: the next check passes at once.
  EXPECT_FALSE(RunToEnd(HealthCheckOptions{}, t).has_value());
}

TEST(HealthCheckTest, ACancelledCheckStopsAndSaysNothing) {
  ScopedTempDir dir;
  HealthCheckOptions o;
  o.command = "sleep 60";
  bool called = false;
  {
    HealthCheck check(o, Target(dir), [&](std::optional<Unhealthy>) { called = true; });
    usleep(100'000);
  }  // the destructor cancels, and waits
  EXPECT_FALSE(called);
}

}  // namespace
}  // namespace rdzv
