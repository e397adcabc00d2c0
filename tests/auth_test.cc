// Authentication and job ownership against a real rdzvd, a real munged (a private one, with its
// own key and socket) and a second real user (nobody): another user's calls never reach a job,
// while the job itself runs to its end with the right ranks. Needs root (to run as nobody).
//
// The attacks: calls without a valid credential (none, replayed, made for another method or job,
// from a munged with another key, over TLS with another CA, with another job's token); another
// user's Leave, abort and squatting of a future job id; a fake server on the port an agent-hosted
// server is looked for at, and one that proves itself but ends the job with exit code 0.
#include "common/auth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/agent/core/agent_options.h"
#include "client/client.h"
#include "client/rdzv.h"
#include "tests/testing/output.h"
#include "tests/testing/rdzvd_fixture.h"
#include "tests/testing/subprocess.h"

namespace rdzv {
namespace {

using ::testing::HasSubstr;
using testing::LineWith;
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
    munged_argv_ = MungedArgv("munge");
    socket_ = dir_.File("munge.socket");
    StartMunged();
  }

  // A munged of its own, with a key of its own, listening at NAME.socket.
  std::vector<std::string> MungedArgv(const std::string& name) {
    const std::string key = dir_.File(name + ".key");
    {
      std::ifstream random("/dev/urandom", std::ios::binary);
      std::string bytes(1024, '\0');
      random.read(bytes.data(), bytes.size());
      std::ofstream(key, std::ios::binary) << bytes;
    }
    EXPECT_EQ(chmod(key.c_str(), 0600), 0);
    return {"munged",
            "--foreground",
            "--force",
            "--socket=" + dir_.File(name + ".socket"),
            "--key-file=" + key,
            "--pid-file=" + dir_.File(name + "d.pid"),
            "--log-file=" + dir_.File(name + "d.log"),
            "--seed-file=" + dir_.File(name + "d.seed")};
  }

  void StartMunged() {
    munged_.emplace(SubprocessOptions{.argv = munged_argv_});
    for (int i = 0; i < 100 && !MungeWorks(socket_); ++i) usleep(50'000);
    ASSERT_TRUE(MungeWorks(socket_)) << munged_->Stderr();
  }

  // librdzv's status call at `endpoint` under MUNGE, told that the server runs as root.
  absl::Status LibrdzvStatus(const std::string& endpoint) {
    ClientOptions options;
    options.endpoint = endpoint;
    options.auth.mode = ClientAuth::Mode::kMunge;
    options.auth.munge_socket = socket_;
    options.auth.server_uid = 0;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
    if (!client.ok()) return client.status();
    return (*client)->Status("").status();
  }

  // rdzvd on a free loopback port with `auth` ("munge" or "token") and `extra` flags.
  void StartRdzvd(const std::string& auth, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"--auth", auth, "--munge-socket", socket_};
    args.insert(args.end(), extra.begin(), extra.end());
    rdzvd_.emplace(std::move(args), SubprocessOptions{.unset_env_prefixes = {"RDZV_", "SLURM_"}},
                   kWait);
    ASSERT_TRUE(rdzvd_->started());
    endpoint_ = rdzvd_->endpoint();
  }

  // An agent of the job `job` (node `node` of 2) running as root; its worker prints its rank
  // (then runs `then`).
  SubprocessOptions Agent(const std::string& job, int node, std::vector<std::string> auth,
                          const std::string& then = "") {
    std::vector<std::string> argv = {
        RDZV_AGENT_BIN, "--rdzv-endpoint",  endpoint_,        "--rdzv-id", job, "--nnodes", "2",
        "--node-rank",  absl::StrCat(node), "--join-timeout", "30"};
    return AgentWith(std::move(argv), std::move(auth), then);
  }

  // The same as `user`, which the rendezvous keeps apart from root's job of the same id.
  SubprocessOptions AgentAs(const std::string& user, const std::string& job, int node,
                            std::vector<std::string> auth) {
    std::vector<std::string> argv = {
        "runuser",   "-u", user,       "--", RDZV_AGENT_BIN, "--rdzv-endpoint",  endpoint_,
        "--rdzv-id", job,  "--nnodes", "2",  "--node-rank",  absl::StrCat(node), "--join-timeout",
        "30"};
    SubprocessOptions o = AgentWith(std::move(argv), std::move(auth));
    o.env = {{"RDZV_CONFIG", "/dev/null"}};
    return o;
  }

