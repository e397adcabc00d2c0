// TLS between real processes: a throwaway CA and server certificate made with the openssl
// command line, a real rdzvd with --tls-cert/--tls-key on loopback, and real rdzv-agents with
// --tls-ca. Asserts what a user would check: the ranks the workers got and the agents' exit
// codes; for a wrong CA, or an agent without TLS, that it gives up within seconds with one line
// that says what to check; that rdzvd refuses a key other users may read; and that no process is
// left running.
#include "common/tls.h"

#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/testing/long_wait.h"
#include "tests/testing/output.h"
#include "tests/testing/process_fixture.h"
#include "tests/testing/subprocess.h"

namespace rdzv {
namespace {

using testing::Contains;
using testing::kLongWait;
using testing::LineWith;
using testing::ScopedTempDir;
using testing::Subprocess;
using testing::SubprocessOptions;

// How soon an agent refused in the TLS handshake must have given up (its join timeout is 60 s).
constexpr absl::Duration kFast = absl::Seconds(10);

// The lines of `text` that are not empty.
std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipWhitespace());
}

class TlsTest : public testing::ProcessTest {
 protected:
  // One CA, a server certificate it signed for localhost and 127.0.0.1, and a second CA that
  // signed nothing here; made once for all tests.
  static void SetUpTestSuite() {
    certs_ = new ScopedTempDir();
    const std::string d = certs_->path();
    const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string script = absl::StrCat(
        "set -e; cd ", d, "; ", "openssl req -x509 ", ec,
        " -keyout ca.key -out ca.pem -days 2 -subj /CN=rdzv-test-ca; ", "openssl req -x509 ", ec,
        " -keyout other-ca.key -out other-ca.pem -days 2 -subj /CN=rdzv-other-ca; ", "openssl req ",
        ec, " -keyout server.key -out server.csr -subj /CN=localhost; ",
        "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san.ext; ",
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial ",
        "-out server.pem -days 2 -extfile san.ext; ",
        "chmod 600 server.key; cp server.key open.key; chmod 644 open.key; ",
        "echo 'not a certificate' > garbage.pem; cp garbage.pem garbage.key; chmod 600 "
        "garbage.key; head -c 2000000 /dev/zero > big.pem");
    Subprocess openssl({.argv = {"bash", "-c", script}});
    ASSERT_EQ(openssl.Wait(kLongWait), 0) << openssl.Stderr();
  }
  static void TearDownTestSuite() {
    delete certs_;
    certs_ = nullptr;
  }
  static std::string Cert(const std::string& name) { return certs_->File(name); }

  TlsTest() { env_.emplace_back("TMPDIR", dir_.path()); }

  // rdzvd with `tls_args` on a free loopback port; returns its port once it accepts connections.
  int StartRdzvd(std::vector<std::string> tls_args) {
    tls_args.push_back("--log-level=info");
    ProcessTest::StartRdzvd(std::move(tls_args));
    return port_;
  }

  int StartTlsRdzvd() {
    return StartRdzvd({"--tls-cert", Cert("server.pem"), "--tls-key", Cert("server.key")});
  }

  // Agent `node` of a 2-agent job at `endpoint`; its one worker prints its rank.
  Subprocess& StartAgent(const std::string& endpoint, const std::string& job, int node,
                         const std::vector<std::string>& tls_args) {
    std::vector<std::string> argv = {RDZV_AGENT_BIN,
                                     "--auth",
                                     "none",
                                     "--rdzv-endpoint",
                                     endpoint,
                                     "--rdzv-id",
                                     job,
                                     "--nnodes",
                                     "2",
                                     "--node-rank",
                                     absl::StrCat(node),
                                     "--host-name",
                                     absl::StrCat("n", node),
                                     "--nproc-per-node",
                                     "1",
                                     "--join-timeout",
                                     "60"};
    argv.insert(argv.end(), tls_args.begin(), tls_args.end());
    for (const char* a : {"--", "bash", "-c", "echo \"rank=$RANK of $WORLD_SIZE\""}) {
      argv.push_back(a);
    }
    argv.push_back(marker_);
    return Start(std::move(argv));
  }

