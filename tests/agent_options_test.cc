#include "client/agent/core/agent_options.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/core/env.h"
#include "common/core/hostlist.h"

namespace rdzv {
namespace {

constexpr char kHostname[] = "box7";
constexpr uid_t kUid = 1234;

// Parses and resolves as rdzv-agent's main() does, with `env` as the whole environment (no
// SLURM_* variables: these tests cover what the flags alone decide).
absl::StatusOr<AgentConfig> Resolve(const std::vector<std::string>& args, const EnvList& env = {}) {
  const EnvLookup lookup = EnvFromList(env);
  absl::StatusOr<AgentFlags> flags = ParseAgentFlags(args, lookup);
  if (!flags.ok()) return flags.status();
  return ResolveAgentConfig(*flags, lookup, {kHostname, 4242, kUid});
}

TEST(AgentOptionsTest, StandaloneDefaults) {
  absl::StatusOr<AgentConfig> c = Resolve({"--standalone", "--", "python", "train.py"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->embedded_server);
  EXPECT_EQ(c->embedded_listen_host, "127.0.0.1");
  EXPECT_EQ(c->embedded_ports, std::vector<int>{0});
  EXPECT_EQ(c->rdzv_host, "");
  EXPECT_TRUE(absl::StartsWith(c->join.job_id, "standalone-")) << c->join.job_id;
  EXPECT_EQ(c->join.min_agents, 1);
  EXPECT_EQ(c->join.max_agents, 1);
  EXPECT_EQ(c->join.agent.nproc, 1);
  EXPECT_EQ(c->join.agent.node_index, 0);
  EXPECT_EQ(c->join.agent.host, kHostname);
  EXPECT_EQ(c->join.max_restarts, 0);
  EXPECT_EQ(c->join.master_addr_override, "");
  EXPECT_EQ(c->join.master_port_override, 0);
  EXPECT_EQ(c->join_timeout, absl::Minutes(10));
  EXPECT_EQ(c->join.last_call, absl::ToInt64Microseconds(absl::Seconds(1)));
  EXPECT_EQ(c->term_timeout, absl::Seconds(3));
  EXPECT_TRUE(c->output.rank_prefix);
  EXPECT_EQ(c->command, (std::vector<std::string>{"python", "train.py"}));
}

TEST(AgentOptionsTest, StandaloneWithFlags) {
  absl::StatusOr<AgentConfig> c =
      Resolve({"--standalone", "--nproc_per_node=4", "--rdzv-id", "mine", "--max-restarts", "2",
               "--master-port", "29600", "--join-timeout", "90", "--term-timeout", "500ms",
               "--rank-prefix=false", "--host-name", "node-a", "--", "torchrun-like", "--x"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->embedded_server);
  EXPECT_EQ(c->join.job_id, "mine");
  EXPECT_EQ(c->join.agent.nproc, 4);
  EXPECT_EQ(c->join.max_restarts, 2);
  EXPECT_EQ(c->join.master_port_override, 29600);
  EXPECT_EQ(c->join_timeout, absl::Seconds(90));
  EXPECT_EQ(c->term_timeout, absl::Milliseconds(500));
  EXPECT_FALSE(c->output.rank_prefix);
  EXPECT_EQ(c->join.agent.host, "node-a");
  EXPECT_EQ(c->command, (std::vector<std::string>{"torchrun-like", "--x"}));
}

TEST(AgentOptionsTest, Endpoint) {
  absl::StatusOr<AgentConfig> c =
      Resolve({"--rdzv-endpoint", "head:29400", "--rdzv-id", "exp1", "--nnodes", "3", "--node-rank",
               "2", "--nproc-per-node", "8", "--", "python", "train.py", "--lr", "1e-3"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->embedded_server);
  EXPECT_EQ(c->rdzv_host, "head");
  EXPECT_EQ(c->rdzv_ports, std::vector<int>{29400});
  EXPECT_EQ(c->join.job_id, "exp1");
  EXPECT_EQ(c->join.min_agents, 3);
  EXPECT_EQ(c->join.max_agents, 3);
  EXPECT_EQ(c->join.agent.node_index, 2);
  EXPECT_EQ(c->join.agent.nproc, 8);
  EXPECT_EQ(c->join.agent.host, kHostname);
  EXPECT_EQ(c->command, (std::vector<std::string>{"python", "train.py", "--lr", "1e-3"}));
}

TEST(AgentOptionsTest, EndpointListNamesThePrimaryThenItsBackups) {
  absl::StatusOr<AgentConfig> c =
      Resolve({"--rdzv-endpoint", "head:29400, head2,[fd00::3]:29500", "--rdzv-id", "exp1",
               "--nnodes", "2", "--failover-timeout", "10s", "--", "./run"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rdzv_host, "head");
  EXPECT_EQ(c->rdzv_ports, std::vector<int>{29400});
  EXPECT_EQ(c->backup_endpoints, (std::vector<std::string>{"head2:29400", "[fd00::3]:29500"}));
  EXPECT_EQ(c->failover_after, absl::Seconds(10));
  // The same from the environment (/etc/rdzv.conf), with the default bound.
  c = Resolve({"--rdzv-id", "exp1", "--nnodes", "2", "--", "./run"},
              {{"RDZV_ENDPOINT", "head:29400,head2:29400"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->backup_endpoints, std::vector<std::string>{"head2:29400"});
  EXPECT_EQ(c->failover_after, absl::Seconds(3));
  // One server: no backups.
  c = Resolve({"--rdzv-endpoint", "head:29400", "--rdzv-id", "exp1", "--nnodes", "2", "--", "x"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->backup_endpoints.empty());
}

TEST(AgentOptionsTest, EndpointWithoutNodeRankLeavesOrderToHostNames) {
  absl::StatusOr<AgentConfig> c =
      Resolve({"--rdzv-endpoint=head:29400", "--rdzv-id=exp1", "--nnodes=2", "--", "./run"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->join.agent.node_index, -1);
}

TEST(AgentOptionsTest, ElasticNnodes) {
  absl::StatusOr<AgentConfig> c = Resolve({"--rdzv-endpoint", "head:29400", "--rdzv-id", "exp1",
                                           "--nnodes", "2:4", "--last-call", "5s", "--", "./run"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->join.min_agents, 2);
  EXPECT_EQ(c->join.max_agents, 4);
  EXPECT_EQ(c->join.last_call, absl::ToInt64Microseconds(absl::Seconds(5)));
}

TEST(AgentOptionsTest, VariablesApplyAndFlagsWin) {
  const EnvList env = {{"RDZV_ENDPOINT", "head:29400"},
                       {"RDZV_ID", "from-env"},
                       {"RDZV_NNODES", "2"},
                       {"RDZV_NPROC_PER_NODE", "4"}};
  absl::StatusOr<AgentConfig> c = Resolve({"--nproc-per-node", "2", "--", "./run"}, env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rdzv_host, "head");
  EXPECT_EQ(c->rdzv_ports, std::vector<int>{29400});
  EXPECT_EQ(c->join.job_id, "from-env");
  EXPECT_EQ(c->join.max_agents, 2);
  EXPECT_EQ(c->join.agent.nproc, 2);
}

// After losing the server mid-job: an rdzvd may come back, so the workers go on while the agent
// rejoins; a server inside an agent (standalone, or node 0's under srun) cannot.
TEST(AgentOptionsTest, ReconnectTimeoutDependsOnWhereTheServerRuns) {
  absl::StatusOr<AgentConfig> external = Resolve(
      {"--rdzv-endpoint", "head:29400", "--rdzv-id", "exp1", "--nnodes", "2", "--", "./run"});
  ASSERT_TRUE(external.ok()) << external.status();
  EXPECT_EQ(external->reconnect_timeout, absl::Seconds(30));

  absl::StatusOr<AgentConfig> standalone = Resolve({"--standalone", "--", "./run"});
  ASSERT_TRUE(standalone.ok()) << standalone.status();
  EXPECT_EQ(standalone->reconnect_timeout, absl::ZeroDuration());

  absl::StatusOr<AgentConfig> chosen =
      Resolve({"--rdzv-endpoint", "head:29400", "--rdzv-id", "exp1", "--nnodes", "2",
               "--reconnect-timeout", "5m", "--", "./run"});
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_EQ(chosen->reconnect_timeout, absl::Minutes(5));

  EXPECT_FALSE(Resolve({"--standalone", "--reconnect-timeout", "soon", "--", "./run"}).ok());
}

// The uid a server must prove it runs as: this user's own for the server node 0's agent hosts,
// whatever --server-uid says; the one --server-uid (RDZV_SERVER_UID) names for an rdzvd, else any.
TEST(AgentOptionsTest, ServerUidIsOwnForAHostedServerAndChosenForAnRdzvd) {
  const EnvList slurm = {{"SLURM_JOB_ID", "7"},
                         {"SLURM_STEP_ID", "0"},
                         {"SLURM_PROCID", "1"},
                         {"SLURM_NODEID", "1"},
                         {"SLURM_LOCALID", "0"},
                         {"SLURM_STEP_NUM_NODES", "2"},
                         {"SLURM_STEP_NUM_TASKS", "2"},
                         {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
                         {"SLURM_STEP_NODELIST", "n[1-2]"}};
  absl::StatusOr<AgentConfig> hosted = Resolve({"--server-uid", "0", "--", "./run"}, slurm);
  ASSERT_TRUE(hosted.ok()) << hosted.status();
  EXPECT_EQ(hosted->auth.server_uid, kUid);

  const std::vector<std::string> rdzvd = {"--rdzv-endpoint", "head:29400", "--rdzv-id", "exp1",
                                          "--nnodes",        "2"};
  const auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> args = rdzvd;
    args.insert(args.end(), more.begin(), more.end());
    args.insert(args.end(), {"--", "./run"});
    return args;
  };
  absl::StatusOr<AgentConfig> any = Resolve(with({}));
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_EQ(any->auth.server_uid, std::nullopt);
  absl::StatusOr<AgentConfig> chosen = Resolve(with({"--server-uid", "990"}));
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_EQ(chosen->auth.server_uid, 990u);
  absl::StatusOr<AgentConfig> site = Resolve(with({}), {{"RDZV_SERVER_UID", "991"}});
  ASSERT_TRUE(site.ok()) << site.status();
  EXPECT_EQ(site->auth.server_uid, 991u);

  absl::StatusOr<AgentConfig> bad = Resolve(with({"--server-uid", "rdzvd"}));
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "--server-uid")) << bad.status();
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "id -u")) << bad.status();
}

struct InterpreterCase {
  std::string name;
  std::vector<std::string> command;
  EnvList env;
  std::vector<std::string> want;
};

class InterpreterTest : public testing::TestWithParam<InterpreterCase> {};

TEST_P(InterpreterTest, PythonScriptsGetAnInterpreter) {
  const InterpreterCase& c = GetParam();
  std::vector<std::string> args = {"--standalone", "--"};
  args.insert(args.end(), c.command.begin(), c.command.end());
  absl::StatusOr<AgentConfig> config = Resolve(args, c.env);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->command, c.want);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, InterpreterTest,
    testing::Values(
        InterpreterCase{"BareScript",
                        {"train.py", "--epochs", "3"},
                        {},
                        {"python3", "train.py", "--epochs", "3"}},
        InterpreterCase{
            "ScriptWithPath", {"examples/train.py"}, {}, {"python3", "examples/train.py"}},
        InterpreterCase{"RdzvPythonChoosesTheInterpreter",
                        {"train.py"},
                        {{"RDZV_PYTHON", "/opt/venv/bin/python"}},
                        {"/opt/venv/bin/python", "train.py"}},
        InterpreterCase{"InterpreterGiven", {"python", "train.py"}, {}, {"python", "train.py"}},
        InterpreterCase{"NotAScript", {"./train.sh"}, {}, {"./train.sh"}}),
    [](const testing::TestParamInfo<InterpreterCase>& info) { return info.param.name; });

struct ErrorCase {
  std::string name;
  std::vector<std::string> args;
  std::vector<std::string> message_has;
};

class AgentOptionsErrorTest : public testing::TestWithParam<ErrorCase> {};

TEST_P(AgentOptionsErrorTest, SaysWhatToDo) {
  const ErrorCase& c = GetParam();
  absl::StatusOr<AgentConfig> config = Resolve(c.args);
  ASSERT_FALSE(config.ok()) << "accepted; job " << config->join.job_id;
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
  for (const std::string& part : c.message_has) {
    EXPECT_TRUE(absl::StrContains(config.status().message(), part))
        << "missing \"" << part << "\" in: " << config.status().message();
  }
  EXPECT_FALSE(absl::StrContains(config.status().message(), '\n')) << config.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AgentOptionsErrorTest,
    testing::Values(
        ErrorCase{"EndpointListWithAnEmptyEntry",
                  {"--rdzv-endpoint", "head:29400,", "--rdzv-id", "x", "--nnodes", "2", "--", "x"},
                  {"--rdzv-endpoint", "HOST:PORT,HOST:PORT"}},
        ErrorCase{
            "EndpointListTooLong",
            {"--rdzv-endpoint", "a,b,c,d,e,f,g,h,i", "--rdzv-id", "x", "--nnodes", "2", "--", "x"},
            {"lists 9 servers", "at most 8"}},
        ErrorCase{"NegativeFailoverTimeout",
                  {"--rdzv-endpoint", "a,b", "--rdzv-id", "x", "--nnodes", "2",
                   "--failover-timeout", "-1s", "--", "x"},
                  {"--failover-timeout", "0 or more"}},
        ErrorCase{"EndpointWithoutNnodes",
                  {"--rdzv-endpoint", "head:29400", "--rdzv-id", "exp1", "--", "./run"},
                  {"--nnodes", "required", "--rdzv-endpoint"}},
        ErrorCase{"EndpointWithoutId",
                  {"--rdzv-endpoint", "head:29400", "--nnodes", "2", "--", "./run"},
                  {"--rdzv-id", "required", "--rdzv-endpoint"}},
        ErrorCase{"NodeRankOutOfRange",
                  {"--rdzv-endpoint", "head:29400", "--rdzv-id", "exp1", "--nnodes", "2",
                   "--node-rank", "2", "--", "./run"},
                  {"--node-rank 2", "--nnodes 2", "0..1"}},
        ErrorCase{"NodeRankOutOfElasticRange",
                  {"--rdzv-endpoint", "head:29400", "--rdzv-id", "exp1", "--nnodes", "1:3",
                   "--node-rank", "3", "--", "./run"},
                  {"--node-rank 3", "0..2"}},
        ErrorCase{"NegativeNodeRank",
                  {"--node-rank", "-1", "--standalone", "--", "./run"},
                  {"--node-rank", "-1"}},
        ErrorCase{"NnodesMinAboveMax",
                  {"--nnodes", "4:2", "--standalone", "--", "./run"},
                  {"--nnodes", "4:2", "MIN:MAX"}},
        ErrorCase{"NnodesZero", {"--nnodes", "0", "--", "./run"}, {"--nnodes", "\"0\""}},
        ErrorCase{"NnodesThreeParts", {"--nnodes", "1:2:3", "--", "./run"}, {"--nnodes"}},
        ErrorCase{"NnodesNotANumber", {"--nnodes=two", "--", "./run"}, {"--nnodes", "two"}},
        ErrorCase{"NprocZero",
                  {"--nproc-per-node", "0", "--standalone", "--", "./run"},
                  {"--nproc-per-node"}},
        ErrorCase{"BadMode",
                  {"--mode", "cluster", "--standalone", "--", "./run"},
                  {"--mode", "cluster", "auto, node or task"}},
        ErrorCase{"BadDuration",
                  {"--join-timeout", "soon", "--standalone", "--", "./run"},
                  {"--join-timeout", "soon", "duration"}},
        ErrorCase{
            "UnknownFlag", {"--nproc", "2", "--standalone", "--", "./run"}, {"--nproc", "--help"}},
        ErrorCase{"NoCommand", {"--standalone"}, {"no training command", "--"}},
        ErrorCase{"NoCommandAfterDoubleDash", {"--standalone", "--"}, {"--"}},
        ErrorCase{"StandaloneWithEndpoint",
                  {"--standalone", "--rdzv-endpoint", "head:29400", "--", "./run"},
                  {"--standalone", "--rdzv-endpoint"}},
        ErrorCase{"StandaloneWithSeveralNodes",
                  {"--standalone", "--nnodes", "2", "--", "./run"},
                  {"--standalone", "--nnodes"}},
        ErrorCase{"NowhereToMeet",
                  {"--nproc-per-node", "2", "--", "./run"},
                  {"--rdzv-endpoint", "--standalone"}},
        ErrorCase{"UnknownFlagWithNewline",
                  {"--np\nroc", "2", "--standalone", "--", "./run"},
                  {"unknown flag --np\\nroc", "--help"}},
        ErrorCase{"NnodesWithNewline",
                  {"--nnodes", "2\n4", "--", "./run"},
                  {"--nnodes=\"2\\n4\"", "MIN:MAX"}}),
    [](const testing::TestParamInfo<ErrorCase>& info) { return info.param.name; });

// Numbers at and beyond their limits, from flags and from the environment (the config file is
// read as environment): each limit is refused in one line naming the flag or variable.
struct ExtremeCase {
  std::string name;
  std::vector<std::string> args;
  EnvList env;
  std::vector<std::string> message_has;
};

class ExtremeNumbersTest : public testing::TestWithParam<ExtremeCase> {};

TEST_P(ExtremeNumbersTest, RefusedInOneLine) {
  const ExtremeCase& c = GetParam();
  std::vector<std::string> args = c.args;
  args.insert(args.end(), {"--", "./run"});
  absl::StatusOr<AgentConfig> config = Resolve(args, c.env);
  ASSERT_FALSE(config.ok()) << "accepted; job " << config->join.job_id;
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
  for (const std::string& part : c.message_has) {
    EXPECT_TRUE(absl::StrContains(config.status().message(), part))
        << "missing \"" << part << "\" in: " << config.status().message();
  }
  EXPECT_FALSE(absl::StrContains(config.status().message(), '\n')) << config.status().message();
}

const std::vector<std::string> kExplicit = {"--rdzv-endpoint", "head:29400", "--rdzv-id", "exp1"};

std::vector<std::string> Explicit(std::vector<std::string> more) {
  std::vector<std::string> args = kExplicit;
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// "0,1,...,n-1".
std::string Devices(int n) {
  std::string list = "0";
  for (int i = 1; i < n; ++i) absl::StrAppend(&list, ",", i);
  return list;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ExtremeNumbersTest,
    testing::Values(
        ExtremeCase{"NegativeLastCall",
                    {"--standalone", "--last-call", "-1"},
                    {},
                    {"--last-call=\"-1\"", "0 or more"}},
        ExtremeCase{"NegativeLastCallDuration",
                    {"--standalone", "--last-call=-5s"},
                    {},
                    {"--last-call", "0 or more"}},
        ExtremeCase{"NegativeLastCallFromEnv",
                    {"--standalone"},
                    {{"RDZV_LAST_CALL", "-0.5"}},
                    {"RDZV_LAST_CALL=\"-0.5\"", "0 or more"}},
        ExtremeCase{"HugeSeconds",
                    {"--standalone", "--join-timeout", "1e300"},
                    {},
                    {"--join-timeout", "at most 365 days"}},
        ExtremeCase{"HugeHours",
                    {"--standalone", "--last-call", "9223372036854775807h"},
                    {},
                    {"--last-call", "at most 365 days"}},
        ExtremeCase{"JustOverAYear",
                    {"--standalone", "--term-timeout", "8761h"},
                    {},
                    {"--term-timeout", "at most 365 days"}},
        ExtremeCase{"InfiniteSeconds",
                    {"--standalone", "--join-timeout", "inf"},
                    {},
                    {"--join-timeout", "at most 365 days"}},
        ExtremeCase{"NotANumberSeconds",
                    {"--standalone", "--term-timeout", "nan"},
                    {},
                    {"--term-timeout", "0 or more"}},
        ExtremeCase{"HugeReconnectTimeoutFromEnv",
                    {"--standalone"},
                    {{"RDZV_RECONNECT_TIMEOUT", "1e19"}},
                    {"RDZV_RECONNECT_TIMEOUT", "at most 365 days"}},
        ExtremeCase{"ZeroHangTimeoutMin",
                    {"--standalone", "--hang-timeout-min", "0"},
                    {},
                    {"--hang-timeout-min", "positive duration"}},
        ExtremeCase{"HangTimeoutThatIsNoDuration",
                    {"--standalone", "--hang-timeout", "soon"},
                    {},
                    {"--hang-timeout=\"soon\"", "such as 60s", "auto", "0 for none"}},
        ExtremeCase{"HangTimeoutAutoMisspelt",
                    {"--standalone", "--hang-timeout=Auto"},
                    {},
                    {"--hang-timeout=\"Auto\"", "auto to learn it"}},
        ExtremeCase{"NegativeHangTimeout",
                    {"--standalone", "--hang-timeout", "-5s"},
                    {},
                    {"--hang-timeout=\"-5s\"", "0 or more, or auto"}},
        ExtremeCase{"HangTimeoutPastAYear",
                    {"--standalone", "--hang-timeout", "8761h"},
                    {},
                    {"--hang-timeout", "at most 365 days (8760h), or auto"}},
        ExtremeCase{"HangTimeoutFromEnvThatIsNoDuration",
                    {"--standalone"},
                    {{"RDZV_HANG_TIMEOUT", "fast"}},
                    {"RDZV_HANG_TIMEOUT=\"fast\"", "such as 60s"}},
        ExtremeCase{"HugeHangTimeoutFromEnv",
                    {"--standalone"},
                    {{"RDZV_HANG_TIMEOUT", "1e19"}},
                    {"RDZV_HANG_TIMEOUT", "at most 365 days"}},
        ExtremeCase{"HugeHangTimeoutMinFromEnv",
                    {"--standalone"},
                    {{"RDZV_HANG_TIMEOUT_MIN", "1e19"}},
                    {"RDZV_HANG_TIMEOUT_MIN", "at most 365 days"}},
        ExtremeCase{"NprocOverTheLimit",
                    {"--standalone", "--nproc-per-node", "4097"},
                    {},
                    {"--nproc-per-node", "1..4096"}},
        ExtremeCase{"NprocOverflowingInt64",
                    {"--standalone", "--nproc-per-node", "99999999999999999999"},
                    {},
                    {"--nproc-per-node", "whole number"}},
        ExtremeCase{"NprocFromTooManyVisibleDevices",
                    {"--standalone"},
                    {{"CUDA_VISIBLE_DEVICES", Devices(5000)}},
                    {"5000 workers per node", "over 4096", "--nproc-per-node"}},
        ExtremeCase{"WorldOverInt32",
                    Explicit({"--nnodes", "524288", "--nproc-per-node", "4096"}),
                    {},
                    {"524288 agents of 4096 workers", "2147483648 ranks", "--nnodes"}},
        ExtremeCase{"ElasticWorldOverInt32",
                    Explicit({"--nnodes", "1:1000000", "--nproc-per-node", "4096"}),
                    {},
                    {"1000000 agents", "over the limit of 2147483647"}},
        ExtremeCase{
            "NnodesOverTheLimit", Explicit({"--nnodes", "1000001"}), {}, {"--nnodes=\"1000001\""}},
        ExtremeCase{"NodeRankOverflowingInt64",
                    Explicit({"--nnodes", "2", "--node-rank", "18446744073709551617"}),
                    {},
                    {"--node-rank", "whole number"}},
        ExtremeCase{"NegativeMaxRestarts",
                    {"--standalone", "--max-restarts", "-1"},
                    {},
                    {"--max-restarts", "0..1000000"}},
        ExtremeCase{"HugeMaxRestarts",
                    {"--standalone", "--max-restarts", "2147483648"},
                    {},
                    {"--max-restarts", "0..1000000"}},
        ExtremeCase{"MasterPortZero",
                    {"--standalone", "--master-port", "0"},
                    {},
                    {"--master-port", "1..65535"}},
        ExtremeCase{"MasterPortOver65535",
                    {"--standalone", "--master-port", "65536"},
                    {},
                    {"--master-port", "1..65535"}},
        ExtremeCase{"MasterPortFromEnv",
                    {"--standalone"},
                    {{"RDZV_MASTER_PORT", "-1"}},
                    {"RDZV_MASTER_PORT", "1..65535"}},
        ExtremeCase{"EndpointPortOver65535",
                    {"--rdzv-endpoint", "head:70000", "--rdzv-id", "x", "--nnodes", "1"},
                    {},
                    {"--rdzv-endpoint", "70000"}},
        ExtremeCase{"HostNameWithControlCharacters",
                    {"--standalone", "--host-name", "n1\x1b[2J\nfake log line"},
                    {},
                    {"--host-name \"n1\\x1b[2J\\nfake log line\"", "control character"}},
        ExtremeCase{"HostNameFromSlurmWithNewline",
                    {"--standalone"},
                    {{"SLURMD_NODENAME", "n1\nn2"}},
                    {"SLURMD_NODENAME", "\"n1\\nn2\""}},
        ExtremeCase{"HostNameTooLong",
                    {"--standalone", "--host-name", std::string(256, 'h')},
                    {},
                    {"--host-name is 256 characters long", "at most 255"}}),
    [](const testing::TestParamInfo<ExtremeCase>& info) { return info.param.name; });

TEST(ExtremeNumbersTest, AcceptsTheLimitsThemselves) {
  absl::StatusOr<AgentConfig> c = Resolve(Explicit(
      {"--nnodes", "1:524287", "--nproc-per-node", "4096", "--last-call", "0", "--join-timeout",
       "8760h", "--term-timeout", "31536000", "--max-restarts", "1000000", "--", "./run"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(int64_t{c->join.max_agents} * c->join.agent.nproc, 2147479552);
  EXPECT_EQ(c->join.last_call, 0);
  EXPECT_EQ(c->join_timeout, absl::Hours(8760));
  EXPECT_EQ(c->term_timeout, absl::Hours(8760));
  EXPECT_EQ(c->join.max_restarts, 1'000'000);
  absl::StatusOr<AgentConfig> last = Resolve({"--standalone", "--last-call", "8760h", "--", "x"});
  ASSERT_TRUE(last.ok()) << last.status();
  // Milliseconds and microseconds of the longest last call still fit, with room to spare.
  EXPECT_EQ(last->join.last_call, int64_t{8760} * 3600 * 1'000'000);
  EXPECT_LT(last->join.last_call, std::numeric_limits<int64_t>::max() / 1000);
}

// --hang-timeout (or RDZV_HANG_TIMEOUT): a heartbeat timeout, auto to learn one, or 0 for none.
TEST(AgentOptionsTest, HangTimeoutIsADurationAutoOrNone) {
  struct Case {
    std::vector<std::string> args;
    EnvList env;
    absl::Duration timeout;
    bool learned;
  };
  const std::vector<Case> cases = {
      {{}, {}, absl::ZeroDuration(), false},
      {{"--hang-timeout", "5s"}, {}, absl::Seconds(5), false},
      {{"--hang-timeout", "90"}, {}, absl::Seconds(90), false},
      {{"--hang-timeout", "0"}, {}, absl::ZeroDuration(), false},
      {{"--hang-timeout", "8760h"}, {}, absl::Hours(8760), false},
      {{"--hang-timeout", "auto"}, {}, absl::ZeroDuration(), true},
      {{}, {{"RDZV_HANG_TIMEOUT", "auto"}}, absl::ZeroDuration(), true},
      {{}, {{"RDZV_HANG_TIMEOUT", "2m"}}, absl::Minutes(2), false},
      {{"--hang-timeout", "10s"}, {{"RDZV_HANG_TIMEOUT", "auto"}}, absl::Seconds(10), false},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"--standalone"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    args.insert(args.end(), {"--", "./run"});
    SCOPED_TRACE(absl::StrCat(absl::StrJoin(args, " "), c.env.empty() ? "" : " with ",
                              c.env.empty() ? "" : c.env[0].second));
    absl::StatusOr<AgentConfig> config = Resolve(args, c.env);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->hang.heartbeat_timeout, c.timeout);
    EXPECT_EQ(config->hang.auto_timeout, c.learned);
    EXPECT_EQ(config->hang.auto_floor, absl::Seconds(30));
  }
  absl::StatusOr<AgentConfig> floor =
      Resolve({"--standalone", "--hang-timeout", "auto", "--hang-timeout-min", "3s", "--", "x"});
  ASSERT_TRUE(floor.ok()) << floor.status();
  EXPECT_EQ(floor->hang.auto_floor, absl::Seconds(3));
}

TEST(AgentOptionsTest, HealthCheckTimeoutIsADurationAsEveryOther) {
  const std::vector<std::pair<std::string, absl::Duration>> good = {
      {"30", absl::Seconds(30)},
      {"1.5s", absl::Milliseconds(1500)},
      {"2m", absl::Minutes(2)},
      {"24h", absl::Hours(24)}};
  for (const auto& [value, want] : good) {
    absl::StatusOr<AgentConfig> config =
        Resolve({"--standalone", "--health-check-timeout", value, "--", "./run"});
    ASSERT_TRUE(config.ok()) << value << ": " << config.status();
    EXPECT_EQ(config->health.timeout, want) << value;
  }
  for (const std::string value : {"0", "-1s", "25h", "soon"}) {
    absl::StatusOr<AgentConfig> config =
        Resolve({"--standalone", "--health-check-timeout", value, "--", "./run"});
    ASSERT_FALSE(config.ok()) << value;
    EXPECT_TRUE(absl::StrContains(config.status().message(), "--health-check-timeout"))
        << config.status();
    EXPECT_FALSE(absl::StrContains(config.status().message(), '\n')) << config.status();
  }
}

TEST(AgentOptionsTest, SpareNodesNeedOneAgentPerNodeAndRoomToRun) {
  // Four nodes under srun, one agent each: three run the job, one waits.
  const auto step = [](const std::string& tasks_per_node, const std::string& tasks) {
    return EnvList{{"SLURM_JOB_ID", "7"},
                   {"SLURM_STEP_ID", "0"},
                   {"SLURM_PROCID", "1"},
                   {"SLURM_NODEID", "1"},
                   {"SLURM_LOCALID", "0"},
                   {"SLURM_STEP_NUM_NODES", "4"},
                   {"SLURM_STEP_NUM_TASKS", tasks},
                   {"SLURM_STEP_TASKS_PER_NODE", tasks_per_node},
                   {"SLURM_STEP_NODELIST", "n[1-4]"}};
  };
  absl::StatusOr<AgentConfig> c =
      Resolve({"--spare-nodes", "1", "--max-restarts", "2", "--", "./run"}, step("1(x4)", "4"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->join.spare_nodes, 1);
  EXPECT_EQ(c->join.max_agents, 4);
  EXPECT_TRUE(c->warnings.empty());
  c = Resolve({"--", "./run"}, [&] {
    EnvList env = step("1(x4)", "4");
    env.push_back({"RDZV_SPARE_NODES", "2"});
    return env;
  }());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->join.spare_nodes, 2);
  // Without restarts a spare can take no place: said at once.
  ASSERT_EQ(c->warnings.size(), 1u);
  EXPECT_TRUE(absl::StrContains(c->warnings[0], "pass --max-restarts N")) << c->warnings[0];

  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--spare-nodes", "4", "--", "./run"}, "--spare-nodes is 4; expected 0 to 3"},
      {{"--spare-nodes", "-1", "--", "./run"}, "--spare-nodes"},
      {{"--standalone", "--spare-nodes", "1", "--", "./run"}, "--spare-nodes is 1"},
  };
  for (const auto& [args, message] : bad) {
    absl::StatusOr<AgentConfig> r = Resolve(args, step("1(x4)", "4"));
    ASSERT_FALSE(r.ok()) << absl::StrJoin(args, " ");
    EXPECT_TRUE(absl::StrContains(r.status().message(), message)) << r.status();
  }
  // One agent per task: a spare would be part of a node.
  absl::StatusOr<AgentConfig> per_task =
      Resolve({"--spare-nodes", "1", "--", "./run"}, step("2(x4)", "8"));
  ASSERT_FALSE(per_task.ok());
  EXPECT_TRUE(absl::StrContains(per_task.status().message(), "srun --ntasks-per-node=1"))
      << per_task.status();
}

TEST(AgentOptionsTest, HelpAndVersionParseWithoutACommand) {
  absl::StatusOr<AgentFlags> help = ParseAgentFlags({"--help"}, EnvFromList({}));
  ASSERT_TRUE(help.ok()) << help.status();
  EXPECT_TRUE(help->help);
  absl::StatusOr<AgentFlags> version = ParseAgentFlags({"--version"}, EnvFromList({}));
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_TRUE(version->version);
  EXPECT_TRUE(absl::StrContains(AgentHelp(), "--nproc-per-node N  [RDZV_NPROC_PER_NODE]"));
}

}  // namespace
}  // namespace rdzv

namespace rdzv {
namespace {

TEST(AgentOptionsTest, UnderMpirunTheLauncherNumbersTheNodes) {
  const EnvList ompi = {{"OMPI_COMM_WORLD_RANK", "1"},
                        {"OMPI_COMM_WORLD_SIZE", "2"},
                        {"PMIX_NAMESPACE", "1525088257"}};
  absl::StatusOr<AgentConfig> c =
      Resolve({"--rdzv-endpoint", "127.0.0.1:29400", "--", "python", "train.py"}, ompi);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mode, AgentMode::kExplicit);
  EXPECT_EQ(c->join.agent.node_index, 1);
  EXPECT_EQ(c->join.min_agents, 2);
  EXPECT_EQ(c->join.max_agents, 2);
  EXPECT_EQ(c->join.job_id, "mpi-1525088257");
  // Flags win over the launcher.
  c = Resolve({"--rdzv-endpoint", "127.0.0.1:29400", "--nnodes", "4", "--node-rank", "3",
               "--rdzv-id", "exp", "--", "python", "train.py"},
              ompi);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->join.agent.node_index, 3);
  EXPECT_EQ(c->join.max_agents, 4);
  EXPECT_EQ(c->join.job_id, "exp");
  // A broken launcher variable is named.
  EXPECT_EQ(Resolve({"--rdzv-endpoint", "h:1", "--", "x"}, {{"PMI_RANK", "a"}}).status().message(),
            "PMI_RANK=\"a\" is not a whole number; unset it or fix the launcher");
}

TEST(AgentOptionsTest, UnderMpichOrPmixTheUserNamesWhatTheLauncherDoesNot) {
  // MPICH's Hydra gives the rank and the size, but no job id.
  const EnvList mpich = {{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}};
  absl::StatusOr<AgentConfig> c =
      Resolve({"--rdzv-endpoint", "head:29400", "--", "python", "train.py"}, mpich);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(),
            "--rdzv-id is required: MPICH gives no job id, and jobs that share rdzvd must not "
            "meet; pass every agent of the job the same id, e.g. --rdzv-id exp1");
  c = Resolve({"--rdzv-endpoint", "head:29400", "--rdzv-id", "exp1", "--", "python", "train.py"},
              mpich);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->join.job_id, "exp1");
  EXPECT_EQ(c->join.agent.node_index, 1);
  EXPECT_EQ(c->join.max_agents, 2);

  // PMIx alone: a rank and a namespace, but no size.
  const EnvList pmix = {{"PMIX_RANK", "0"}, {"PMIX_NAMESPACE", "prterun-h-1234@1"}};
  c = Resolve({"--rdzv-endpoint", "head:29400", "--", "python", "train.py"}, pmix);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            "--nnodes is required: PMIx gives this agent its rank but not how many were started; "
            "pass the number of agents, e.g. --nnodes 2");
  c = Resolve({"--rdzv-endpoint", "head:29400", "--nnodes", "2", "--", "python", "train.py"}, pmix);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->join.job_id, "mpi-prterun-h-1234@1");
  EXPECT_EQ(c->join.agent.node_index, 0);
}

TEST(AgentOptionsTest, WorkerShapeFlags) {
  const EnvList step = {{"SLURM_JOB_ID", "5"},         {"SLURM_STEP_ID", "0"},
                        {"SLURM_PROCID", "0"},         {"SLURM_NODEID", "0"},
                        {"SLURM_LOCALID", "0"},        {"SLURM_NNODES", "1"},
                        {"SLURM_STEP_NODELIST", "n1"}, {"SLURM_STEP_NUM_TASKS", "1"}};
  absl::StatusOr<AgentConfig> c = Resolve({"--", "python", "train.py"}, step);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->worker_shape.slurm_tasks.has_value());
  EXPECT_FALSE(c->worker_shape.pass_local_rank);
  c = Resolve({"--slurm-env", "keep", "--pass-local-rank", "--", "python", "train.py"}, step);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->worker_shape.slurm_tasks.has_value());
  EXPECT_TRUE(c->worker_shape.pass_local_rank);
  EnvList keep = step;
  keep.emplace_back("RDZV_SLURM_ENV", "keep");
  c = Resolve({"--", "python", "train.py"}, keep);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->worker_shape.slurm_tasks.has_value());
  EXPECT_EQ(Resolve({"--slurm-env", "yes", "--", "x"})
                    .status()
                    .message()
                    .find("expected tasks or keep") != std::string::npos,
            true);
}

