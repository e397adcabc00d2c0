// rdzvd's command line: defaults, each flag and its variable, values out of range, the checks
// across flags, and the help text.
#include "server/server_flags.h"

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "guard/authenticator.h"

namespace rdzv {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<ServerFlags> Parse(std::vector<std::string> args, EnvList env = {}) {
  return ParseServerFlags(args, EnvFromList(std::move(env)));
}

TEST(ServerFlagsTest, Defaults) {
  absl::StatusOr<ServerFlags> f = Parse({});
  ASSERT_TRUE(f.ok()) << f.status();
  const ServerOptions& o = f->options;
  EXPECT_EQ(o.listen, "0.0.0.0:29400");
  EXPECT_EQ(o.service.auth.mode, AuthMode::kMunge);
  EXPECT_EQ(o.service.auth.munge_socket, "");
  EXPECT_TRUE(o.service.auth.admin_gids.empty());
  EXPECT_EQ(o.metrics_listen, "");
  EXPECT_EQ(o.service.state.progress_interval, 3'000'000);
  EXPECT_EQ(o.keepalive, absl::Seconds(1));
  EXPECT_EQ(o.keepalive_timeout, absl::Seconds(1));
  EXPECT_EQ(o.ping_interval, absl::Seconds(30));
  EXPECT_EQ(o.service.max_jobs_per_user, 1000);
  EXPECT_EQ(o.service.max_agents_per_user, 100'000);
  EXPECT_EQ(o.memory_limit_bytes, size_t{4096} << 20);
  // Zero: the server derives the shares from memory_limit_bytes when it starts.
  EXPECT_EQ(o.service.max_memory_bytes, 0);
  EXPECT_EQ(o.service.max_memory_per_user_bytes, 0);
  EXPECT_EQ(o.service.max_queued_bytes_per_stream, int64_t{1} << 20);
  EXPECT_EQ(o.unused_connection_timeout, absl::Seconds(60));
  EXPECT_EQ(o.max_connections_per_host, 512);
  EXPECT_EQ(o.max_unproven_connections_per_host, 128);
  EXPECT_EQ(o.stream_window_bytes, 16 << 10);
  EXPECT_TRUE(o.tls.cert_chain_pem.empty());
  EXPECT_EQ(f->log_level, "info");
  EXPECT_EQ(f->admin_groups, "");
  EXPECT_EQ(f->tls_cert, "");
  EXPECT_EQ(f->tls_key, "");
  EXPECT_FALSE(f->help);
}

// One flag, given on the command line and then through its variable, and what it must set.
struct FlagCase {
  std::string name;
  std::string flag;
  std::string variable;
  std::string value;
  std::function<void(const ServerFlags&)> check;
};

class ServerFlagTest : public testing::TestWithParam<FlagCase> {};

TEST_P(ServerFlagTest, SetByFlagAndByVariable) {
  const FlagCase& c = GetParam();
  absl::StatusOr<ServerFlags> f = Parse({"--" + c.flag, c.value});
  ASSERT_TRUE(f.ok()) << f.status();
  c.check(*f);
  f = Parse({}, {{c.variable, c.value}});
  ASSERT_TRUE(f.ok()) << f.status();
  c.check(*f);
  // The command line wins over the variable, which is then not even read.
  f = Parse({"--" + c.flag + "=" + c.value}, {{c.variable, "\x01not a value"}});
  ASSERT_TRUE(f.ok()) << f.status();
  c.check(*f);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ServerFlagTest,
    testing::Values(
        FlagCase{
            "Auth", "auth", "RDZV_AUTH", "token",
            [](const ServerFlags& f) { EXPECT_EQ(f.options.service.auth.mode, AuthMode::kToken); }},
        FlagCase{"MungeSocket", "munge-socket", "RDZV_MUNGE_SOCKET", "/tmp/m.sock",
                 [](const ServerFlags& f) {
                   EXPECT_EQ(f.options.service.auth.munge_socket, "/tmp/m.sock");
                 }},
        FlagCase{"AdminGroup", "admin-group", "RDZV_ADMIN_GROUP", "wheel,1001",
                 [](const ServerFlags& f) { EXPECT_EQ(f.admin_groups, "wheel,1001"); }},
        FlagCase{"Listen", "listen", "RDZV_LISTEN", "10.0.0.1:1234",
                 [](const ServerFlags& f) { EXPECT_EQ(f.options.listen, "10.0.0.1:1234"); }},
        FlagCase{"MetricsListen", "metrics-listen", "RDZV_METRICS_LISTEN", "0.0.0.0:9400",
                 [](const ServerFlags& f) { EXPECT_EQ(f.options.metrics_listen, "0.0.0.0:9400"); }},
        FlagCase{"LogLevel", "log-level", "RDZV_LOG_LEVEL", "debug",
                 [](const ServerFlags& f) { EXPECT_EQ(f.log_level, "debug"); }},
        FlagCase{"ProgressInterval", "progress-interval-ms", "RDZV_PROGRESS_INTERVAL_MS", "250",
                 [](const ServerFlags& f) {
                   EXPECT_EQ(f.options.service.state.progress_interval, 250'000);
                 }},
        FlagCase{
            "Keepalive", "keepalive-ms", "RDZV_KEEPALIVE_MS", "0",
            [](const ServerFlags& f) { EXPECT_EQ(f.options.keepalive, absl::ZeroDuration()); }},
        FlagCase{"KeepaliveTimeout", "keepalive-timeout-ms", "RDZV_KEEPALIVE_TIMEOUT_MS", "20000",
                 [](const ServerFlags& f) {
                   EXPECT_EQ(f.options.keepalive_timeout, absl::Seconds(20));
                 }},
        FlagCase{"PingInterval", "ping-ms", "RDZV_PING_MS", "2500",
                 [](const ServerFlags& f) {
                   EXPECT_EQ(f.options.ping_interval, absl::Milliseconds(2500));
                 }},
        FlagCase{"MaxJobsPerUser", "max-jobs-per-user", "RDZV_MAX_JOBS_PER_USER", "7",
                 [](const ServerFlags& f) { EXPECT_EQ(f.options.service.max_jobs_per_user, 7); }},
        FlagCase{"MaxAgentsPerUser", "max-agents-per-user", "RDZV_MAX_AGENTS_PER_USER", "10000000",
                 [](const ServerFlags& f) {
                   EXPECT_EQ(f.options.service.max_agents_per_user, 10'000'000);
                 }},
        FlagCase{"MemoryLimit", "memory-limit-mb", "RDZV_MEMORY_LIMIT_MB", "64",
                 [](const ServerFlags& f) {
                   EXPECT_EQ(f.options.memory_limit_bytes, size_t{64} << 20);
                 }},
        FlagCase{"MaxMemory", "max-memory-mb", "RDZV_MAX_MEMORY_MB", "512",
                 [](const ServerFlags& f) {
                   EXPECT_EQ(f.options.service.max_memory_bytes, int64_t{512} << 20);
                 }},
        FlagCase{"MaxMemoryPerUser", "max-memory-per-user-mb", "RDZV_MAX_MEMORY_PER_USER_MB", "100",
                 [](const ServerFlags& f) {
                   EXPECT_EQ(f.options.service.max_memory_per_user_bytes, int64_t{100} << 20);
                 }},
        FlagCase{"MaxQueued", "max-queued-kb", "RDZV_MAX_QUEUED_KB", "64",
                 [](const ServerFlags& f) {
                   EXPECT_EQ(f.options.service.max_queued_bytes_per_stream, int64_t{64} << 10);
                 }},
        FlagCase{"UnusedConnectionTimeout", "unused-connection-timeout-ms",
                 "RDZV_UNUSED_CONNECTION_TIMEOUT_MS", "30000",
                 [](const ServerFlags& f) {
                   EXPECT_EQ(f.options.unused_connection_timeout, absl::Seconds(30));
                 }},
        FlagCase{"MaxConnectionsPerHost", "max-connections-per-host",
                 "RDZV_MAX_CONNECTIONS_PER_HOST", "64",
                 [](const ServerFlags& f) { EXPECT_EQ(f.options.max_connections_per_host, 64); }},
        FlagCase{"MaxUnprovenConnectionsPerHost", "max-unproven-connections-per-host",
                 "RDZV_MAX_UNPROVEN_CONNECTIONS_PER_HOST", "32",
                 [](const ServerFlags& f) {
                   EXPECT_EQ(f.options.max_unproven_connections_per_host, 32);
                 }},
        FlagCase{"StreamWindow", "stream-window-kb", "RDZV_STREAM_WINDOW_KB", "8",
                 [](const ServerFlags& f) { EXPECT_EQ(f.options.stream_window_bytes, 8 << 10); }}),
    [](const testing::TestParamInfo<FlagCase>& info) { return info.param.name; });

TEST(ServerFlagsTest, TlsCertAndKeyTogether) {
  absl::StatusOr<ServerFlags> f = Parse({"--tls-cert", "c.pem", "--tls-key", "k.pem"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->tls_cert, "c.pem");
  EXPECT_EQ(f->tls_key, "k.pem");
  f = Parse({}, {{"RDZV_TLS_CERT", "c.pem"}, {"RDZV_TLS_KEY", "k.pem"}});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->tls_cert, "c.pem");
  EXPECT_EQ(f->tls_key, "k.pem");
}

TEST(ServerFlagsTest, PeersAreTheOtherServersOfTheList) {
  absl::StatusOr<ServerFlags> f = Parse({"--peers", "head2:29400, head3"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->options.service.peers, (std::vector<std::string>{"head2:29400", "head3:29400"}));
  f = Parse({}, {{"RDZV_PEERS", "head:29400"}, {"RDZV_PEER_TLS_CA", "/etc/rdzv/ca.pem"}});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->options.service.peers, std::vector<std::string>{"head:29400"});
  EXPECT_EQ(f->peer_tls_ca, "/etc/rdzv/ca.pem");
  EXPECT_TRUE(Parse({})->options.service.peers.empty());

  // A list names at most 8 servers, this one among them.
  f = Parse({"--peers", "a,b,c,d,e,f,g,h"});
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(absl::StrContains(f.status().message(), "at most 8")) << f.status();

  f = Parse({"--peers", "head2:notaport"});
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(absl::StrContains(f.status().message(), "--peers")) << f.status();
  // Peers prove themselves to each other with MUNGE; a token is each job's own.
  f = Parse({"--auth", "token", "--peers", "head2:29400"});
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(absl::StrContains(f.status().message(), "--peers needs --auth munge")) << f.status();
}

TEST(ServerFlagsTest, AuthNoneOnLoopback) {
  for (const char* listen : {"127.0.0.1:0", "[::1]:29400", "localhost:29400"}) {
    absl::StatusOr<ServerFlags> f = Parse({"--auth", "none", "--listen", listen});
    ASSERT_TRUE(f.ok()) << listen << ": " << f.status();
    EXPECT_EQ(f->options.service.auth.mode, AuthMode::kNone);
  }
}

TEST(ServerFlagsTest, HugeProgressIntervalSaturates) {
  absl::StatusOr<ServerFlags> f = Parse({"--progress-interval-ms", "9223372036854775807"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->options.service.state.progress_interval, INT64_MAX);
}

struct ErrorCase {
  std::string name;
  std::vector<std::string> args;
  EnvList env;
  std::string message;  // all of it, as rdzvd prints it after "rdzvd: "
};

class ServerFlagsErrorTest : public testing::TestWithParam<ErrorCase> {};

TEST_P(ServerFlagsErrorTest, NamesTheFix) {
  const ErrorCase& c = GetParam();
  absl::StatusOr<ServerFlags> f = Parse(c.args, c.env);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.status().message(), c.message);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ServerFlagsErrorTest,
    testing::Values(
        ErrorCase{"UnknownFlag", {"--port=1"}, {}, "unknown flag --port=1; see rdzvd --help"},
        ErrorCase{"MissingValue", {"--listen"}, {}, "--listen needs a value (HOST:PORT)"},
        ErrorCase{"UnexpectedArgument",
                  {"--listen", "127.0.0.1:1", "extra"},
                  {},
                  "unexpected argument \"extra\"; see rdzvd --help"},
        ErrorCase{"UnknownAuth",
                  {"--auth", "kerberos"},
                  {},
                  "--auth=\"kerberos\": --auth must be munge, token or none, not 'kerberos'"},
        ErrorCase{"NegativeMillis",
                  {"--keepalive-ms=-1"},
                  {},
                  "--keepalive-ms=\"-1\": expected milliseconds, a whole number >= 0"},
        ErrorCase{"MillisNotANumber",
                  {},
                  {{"RDZV_PROGRESS_INTERVAL_MS", "3s"}},
                  "RDZV_PROGRESS_INTERVAL_MS=\"3s\": expected milliseconds, a whole number >= 0"},
        ErrorCase{"MaxJobsZero",
                  {"--max-jobs-per-user", "0"},
                  {},
                  "--max-jobs-per-user=\"0\": expected a whole number from 1 to 1000000"},
        ErrorCase{"MaxJobsOverTheLimit",
                  {},
                  {{"RDZV_MAX_JOBS_PER_USER", "1000001"}},
                  "RDZV_MAX_JOBS_PER_USER=\"1000001\": expected a whole number from 1 to 1000000"},
        ErrorCase{"MaxAgentsOverTheLimit",
                  {"--max-agents-per-user=10000001"},
                  {},
                  "--max-agents-per-user=\"10000001\": expected a whole number from 1 to 10000000"},
        ErrorCase{"MemoryUnderTheLimit",
                  {"--memory-limit-mb", "63"},
                  {},
                  "--memory-limit-mb=\"63\": expected a whole number from 64 to 16777216"},
        ErrorCase{"MemoryOverflowingInt64",
                  {"--memory-limit-mb", "99999999999999999999"},
                  {},
                  "--memory-limit-mb=\"99999999999999999999\": expected a whole number from 64 "
                  "to 16777216"},
        ErrorCase{"StreamWindowTooLarge",
                  {"--stream-window-kb", "4096"},
                  {},
                  "--stream-window-kb=\"4096\": expected a whole number from 1 to 1024"},
        ErrorCase{"NegativeConnectionsPerHost",
                  {"--max-connections-per-host=-1"},
                  {},
                  "--max-connections-per-host=\"-1\": expected a whole number from 0 to 1000000"},
        ErrorCase{"KeepaliveTimeoutZero",
                  {"--keepalive-timeout-ms", "0"},
                  {},
                  "--keepalive-timeout-ms is 0; give probes and pings at least 1 ms to be "
                  "answered"},
        ErrorCase{"KeepaliveTimeoutZeroWithPingsOnly",
                  {"--keepalive-ms", "0", "--keepalive-timeout-ms", "0"},
                  {},
                  "--keepalive-timeout-ms is 0; give probes and pings at least 1 ms to be "
                  "answered"},
        ErrorCase{"AuthNoneOnAllAddresses",
                  {"--auth", "none"},
                  {},
                  "--auth none lets anyone who can reach 0.0.0.0:29400 stop or redirect any job; "
                  "it is allowed only on a loopback address (--listen 127.0.0.1:PORT). Use "
                  "--auth munge or token"},
        ErrorCase{"AuthNoneFromVariablesOnAName",
                  {},
                  {{"RDZV_AUTH", "none"}, {"RDZV_LISTEN", "127.example.org:1"}},
                  "--auth none lets anyone who can reach 127.example.org:1 stop or redirect any "
                  "job; it is allowed only on a loopback address (--listen 127.0.0.1:PORT). Use "
                  "--auth munge or token"},
        ErrorCase{"TlsCertWithoutKey",
                  {"--tls-cert", "c.pem"},
                  {},
                  "--tls-cert without --tls-key; give both --tls-cert and --tls-key, or neither"},
        ErrorCase{"TlsKeyWithoutCert",
                  {},
                  {{"RDZV_TLS_KEY", "k.pem"}},
                  "--tls-key without --tls-cert; give both --tls-cert and --tls-key, or neither"}),
    [](const testing::TestParamInfo<ErrorCase>& info) { return info.param.name; });

TEST(ServerFlagsTest, KeepaliveTimeoutZeroIsFineWithoutProbesOrPings) {
  absl::StatusOr<ServerFlags> f =
      Parse({"--keepalive-ms", "0", "--ping-ms", "0", "--keepalive-timeout-ms", "0"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->options.keepalive, absl::ZeroDuration());
  EXPECT_EQ(f->options.ping_interval, absl::ZeroDuration());
}

TEST(ServerFlagsTest, HelpWinsOverEverythingElse) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--help"}, {"--auth", "none", "--help", "extra"}, {"--tls-cert", "c", "--help"}}) {
    absl::StatusOr<ServerFlags> f = Parse(args);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_TRUE(f->help);
  }
  // A bad value is still refused: the help would not say what was wrong with it.
  EXPECT_FALSE(Parse({"--help", "--max-jobs-per-user", "0"}).ok());
}

TEST(ServerFlagsTest, VersionNeedsNothingElse) {
  absl::StatusOr<ServerFlags> f = Parse({"--version", "extra"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->version);
  EXPECT_FALSE(Parse({}).value().version);
}

TEST(ServerFlagsTest, HelpListsEveryFlagWithItsVariable) {
  const std::string help = ServerHelp();
  EXPECT_TRUE(absl::StartsWith(help, "rdzvd: rendezvous server for rdzv-agent;")) << help;
  for (const char* entry :
       {"--auth MODE  [RDZV_AUTH]", "--munge-socket PATH  [RDZV_MUNGE_SOCKET]",
        "--admin-group GROUP,...  [RDZV_ADMIN_GROUP]", "--listen HOST:PORT  [RDZV_LISTEN]",
        "--tls-cert FILE  [RDZV_TLS_CERT]", "--tls-key FILE  [RDZV_TLS_KEY]",
        "--metrics-listen HOST:PORT  [RDZV_METRICS_LISTEN]", "--log-level LEVEL  [RDZV_LOG_LEVEL]",
        "--progress-interval-ms MS  [RDZV_PROGRESS_INTERVAL_MS]",
        "--keepalive-ms MS  [RDZV_KEEPALIVE_MS]",
        "--keepalive-timeout-ms MS  [RDZV_KEEPALIVE_TIMEOUT_MS]", "--ping-ms MS  [RDZV_PING_MS]",
        "--max-jobs-per-user N  [RDZV_MAX_JOBS_PER_USER]",
        "--max-agents-per-user N  [RDZV_MAX_AGENTS_PER_USER]",
        "--memory-limit-mb MB  [RDZV_MEMORY_LIMIT_MB]",
        "--max-memory-per-user-mb MB  [RDZV_MAX_MEMORY_PER_USER_MB]",
        "--stream-window-kb KB  [RDZV_STREAM_WINDOW_KB]", "--help\n      print this help"}) {
    EXPECT_THAT(help, HasSubstr(entry));
  }
  EXPECT_THAT(help, HasSubstr("address to serve on (default 0.0.0.0:29400)"));
}

}  // namespace
}  // namespace rdzv
