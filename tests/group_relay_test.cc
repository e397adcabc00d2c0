// The tree of a large per-node job (--fan-in): real rdzv-agents of a Slurm step of six nodes,
// each node its own loopback address (127.0.0.1..6), join a real rdzvd with the job's token in
// groups of three through the relay of each group's first node. What a user would check: every
// node gets its rank, rdzvd holds a connection per group, a failure behind a relay ends the job
// everywhere, a relay that dies is a lost node and no one hangs, and a relay lets in no one
// without the job's token.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/agent/core/agent_options.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/testing/long_wait.h"
#include "tests/testing/output.h"
#include "tests/testing/process_fixture.h"
#include "tests/testing/subprocess.h"

namespace rdzv {
namespace {

using testing::Contains;
using testing::Describe;
using testing::kLongWait;
using testing::LineWith;
using testing::ScopedTempDir;
using testing::Subprocess;

constexpr int kNodes = 6;
constexpr int kFanIn = 3;
// How soon every agent must have ended once the job has failed, with room for a loaded machine.
constexpr absl::Duration kPrompt = absl::Seconds(10);

// The TCP connections established to local port `port`: what `ss -tn state established sport
// = :PORT` counts (gRPC's sockets are IPv6 ones, with IPv4 mapped into them).
int ConnectionsTo(int port) {
  int n = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const size_t colon = local.find(':');
      if (colon == std::string::npos || state != "01") continue;
      if (std::stoi(local.substr(colon + 1), nullptr, 16) == port) ++n;
    }
  }
  return n;
}