// What an sbatch -N3 script on nodes n1..n3 runs with on its first node: the batch step's
// SLURM_PROCID=0 and the allocation's layout, but no step id.
EnvList BatchScript() {
  return {{"SLURM_JOB_ID", "41"}, {"SLURM_JOB_NUM_NODES", "3"}, {"SLURM_JOB_NODELIST", "n[1-3]"},
          {"SLURM_NNODES", "3"},  {"SLURM_NODELIST", "n[1-3]"}, {"SLURM_TASKS_PER_NODE", "1(x3)"},
          {"SLURM_NODEID", "0"},  {"SLURM_PROCID", "0"},        {"SLURM_LOCALID", "0"},
          {"SLURM_GTIDS", "0"},   {"SLURMD_NODENAME", "n1"}};
}

TEST(AgentOptionsTest, StandaloneInABatchScriptDescribesThisNodeAlone) {
  absl::StatusOr<AgentConfig> c =
      Resolve({"--standalone", "--nproc-per-node", "3", "--", "python", "train.py"}, BatchScript());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mode, AgentMode::kStandalone);
  ASSERT_TRUE(c->worker_shape.slurm_tasks.has_value());
  EXPECT_EQ(c->worker_shape.job_nodes, (std::vector<std::string>{"n1"}));
  EXPECT_TRUE(c->worker_shape.hide_launcher_env);
  EXPECT_TRUE(absl::StartsWith(c->join.job_id, "standalone-")) << c->join.job_id;
  EXPECT_TRUE(c->warnings.empty());
  // Outside Slurm there is nothing to describe.
  c = Resolve({"--standalone", "--nproc-per-node", "3", "--", "python", "train.py"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->worker_shape.slurm_tasks.has_value());
  EXPECT_TRUE(c->worker_shape.job_nodes.empty());
}

