// Real PyTorch under real agents: deploy/examples/train_ddp.py trains with DDP over gloo, and
// the test checks what a user would: every rank saw the same world (its all_reduce check), the
// replicas stayed identical, rank 0 printed the loss, and the exit codes are the workers'.
// One test runs the two nodes in network namespaces of their own, to prove that MASTER_ADDR is
// an address the other host can reach and not this host's loopback.
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/torch_job.h"
#include "tests/testing/two_hosts.h"

namespace rdzv {
namespace {

using ::rdzv::testing::Subprocess;
using ::rdzv::testing::SubprocessOptions;
using ::testing::HasSubstr;

const std::string kTrain = std::string(RDZV_SOURCE_DIR) + "/deploy/examples/train_ddp.py";
constexpr absl::Duration kTimeout = absl::Seconds(180);

// The lines train_ddp.py prints for each rank: "rank R/W local L/LW node G master A:P
// all_reduce ok (...)".
struct RankLine {
  int rank = -1, world = -1, local = -1, local_world = -1, node = -1;
  std::string master;
  bool all_reduce_ok = false;
};

std::vector<RankLine> RankLines(const std::string& out) {
  std::vector<RankLine> lines;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    const size_t at = line.find("rank ");
    if (at == absl::string_view::npos || !absl::StrContains(line, "all_reduce")) continue;
    std::vector<std::string> w = absl::StrSplit(line.substr(at), ' ', absl::SkipEmpty());
    // rank R/W local L/LW node G master A:P all_reduce ok
    if (w.size() < 9) continue;
    RankLine r;
    std::vector<std::string> rw = absl::StrSplit(w[1], '/');
    std::vector<std::string> ll = absl::StrSplit(w[3], '/');
    if (rw.size() != 2 || ll.size() != 2 || !absl::SimpleAtoi(rw[0], &r.rank) ||
        !absl::SimpleAtoi(rw[1], &r.world) || !absl::SimpleAtoi(ll[0], &r.local) ||
        !absl::SimpleAtoi(ll[1], &r.local_world) || !absl::SimpleAtoi(w[5], &r.node)) {
      continue;
    }
    r.master = w[7];
    r.all_reduce_ok = w[9] == "ok";
    lines.push_back(r);
  }
  return lines;
}

// Agent `node` of a 2-node job with `nproc` workers running train_ddp.py `train_args`.
SubprocessOptions Agent(int port, const std::string& job, int node, int nproc,
                        std::vector<std::string> train_args) {
  std::vector<std::string> worker = {kTrain};
  worker.insert(worker.end(), train_args.begin(), train_args.end());
  return testing::TorchAgent(
      {.port = port, .job = job, .node = node, .nproc = nproc, .worker = std::move(worker)});
}

using TorchTest = testing::TorchJobTest;

TEST_F(TorchTest, TwoAgentsTimesTwoWorkersTrainWithGloo) {
  Subprocess node1(Agent(port(), "ddp-ok", 1, 2, {"--steps", "10"}));
  Subprocess node0(Agent(port(), "ddp-ok", 0, 2, {"--steps", "10"}));
  ASSERT_EQ(node0.Wait(kTimeout), 0) << node0.Stdout() << node0.Stderr();
  ASSERT_EQ(node1.Wait(kTimeout), 0) << node1.Stdout() << node1.Stderr();

  std::vector<RankLine> lines = RankLines(node0.Stdout() + node1.Stdout());
  ASSERT_EQ(lines.size(), 4u) << node0.Stdout() << node1.Stdout();
  std::vector<bool> seen(4, false);
  for (const RankLine& r : lines) {
    ASSERT_GE(r.rank, 0);
    ASSERT_LT(r.rank, 4);
    seen[r.rank] = true;
    EXPECT_EQ(r.world, 4);
    EXPECT_EQ(r.local_world, 2);
    EXPECT_EQ(r.node, r.rank / 2) << "ranks follow --node-rank";
    EXPECT_EQ(r.local, r.rank % 2);
    EXPECT_EQ(r.master, lines.front().master) << "one master for everyone";
    EXPECT_TRUE(r.all_reduce_ok) << "rank " << r.rank;
  }
  EXPECT_EQ(seen, std::vector<bool>(4, true));
  EXPECT_THAT(node0.Stdout(), HasSubstr("final loss"));
  EXPECT_THAT(node0.Stdout(), HasSubstr("replicas identical"));
}

TEST_F(TorchTest, FailingWorkerGivesItsExitCodeToEveryAgent) {
  // Rank 3 exits with 7 after its first step; the other ranks would train for a long time.
  const std::vector<std::string> args = {"--steps", "1000000",     "--fail-rank",
                                         "3",       "--fail-code", "7"};
  Subprocess node0(Agent(port(), "ddp-fail", 0, 2, args));
  Subprocess node1(Agent(port(), "ddp-fail", 1, 2, args));
  EXPECT_EQ(node1.Wait(kTimeout), 7) << node1.Stderr();
  EXPECT_EQ(node0.Wait(kTimeout), 7) << node0.Stderr();
  EXPECT_THAT(node0.Stderr(), HasSubstr("rank 3 (local rank 1, node 1)"));
  EXPECT_THAT(node0.Stderr(), HasSubstr("exited with code 7"));
  EXPECT_THAT(node1.Stderr(), HasSubstr("rank 3 failing on purpose"));
}

TEST(TorchStandaloneTest, OneNodeTwoWorkers) {
  Subprocess agent(
      SubprocessOptions{.argv = {RDZV_AGENT_BIN, "--standalone", "--nproc-per-node", "2", "--",
                                 testing::kTorchPython, kTrain, "--steps", "5"},
                        .env = {{"RDZV_CONFIG", "/dev/null"}},
                        .unset_env_prefixes = testing::TorchUnsetEnvPrefixes()});
  ASSERT_EQ(agent.Wait(kTimeout), 0) << agent.Stderr();
  EXPECT_EQ(RankLines(agent.Stdout()).size(), 2u) << agent.Stdout();
  EXPECT_THAT(agent.Stdout(), HasSubstr("final loss"));
}

// Two hosts with addresses of their own (testing::TwoHosts). rdzvd and node 0 live on one,
// node 1 on the other; gloo's traffic only works if MASTER_ADDR is node 0's address on the shared
// link.
class TwoHostsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
    const absl::Status made = hosts_.Create();
    ASSERT_TRUE(made.ok()) << made;
  }

  // Runs argv on host A or B, with gloo bound to that host's link.
  SubprocessOptions OnHost(char host, std::vector<std::string> argv) {
    SubprocessOptions o;
    o.unset_env_prefixes = testing::TorchUnsetEnvPrefixes();
    o.env = {{"RDZV_CONFIG", "/dev/null"},
             {"GLOO_SOCKET_IFNAME", host == 'A' ? hosts_.link_a() : hosts_.link_b()}};
    return host == 'A' ? hosts_.OnA(std::move(argv), std::move(o))
                       : hosts_.OnB(std::move(argv), std::move(o));
  }

  static constexpr const char* kAddrA = testing::TwoHosts::kAddrA;
  testing::TwoHosts hosts_;
};