  // Two agents at `endpoint` with the right CA: ranks 0 and 1, both exit 0.
  void ExpectJobRuns(const std::string& endpoint, const std::string& job) {
    const std::vector<std::string> tls = {"--tls-ca", Cert("ca.pem")};
    Subprocess& a0 = StartAgent(endpoint, job, 0, tls);
    Subprocess& a1 = StartAgent(endpoint, job, 1, tls);
    EXPECT_EQ(a0.Wait(kLongWait), 0) << a0.Stderr();
    EXPECT_EQ(a1.Wait(kLongWait), 0) << a1.Stderr();
    EXPECT_TRUE(Contains(a0.Stdout(), "rank=0 of 2"));
    EXPECT_TRUE(Contains(a1.Stdout(), "rank=1 of 2"));
  }

  // An agent that must give up at once: non-zero, within kFast, and with exactly one line on
  // stderr that holds `needle`.
  void ExpectRefusedFast(Subprocess& agent, const std::string& needle) {
    const absl::Time start = absl::Now();
    const int code = agent.Wait(kLongWait);
    const absl::Duration took = absl::Now() - start;
    EXPECT_NE(code, 0) << agent.Stderr();
    EXPECT_LT(took, kFast) << agent.Stderr();
    std::vector<std::string> hits;
    for (const std::string& line : Lines(agent.Stderr())) {
      if (line.find(needle) != std::string::npos) hits.push_back(line);
    }
    EXPECT_EQ(hits.size(), 1u) << agent.Stderr();
  }

  static ScopedTempDir* certs_;
  ScopedTempDir dir_;
};

ScopedTempDir* TlsTest::certs_ = nullptr;

TEST_F(TlsTest, TwoAgentsJoinByHostName) {
  const int port = StartTlsRdzvd();
  ASSERT_NE(port, 0);
  ExpectJobRuns(absl::StrCat("localhost:", port), "by-name");
}

TEST_F(TlsTest, TwoAgentsJoinByAddress) {
  const int port = StartTlsRdzvd();
  ASSERT_NE(port, 0);
  ExpectJobRuns(absl::StrCat("127.0.0.1:", port), "by-address");
}

TEST_F(TlsTest, AgentWithAnotherCaIsRefusedAtOnce) {
  const int port = StartTlsRdzvd();
  ASSERT_NE(port, 0);
  const std::string endpoint = absl::StrCat("localhost:", port);
  Subprocess& agent = StartAgent(endpoint, "wrong-ca", 0, {"--tls-ca", Cert("other-ca.pem")});
  ExpectRefusedFast(agent, "TLS verification failed for the rendezvous server at " + endpoint);
  EXPECT_TRUE(Contains(LineWith(agent.Stderr(), "TLS verification failed"), "check --tls-ca"));
}

TEST_F(TlsTest, AgentWithoutTlsIsRefusedAtOnce) {
  const int port = StartTlsRdzvd();
  ASSERT_NE(port, 0);
  const std::string endpoint = absl::StrCat("127.0.0.1:", port);
  Subprocess& agent = StartAgent(endpoint, "plaintext", 0, {});
  ExpectRefusedFast(agent, "pass --tls-ca");
  EXPECT_TRUE(Contains(LineWith(agent.Stderr(), "pass --tls-ca"), endpoint));
}

TEST_F(TlsTest, AgentWithTlsAgainstPlaintextServerIsRefusedAtOnce) {
  const int port = StartRdzvd({});
  ASSERT_NE(port, 0);
  const std::string endpoint = absl::StrCat("127.0.0.1:", port);
  Subprocess& agent = StartAgent(endpoint, "tls-to-plain", 0, {"--tls-ca", Cert("ca.pem")});
  ExpectRefusedFast(agent, "TLS verification failed for the rendezvous server at " + endpoint);
}