TEST(AgentOptionsTest, LauncherPlaceIsHiddenWhereTheAgentStartsTheWorkers) {
  const EnvList per_node = {{"SLURM_JOB_ID", "5"},
                            {"SLURM_STEP_ID", "0"},
                            {"SLURM_PROCID", "1"},
                            {"SLURM_NODEID", "1"},
                            {"SLURM_LOCALID", "0"},
                            {"SLURM_NNODES", "2"},
                            {"SLURM_STEP_NODELIST", "n[1-2]"},
                            {"SLURM_STEP_NUM_TASKS", "2"},
                            {"PMI_RANK", "1"},
                            {"PMI_SIZE", "2"},
                            {"PMI_FD", "7"}};
  EnvList per_task = per_node;
  per_task.emplace_back("SLURM_STEP_TASKS_PER_NODE", "1,2");
  per_task[7].second = "3";  // SLURM_STEP_NUM_TASKS
  const struct {
    const char* name;
    std::vector<std::string> args;
    EnvList env;
    bool hidden;
  } cases[] = {
      {"per-node", {}, per_node, true},
      {"per-node, --mpi-env keep", {"--mpi-env", "keep"}, per_node, false},
      {"per-task: the worker is the launcher's task", {}, per_task, false},
      {"standalone", {"--standalone"}, {}, true},
      {"mpirun", {"--rdzv-endpoint", "h:1", "--rdzv-id", "x", "--nnodes", "2"}, {}, true},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = c.args;
    for (const char* a : {"--", "python", "train.py"}) args.push_back(a);
    absl::StatusOr<AgentConfig> config = Resolve(args, c.env);
    ASSERT_TRUE(config.ok()) << c.name << ": " << config.status();
    EXPECT_EQ(config->worker_shape.hide_launcher_env, c.hidden) << c.name;
  }
  EnvList keep = per_node;
  keep.emplace_back("RDZV_MPI_ENV", "keep");
  absl::StatusOr<AgentConfig> config = Resolve({"--", "python", "train.py"}, keep);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->worker_shape.hide_launcher_env);
  EXPECT_EQ(Resolve({"--mpi-env", "no", "--", "x"}).status().message(),
            "--mpi-env=\"no\": expected drop or keep");
}

