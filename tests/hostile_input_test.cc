// Real agents (--standalone) whose workers do what a careless user or a hostile neighbour
// would: progress bars redrawn millions of times without a newline, endless lines, a FIFO or a
// link to /dev/zero where torch's error file goes, a 1 GB error file, a log directory or log
// file set up by someone else, control characters on stderr. Asserts what the user sees: the
// output arrives, the agent ends with the job's exit code and one clear line where something
// was refused, and nothing is left running.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/testing/long_wait.h"
#include "tests/testing/output.h"
#include "tests/testing/process_fixture.h"
#include "tests/testing/subprocess.h"

namespace rdzv {
namespace {

using testing::kLongWait;
using testing::ScopedTempDir;
using testing::Subprocess;
using testing::SubprocessOptions;

// The forwarder's limit on a line (client/agent/output_forwarder.h), as the user sees it.
constexpr size_t kMaxLineBytes = 64 * 1024;

class HostileInputTest : public testing::ProcessTest {
 protected:
  // A standalone agent with `flags` running the bash `script` as its one worker. The marker in
  // the worker's command line lets TearDown find leftovers.
  Subprocess& StartAgent(const std::string& script, std::vector<std::string> flags = {}) {
    std::vector<std::string> argv = {RDZV_AGENT_BIN, "--standalone"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {"--", "bash", "-c", absl::StrCat(script, " # ", marker_)});
    return Start(std::move(argv));
  }

