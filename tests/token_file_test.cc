// Token files that cannot be used, through each program that reads one with librdzv: rdzv-agent
// and rdzvctl refuse them before any call with one line naming the file and the fix, and exit
// code 2 (bad input); the C interface returns its error code with that line. A token holding a
// NUL, a control character or a byte past ASCII would reach gRPC's metadata, which aborts the
// whole process (the library's host, for the C interface) on such a byte.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/rdzv.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace {

using rdzv::testing::ScopedTempDir;
using rdzv::testing::Subprocess;
using ::testing::HasSubstr;
using ::testing::SizeIs;

constexpr absl::Duration kWait = absl::Seconds(30);
// Nothing listens there: a program that got past its token file would wait or fail on it.
constexpr char kNoServer[] = "127.0.0.1:1";

struct BadToken {
  std::string name;
  std::string contents;
  mode_t mode;
  std::string why;  // in the one line the user sees
};

// gtest names a case by this, not by the struct's bytes.
void PrintTo(const BadToken& bad, std::ostream* os) { *os << bad.name; }

std::vector<BadToken> BadTokens() {
  const std::string fix = "openssl rand -hex 32 >";
  return {
      {"nul", std::string("abcdefgh\0ijklmnopqrstuvwxyz\n", 28), 0600, "byte 0x00 at offset 8"},
      {"escape", "abcdefghij\x1b[2Jklmnopqrstuvwxyz\n", 0600, "byte 0x1b at offset 10"},
      {"inner_newline", "abcdefghijklmnop\nqrstuvwxyz\n", 0600, "byte 0x0a at offset 16"},
      {"past_ascii", "abcdefghijkl\x80mnopqrstuvwxyz\n", 0600, "byte 0x80 at offset 12"},
      {"utf8", "abcdefghijklmnop\xc3\xa9qrstuvwxyz\n", 0600, "byte 0xc3 at offset 16"},
      {"readable_by_others", "abcdefghijklmnopqrstuvwxyz\n", 0644, "chmod 600"},
  };
}

class TokenFileTest : public ::testing::TestWithParam<BadToken> {
 protected:
  // The case's token file, owned by this user.
  std::string Write() {
    const BadToken& bad = GetParam();
    const std::string path = dir_.File(bad.name + ".token");
    std::ofstream(path, std::ios::binary) << bad.contents;
    EXPECT_EQ(chmod(path.c_str(), bad.mode), 0);
    return path;
  }

  // What `program` wrote to stderr is one line, about `path`, saying what is wrong.
  static void ExpectOneLine(const std::string& stderr_text, const std::string& program,
                            const std::string& path) {
    std::vector<std::string> lines = absl::StrSplit(stderr_text, '\n', absl::SkipEmpty());
    ASSERT_THAT(lines, SizeIs(1)) << stderr_text;
    EXPECT_THAT(lines[0], HasSubstr(program + ": "));
    EXPECT_THAT(lines[0], HasSubstr(path));
    EXPECT_THAT(lines[0], HasSubstr(GetParam().why));
  }

  ScopedTempDir dir_;
};

TEST_P(TokenFileTest, AgentExits2) {
  const std::string path = Write();
  Subprocess agent({.argv = {RDZV_AGENT_BIN, "--rdzv-endpoint", kNoServer, "--rdzv-id", "x",
                             "--nnodes", "1", "--rdzv-token-file", path, "--", "true"},
                    .env = {{"RDZV_CONFIG", "/dev/null"}},
                    .unset_env_prefixes = {"RDZV_", "SLURM_"}});
  EXPECT_EQ(agent.Wait(kWait), 2) << agent.Stderr();
  ExpectOneLine(agent.Stderr(), "rdzv-agent", path);
}

TEST_P(TokenFileTest, RdzvctlExits2) {
  const std::string path = Write();
  for (const std::vector<std::string>& command :
       {std::vector<std::string>{"status"}, std::vector<std::string>{"--count", "1", "watch"},
        std::vector<std::string>{"abort", "x", "--reason", "test"}}) {
    std::vector<std::string> argv = {RDZVCTL_BIN, "--rdzv-endpoint",   kNoServer, "--timeout",
                                     "1",         "--rdzv-token-file", path};
    argv.insert(argv.end(), command.begin(), command.end());
    Subprocess ctl({.argv = argv,
                    .env = {{"RDZV_CONFIG", "/dev/null"}},
                    .unset_env_prefixes = {"RDZV_", "SLURM_"}});
    EXPECT_EQ(ctl.Wait(kWait), 2) << command.back() << ": " << ctl.Stderr();
    ExpectOneLine(ctl.Stderr(), "rdzvctl", path);
  }
}

TEST_P(TokenFileTest, CInterfaceReturnsTheErrorWithOneLine) {
  const std::string path = Write();
  for (int auth : {RDZV_AUTH_TOKEN, RDZV_AUTH_AUTO}) {
    rdzv_client* client = nullptr;
    const rdzv_code code = rdzv_client_create(kNoServer, 1, auth, path.c_str(), nullptr, &client);
    EXPECT_EQ(client, nullptr);
    if (client != nullptr) rdzv_client_destroy(client);
    EXPECT_EQ(code, GetParam().mode == 0600 ? RDZV_INVALID_ARGUMENT : RDZV_PERMISSION_DENIED)
        << rdzv_code_name(code) << ": " << rdzv_last_error();
    const std::string message = rdzv_last_error();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    ExpectOneLine(message, "rdzv_client_create", path);
  }
}

INSTANTIATE_TEST_SUITE_P(Tokens, TokenFileTest, ::testing::ValuesIn(BadTokens()),
                         [](const ::testing::TestParamInfo<BadToken>& info) {
                           return info.param.name;
                         });

// The check refuses only what gRPC cannot send: a token of printable ASCII, spaces inside
// included, still makes a client.
TEST(TokenFileAcceptedTest, PrintableTokenMakesAClient) {
  ScopedTempDir dir;
  const std::string path = dir.File("good.token");
  std::ofstream(path) << "  good token 0123456789 ~!@#$%^&*()_+{}|:\"<>?`-=[]\\;',./\n";
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  rdzv_client* client = nullptr;
  ASSERT_EQ(rdzv_client_create(kNoServer, 1, RDZV_AUTH_TOKEN, path.c_str(), nullptr, &client),
            RDZV_OK)
      << rdzv_last_error();
  rdzv_client_destroy(client);
}

}  // namespace