TEST(AgentOptionsTest, PerTaskNodesWithSeveralTasksJoinThroughTheirFirstTasksRelay) {
  // Node 1 of n[1-2] runs tasks 1 and 2 (SLURM_STEP_TASKS_PER_NODE 1,2).
  const EnvList second_node = {{"SLURM_JOB_ID", "5"},         {"SLURM_STEP_ID", "0"},
                               {"SLURM_PROCID", "1"},         {"SLURM_NODEID", "1"},
                               {"SLURM_LOCALID", "0"},        {"SLURMD_NODENAME", "n2"},
                               {"SLURM_NNODES", "2"},         {"SLURM_STEP_NODELIST", "n[1-2]"},
                               {"SLURM_STEP_NUM_TASKS", "3"}, {"SLURM_STEP_TASKS_PER_NODE", "1,2"}};
  EnvList later_task = second_node;
  later_task[2].second = "2";  // SLURM_PROCID
  later_task[4].second = "1";  // SLURM_LOCALID
  EnvList first_node = second_node;
  first_node[2].second = "0";  // SLURM_PROCID
  first_node[3].second = "0";  // SLURM_NODEID
  first_node[5].second = "n1";
  const struct {
    const char* name;
    std::vector<std::string> args;
    EnvList env;
    int tasks_on_node;
    bool host;
  } cases[] = {
      {"the node's first task hosts it", {}, second_node, 2, true},
      {"a later task joins through it", {}, later_task, 2, false},
      {"a node with one task has none", {}, first_node, 0, false},
      {"--node-relay off", {"--node-relay", "off"}, second_node, 0, false},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = c.args;
    for (const char* a : {"--", "python", "train.py"}) args.push_back(a);
    absl::StatusOr<AgentConfig> config = Resolve(args, c.env);
    ASSERT_TRUE(config.ok()) << c.name << ": " << config.status();
    EXPECT_EQ(config->relay.tasks_on_node, c.tasks_on_node) << c.name;
    EXPECT_EQ(config->relay.host, c.host) << c.name;
    if (c.tasks_on_node > 0) {
      EXPECT_EQ(config->relay.node, "n2") << c.name;
    }
  }
  EXPECT_EQ(Resolve({"--node-relay", "yes", "--", "x"}, second_node).status().message(),
            "--node-relay=\"yes\": expected on or off, got \"yes\"");
  EnvList off = second_node;
  off.emplace_back("RDZV_NODE_RELAY", "off");
  absl::StatusOr<AgentConfig> config = Resolve({"--", "python", "train.py"}, off);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->relay.tasks_on_node, 0);
}