class GroupRelayTest : public testing::ProcessTest {
 protected:
  void SetUp() override {
    token_ = dir_.File("token");
    {
      std::ofstream out(token_);
      out << "group-relay-test-token-" << marker_ << "\n";
    }
    std::filesystem::permissions(
        token_, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    // A job id of its own: the relays' ports derive from it.
    std::mt19937 rng(std::random_device{}());
    slurm_job_ = absl::StrCat(8'000'000 + rng() % 1'000'000);
  }

  void StartTokenRdzvd() { StartRdzvd({"--auth", "token"}); }

  // The agent of node `node` of the six-node step, on address 127.0.0.<node+1>, with `flags`;
  // its one worker runs `script` (bash) after writing down its rank.
  Subprocess& StartNode(int node, const std::string& script,
                        const std::vector<std::string>& flags = {}) {
    std::vector<std::string> argv = {
        RDZV_AGENT_BIN,       "--rdzv-endpoint", endpoint_, "--rdzv-token-file", token_, "--fan-in",
        absl::StrCat(kFanIn), "--join-timeout",  "60"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    const std::string worker = absl::StrCat(
        "d=", dir_.path(), "; echo \"$RANK $WORLD_SIZE $GROUP_RANK\" > $d/w$SLURM_NODEID.tmp && ",
        "mv $d/w$SLURM_NODEID.tmp $d/w$SLURM_NODEID; ", script);
    for (const std::string& w :
         {std::string("--"), std::string("bash"), std::string("-c"), worker, marker_}) {
      argv.push_back(w);
    }
    const std::string n = absl::StrCat(node);
    return Start(std::move(argv),
                 {{"SLURM_JOB_ID", slurm_job_},
                  {"SLURM_STEP_ID", "0"},
                  {"SLURM_PROCID", n},
                  {"SLURM_NODEID", n},
                  {"SLURM_LOCALID", "0"},
                  {"SLURM_STEP_NUM_NODES", absl::StrCat(kNodes)},
                  {"SLURM_STEP_NUM_TASKS", absl::StrCat(kNodes)},
                  {"SLURM_STEP_TASKS_PER_NODE", absl::StrCat("1(x", kNodes, ")")},
                  {"SLURM_STEP_NODELIST", absl::StrCat("127.0.0.[1-", kNodes, "]")},
                  {"SLURMD_NODENAME", Host(node)},
                  {"TMPDIR", dir_.path()}});
  }

  std::vector<Subprocess*> StartNodes(const std::string& script,
                                      const std::vector<std::string>& flags = {}) {
    std::vector<Subprocess*> agents;
    for (int node = 0; node < kNodes; ++node) agents.push_back(&StartNode(node, script, flags));
    return agents;
  }

  static std::string Host(int node) { return absl::StrCat("127.0.0.", node + 1); }

  // Waits until every worker has written its rank; returns "RANK WORLD_SIZE GROUP_RANK" of each
  // node.
  std::vector<std::string> AwaitWorkers() {
    std::vector<std::string> seen(kNodes);
    const absl::Time deadline = absl::Now() + kLongWait;
    for (int node = 0; node < kNodes; ++node) {
      const std::string path = absl::StrCat(dir_.path(), "/w", node);
      while (!std::filesystem::exists(path) && absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(20));
      }
      std::ifstream in(path);
      std::getline(in, seen[node]);
    }
    return seen;
  }

  // Bash that waits (up to a minute) until the test writes the go file, then exits 0.
  std::string AwaitGo() const {
    return absl::StrCat("for i in $(seq 600); do [ -e $d/go ] && exit 0; sleep 0.1; done; exit 9");
  }
  void Go() { std::ofstream(dir_.File("go")) << "go\n"; }

  // Once every worker runs, SIGKILLs node `victim`'s agent: every other node's agent must fail the
  // job for having lost contact with it, promptly, and leave nothing running.
  void KillAndExpectEveryOtherNodeToLoseIt(int victim) {
    StartTokenRdzvd();
    ASSERT_NE(rdzvd_, nullptr);
    const std::vector<Subprocess*> agents = StartNodes(AwaitGo());
    AwaitWorkers();
    agents[victim]->Signal(SIGKILL);
    EXPECT_EQ(agents[victim]->Wait(kLongWait), 128 + SIGKILL);
    const absl::Time start = absl::Now();
    for (int node = 0; node < kNodes; ++node) {
      if (node == victim) continue;
      Subprocess& a = *agents[node];
      const int code = a.Wait(kLongWait);
      EXPECT_NE(code, 0) << Describe(a);
      EXPECT_NE(code, Subprocess::kTimedOut) << Describe(a);
      EXPECT_TRUE(Contains(LineWith(a.Stderr(), "failed"),
                           absl::StrCat("lost contact with the agent on ", Host(victim))))
          << Describe(a);
    }
    EXPECT_LT(absl::Now() - start, kPrompt) << "the other nodes were not told promptly";
    EXPECT_TRUE(testing::NoProcessLeft(marker_));
  }

  ScopedTempDir dir_;
  std::string token_;
  std::string slurm_job_;
};

TEST_F(GroupRelayTest, EveryNodeGetsItsRankAndRdzvdHoldsAConnectionPerGroup) {
  StartTokenRdzvd();
  ASSERT_NE(rdzvd_, nullptr);
  const std::vector<Subprocess*> agents = StartNodes(AwaitGo());
  const std::vector<std::string> workers = AwaitWorkers();
  for (int node = 0; node < kNodes; ++node) {
    EXPECT_EQ(workers[node], absl::StrCat(node, " ", kNodes, " ", node)) << "node " << node;
  }
  // Nodes 0..2 through node 0's relay, 3..5 through node 3's: two connections, not six.
  EXPECT_EQ(ConnectionsTo(port_), kNodes / kFanIn);
  Go();
  for (Subprocess* a : agents) EXPECT_EQ(a->Wait(kLongWait), 0) << Describe(*a);
  EXPECT_TRUE(testing::NoProcessLeft(marker_));
}

TEST_F(GroupRelayTest, AFailureBehindARelayEndsTheJobEverywhere) {
  StartTokenRdzvd();
  ASSERT_NE(rdzvd_, nullptr);
  // Node 4 joined through node 3's relay; its worker fails once every worker runs.
  const std::vector<Subprocess*> agents = StartNodes(absl::StrCat(
      "for i in $(seq 600); do [ $(ls $d/w? | wc -l) -ge ", kNodes,
      " ] && break; sleep 0.1; done; if [ $SLURM_NODEID = 4 ]; then exit 3; fi; ", AwaitGo()));
  AwaitWorkers();
  const absl::Time start = absl::Now();
  for (Subprocess* a : agents) {
    EXPECT_EQ(a->Wait(kLongWait), 3) << Describe(*a);
    EXPECT_TRUE(
        Contains(LineWith(a->Stderr(), "failed"),
                 absl::StrCat("rank 4 (local rank 0, node 4) on ", Host(4), " exited with code 3")))
        << Describe(*a);
  }
  EXPECT_LT(absl::Now() - start, kPrompt) << "the other nodes were not told promptly";
  EXPECT_TRUE(testing::NoProcessLeft(marker_));
}

TEST_F(GroupRelayTest, ARelayThatDiesIsALostNodeAndNoOneHangs) {
  // Node 3 relays nodes 3..5: its end takes their way to rdzvd with it.
  KillAndExpectEveryOtherNodeToLoseIt(3);
}

TEST_F(GroupRelayTest, ANodeBehindARelayThatDiesIsReportedLostByTheRelay) {
  // Node 5 reached rdzvd only through node 3's relay, which tells rdzvd that it is gone.
  KillAndExpectEveryOtherNodeToLoseIt(5);
}

TEST_F(GroupRelayTest, ARelayLetsInNoOneWithoutTheJobsToken) {
  StartTokenRdzvd();
  ASSERT_NE(rdzvd_, nullptr);
  const std::vector<Subprocess*> agents = StartNodes(AwaitGo());
  AwaitWorkers();
  // A stranger with a token of its own calls node 3's relay as if it were node 4.
  const int first_port = DerivedPort(slurm_job_, "0.relay");
  bool refused = false;
  for (int port = first_port; port < first_port + kEmbeddedPortCandidates; ++port) {
    ClientOptions options;
    options.endpoint = absl::StrCat(Host(3), ":", port);
    options.auth.mode = ClientAuth::Mode::kToken;
    options.auth.token = "a-token-of-another-job-entirely";
    options.join_timeout = absl::Seconds(3);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    JoinSpec spec;
    spec.job_id = absl::StrCat("slurm-", slurm_job_, ".0");
    spec.agent = {.agent_id = "stranger", .host = Host(4), .node_index = 4, .nproc = 1};
    spec.min_agents = spec.max_agents = kNodes;
    spec.addresses = {Host(4)};
    spec.master_port = 29500;
    const absl::StatusOr<AssignmentEvent> joined = (*client)->Join(spec, Handlers{});
    EXPECT_FALSE(joined.ok()) << "port " << port;
    if (joined.status().code() == absl::StatusCode::kPermissionDenied) {
      EXPECT_TRUE(Contains(joined.status().message(), "wrong job token"));
      refused = true;  // the relay's port
      break;
    }
  }
  EXPECT_TRUE(refused) << "no candidate port of node 3's relay refused the stranger's token";
  // Nor may a stranger hold the relay's connections: one that answers no ping is closed in 2 s,
  // and one that carries no call the relay lets in, in 10 s.
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(first_port));
  inet_pton(AF_INET, Host(3).c_str(), &addr.sin_addr);
  ASSERT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  const timeval patience = {30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof(patience));
  char buf[256];
  ssize_t got;
  while ((got = recv(fd, buf, sizeof(buf), 0)) > 0) {
  }  // the server's HTTP/2 settings, then the end
  EXPECT_EQ(got, 0) << "the relay kept a stranger's silent connection for 30 s";
  close(fd);
  // The job never noticed.
  Go();
  for (Subprocess* a : agents) EXPECT_EQ(a->Wait(kLongWait), 0) << Describe(*a);
  EXPECT_TRUE(testing::NoProcessLeft(marker_));
}

}  // namespace
}  // namespace rdzv
