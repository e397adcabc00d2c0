// Authentication and job ownership against a real rdzvd, a real munged (a private one, with its
// own key and socket) and a second real user (nobody): another user's calls never reach a job,
// while the job itself runs to its end with the right ranks. Needs root (to run as nobody).
#include "common/auth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "tests/testing/output.h"
#include "tests/testing/subprocess.h"

namespace rdzv {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::Subprocess;
using testing::SubprocessOptions;

constexpr absl::Duration kWait = absl::Seconds(60);

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(geteuid(), 0u) << "the authentication tests run a second user and need root";
    // Others (nobody) must reach the socket; the key stays private.
    ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);
    const std::string key = dir_.File("munge.key");
    {
      std::ifstream random("/dev/urandom", std::ios::binary);
      std::string bytes(1024, '\0');
      random.read(bytes.data(), bytes.size());
      std::ofstream(key, std::ios::binary) << bytes;
    }
    ASSERT_EQ(chmod(key.c_str(), 0600), 0);
    socket_ = dir_.File("munge.socket");
    munged_argv_ = {"munged",
                    "--foreground",
                    "--force",
                    "--socket=" + socket_,
                    "--key-file=" + key,
                    "--pid-file=" + dir_.File("munged.pid"),
                    "--log-file=" + dir_.File("munged.log"),
                    "--seed-file=" + dir_.File("munged.seed")};
    StartMunged();
  }

  void StartMunged() {
    munged_.emplace(SubprocessOptions{.argv = munged_argv_});
    for (int i = 0; i < 100 && !MungeWorks(socket_); ++i) usleep(50'000);
    ASSERT_TRUE(MungeWorks(socket_)) << munged_->Stderr();
  }

  // rdzvd on a free loopback port with `auth` ("munge" or "token").
  void StartRdzvd(const std::string& auth) {
    for (int attempt = 0; attempt < 5; ++attempt) {
      const int port = testing::FreeLoopbackPort();
      rdzvd_.emplace(
          SubprocessOptions{.argv = {RDZVD_BIN, "--auth", auth, "--munge-socket", socket_,
                                     "--listen", absl::StrCat("127.0.0.1:", port)},
                            .unset_env_prefixes = {"RDZV_", "SLURM_"}});
      if (testing::WaitForLoopbackPort(port, kWait) && rdzvd_->Running()) {
        endpoint_ = absl::StrCat("127.0.0.1:", port);
        return;
      }
      rdzvd_.reset();
    }
    FAIL() << "rdzvd did not start";
  }

  // An agent of the job `job` (node `node` of 2) running as root; it prints its rank.
  SubprocessOptions Agent(const std::string& job, int node, std::vector<std::string> auth) {
    std::vector<std::string> argv = {
        RDZV_AGENT_BIN, "--rdzv-endpoint",  endpoint_,        "--rdzv-id", job, "--nnodes", "2",
        "--node-rank",  absl::StrCat(node), "--join-timeout", "30"};
    argv.insert(argv.end(), auth.begin(), auth.end());
    for (const char* w : {"--", "sh", "-c", "sleep 2; echo rank=$RANK of $WORLD_SIZE"}) {
      argv.push_back(w);
    }
    return {.argv = argv, .unset_env_prefixes = {"RDZV_", "SLURM_"}};
  }

  // auth_probe as nobody.
  Subprocess Probe(const std::string& credential, const std::string& action, const std::string& job,
                   const std::string& agent = "") {
    std::vector<std::string> argv = {"runuser", "-u",       "nobody", "--", AUTH_PROBE_BIN,
                                     endpoint_, credential, action,   job};
    if (!agent.empty()) argv.push_back(agent);
    return Subprocess({.argv = argv});
  }

  // A token file owned by `uid`, mode 0600.
  std::string TokenFile(const std::string& name, const std::string& token, uid_t uid) {
    const std::string path = dir_.File(name);
    std::ofstream(path) << token << "\n";
    EXPECT_EQ(chmod(path.c_str(), 0600), 0);
    EXPECT_EQ(chown(path.c_str(), uid, static_cast<gid_t>(-1)), 0);
    return path;
  }

  // Waits until root's view of rdzvd lists `job`.
  bool WaitForJob(const std::string& job) {
    for (int i = 0; i < 200; ++i) {
      Subprocess status({.argv = {AUTH_PROBE_BIN, endpoint_, "munge:" + socket_, "status", ""}});
      if (status.Wait(kWait) == 0 && status.Stdout().find(job) != std::string::npos) return true;
      usleep(50'000);
    }
    return false;
  }

  static void ExpectRanks(Subprocess& a, Subprocess& b) {
    ASSERT_EQ(a.Wait(kWait), 0) << a.Stderr();
    ASSERT_EQ(b.Wait(kWait), 0) << b.Stderr();
    const std::string out = a.Stdout() + b.Stdout();
    EXPECT_THAT(out, HasSubstr("rank=0 of 2"));
    EXPECT_THAT(out, HasSubstr("rank=1 of 2"));
  }

  testing::ScopedTempDir dir_;
  std::string socket_;
  std::string endpoint_;
  std::vector<std::string> munged_argv_;
  std::optional<Subprocess> munged_;
  std::optional<Subprocess> rdzvd_;
};

// munged restarting while agents (told to use MUNGE) start: their joins wait for it instead of
// failing.
TEST_F(AuthTest, AgentsWaitOutAMungedRestart) {
  StartRdzvd("munge");
  munged_->Signal(SIGTERM);
  munged_->Wait(kWait);
  ASSERT_FALSE(MungeWorks(socket_));
  const std::vector<std::string> auth = {"--auth", "munge", "--munge-socket", socket_};
  Subprocess node0(Agent("restart", 0, auth));
  Subprocess node1(Agent("restart", 1, auth));
  // Both have tried and failed to make a credential by the time munged is back.
  usleep(1'500'000);
  ASSERT_TRUE(node0.Running()) << node0.Stderr();
  ASSERT_TRUE(node1.Running()) << node1.Stderr();
  StartMunged();
  ExpectRanks(node0, node1);
}

// munged that stays away: the join gives up with munged's own line, long before --join-timeout.
TEST_F(AuthTest, AgentWithoutMungedSaysSoAndExits) {
  StartRdzvd("munge");
  Subprocess agent(
      Agent("nomunge", 0, {"--auth", "munge", "--munge-socket", dir_.File("absent.socket")}));
  EXPECT_EQ(agent.Wait(kWait), 1) << agent.Stderr();
  EXPECT_THAT(agent.Stderr(), HasSubstr("is munged running"));
  EXPECT_THAT(agent.Stderr(), HasSubstr("absent.socket"));
}

TEST_F(AuthTest, AnotherUserCannotSeeStopOrJoinAJob) {
  StartRdzvd("munge");
  const std::vector<std::string> auth = {"--munge-socket", socket_};
  Subprocess node0(Agent("victim", 0, auth));
  ASSERT_TRUE(WaitForJob("victim")) << node0.Stderr() << rdzvd_->Stderr();

  // Status lists only the caller's own jobs.
  Subprocess status = Probe("munge:" + socket_, "status", "");
  EXPECT_EQ(status.Wait(kWait), 0) << status.Stdout() << status.Stderr();
  EXPECT_THAT(status.Stdout(), HasSubstr("OK jobs: []"));

  // A failure report or a departure for the job reaches only the caller's own (absent) job.
  Subprocess report = Probe("munge:" + socket_, "report", "victim", "n1/agent");
  EXPECT_EQ(report.Wait(kWait), 1) << report.Stdout();
  EXPECT_THAT(report.Stdout(), HasSubstr("has no agent"));
  Subprocess leave = Probe("munge:" + socket_, "leave", "victim");
  EXPECT_EQ(leave.Wait(kWait), 1) << leave.Stdout();
  EXPECT_THAT(leave.Stdout(), HasSubstr("job victim has no agent"));

  // Joining the same id makes the intruder's own job: it does not fill the victim's round.
  Subprocess join = Probe("munge:" + socket_, "join", "victim");
  EXPECT_EQ(join.Wait(kWait), 0) << join.Stdout();
  EXPECT_THAT(join.Stdout(), HasSubstr("OK assigned rank 0 of 1"));

  Subprocess node1(Agent("victim", 1, auth));
  ExpectRanks(node0, node1);
}

TEST_F(AuthTest, CallsWithoutAValidCredentialAreRefusedWithTheReason) {
  StartRdzvd("munge");
  Subprocess none = Probe("none", "status", "");
  EXPECT_EQ(none.Wait(kWait), 1);
  EXPECT_THAT(none.Stdout(), HasSubstr("16: "));  // UNAUTHENTICATED
  EXPECT_THAT(none.Stdout(), HasSubstr("is munged running"));

  Subprocess replay = Probe("munge:" + socket_, "replay", "some-job");
  EXPECT_EQ(replay.Wait(kWait), 1) << replay.Stdout();
  EXPECT_THAT(replay.Stdout(), HasSubstr("replayed"));

  // An agent without a credential gets one line saying what to check, and exits non-zero.
  Subprocess agent(Agent("nocred", 0, {"--auth", "none"}));
  EXPECT_NE(agent.Wait(kWait), 0);
  EXPECT_THAT(agent.Stderr(), HasSubstr("needs a MUNGE credential"));
  EXPECT_THAT(agent.Stdout() + agent.Stderr(), Not(HasSubstr("rank=")));
}

TEST_F(AuthTest, JobTokensKeepJobsApart) {
  StartRdzvd("token");
  const std::string mine = TokenFile("job.token", "victim-token-0123456789abcdef", 0);
  Subprocess node0(Agent("shared-id", 0, {"--rdzv-token-file", mine}));
  for (int i = 0; i < 100 && !node0.WaitForOutput("waiting for", absl::Milliseconds(50)); ++i) {
  }
  const std::string theirs = TokenFile("other.token", "intruder-token-0123456789abc", 65534);
  Subprocess status = Probe("token:" + theirs, "status", "");
  EXPECT_EQ(status.Wait(kWait), 0) << status.Stdout();
  EXPECT_THAT(status.Stdout(), HasSubstr("OK jobs: []"));
  Subprocess report = Probe("token:" + theirs, "report", "shared-id", "n1/agent");
  EXPECT_EQ(report.Wait(kWait), 1);
  Subprocess none = Probe("none", "status", "");
  EXPECT_EQ(none.Wait(kWait), 1);
  EXPECT_THAT(none.Stdout(), HasSubstr("needs a job token"));

  Subprocess node1(Agent("shared-id", 1, {"--rdzv-token-file", mine}));
  ExpectRanks(node0, node1);
}

TEST_F(AuthTest, UnsafeSettingsAreRefusedBeforeAnythingStarts) {
  Subprocess open_none({.argv = {RDZVD_BIN, "--auth", "none", "--listen", "0.0.0.0:0"}});
  EXPECT_EQ(open_none.Wait(kWait), 2);
  EXPECT_THAT(open_none.Stderr(), HasSubstr("allowed only on a loopback address"));

  Subprocess no_munged({.argv = {RDZVD_BIN, "--munge-socket", dir_.File("absent.socket"),
                                 "--listen", "127.0.0.1:0"}});
  EXPECT_EQ(no_munged.Wait(kWait), 2);
  EXPECT_THAT(no_munged.Stderr(), HasSubstr("munged does not answer"));

  // A token file others can read is refused with the fix.
  const std::string loose = dir_.File("loose.token");
  std::ofstream(loose) << "loose-token-0123456789abcdef\n";
  ASSERT_EQ(chmod(loose.c_str(), 0644), 0);
  Subprocess agent({.argv = {RDZV_AGENT_BIN, "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-id", "x",
                             "--nnodes", "1", "--rdzv-token-file", loose, "--", "true"},
                    .unset_env_prefixes = {"RDZV_", "SLURM_"}});
  EXPECT_NE(agent.Wait(kWait), 0);
  EXPECT_THAT(agent.Stderr(), HasSubstr("chmod 600"));
}

TEST_F(AuthTest, TokenFilesThatAreLinksOrFifosAreRefusedWithoutBlocking) {
  const std::string real = TokenFile("real.token", "real-token-0123456789abcdef", 0);
  const std::string link = dir_.File("link.token");
  ASSERT_EQ(symlink(real.c_str(), link.c_str()), 0);
  const std::string fifo = dir_.File("fifo.token");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  for (const auto& [path, why] : std::vector<std::pair<std::string, std::string>>{
           {link, "symbolic link"}, {fifo, "not a regular file"}}) {
    Subprocess agent({.argv = {RDZV_AGENT_BIN, "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-id", "x",
                               "--nnodes", "1", "--rdzv-token-file", path, "--", "true"},
                      .unset_env_prefixes = {"RDZV_", "SLURM_"}});
    EXPECT_NE(agent.Wait(kWait), 0);
    EXPECT_THAT(agent.Stderr(), HasSubstr(why)) << path;
  }
}

// A socket file whose munged is gone (the daemon was killed) is no MUNGE: --auth auto sends
// nothing rather than fail every call on "connection refused".
TEST_F(AuthTest, AutoPicksMungeOnlyWhenMungedListens) {
  ClientAuth auto_auth;
  auto_auth.munge_socket = socket_;
  absl::StatusOr<ClientAuth> live = ResolveClientAuth(auto_auth);
  ASSERT_TRUE(live.ok()) << live.status();
  EXPECT_EQ(live->mode, ClientAuth::Mode::kMunge);

  const std::string stale = dir_.File("stale.socket");
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(stale.size(), sizeof(addr.sun_path));
  stale.copy(addr.sun_path, stale.size());
  ASSERT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  close(fd);  // the file stays, nobody listens
  auto_auth.munge_socket = stale;
  absl::StatusOr<ClientAuth> gone = ResolveClientAuth(auto_auth);
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_EQ(gone->mode, ClientAuth::Mode::kNone);

  auto_auth.munge_socket = dir_.File("no.socket");
  EXPECT_EQ(ResolveClientAuth(auto_auth)->mode, ClientAuth::Mode::kNone);
}

}  // namespace
}  // namespace rdzv