// A per-node step of 10 nodes n[1-10], as node `node` sees it.
EnvList PerNodeStepOfTen(int node) {
  return {{"SLURM_JOB_ID", "5"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_PROCID", absl::StrCat(node)},
          {"SLURM_NODEID", absl::StrCat(node)},
          {"SLURM_LOCALID", "0"},
          {"SLURMD_NODENAME", absl::StrCat("n", node + 1)},
          {"SLURM_NNODES", "10"},
          {"SLURM_STEP_NODELIST", "n[1-10]"},
          {"SLURM_STEP_NUM_TASKS", "10"},
          {"SLURM_STEP_TASKS_PER_NODE", "1(x10)"}};
}

TEST(AgentOptionsTest, InsideSrunNnodesMayLowerTheMinimumOfTheStepsCount) {
  absl::StatusOr<AgentConfig> c = Resolve({"--nnodes", "8:10", "--", "./run"}, PerNodeStepOfTen(3));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->join.min_agents, 8);
  EXPECT_EQ(c->join.max_agents, 10);
  // More than the step runs is still a contradiction.
  EXPECT_FALSE(Resolve({"--nnodes", "8:12", "--", "./run"}, PerNodeStepOfTen(3)).ok());
}

TEST(AgentOptionsTest, ManyNodesJoinInGroupsThroughEachGroupsFirstNode) {
  const struct {
    int fan_in;
    int node;
    int first, last;  // the group's nodes; first > last: none
    bool host;
  } cases[] = {
      {4, 0, 0, 3, true},    // the first group's relay
      {4, 2, 0, 3, false},   //
      {4, 4, 4, 7, true},    // the second group's relay
      {4, 7, 4, 7, false},   //
      {4, 9, 8, 9, false},   // the last group is smaller
      {3, 9, 1, 0, false},   // a group of one joins directly
      {10, 5, 1, 0, false},  // no more nodes than the fan-in: no groups
      {0, 5, 1, 0, false},   // --fan-in 0: none
  };
  const int ports = DerivedPort("5", "0.relay");
  for (const auto& c : cases) {
    const std::string name = absl::StrCat("--fan-in ", c.fan_in, ", node ", c.node);
    absl::StatusOr<AgentConfig> config =
        Resolve({"--fan-in", absl::StrCat(c.fan_in), "--", "x"}, PerNodeStepOfTen(c.node));
    ASSERT_TRUE(config.ok()) << name << ": " << config.status();
    const AgentConfig::GroupRelayConfig& g = config->group;
    if (c.first > c.last) {
      EXPECT_EQ(g.fan_in, 0) << name;
      continue;
    }
    EXPECT_EQ(g.fan_in, c.fan_in) << name;
    EXPECT_EQ(g.first_node, c.first) << name;
    EXPECT_EQ(g.last_node, c.last) << name;
    EXPECT_EQ(g.host, c.host) << name;
    EXPECT_EQ(g.relay_node, absl::StrCat("n", c.first + 1)) << name;
    ASSERT_EQ(g.ports.size(), static_cast<size_t>(kEmbeddedPortCandidates)) << name;
    EXPECT_EQ(g.ports.front(), ports) << name;
  }
  // The default groups 64 nodes: ten are too few.
  absl::StatusOr<AgentConfig> config = Resolve({"--", "x"}, PerNodeStepOfTen(5));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->group.fan_in, 0);
  EnvList by_variable = PerNodeStepOfTen(5);
  by_variable.emplace_back("RDZV_FAN_IN", "5");
  config = Resolve({"--", "x"}, by_variable);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->group.first_node, 5);
  EXPECT_TRUE(config->group.host);
  // Nodes ranked by --node-rank need not follow the node list: no groups then.
  config = Resolve({"--fan-in", "4", "--node-rank", "5", "--", "x"}, PerNodeStepOfTen(5));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->group.fan_in, 0);
  EXPECT_EQ(Resolve({"--fan-in", "1", "--", "x"}, PerNodeStepOfTen(5)).status().message(),
            "--fan-in=\"1\": a group of 1 node relays nothing; give 2..512, or 0 for no groups");
  EXPECT_FALSE(Resolve({"--fan-in", "513", "--", "x"}, PerNodeStepOfTen(5)).ok());
}