  ScopedTempDir dir_;
};

// The longest line of `text`, split at '\n' and '\r'.
size_t LongestLine(const std::string& text) {
  size_t longest = 0;
  for (absl::string_view line : absl::StrSplit(text, absl::ByAnyChar("\r\n"))) {
    longest = std::max(longest, line.size());
  }
  return longest;
}

TEST_F(HostileInputTest, ProgressBarWithoutNewlineArrivesAndAgentEnds) {
  // tqdm's way: "\r" then the bar, on stderr, never a newline; 300,000 redraws (about 6 MB).
  Subprocess& agent =
      StartAgent(absl::StrCat("exec ", RDZV_TORCH_PYTHON, " -c '",
                              "import sys\n"
                              "w = sys.stderr.write\n"
                              "for i in range(300000): w(\"\\rstep %d/300000\" % (i + 1))\n"
                              "sys.stdout.write(\"done\\n\")\n'"));
  ASSERT_EQ(agent.Wait(kLongWait), 0) << agent.Stderr();
  const std::string err = agent.Stderr();
  // The last redraw is on the console, prefixed as every other line.
  EXPECT_TRUE(absl::StrContains(err, "\r[0]: step 300000/300000")) << err.substr(err.size() - 300);
  EXPECT_TRUE(absl::StrContains(err, "[0]: step 1/300000\r"));
  EXPECT_TRUE(absl::StrContains(agent.Stdout(), "[0]: done\n")) << agent.Stdout();
  // Every redraw went through once, prefixed: the output grows with the input, no more.
  EXPECT_LT(err.size(), 300000u * 32) << "redraws repeated";
}

TEST_F(HostileInputTest, ProgressBarShowsAtOnceNotAtTheNextRedraw) {
  // One redraw, then a long pause: without the agent the terminal shows it during the pause.
  Subprocess& agent = StartAgent("printf '\\rloading 50%%' >&2; sleep 30");
  EXPECT_TRUE(agent.WaitForOutput("[0]: loading 50%", absl::Seconds(20))) << agent.Stderr();
  agent.Kill();
}

TEST_F(HostileInputTest, EndlessLineArrivesInPieces) {
  // 1 MiB without a newline, then a short line.
  Subprocess& agent = StartAgent("head -c 1048576 /dev/zero | tr '\\0' x; echo; echo after");
  ASSERT_EQ(agent.Wait(kLongWait), 0) << agent.Stderr();
  const std::string out = agent.Stdout();
  EXPECT_EQ(std::count(out.begin(), out.end(), 'x'), 1048576);
  EXPECT_LE(LongestLine(out), kMaxLineBytes + 8);  // a piece and its prefix
  EXPECT_TRUE(absl::StrContains(out, "[0]: after\n")) << out.substr(out.size() - 200);
}

TEST_F(HostileInputTest, FifoAsErrorFileDoesNotHangTheAgent) {
  Subprocess& agent =
      StartAgent("mkfifo \"$TORCHELASTIC_ERROR_FILE\"; echo 'the real error' >&2; exit 3");
  EXPECT_EQ(agent.Wait(absl::Seconds(20)), 3) << agent.Stderr();
  const std::string err = agent.Stderr();
  EXPECT_TRUE(absl::StrContains(testing::LineWith(err, "ignoring the worker's error file"),
                                "not a regular file"))
      << err;
  // The root cause falls back to the worker's stderr.
  EXPECT_TRUE(absl::StrContains(err, "    the real error")) << err;
}

TEST_F(HostileInputTest, LinkToDevZeroAsErrorFileIsNotFollowed) {
  Subprocess& agent =
      StartAgent("ln -s /dev/zero \"$TORCHELASTIC_ERROR_FILE\"; echo 'the real error' >&2; exit 1");
  EXPECT_EQ(agent.Wait(absl::Seconds(20)), 1) << agent.Stderr();
  const std::string err = agent.Stderr();
  EXPECT_TRUE(absl::StrContains(testing::LineWith(err, "ignoring the worker's error file"),
                                "symbolic link"))
      << err;
  EXPECT_TRUE(absl::StrContains(err, "    the real error")) << err;
}

TEST_F(HostileInputTest, HugeErrorFileIsNotRead) {
  // 1 GB, sparse: reading it whole would take seconds and a gigabyte.
  Subprocess& agent =
      StartAgent("truncate -s 1G \"$TORCHELASTIC_ERROR_FILE\"; echo 'the real error' >&2; exit 1");
  EXPECT_EQ(agent.Wait(absl::Seconds(20)), 1) << agent.Stderr();
  const std::string err = agent.Stderr();
  EXPECT_TRUE(absl::StrContains(testing::LineWith(err, "ignoring the worker's error file"),
                                "over 1048576 bytes"))
      << err;
  EXPECT_TRUE(absl::StrContains(err, "    the real error")) << err;
}

TEST_F(HostileInputTest, ErrorFileWithinLimitsIsStillShown) {
  Subprocess& agent = StartAgent(
      "printf '{\"message\": {\"message\": \"ValueError: bad\\\\u001b[2J lr\"}}' > "
      "\"$TORCHELASTIC_ERROR_FILE\"; exit 1");
  EXPECT_EQ(agent.Wait(absl::Seconds(20)), 1) << agent.Stderr();
  const std::string err = agent.Stderr();
  // Its control characters are escaped: the message cannot clear the user's screen.
  EXPECT_TRUE(absl::StrContains(err, "    ValueError: bad\\x1b[2J lr")) << err;
  EXPECT_FALSE(absl::StrContains(err, "\x1b")) << err;
}

TEST_F(HostileInputTest, ControlCharactersInTheStderrTailAreEscaped) {
  Subprocess& agent = StartAgent("printf 'boom\\033[31m red\\a\\n' >&2; exit 1");
  EXPECT_EQ(agent.Wait(absl::Seconds(20)), 1) << agent.Stderr();
  const std::string err = agent.Stderr();
  // Forwarded as written (colours work), but escaped in the root cause.
  EXPECT_TRUE(absl::StrContains(err, "[0]: boom\x1b[31m red\a\n")) << err;
  EXPECT_TRUE(absl::StrContains(testing::LineWith(err, "    boom"), "boom\\x1b[31m red\\x07"))
      << err;
}

TEST_F(HostileInputTest, LogDirOfAnotherUserIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a directory to another user";
  const std::string logs = dir_.File("theirs");
  ASSERT_EQ(mkdir(logs.c_str(), 0777), 0);
  ASSERT_EQ(chmod(logs.c_str(), 0777), 0);
  ASSERT_EQ(chown(logs.c_str(), 65534, 65534), 0);
  Subprocess& agent = StartAgent("echo ran > " + dir_.File("ran"), {"--log-dir", logs});
  EXPECT_NE(agent.Wait(absl::Seconds(20)), 0) << agent.Stderr();
  EXPECT_TRUE(absl::StrContains(testing::LineWith(agent.Stderr(), "--log-dir " + logs),
                                "belongs to another user (uid 65534)"))
      << agent.Stderr();
  EXPECT_EQ(access(dir_.File("ran").c_str(), F_OK), -1) << "the worker ran";
  EXPECT_EQ(access((logs + "/rank-0.log").c_str(), F_OK), -1);
}

TEST_F(HostileInputTest, LogFileThatIsALinkIsNotFollowed) {
  const std::string logs = dir_.File("logs");
  ASSERT_EQ(mkdir(logs.c_str(), 0755), 0);
  const std::string target = dir_.File("precious");
  ASSERT_EQ(symlink(target.c_str(), (logs + "/rank-0.log").c_str()), 0);
  Subprocess& agent = StartAgent("echo ran", {"--log-dir", logs});
  EXPECT_NE(agent.Wait(absl::Seconds(20)), 0) << agent.Stderr();
  EXPECT_TRUE(
      absl::StrContains(testing::LineWith(agent.Stderr(), logs + "/rank-0.log"), "symbolic link"))
      << agent.Stderr();
  EXPECT_EQ(access(target.c_str(), F_OK), -1) << "the link was followed";
}

TEST_F(HostileInputTest, LogFileThatIsAFifoDoesNotBlock) {
  const std::string logs = dir_.File("logs");
  ASSERT_EQ(mkdir(logs.c_str(), 0755), 0);
  ASSERT_EQ(mkfifo((logs + "/rank-0.log").c_str(), 0644), 0);
  Subprocess& agent = StartAgent("echo ran", {"--log-dir", logs});
  EXPECT_NE(agent.Wait(absl::Seconds(20)), 0) << agent.Stderr();
  EXPECT_TRUE(
      absl::StrContains(testing::LineWith(agent.Stderr(), logs + "/rank-0.log"), "cannot write"))
      << agent.Stderr();
}

TEST_F(HostileInputTest, LogDirOfOwnIsUsedAsBefore) {
  const std::string logs = dir_.File("logs");
  Subprocess& agent = StartAgent("printf 'a\\rb\\n'; echo line", {"--log-dir", logs});
  ASSERT_EQ(agent.Wait(kLongWait), 0) << agent.Stderr();
  EXPECT_EQ(testing::ReadFileOrEmpty(logs + "/rank-0.log"), "a\rb\nline\n");
}

TEST_F(HostileInputTest, OrphansBeyondAPageOfPidsAreAllKilled) {
  // 900 processes that leave the worker's group and are orphaned: their pids take more than
  // one 4 KiB read of the guard's list of adopted children. The sleeps carry no marker, so they get
  // a duration no one else uses.
  const std::string sleep = absl::StrCat("sleep 977.", getpid(), "1");
  Subprocess& agent = StartAgent(absl::StrCat("for i in $(seq 900); do setsid ", sleep,
                                              " & done; sleep 1; echo started; exit 0"));
  EXPECT_EQ(agent.Wait(kLongWait), 0) << agent.Stderr();
  EXPECT_TRUE(absl::StrContains(agent.Stdout(), "started"));
  EXPECT_TRUE(testing::NoProcessLeft(sleep));
}

}  // namespace
}  // namespace rdzv