  SubprocessOptions AgentWith(std::vector<std::string> argv, std::vector<std::string> auth,
                              const std::string& then = "") {
    argv.insert(argv.end(), auth.begin(), auth.end());
    for (const std::string& w : {std::string("--"), std::string("sh"), std::string("-c"),
                                 absl::StrCat("sleep 2; echo rank=$RANK of $WORLD_SIZE; ", then)}) {
      argv.push_back(w);
    }
    return {.argv = argv, .unset_env_prefixes = {"RDZV_", "SLURM_"}};
  }

  // Agent `node` of a 2-node Slurm step of job `slurm_job` (step 0), on this host (both nodes
  // are 127.0.0.1): node 0 hosts the rendezvous, node 1 looks for it on the job's candidate
  // ports. Run as `user` ("" for root); its one worker prints its rank.
  SubprocessOptions SlurmAgent(const std::string& slurm_job, int node,
                               std::vector<std::string> flags, const std::string& user = "") {
    std::vector<std::string> argv;
    if (!user.empty()) argv = {"runuser", "-u", user, "--"};
    argv.insert(argv.end(), {RDZV_AGENT_BIN, "--munge-socket", socket_, "--host-name",
                             absl::StrCat("node", node)});
    argv.insert(argv.end(), flags.begin(), flags.end());
    for (const char* w : {"--", "sh", "-c", "sleep 2; echo rank=$RANK of $WORLD_SIZE"}) {
      argv.push_back(w);
    }
    const std::string n = absl::StrCat(node);
    return {.argv = argv,
            .env = {{"RDZV_CONFIG", "/dev/null"},
                    {"SLURM_JOB_ID", slurm_job},
                    {"SLURM_STEP_ID", "0"},
                    {"SLURM_PROCID", n},
                    {"SLURM_NODEID", n},
                    {"SLURM_LOCALID", "0"},
                    {"SLURM_STEP_NUM_NODES", "2"},
                    {"SLURM_STEP_NUM_TASKS", "2"},
                    {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
                    {"SLURM_STEP_NODELIST", "127.0.0.1,127.0.0.1"}},
            .unset_env_prefixes = {"RDZV_", "SLURM_"}};
  }

  // A Slurm job id whose step 0's first candidate ports are free on loopback, and that port.
  static std::pair<std::string, int> FreeSlurmJob() {
    std::mt19937 rng(std::random_device{}());
    for (int attempt = 0; attempt < 100; ++attempt) {
      const std::string job = absl::StrCat(9'000'000 + rng() % 1'000'000);
      const int port = DerivedPort(job, "0");
      bool free = true;
      for (int p = port; p < port + 3 && free; ++p) free = PortFree(p);
      if (free) return {job, port};
    }
    ADD_FAILURE() << "no Slurm job id with free candidate ports";
    return {"0", 0};
  }

  static bool PortFree(int port) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    return ok;
  }