TEST(AgentOptionsTest, SlurmEnvKeepWarnsWhereRanksRepeat) {
  const EnvList step = {{"SLURM_JOB_ID", "5"},         {"SLURM_STEP_ID", "0"},
                        {"SLURM_PROCID", "0"},         {"SLURM_NODEID", "0"},
                        {"SLURM_LOCALID", "0"},        {"SLURM_NNODES", "1"},
                        {"SLURM_STEP_NODELIST", "n1"}, {"SLURM_STEP_NUM_TASKS", "1"}};
  absl::StatusOr<AgentConfig> c =
      Resolve({"--slurm-env", "keep", "--nproc-per-node", "4", "--", "python", "train.py"}, step);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->warnings.size(), 1u);
  EXPECT_NE(c->warnings[0].find("4 workers all keep its SLURM_PROCID"), std::string::npos)
      << c->warnings[0];
  EXPECT_NE(c->warnings[0].find("PyTorch Lightning"), std::string::npos) << c->warnings[0];
  EXPECT_NE(c->warnings[0].find("submitit"), std::string::npos) << c->warnings[0];
  // One worker per agent keeps a rank of its own; so does a worker outside Slurm.
  c = Resolve({"--slurm-env", "keep", "--nproc-per-node", "1", "--", "python", "train.py"}, step);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->warnings.empty());
  c = Resolve({"--slurm-env", "keep", "--standalone", "--nproc-per-node", "4", "--", "x"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->warnings.empty());
  c = Resolve({"--slurm-env", "keep", "--standalone", "--nproc-per-node", "4", "--", "x"},
              BatchScript());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->warnings.size(), 1u);
  c = Resolve({"--nproc-per-node", "4", "--", "python", "train.py"}, step);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->warnings.empty());
}