// rdzvctl verifies rdzvd as the agents do.
TEST_F(TlsTest, RdzvctlHealthOverTls) {
  const int port = StartTlsRdzvd();
  ASSERT_NE(port, 0);
  const std::string endpoint = absl::StrCat("localhost:", port);
  Subprocess& ok =
      Start({RDZVCTL_BIN, "--rdzv-endpoint", endpoint, "--tls-ca", Cert("ca.pem"), "health"});
  EXPECT_EQ(ok.Wait(kLongWait), 0) << ok.Stderr();
  EXPECT_TRUE(Contains(ok.Stdout(), "SERVING"));
  Subprocess& wrong =
      Start({RDZVCTL_BIN, "--rdzv-endpoint", endpoint, "--tls-ca", Cert("other-ca.pem"), "health"});
  EXPECT_EQ(wrong.Wait(kLongWait), 1);
  ASSERT_EQ(Lines(wrong.Stderr()).size(), 1u) << wrong.Stderr();
  EXPECT_TRUE(Contains(wrong.Stderr(), "TLS verification failed for the rendezvous server at"));
  Subprocess& plain = Start({RDZVCTL_BIN, "--rdzv-endpoint", endpoint, "health"});
  EXPECT_EQ(plain.Wait(kLongWait), 1);
  ASSERT_EQ(Lines(plain.Stderr()).size(), 1u) << plain.Stderr();
  EXPECT_TRUE(Contains(plain.Stderr(), "pass --tls-ca"));
}

// Sets `file`'s access ACL to its owner and `user` reading, nobody else; false where the file
// system has no ACLs.
bool ShareByAcl(const std::string& file, uint32_t user) {
  std::string acl;
  const auto put = [&acl](uint32_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) acl.push_back(static_cast<char>(v >> (8 * i) & 0xff));
  };
  put(2, 4);  // version
  const uint32_t kNoId = 0xffffffff;
  for (const auto& [tag, perm, id] :
       std::vector<std::tuple<uint16_t, uint16_t, uint32_t>>{{0x01, 4, kNoId},
                                                             {0x02, 4, user},
                                                             {0x04, 0, kNoId},
                                                             {0x10, 4, kNoId},
                                                             {0x20, 0, kNoId}}) {
    put(tag, 2);
    put(perm, 2);
    put(id, 4);
  }
  return setxattr(file.c_str(), "system.posix_acl_access", acl.data(), acl.size(), 0) == 0;
}