  // rdzvctl at this test's rdzvd as `user`.
  Subprocess Ctl(const std::string& user, std::vector<std::string> args) {
    std::vector<std::string> argv = {
        "runuser",        "-u",   user, "--", RDZVCTL_BIN, "--rdzv-endpoint", endpoint_,
        "--munge-socket", socket_};
    argv.insert(argv.end(), args.begin(), args.end());
    return Subprocess({.argv = argv,
                       .env = {{"RDZV_CONFIG", "/dev/null"}},
                       .unset_env_prefixes = {"RDZV_", "SLURM_"}});
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
  std::optional<testing::RdzvdProcess> rdzvd_;
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
  EXPECT_THAT(agent.Stderr(), HasSubstr("cannot reach munged: no MUNGE socket at "));
  EXPECT_THAT(agent.Stderr(), HasSubstr("absent.socket"));
}

// As in a container that does not mount /run/munge: an agent with neither munged's socket nor a
// token refuses at once to join a server off this host's loopback, which would refuse its every
// call, and says what to mount. The address is one no host has (TEST-NET-1): nothing is sent.
TEST_F(AuthTest, AnAgentWithoutMungeOrTokenNamesTheMountInsteadOfWaiting) {
  const absl::Time start = absl::Now();
  Subprocess agent(AgentWith({RDZV_AGENT_BIN, "--rdzv-endpoint", "192.0.2.1:29400", "--rdzv-id",
                              "nomount", "--nnodes", "2", "--node-rank", "1"},
                             {"--munge-socket", dir_.File("run/munge/munge.socket.2")}));
  EXPECT_EQ(agent.Wait(kWait), 1) << agent.Stderr();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "it waited for the join timeout";
  const std::string err = agent.Stderr();
  EXPECT_THAT(err, HasSubstr("cannot prove who this process is to the rendezvous server at "
                             "192.0.2.1:29400: no MUNGE socket at "));
  EXPECT_THAT(err, HasSubstr("--container-mounts="));
  EXPECT_THAT(err, HasSubstr("and no --rdzv-token-file"));
}

TEST_F(AuthTest, AnotherUserCannotSeeStopOrJoinAJob) {
  StartRdzvd("munge");
  const std::vector<std::string> auth = {"--munge-socket", socket_};
  Subprocess node0(Agent("victim", 0, auth));
  ASSERT_TRUE(WaitForJob("victim")) << node0.Stderr() << rdzvd_->process().Stderr();

  // Status lists only the caller's own jobs.
  Subprocess status = Probe("munge:" + socket_, "status", "");
  EXPECT_EQ(status.Wait(kWait), 0) << status.Stdout() << status.Stderr();
  EXPECT_THAT(status.Stdout(), HasSubstr("OK jobs: []"));

  // A failure report or a departure for the job reaches only the caller's own (absent) job.
  Subprocess report = Probe("munge:" + socket_, "report", "victim", "n1/agent");
  EXPECT_EQ(report.Wait(kWait), 1) << report.Stdout();
  EXPECT_THAT(report.Stdout(), HasSubstr("has no agent"));
  Subprocess leave = Probe("munge:" + socket_, "leave", "victim", "n1/agent");
  EXPECT_EQ(leave.Wait(kWait), 1) << leave.Stdout();
  EXPECT_THAT(leave.Stdout(), HasSubstr("5: job victim has no agent"));  // NOT_FOUND

  // A credential of the caller's own, but made for another method or another job.
  for (const char* action : {"crossmethod", "crossjob"}) {
    Subprocess cross = Probe("munge:" + socket_, action, "victim", "n1/agent");
    EXPECT_EQ(cross.Wait(kWait), 1) << cross.Stdout();
    EXPECT_THAT(cross.Stdout(), HasSubstr("16: the MUNGE credential was made for another call"))
        << action;
  }

  // Joining the same id makes the intruder's own job: it does not fill the victim's round.
  Subprocess join = Probe("munge:" + socket_, "join", "victim");
  EXPECT_EQ(join.Wait(kWait), 0) << join.Stdout();
  EXPECT_THAT(join.Stdout(), HasSubstr("OK assigned rank 0 of 1"));

  Subprocess node1(Agent("victim", 1, auth));
  ExpectRanks(node0, node1);
}

TEST_F(AuthTest, CallsWithoutAValidCredentialAreRefusedWhileTheJobRuns) {
  StartRdzvd("munge");
  const std::vector<std::string> auth = {"--munge-socket", socket_};
  Subprocess node0(Agent("victim", 0, auth));
  ASSERT_TRUE(WaitForJob("victim")) << node0.Stderr() << rdzvd_->process().Stderr();

  Subprocess none = Probe("none", "status", "");
  EXPECT_EQ(none.Wait(kWait), 1);
  EXPECT_THAT(none.Stdout(), HasSubstr("16: "));  // UNAUTHENTICATED
  EXPECT_THAT(none.Stdout(), HasSubstr("is munged running"));

  Subprocess replay = Probe("munge:" + socket_, "replay", "victim");
  EXPECT_EQ(replay.Wait(kWait), 1) << replay.Stdout();
  EXPECT_THAT(replay.Stdout(), HasSubstr("replayed"));

  // An agent without a credential gets one line saying what to check, and exits non-zero.
  Subprocess agent(AgentAs("nobody", "victim", 1, {"--auth", "none"}));
  EXPECT_NE(agent.Wait(kWait), 0);
  EXPECT_THAT(agent.Stderr(), HasSubstr("needs a MUNGE credential"));
  EXPECT_THAT(agent.Stdout() + agent.Stderr(), Not(HasSubstr("rank=")));

  // A munged with another key vouches for nothing here: the call and the agent are refused with
  // the line that says to check the key.
  Subprocess other_munged({.argv = MungedArgv("other")});
  const std::string other_socket = dir_.File("other.socket");
  for (int i = 0; i < 100 && !MungeWorks(other_socket); ++i) usleep(50'000);
  ASSERT_TRUE(MungeWorks(other_socket)) << other_munged.Stderr();
  Subprocess foreign = Probe("munge:" + other_socket, "report", "victim", "n1/agent");
  EXPECT_EQ(foreign.Wait(kWait), 1) << foreign.Stdout();
  EXPECT_THAT(foreign.Stdout(), HasSubstr("share one munge key"));
  Subprocess foreign_agent(AgentAs("nobody", "victim", 1, {"--munge-socket", other_socket}));
  EXPECT_NE(foreign_agent.Wait(kWait), 0);
  EXPECT_THAT(LineWith(foreign_agent.Stderr(), "invalid MUNGE credential"),
              HasSubstr("share one munge key"));

  Subprocess node1(Agent("victim", 1, auth));
  ExpectRanks(node0, node1);
}

// Another user who starts a job of the same id first makes only a job of their own: it runs
// alone, and the owner's job later fills with the owner's agents.
TEST_F(AuthTest, SquattingAFutureJobIdMakesOnlyTheSquattersOwnJob) {
  StartRdzvd("munge");
  Subprocess squatter(
      {.argv = {"runuser", "-u", "nobody", "--", RDZV_AGENT_BIN, "--rdzv-endpoint", endpoint_,
                "--rdzv-id", "future", "--nnodes", "1", "--munge-socket", socket_, "--", "sh", "-c",
                "echo squatter rank=$RANK of $WORLD_SIZE; sleep 4"},
       .env = {{"RDZV_CONFIG", "/dev/null"}},
       .unset_env_prefixes = {"RDZV_", "SLURM_"}});
  ASSERT_TRUE(squatter.WaitForOutput("squatter rank=0 of 1", kWait)) << squatter.Stderr();

  const std::vector<std::string> auth = {"--munge-socket", socket_};
  Subprocess node0(Agent("future", 0, auth));
  Subprocess node1(Agent("future", 1, auth));
  ExpectRanks(node0, node1);
  EXPECT_EQ(squatter.Wait(kWait), 0) << squatter.Stderr();
  EXPECT_THAT(squatter.Stdout(), Not(HasSubstr("of 2")));
  EXPECT_THAT(node0.Stdout() + node1.Stdout(), Not(HasSubstr("of 1")));
}

// rdzvd with TLS: a client that trusts another CA gives up at once with one line, while the
// job of clients with the right CA runs.
TEST_F(AuthTest, AClientTrustingAnotherCaIsRefusedWhileTheJobRuns) {
  Subprocess openssl(
      {.argv = {"bash", "-c",
                absl::StrCat("set -e; cd ", dir_.path(),
                             "; ec='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes';"
                             " openssl req -x509 $ec -keyout ca.key -out ca.pem -days 2"
                             " -subj /CN=rdzv-test-ca;"
                             " openssl req -x509 $ec -keyout other-ca.key -out other-ca.pem"
                             " -days 2 -subj /CN=rdzv-other-ca;"
                             " openssl req $ec -keyout tls.key -out tls.csr -subj /CN=localhost;"
                             " printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext;"
                             " openssl x509 -req -in tls.csr -CA ca.pem -CAkey ca.key"
                             " -CAcreateserial -out tls.pem -days 2 -extfile san.ext;"
                             " chmod 600 tls.key; chmod 644 ca.pem other-ca.pem")}});
  ASSERT_EQ(openssl.Wait(kWait), 0) << openssl.Stderr();
  StartRdzvd("munge", {"--tls-cert", dir_.File("tls.pem"), "--tls-key", dir_.File("tls.key")});
  const std::vector<std::string> auth = {"--munge-socket", socket_, "--tls-ca",
                                         dir_.File("ca.pem")};
  Subprocess node0(Agent("victim", 0, auth));

  Subprocess intruder(AgentAs("nobody", "victim", 1,
                              {"--munge-socket", socket_, "--tls-ca", dir_.File("other-ca.pem")}));
  EXPECT_NE(intruder.Wait(kWait), 0);
  EXPECT_THAT(LineWith(intruder.Stderr(), "TLS verification failed"), HasSubstr("--tls-ca"));
  EXPECT_THAT(intruder.Stdout(), Not(HasSubstr("rank=")));

  Subprocess node1(Agent("victim", 1, auth));
  ExpectRanks(node0, node1);
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

// A server hosted by an agent of another job (or a wrong token's holder) on the job's port: it
// refuses the wrong token with one line, and the job's own agents run.
TEST_F(AuthTest, AWrongTokenIsRefusedByTheAgentHostedServer) {
  const auto [slurm_job, port] = FreeSlurmJob();
  const std::string mine = TokenFile("job.token", "victim-token-0123456789abcdef", 0);
  Subprocess node0(SlurmAgent(slurm_job, 0, {"--rdzv-token-file", mine}));
  ASSERT_TRUE(testing::WaitForLoopbackPort(port, kWait)) << node0.Stderr();

  const std::string theirs = TokenFile("other.token", "intruder-token-0123456789abc", 65534);
  Subprocess join(
      {.argv = {"runuser", "-u", "nobody", "--", AUTH_PROBE_BIN, absl::StrCat("127.0.0.1:", port),
                "token:" + theirs, "join", absl::StrCat("slurm-", slurm_job, ".0")}});
  EXPECT_EQ(join.Wait(kWait), 1) << join.Stdout();
  EXPECT_THAT(join.Stdout(), HasSubstr("7: wrong job token"));  // PERMISSION_DENIED

  // An agent with the wrong token finds no server of its job, and says why.
  Subprocess intruder(
      SlurmAgent(slurm_job, 1, {"--rdzv-token-file", theirs, "--join-timeout", "3"}, "nobody"));
  EXPECT_EQ(intruder.Wait(kWait), 1) << intruder.Stderr();
  EXPECT_THAT(LineWith(intruder.Stderr(), "Another user's process"), HasSubstr("wrong job token"));

  Subprocess node1(SlurmAgent(slurm_job, 1, {"--rdzv-token-file", mine}));
  ExpectRanks(node0, node1);
}

// Another user's fake server on the port where an agent looks for its job's server first: the
// agent does not believe it (its MUNGE proof comes from another uid) and goes on to the real
// one; alone with the fake, it gives up after its join timeout with one line.
TEST_F(AuthTest, AFakeServerOnTheJobsPortIsSkipped) {
  const auto [slurm_job, port] = FreeSlurmJob();
  const std::string job = absl::StrCat("slurm-", slurm_job, ".0");
  const std::string fake_at = absl::StrCat("127.0.0.1:", port);
  Subprocess fake({.argv = {"runuser", "-u", "nobody", "--", AUTH_PROBE_BIN, fake_at,
                            "munge:" + socket_, "serve", job}});
  ASSERT_TRUE(fake.WaitForOutput("serving", kWait)) << fake.Stdout() << fake.Stderr();

  Subprocess lone(SlurmAgent(slurm_job, 1, {"--join-timeout", "3"}));
  EXPECT_EQ(lone.Wait(kWait), 1) << lone.Stderr();
  const std::string line = LineWith(lone.Stderr(), "Another user's process");
  EXPECT_THAT(line, HasSubstr(absl::StrCat("the server at ", fake_at, " did not prove")));
  EXPECT_THAT(line, HasSubstr("runs as uid 65534"));
  EXPECT_THAT(lone.Stdout(), Not(HasSubstr("rank=")));

  // Node 0 finds the port taken and hosts the job's server on the next one.
  Subprocess node0(SlurmAgent(slurm_job, 0, {}));
  Subprocess node1(SlurmAgent(slurm_job, 1, {}));
  ExpectRanks(node0, node1);
  // Said once, however often the candidates were gone through.
  const std::vector<std::string> said = absl::StrSplit(node1.Stderr(), "did not prove");
  EXPECT_EQ(said.size(), 2u) << node1.Stderr();
}

// rdzvctl and librdzv (C++ and C) told which uid rdzvd runs as refuse another user's server on
// rdzvd's port, whose answer carries a MUNGE proof of that other uid.
TEST_F(AuthTest, RdzvctlAndLibrdzvRefuseAServerOfAnotherUid) {
  const int port = testing::FreeLoopbackPort();
  endpoint_ = absl::StrCat("127.0.0.1:", port);
  Subprocess fake({.argv = {"runuser", "-u", "nobody", "--", AUTH_PROBE_BIN, endpoint_,
                            "munge:" + socket_, "serve", "planted"}});
  ASSERT_TRUE(fake.WaitForOutput("serving", kWait)) << fake.Stdout() << fake.Stderr();

  Subprocess ctl({.argv = {RDZVCTL_BIN, "--rdzv-endpoint", endpoint_, "--munge-socket", socket_,
                           "--server-uid", "0", "status"},
                  .env = {{"RDZV_CONFIG", "/dev/null"}},
                  .unset_env_prefixes = {"RDZV_", "SLURM_"}});
  EXPECT_EQ(ctl.Wait(kWait), 1);
  EXPECT_THAT(ctl.Stderr(), HasSubstr("did not prove that it is rdzvd: it runs as uid 65534"));
  EXPECT_THAT(ctl.Stdout(), Not(HasSubstr("planted")));

  const absl::Status listed = LibrdzvStatus(endpoint_);
  EXPECT_EQ(listed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(listed.message(), HasSubstr("uid 65534"));

  setenv("RDZV_SERVER_UID", "0", 1);
  rdzv_client* c = nullptr;
  const rdzv_code created =
      rdzv_client_create(endpoint_.c_str(), 10, RDZV_AUTH_MUNGE, nullptr, socket_.c_str(), &c);
  unsetenv("RDZV_SERVER_UID");
  ASSERT_EQ(created, RDZV_OK) << rdzv_last_error();
  rdzv_job_status status;
  EXPECT_EQ(rdzv_status(c, "planted", &status), RDZV_FAILED_PRECONDITION);
  EXPECT_THAT(rdzv_last_error(), HasSubstr("uid 65534"));
  rdzv_client_destroy(c);
}

// A primary rdzvd and its backup under MUNGE (both root here): the agents, told --server-uid 0,
// move to the backup when the primary is killed and their job runs to its end there. The question
// the servers ask each other is answered with a proof to root, and to another user not at all.
TEST_F(AuthTest, APrimaryAndItsBackupProveThemselvesToTheAgentsAndToEachOther) {
  const int primary_port = testing::FreeLoopbackPort();
  const std::string primary = absl::StrCat("127.0.0.1:", primary_port);
  StartRdzvd("munge", {"--peers", primary});
  const std::string backup = endpoint_;
  Subprocess first({.argv = {RDZVD_BIN, "--auth", "munge", "--munge-socket", socket_, "--listen",
                             primary, "--peers", backup},
                    .unset_env_prefixes = {"RDZV_", "SLURM_"}});
  ASSERT_TRUE(testing::WaitForLoopbackPort(primary_port, kWait)) << first.Stderr();
  endpoint_ = absl::StrCat(primary, ",", backup);
  const std::vector<std::string> auth = {"--munge-socket",     socket_, "--server-uid", "0",
                                         "--failover-timeout", "1s"};
  Subprocess node0(Agent("ha", 0, auth, "sleep 8"));
  Subprocess node1(Agent("ha", 1, auth, "sleep 8"));
  ASSERT_TRUE(node0.WaitForOutput("ranks 0-0 of 2", kWait)) << node0.Stderr();
  ASSERT_TRUE(node1.WaitForOutput("ranks 1-1 of 2", kWait)) << node1.Stderr();

  first.Kill();
  for (Subprocess* node : {&node0, &node1}) {
    EXPECT_TRUE(node->WaitForOutput(
        absl::StrCat("back in touch with the rendezvous server at ", backup), kWait))
        << node->Stderr();
  }
  EXPECT_THAT(rdzvd_->process().Stderr(), HasSubstr("job ha: taken up from its resuming agents"));

  // The servers' own question: root (the servers' uid) gets the answer and its proof.
  Subprocess asked({.argv = {AUTH_PROBE_BIN, backup, "munge:" + socket_, "holds", "ha"}});
  EXPECT_EQ(asked.Wait(kWait), 0) << asked.Stdout();
  EXPECT_THAT(asked.Stdout(), HasSubstr("proof by uid 0"));
  EXPECT_THAT(asked.Stdout(), HasSubstr("OK holds=1 proven=1"));
  // Another user is told nothing.
  Subprocess prying({.argv = {"runuser", "-u", "nobody", "--", AUTH_PROBE_BIN, backup,
                              "munge:" + socket_, "holds", "ha"}});
  EXPECT_EQ(prying.Wait(kWait), 1) << prying.Stdout();
  EXPECT_THAT(prying.Stdout(), HasSubstr("7: HoldsJob is for the other rdzvds of a server list"));

  ExpectRanks(node0, node1);
}

// rdzvd sends the credential vouching for its key to any caller it authenticated; another user
// who copied it and serves it from a fake server still cannot sign with rdzvd's key. rdzvctl and
// librdzv told rdzvd's uid believe the real rdzvd and refuse the fake, naming the signature.
TEST_F(AuthTest, AFakeServerSendingTheRealServersKeyCredentialIsRefused) {
  StartRdzvd("munge");
  const std::string real = endpoint_;
  const auto ctl_status = [&](const std::string& at) {
    return Subprocess({.argv = {RDZVCTL_BIN, "--rdzv-endpoint", at, "--munge-socket", socket_,
                                "--server-uid", "0", "status"},
                       .env = {{"RDZV_CONFIG", "/dev/null"}},
                       .unset_env_prefixes = {"RDZV_", "SLURM_"}});
  };
  Subprocess honest = ctl_status(real);
  EXPECT_EQ(honest.Wait(kWait), 0) << honest.Stderr();

  const std::string fake_at = absl::StrCat("127.0.0.1:", testing::FreeLoopbackPort());
  Subprocess fake({.argv = {"runuser", "-u", "nobody", "--", AUTH_PROBE_BIN, fake_at,
                            "munge:" + socket_, "serve-copied-key", "planted", real}});
  ASSERT_TRUE(fake.WaitForOutput("serving", kWait)) << fake.Stdout() << fake.Stderr();

  Subprocess ctl = ctl_status(fake_at);
  EXPECT_EQ(ctl.Wait(kWait), 1);
  EXPECT_THAT(ctl.Stderr(), HasSubstr("did not prove that it is rdzvd: its proof is not signed by "
                                      "the key uid 0 vouched for"));
  EXPECT_THAT(ctl.Stdout(), Not(HasSubstr("planted")));

  const absl::Status listed = LibrdzvStatus(fake_at);
  EXPECT_EQ(listed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(listed.message(), HasSubstr("not signed by the key uid 0 vouched for"));

  // librdzv pointed at the real rdzvd believes it: the credential itself was sound.
  EXPECT_TRUE(LibrdzvStatus(real).ok());
}

// A key credential is shown to many clients of one host, so its replay is accepted where a
// call's credential is refused; both still say who made them, and for how long they hold.
TEST_F(AuthTest, AKeyCredentialMayBeDecodedTwiceACallsCredentialMayNot) {
  absl::StatusOr<std::string> cred =
      MungeEncodeFor("rdzv.v1 test", socket_, absl::Minutes(5), absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(cred.ok()) << cred.status();
  absl::StatusOr<MungeIdentity> first = MungeDecode(*cred, socket_);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->uid, geteuid());
  EXPECT_EQ(first->payload, "rdzv.v1 test");
  EXPECT_EQ(first->ttl, absl::Minutes(5));
  EXPECT_LE(absl::AbsDuration(first->encoded_at - absl::Now()), absl::Seconds(5));

  absl::StatusOr<MungeIdentity> again = MungeDecode(*cred, socket_);
  ASSERT_FALSE(again.ok());
  EXPECT_THAT(again.status().message(), HasSubstr("replayed"));

  absl::StatusOr<MungeIdentity> shared =
      MungeDecodeShared(*cred, socket_, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_EQ(shared->uid, geteuid());
  EXPECT_EQ(shared->payload, "rdzv.v1 test");

  // Anything else munged refuses stays refused.
  std::string forged = *cred;
  forged[forged.size() / 2] = forged[forged.size() / 2] == 'A' ? 'B' : 'A';
  EXPECT_FALSE(MungeDecodeShared(forged, socket_, absl::Now() + absl::Seconds(10)).ok());
}

// A server that proves itself (here: a process of the job's own user) but ends the job with exit
// code 0, or 256 (which a process would show as 0): every agent still exits non-zero.
TEST_F(AuthTest, AnAbortSayingExitCodeZeroStillEndsTheAgentNonZero) {
  for (const char* code : {"0", "256"}) {
    const int port = testing::FreeLoopbackPort();
    Subprocess fake({.argv = {AUTH_PROBE_BIN, absl::StrCat("127.0.0.1:", port), "munge:" + socket_,
                              "serve", "ends", code}});
    ASSERT_TRUE(fake.WaitForOutput("serving", kWait)) << fake.Stdout() << fake.Stderr();
    Subprocess agent({.argv = {RDZV_AGENT_BIN, "--rdzv-endpoint", absl::StrCat("127.0.0.1:", port),
                               "--rdzv-id", "ends", "--nnodes", "1", "--munge-socket", socket_,
                               "--", "sh", "-c", "echo started; sleep 30"},
                      .unset_env_prefixes = {"RDZV_", "SLURM_"}});
    EXPECT_EQ(agent.Wait(kWait), 1) << code << ": " << agent.Stderr();
    EXPECT_THAT(agent.Stdout(), HasSubstr("started"));
    EXPECT_THAT(agent.Stderr(), HasSubstr("the fake server ended the job"));
  }
}

// --admin-group: its members see and may abort every user's job; others see only their own, and
// another user's abort is refused as if the job did not exist, which then runs to its end.
TEST_F(AuthTest, OnlyAdminGroupMembersSeeAndAbortOtherUsersJobs) {
  StartRdzvd("munge", {"--admin-group", "nogroup"});  // nobody's group; daemon is not in it
  const std::vector<std::string> auth = {"--munge-socket", socket_};
  Subprocess node0(Agent("kept", 0, auth));
  ASSERT_TRUE(WaitForJob("kept")) << node0.Stderr();

  Subprocess status = Ctl("daemon", {"--json", "status"});
  EXPECT_EQ(status.Wait(kWait), 0) << status.Stderr();
  EXPECT_THAT(status.Stdout(), Not(HasSubstr("kept")));
  Subprocess abort = Ctl("daemon", {"abort", "kept", "--reason", "mine now"});
  EXPECT_EQ(abort.Wait(kWait), 1);
  EXPECT_THAT(abort.Stderr(), HasSubstr("rdzvd has no job kept"));
  Subprocess node1(Agent("kept", 1, auth));
  ExpectRanks(node0, node1);

  Subprocess long0(Agent("stopped", 0, auth, "sleep 60"));
  Subprocess long1(Agent("stopped", 1, auth, "sleep 60"));
  ASSERT_TRUE(long0.WaitForOutput("rank=", kWait)) << long0.Stderr();
  Subprocess admin_status = Ctl("nobody", {"--json", "status"});
  EXPECT_EQ(admin_status.Wait(kWait), 0) << admin_status.Stderr();
  EXPECT_THAT(admin_status.Stdout(), HasSubstr("stopped"));
  Subprocess admin_abort = Ctl("nobody", {"abort", "stopped", "--reason", "node maintenance"});
  EXPECT_EQ(admin_abort.Wait(kWait), 0) << admin_abort.Stderr();
  for (Subprocess* agent : {&long0, &long1}) {
    EXPECT_NE(agent->Wait(kWait), 0);
    EXPECT_THAT(agent->Stderr(), HasSubstr("node maintenance"));
  }
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