// What `srun -N1 -n1 -w NODE` gives its task inside `sbatch -N3` on nodes n1..n3.
EnvList OneNodeStep(const std::string& node, const std::string& step_id) {
  return {{"SLURM_JOB_ID", "40"},
          {"SLURM_STEP_ID", step_id},
          {"SLURM_JOB_NUM_NODES", "3"},
          {"SLURM_JOB_NODELIST", "n[1-3]"},
          {"SLURM_NNODES", "1"},
          {"SLURM_STEP_NUM_NODES", "1"},
          {"SLURM_STEP_NODELIST", node},
          {"SLURM_NTASKS", "1"},
          {"SLURM_STEP_TASKS_PER_NODE", "1"},
          {"SLURM_NODEID", "0"},
          {"SLURM_PROCID", "0"},
          {"SLURM_LOCALID", "0"},
          {"SLURMD_NODENAME", node}};
}

TEST(AgentOptionsTest, OneStepPerNodeFormsOneJob) {
  const std::vector<std::string> cmd = {"--", "python", "train.py"};
  auto args = [&](std::vector<std::string> flags) {
    flags.insert(flags.end(), cmd.begin(), cmd.end());
    return flags;
  };
  // The seeds' loop: srun -N1 -n1 -w ${nodes[i]} ... --nnodes=$SLURM_NNODES --node_rank=$i &
  absl::StatusOr<AgentConfig> second =
      Resolve(args({"--nnodes", "3", "--node-rank", "1"}), OneNodeStep("n2", "1"));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->mode, AgentMode::kSlurmStepPerNode);
  EXPECT_EQ(second->join.job_id, "slurm-40");
  EXPECT_EQ(second->join.min_agents, 3);
  EXPECT_EQ(second->join.max_agents, 3);
  EXPECT_EQ(second->join.agent.node_index, 1);
  EXPECT_EQ(second->join.agent.nproc, 1);
  EXPECT_EQ(second->rdzv_host, "n1");  // the allocation's first node, not the step's
  EXPECT_FALSE(second->embedded_server);
  EXPECT_EQ(second->worker_shape.job_nodes, (std::vector<std::string>{"n1", "n2", "n3"}));
  // rdzvd's status names the job's nodes: the allocation's, not the step's one.
  EXPECT_EQ(second->join.node_list, "n[1-3]");

  // The first node's step hosts, at the port every step derives: step ids differ.
  absl::StatusOr<AgentConfig> first =
      Resolve(args({"--nnodes=3", "--node-rank=0", "--nproc-per-node=2"}), OneNodeStep("n1", "0"));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->embedded_server);
  EXPECT_EQ(first->embedded_listen_host, "0.0.0.0");
  EXPECT_EQ(first->embedded_ports, second->rdzv_ports);
  EXPECT_EQ(first->rdzv_ports, second->rdzv_ports);
  EXPECT_EQ(first->join.job_id, second->join.job_id);
  EXPECT_EQ(first->join.agent.nproc, 2);

  // Without --node-rank the node's place in the allocation ranks it.
  absl::StatusOr<AgentConfig> third = Resolve(args({"--nnodes", "3"}), OneNodeStep("n3", "2"));
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->join.agent.node_index, 2);

  // A node rank that is not the node's place: ranks follow it, and workers get no node list
  // that would contradict them.
  absl::StatusOr<AgentConfig> swapped =
      Resolve(args({"--nnodes", "3", "--node-rank", "2"}), OneNodeStep("n2", "1"));
  ASSERT_TRUE(swapped.ok()) << swapped.status();
  EXPECT_EQ(swapped->join.agent.node_index, 2);
  EXPECT_TRUE(swapped->worker_shape.job_nodes.empty());

  // A step over every node of the allocation stays an ordinary per-node step.
  EnvList whole = OneNodeStep("n1", "0");
  for (auto& [name, value] : whole) {
    if (name == "SLURM_NNODES" || name == "SLURM_STEP_NUM_NODES") value = "3";
    if (name == "SLURM_STEP_NODELIST") value = "n[1-3]";
    if (name == "SLURM_STEP_TASKS_PER_NODE") value = "1(x3)";
    if (name == "SLURM_NTASKS") value = "3";
  }
  absl::StatusOr<AgentConfig> ordinary = Resolve(args({"--nnodes", "3"}), whole);
  ASSERT_TRUE(ordinary.ok()) << ordinary.status();
  EXPECT_EQ(ordinary->mode, AgentMode::kSlurmPerNode);
  EXPECT_EQ(ordinary->join.job_id, "slurm-40.0");
  EXPECT_EQ(ordinary->join.node_list, "n[1-3]");
}