TEST_F(TwoHostsTest, MasterAddrIsReachableFromTheOtherHost) {
  const std::string endpoint = std::string(kAddrA) + ":29400";
  // Not a loopback address, so rdzvd authenticates: the job shares a token.
  char token_path[] = "/tmp/rdzv-token-XXXXXX";
  const int fd = mkstemp(token_path);
  ASSERT_GE(fd, 0);
  const std::string token = "two-hosts-secret-0123456789abcdef\n";
  ASSERT_EQ(write(fd, token.data(), token.size()), static_cast<ssize_t>(token.size()));
  close(fd);
  struct RemoveToken {
    const char* path;
    ~RemoveToken() { unlink(path); }
  } remove_token{token_path};
  Subprocess rdzvd(OnHost('A', {RDZVD_BIN, "--auth", "token", "--listen", endpoint}));
  const auto agent = [&](int node) {
    return std::vector<std::string>{RDZV_AGENT_BIN,
                                    "--rdzv-token-file",
                                    token_path,
                                    "--rdzv-endpoint",
                                    endpoint,
                                    "--rdzv-id",
                                    "two-hosts",
                                    "--nnodes",
                                    "2",
                                    "--node-rank",
                                    absl::StrCat(node),
                                    "--nproc-per-node",
                                    "1",
                                    "--join-timeout",
                                    "60",
                                    "--",
                                    testing::kTorchPython,
                                    kTrain,
                                    "--steps",
                                    "5"};
  };
  Subprocess node1(OnHost('B', agent(1)));
  Subprocess node0(OnHost('A', agent(0)));
  ASSERT_EQ(node0.Wait(kTimeout), 0) << node0.Stdout() << node0.Stderr();
  ASSERT_EQ(node1.Wait(kTimeout), 0) << node1.Stdout() << node1.Stderr();
  rdzvd.Signal(SIGTERM);
  EXPECT_EQ(rdzvd.Wait(absl::Seconds(20)), 0) << rdzvd.Stderr();

  std::vector<RankLine> lines = RankLines(node0.Stdout() + node1.Stdout());
  ASSERT_EQ(lines.size(), 2u) << node0.Stdout() << node1.Stdout();
  for (const RankLine& r : lines) {
    EXPECT_TRUE(absl::StartsWith(r.master, std::string(kAddrA) + ":"))
        << "rank " << r.rank << " was told master " << r.master;
    EXPECT_TRUE(r.all_reduce_ok);
  }
  EXPECT_THAT(node0.Stdout(), HasSubstr("final loss"));
}

}  // namespace
}  // namespace rdzv