// systemd's LoadCredential= hands rdzvd its key as a 0400 file with an ACL entry for rdzvd's user
// (stat shows 0440): accepted. The same ACL for another user is refused.
TEST_F(TlsTest, RdzvdTakesAKeySharedOnlyWithItsOwnUser) {
  const std::string own = dir_.File("own.key");
  const std::string other = dir_.File("other.key");
  for (const std::string& f : {own, other}) {
    Subprocess cp({.argv = {"install", "-m", "0400", Cert("server.key"), f}});
    ASSERT_EQ(cp.Wait(kLongWait), 0) << cp.Stderr();
  }
  if (!ShareByAcl(own, geteuid())) GTEST_SKIP() << "no ACLs on " << dir_.path();
  ASSERT_TRUE(ShareByAcl(other, geteuid() + 1));
  struct stat st;
  ASSERT_EQ(stat(own.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0440u);

  EXPECT_NE(StartRdzvd({"--tls-cert", Cert("server.pem"), "--tls-key", own}), 0);
  Subprocess& refused = Start({RDZVD_BIN, "--auth", "none", "--listen", "127.0.0.1:0", "--tls-cert",
                               Cert("server.pem"), "--tls-key", other});
  EXPECT_EQ(refused.Wait(kLongWait), 2);
  EXPECT_TRUE(Contains(refused.Stderr(), "chmod 600 " + other));
}

// rdzvd refuses to start, with exit 2 and one line naming the file and the fix.
TEST_F(TlsTest, RdzvdRefusesBadFiles) {
  struct Case {
    std::string cert, key, needle;
  };
  const std::vector<Case> cases = {
      {Cert("server.pem"), Cert("open.key"), "chmod 600 " + Cert("open.key")},
      {Cert("garbage.pem"), Cert("server.key"), "holds no PEM certificate"},
      {Cert("server.pem"), Cert("garbage.key"), "holds no PEM private key"},
      {Cert("server.pem"), Cert("missing.key"), Cert("missing.key") + " cannot be read"},
      {Cert("ca.pem"), Cert("server.key"), "is not the key of the certificate"},
      {Cert("server.pem"), "", "--tls-cert without --tls-key"},
      {Cert("big.pem"), Cert("server.key"), "is larger than 1048576 bytes"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {RDZVD_BIN,     "--auth",     "none", "--listen",
                                     "127.0.0.1:0", "--tls-cert", c.cert};
    if (!c.key.empty()) {
      argv.push_back("--tls-key");
      argv.push_back(c.key);
    }
    Subprocess& rdzvd = Start(argv);
    EXPECT_EQ(rdzvd.Wait(kLongWait), 2) << c.needle;
    const std::vector<std::string> lines = Lines(rdzvd.Stderr());
    ASSERT_EQ(lines.size(), 1u) << rdzvd.Stderr();
    EXPECT_TRUE(Contains(lines.front(), c.needle));
  }
}

// Which failed calls end a join at once. Without TLS only a closed connection is looked into (and
// nothing listens on port 1 here, so the answer is no).
TEST(TlsConnectFailureTest, TellsHandshakeFailuresFromUnreachableServers) {
  struct Case {
    absl::StatusCode code;
    std::string message;
    bool tls;
    bool gives_up;
  };
  const std::string prefix = "failed to connect to all addresses; last error: UNKNOWN: ipv4:h:1: ";
  const std::vector<Case> cases = {
      {absl::StatusCode::kUnavailable,
       prefix + "Ssl handshake failed: SSL_ERROR_SSL: error:0A000086:SSL "
                "routines::certificate verify failed",
       true, true},
      {absl::StatusCode::kUnavailable,
       prefix + "Ssl handshake failed: SSL_ERROR_SSL: error:0A00010B:SSL routines::wrong "
                "version number",
       true, true},
      {absl::StatusCode::kUnavailable, prefix + "Peer name other is not in peer certificate", true,
       true},
      {absl::StatusCode::kUnavailable, prefix + "Handshake timed out", true, false},
      {absl::StatusCode::kUnavailable,
       prefix + "Failed to connect to remote host: Connection refused", true, false},
      {absl::StatusCode::kUnavailable, prefix + "Socket closed", true, false},
      {absl::StatusCode::kDeadlineExceeded, prefix + "Ssl handshake failed", true, false},
      {absl::StatusCode::kUnavailable, prefix + "Ssl handshake failed", false, false},
      {absl::StatusCode::kUnavailable, prefix + "Socket closed", false, false},
  };
  for (const Case& c : cases) {
    const std::optional<absl::Status> failure =
        TlsConnectFailure(absl::Status(c.code, c.message), "127.0.0.1:1", c.tls);
    EXPECT_EQ(failure.has_value(), c.gives_up) << c.message << " tls=" << c.tls;
    if (failure) {
      EXPECT_EQ(failure->code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_TRUE(Contains(failure->message(), "at 127.0.0.1:1"));
      EXPECT_TRUE(Contains(failure->message(), "check --tls-ca"));
      EXPECT_EQ(failure->message().find('\n'), absl::string_view::npos);
    }
  }
}

}  // namespace
}  // namespace rdzv