TEST(AgentOptionsTest, NodeListTooLongForAJoinIsLeftOut) {
  // Names that share no numbered prefix do not compress: 2,000 of them are over the bound.
  std::vector<std::string> names;
  for (int i = 0; i < 2000; ++i) {
    std::string name = "compute";
    for (int v = i; v > 0 || name.size() == 7; v /= 26) name += static_cast<char>('a' + v % 26);
    names.push_back(name);
  }
  ASSERT_GT(CompressHostlist(names).size(), kMaxNodeListBytes);
  const EnvList step = {{"SLURM_JOB_ID", "7"},
                        {"SLURM_STEP_ID", "0"},
                        {"SLURM_NNODES", "2000"},
                        {"SLURM_STEP_NODELIST", absl::StrJoin(names, ",")},
                        {"SLURM_STEP_NUM_TASKS", "2000"},
                        {"SLURM_STEP_TASKS_PER_NODE", "1(x2000)"},
                        {"SLURM_NODEID", "1"},
                        {"SLURM_PROCID", "1"},
                        {"SLURM_LOCALID", "0"},
                        {"SLURMD_NODENAME", names[1]}};
  absl::StatusOr<AgentConfig> c = Resolve({"--", "python", "train.py"}, step);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->join.max_agents, 2000);
  EXPECT_EQ(c->join.node_list, "");
}

TEST(AgentOptionsTest, OneStepPerNodeMistakesAreNamed) {
  auto message = [](std::vector<std::string> flags, const EnvList& env) {
    flags.insert(flags.end(), {"--", "python", "train.py"});
    absl::StatusOr<AgentConfig> c = Resolve(flags, env);
    return c.ok() ? std::string("ok") : std::string(c.status().message());
  };
  EXPECT_EQ(message({"--nnodes", "2"}, OneNodeStep("n2", "1")),
            "--nnodes 2:2 matches neither the Slurm step, which runs 1 node, nor the allocation's "
            "3 nodes; drop --nnodes inside srun, or to join one step per node (srun -N1 -n1) "
            "into one job pass the allocation's node count");
  EXPECT_EQ(message({"--nnodes", "3", "--node-rank", "3"}, OneNodeStep("n2", "1")),
            "--node-rank 3 is out of range for the allocation's 3 nodes; expected 0..2");
  EXPECT_EQ(message({"--nnodes", "3"}, OneNodeStep("gpu9", "1")),
            "this node (SLURMD_NODENAME=gpu9) is not in SLURM_JOB_NODELIST, so its place among "
            "the allocation's 3 nodes is unknown; pass --node-rank I");
  // Within a step of several tasks each agent is one rank: no steps to join.
  EnvList tasks = OneNodeStep("n2", "1");
  for (auto& [name, value] : tasks) {
    if (name == "SLURM_STEP_TASKS_PER_NODE") value = "2";
    if (name == "SLURM_NTASKS") value = "2";
  }
  EXPECT_EQ(message({"--nnodes", "3"}, tasks),
            "--nnodes 3:3 matches neither the Slurm step, which runs 2 tasks, nor the "
            "allocation's 3 nodes; drop --nnodes inside srun, or to join one step per node "
            "(srun -N1 -n1) into one job pass the allocation's node count");
}

TEST(AgentOptionsTest, TlsCaIsForAnRdzvdOnly) {
  const std::vector<std::string> endpoint = {"--rdzv-endpoint", "head:29400", "--rdzv-id", "j",
                                             "--nnodes",        "2"};
  std::vector<std::string> args = endpoint;
  for (const char* a : {"--tls-ca", "/etc/rdzv/ca.pem", "--tls-server-name", "head", "--", "x"}) {
    args.push_back(a);
  }
  absl::StatusOr<AgentConfig> c = Resolve(args);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tls.ca_file, "/etc/rdzv/ca.pem");
  EXPECT_EQ(c->tls.server_name, "head");
  // From the environment (or /etc/rdzv.conf) as well.
  args = endpoint;
  args.insert(args.end(), {"--", "x"});
  c = Resolve(args, {{"RDZV_TLS_CA", "/site/ca.pem"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tls.ca_file, "/site/ca.pem");
  // A job that hosts its own rendezvous serves it in plaintext: refused, not left to hang.
  const EnvList step = {{"SLURM_JOB_ID", "5"},
                        {"SLURM_STEP_ID", "0"},
                        {"SLURM_PROCID", "1"},
                        {"SLURM_NODEID", "1"},
                        {"SLURM_LOCALID", "0"},
                        {"SLURM_NNODES", "2"},
                        {"SLURM_STEP_NODELIST", "n[1-2]"},
                        {"SLURM_STEP_NUM_TASKS", "2"},
                        {"RDZV_TLS_CA", "/site/ca.pem"}};
  c = Resolve({"--", "x"}, step);
  EXPECT_NE(c.status().message().find("pass --rdzv-endpoint"), std::string::npos) << c.status();
  // A standalone job has no server to talk to.
  EXPECT_TRUE(Resolve({"--standalone", "--tls-ca", "ca.pem", "--", "x"}).ok());
  EXPECT_NE(Resolve({"--rdzv-endpoint", "h:1", "--rdzv-id", "j", "--nnodes", "1",
                     "--tls-server-name", "h", "--", "x"})
                .status()
                .message()
                .find("--tls-server-name needs --tls-ca"),
            std::string::npos);
}

}  // namespace
}  // namespace rdzv
