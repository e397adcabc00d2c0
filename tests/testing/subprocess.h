// Test helpers for running real processes: rdzvd, rdzv-agent and the workers they start.
//
//   rdzv::testing::ScopedTempDir dir;
//   rdzv::testing::Subprocess agent({.argv = {RDZV_AGENT_BIN, "--standalone", "--", "true"},
//                                    .env = {{"RDZV_LOG_LEVEL", "debug"}}});
//   EXPECT_EQ(agent.Wait(absl::Seconds(60)), 0) << agent.Stderr();
//   EXPECT_THAT(rdzv::testing::ProcessesMatching(marker), IsEmpty());
//
// A Subprocess is started in a process group of its own; if it is still running when the object
// is destroyed, the whole group gets SIGKILL and is reaped, so a failing test leaves nothing
// behind. The child also gets SIGKILL when the thread that started it exits (PR_SET_PDEATHSIG),
// which covers a test binary that crashes: start processes from the test's own thread, not from
// a short-lived helper thread.
//
// Waiting never hangs: Wait() takes a timeout, and on timeout it kills the group, reports a
// gtest failure that shows the command and the end of its output, and returns kTimedOut.
//
// Not thread-safe: use each Subprocess from one thread.
#ifndef RDZV_TESTS_TESTING_SUBPROCESS_H_
#define RDZV_TESTS_TESTING_SUBPROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace rdzv::testing {

// A directory under $TMPDIR (else /tmp) that is removed, with everything in it, on destruction.
class ScopedTempDir {
 public:
  ScopedTempDir();
  ~ScopedTempDir();
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::string& path() const { return path_; }
  // path()/name.
  std::string File(absl::string_view name) const;

 private:
  std::string path_;
};

// Members have default initializers so that designated initializers may name only some.
struct SubprocessOptions {
  // argv[0] is looked up in PATH when it has no '/'.
  std::vector<std::string> argv = {};
  // Set on top of this process's environment (replacing a variable of the same name).
  std::vector<std::pair<std::string, std::string>> env = {};
  // Variables inherited from this process whose names start with one of these are dropped
  // (e.g. {"SLURM_", "RDZV_"} so that a test run inside an allocation is not affected by it).
  // `env` is applied after this, so it can set such variables again.
  std::vector<std::string> unset_env_prefixes = {};
  // Where stdout and stderr go; empty: a file in a temporary directory owned by the Subprocess.
  std::string stdout_path = {};
  std::string stderr_path = {};
  // Working directory; empty: this process's.
  std::string cwd = {};
};

class Subprocess {
 public:
  // What Wait() returns when the process did not end in time (it has been killed then).
  static constexpr int kTimedOut = -1;

  // Starts the process. A failure to start (no such program, fork failed) is a gtest failure,
  // and the object then behaves as a process that exited with 127.
  explicit Subprocess(SubprocessOptions options);
  // SIGKILLs the process group if the process is still running, and reaps it.
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }

  // Whether the process is still running (reaps it without blocking if it ended).
  bool Running();

  // Waits up to `timeout` for the process to end and returns its exit code: the exit status,
  // or 128 + the signal that killed it (the shell's convention). On timeout, kills the process
  // group, records a gtest failure (non-fatal) and returns kTimedOut.
  int Wait(absl::Duration timeout);

  // The exit code, once the process has been reaped by Running() or Wait().
  std::optional<int> exit_code() const { return exit_code_; }

  // Sends `sig` to the process (Signal) or to its whole process group (SignalGroup). Nothing
  // happens once the process has been reaped.
  void Signal(int sig);
  void SignalGroup(int sig);

  // SIGKILLs the process group and reaps the process (blocks briefly).
  void Kill();

  // Everything the process has written so far (read from the capture files).
  std::string Stdout() const;
  std::string Stderr() const;
  const std::string& stdout_path() const { return stdout_path_; }
  const std::string& stderr_path() const { return stderr_path_; }

  // Waits until the process's stdout or stderr contains `needle`. False when the timeout passes
  // or the process exits first (no gtest failure: the caller asserts).
  bool WaitForOutput(absl::string_view needle, absl::Duration timeout);

  // The command line, for messages.
  std::string CommandLine() const;

 private:
  void Reaped(int status);

  SubprocessOptions options_;
  std::optional<ScopedTempDir> capture_dir_;
  std::string stdout_path_;
  std::string stderr_path_;
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

// A TCP port on 127.0.0.1 that was free a moment ago (bound with port 0, then closed).
int FreeLoopbackPort();

// Waits until something accepts TCP connections on 127.0.0.1:`port`.
bool WaitForLoopbackPort(int port, absl::Duration timeout);

// Live processes (zombies excluded, this process excluded) whose command line contains
// `marker`, as "PID: command line" entries. Put a unique marker in the commands a test starts
// and expect this to be empty at the end.
std::vector<std::string> ProcessesMatching(absl::string_view marker);

// Polls ProcessesMatching until it is empty; returns what is still there after `timeout`
// (processes killed a moment ago take a little while to disappear).
std::vector<std::string> WaitUntilNoProcessMatches(absl::string_view marker,
                                                   absl::Duration timeout);

// A marker unique to this test process and call, e.g. "rdzvtest-12345-7".
std::string UniqueMarker();

// Reads a whole file; empty when it cannot be read.
std::string ReadFileOrEmpty(const std::string& path);

// `process`'s command line and everything it wrote, for a failure's message.
std::string Describe(const Subprocess& process);

}  // namespace rdzv::testing

#endif  // RDZV_TESTS_TESTING_SUBPROCESS_H_
