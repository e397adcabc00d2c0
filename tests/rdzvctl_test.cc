// rdzvctl's pure parts: the command line and how answers are shown.
#include <string>
#include <vector>

#include "client/ctl/ctl_options.h"
#include "client/ctl/status_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rdzv {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

absl::StatusOr<CtlOptions> Parse(std::vector<std::string> args, EnvList env = {}) {
  return ParseCtlOptions(args, EnvFromList(std::move(env)));
}

TEST(CtlOptionsTest, CommandsWordsAndOptionsInAnyOrder) {
  absl::StatusOr<CtlOptions> o =
      Parse({"--rdzv-endpoint", "h:1", "abort", "job7", "--reason", "bad data", "--json"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->command, CtlCommand::kAbort);
  EXPECT_EQ(o->job, "job7");
  EXPECT_EQ(o->reason, "bad data");
  EXPECT_TRUE(o->json);
  EXPECT_EQ(o->endpoint, "h:1");

  o = Parse({"watch", "--interval", "0.5", "--count", "3", "--nodelist", "n[1-3]"},
            {{"RDZV_ENDPOINT", "head:29400"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->command, CtlCommand::kWatch);
  EXPECT_EQ(o->interval, absl::Milliseconds(500));
  EXPECT_EQ(o->count, 3);
  EXPECT_EQ(o->nodelist, (std::vector<std::string>{"n1", "n2", "n3"}));
  EXPECT_EQ(o->endpoint, "head:29400");

  // The flag wins over the environment.
  o = Parse({"--rdzv-endpoint", "a:1", "health"}, {{"RDZV_ENDPOINT", "b:2"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->endpoint, "a:1");
  EXPECT_EQ(o->command, CtlCommand::kHealth);
}

TEST(CtlOptionsTest, VersionNeedsNoCommand) {
  absl::StatusOr<CtlOptions> o = Parse({"--version"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->version);
  absl::StatusOr<CtlOptions> health = Parse({"--rdzv-endpoint", "h:1", "health"});
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_FALSE(health->version);
}

TEST(CtlOptionsTest, InAWorkerTheJobIsItsOwn) {
  const EnvList worker = {{"RDZV_ENDPOINT", "n1:20417"}, {"RDZV_RUN_ID", "slurm-7.0"}};
  absl::StatusOr<CtlOptions> o = Parse({"status"}, worker);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->job, "slurm-7.0");
  EXPECT_EQ(o->endpoint, "n1:20417");
  o = Parse({"watch", "--count", "2"}, worker);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->job, "slurm-7.0");
  // A job named, or --all, wins; abort always names its job.
  o = Parse({"status", "other"}, worker);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->job, "other");
  o = Parse({"status", "--all"}, worker);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->job, "");
  EXPECT_FALSE(Parse({"abort", "--reason", "x"}, worker).ok());
  o = Parse({"status", "--all", "other"}, worker);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().message(), "--all shows every job; drop it or the job \"other\"");
}

TEST(CtlOptionsTest, MistakesAreOneLineErrorsSayingWhatToDo) {
  const struct {
    std::vector<std::string> args;
    std::string says;
  } cases[] = {
      {{"status"}, "--rdzv-endpoint"},
      {{"--rdzv-endpoint", "a,b,c,d,e,f,g,h,i", "status"}, "give at most 8"},
      {{}, "no command"},
      {{"--rdzv-endpoint", "h:1", "stats"}, "unknown command \"stats\""},
      {{"--rdzv-endpoint", "h:1", "abort", "j"}, "--reason"},
      {{"--rdzv-endpoint", "h:1", "abort", "--reason", "x"}, "abort needs the job"},
      {{"--rdzv-endpoint", "h:1", "health", "extra"}, "unexpected argument \"extra\""},
      {{"--rdzv-endpoint", "h:1", "watch", "--interval", "0"}, "seconds"},
      {{"--rdzv-endpoint", "h:1", "status", "--nodelist", "n[1-"}, "nodelist"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<CtlOptions> o = Parse(c.args);
    ASSERT_FALSE(o.ok()) << c.says;
    EXPECT_THAT(std::string(o.status().message()), HasSubstr(c.says));
    EXPECT_EQ(std::string(o.status().message()).find('\n'), std::string::npos);
  }
}

JobStatusView Job(const std::string& id, const std::string& state, int max_agents,
                  std::vector<std::pair<std::string, int64_t>> agents) {
  JobStatusView job;
  job.job_id = id;
  job.state = state;
  job.round = 1;
  job.min_agents = max_agents;
  job.max_agents = max_agents;
  job.joined = static_cast<int32_t>(agents.size());
  for (const auto& [host, index] : agents) {
    AgentStatusView& a = job.agents.emplace_back();
    a.host = host;
    a.node_index = index;
  }
  return job;
}

TEST(StatusFormatTest, MissingNodesAsAHostlist) {
  const JobStatusView filling = Job("j", "filling", 8, {{"n0", 0}, {"n1", 1}, {"n4", 4}});
  EXPECT_EQ(MissingNodes(filling, {}), "[2-3,5-7]");
  EXPECT_EQ(MissingNodes(filling, {"n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7"}), "n[2-3,5-7]");
  EXPECT_EQ(MissingNodes(Job("j", "filling", 2, {{"a", 0}}), {}), "[1]");
  EXPECT_EQ(MissingNodes(Job("j", "filling", 4, {{"a", -1}}), {}), "3 more");
  EXPECT_EQ(MissingNodes(Job("j", "running", 2, {{"a", 0}, {"b", 1}}), {}), "");
}

TEST(StatusFormatTest, MissingNodesNamedFromTheJobsNodeList) {
  JobStatusView filling = Job("j", "filling", 4, {{"n1", 0}, {"n4", 3}});
  filling.node_list = "n[1-4]";
  EXPECT_EQ(MissingNodes(filling, {}), "n[2-3]");
  // --nodelist wins over the job's list.
  EXPECT_EQ(MissingNodes(filling, {"n1", "n4", "n9"}), "n9");
  // One agent per task: every node has one, more are due.
  JobStatusView tasks = Job("t", "filling", 4, {{"n1", 0}, {"n1", 0}, {"n2", 1}});
  tasks.node_list = "n[1-2]";
  EXPECT_EQ(MissingNodes(tasks, {}), "1 more");
  JobStatusView partly = Job("t", "filling", 4, {{"n1", 0}, {"n1", 0}});
  partly.node_list = "n[1-2]";
  EXPECT_EQ(MissingNodes(partly, {}), "n2");
  // Back to indices when the list cannot be trusted to name the agents: an agent under another
  // name (--host-name), or a list that does not parse.
  JobStatusView renamed = Job("j", "filling", 3, {{"login7", 0}});
  renamed.node_list = "n[1-3]";
  EXPECT_EQ(MissingNodes(renamed, {}), "[1-2]");
  JobStatusView garbled = Job("j", "filling", 2, {{"n1", 0}});
  garbled.node_list = "n[1-";
  EXPECT_EQ(MissingNodes(garbled, {}), "[1]");
  // Past filling nobody is missing.
  JobStatusView running = Job("j", "running", 2, {{"n1", 0}, {"n2", 1}});
  running.node_list = "n[1-2]";
  EXPECT_EQ(MissingNodes(running, {}), "");
}

TEST(StatusFormatTest, TableHasOneLinePerJobWithItsFailure) {
  std::vector<JobStatusView> jobs = {Job("train", "filling", 4, {{"n0", 0}, {"n1", 1}})};
  JobStatusView ended = Job("bad", "ended", 2, {{"n5", 0}, {"n6", 1}});
  ended.abort.emplace().reason = "rank 3 (local rank 1, node 1) on n6 exited with code 3";
  ended.world_size = 4;
  jobs.push_back(ended);
  const std::string table = FormatStatusTable(jobs, {});
  EXPECT_THAT(table, HasSubstr("JOB    STATE    ROUND  AGENTS  WORLD  HOSTS   MISSING  FAILURE\n"));
  EXPECT_THAT(table, HasSubstr("train  filling  1      2/4     -      n[0-1]  [2-3]    -\n"));
  jobs[0].node_list = "n[0-3]";
  EXPECT_THAT(FormatStatusTable(jobs, {}),
              HasSubstr("train  filling  1      2/4     -      n[0-1]  n[2-3]   -\n"));
  EXPECT_THAT(table, HasSubstr("bad    ended    1      2/2     4      n[5-6]  -        rank 3"));
  EXPECT_EQ(FormatStatusTable({}, {}), "no jobs\n");
}

TEST(StatusFormatTest, AServerListNamesTheServerOfEachJob) {
  std::vector<JobStatusView> jobs = {Job("old", "running", 2, {{"n0", 0}, {"n1", 1}}),
                                     Job("new", "filling", 2, {{"n2", 0}})};
  EXPECT_THAT(FormatStatusTable(jobs, {}), Not(HasSubstr("SERVER")));
  jobs[0].server = "head2:29400";
  jobs[1].server = "head:29400";
  const std::string table = FormatStatusTable(jobs, {});
  EXPECT_THAT(table, HasSubstr("JOB  SERVER       STATE    ROUND"));
  EXPECT_THAT(table, HasSubstr("old  head2:29400  running  1"));
  EXPECT_THAT(table, HasSubstr("new  head:29400   filling  1"));
  EXPECT_THAT(StatusJson(jobs), HasSubstr("\"server\":\"head2:29400\""));
}

TEST(StatusFormatTest, NodesLeftOutAreNamedWithWhyAndTheExcludeLine) {
  JobStatusView job = Job("train", "filling", 4, {{"n1", 0}, {"n4", 3}});
  job.node_list = "n[1-4]";
  job.excluded = {ExcludedNode{"n2", 1, Unhealthy{ExclusionKind::kHealthCheckFailed, "ECC"}},
                  ExcludedNode{"n3", 2, Unhealthy{ExclusionKind::kRunDir, "/tmp is full"}}};
  // Nodes left out are not waited for.
  EXPECT_EQ(MissingNodes(job, {}), "");
  const std::string table = FormatStatusTable({job}, {});
  EXPECT_THAT(table, HasSubstr("job train left out n2 (node 1): health check failed: ECC\n"));
  EXPECT_THAT(table,
              HasSubstr("job train left out n3 (node 2): run directory unusable: /tmp is full\n"));
  EXPECT_THAT(table, HasSubstr("  next time: sbatch --exclude=n[2-3]\n"));
  job.node_list.clear();
  job.excluded.pop_back();
  EXPECT_EQ(MissingNodes(job, {}), "[2]");
}

TEST(StatusFormatTest, SparesAndLostNodesAreNamed) {
  JobStatusView job = Job("train", "running", 4, {{"n1", 0}, {"n3", 2}, {"n4", 3}});
  job.agents[2].state = "spare";
  job.agents[2].rank_offset = -1;
  job.excluded = {ExcludedNode{"n2", 1, Unhealthy{ExclusionKind::kNodeLost, ""}}};
  const std::string table = FormatStatusTable({job}, {});
  EXPECT_THAT(table, HasSubstr("job train spares: n4\n"));
  EXPECT_THAT(table, HasSubstr("job train left out n2 (node 1): lost while the job ran\n"));
  EXPECT_THAT(table, HasSubstr("  next time: sbatch --exclude=n2\n"));
  job.agents[2].state = "left";
  EXPECT_THAT(FormatStatusTable({job}, {}), Not(HasSubstr("spares")));
}

// A reply rdzvd trimmed to its size says what it left out, so an operator knows the view is
// partial and how to see the rest.
TEST(StatusFormatTest, TableSaysWhatTheServerLeftOut) {
  std::vector<JobStatusView> jobs = {Job("big", "running", 2, {{"n0", 0}})};
  jobs[0].omitted_agents = 5;
  EXPECT_THAT(FormatStatusTable(jobs, {}, 2),
              HasSubstr("(too much to show: 2 more jobs and 5 agents of 1 jobs left out; rdzvctl "
                        "status JOB shows one job)\n"));
  EXPECT_THAT(FormatStatusTable({}, {}, 4), HasSubstr("4 more jobs"));
  EXPECT_THAT(FormatStatusTable(jobs, {}, 0), HasSubstr("too much to show"));
  jobs[0].omitted_agents = 0;
  EXPECT_THAT(FormatStatusTable(jobs, {}, 0), Not(HasSubstr("too much to show")));
}

// Scripts parse --json: it is rdzv.proto's messages in protobuf's JSON mapping, every field
// named as there and shown even when zero, 64-bit integers as strings.
TEST(StatusFormatTest, JsonIsTheProtocolsJsonMapping) {
  JobStatusView job = Job("train", "filling", 4, {{"n0", 0}});
  job.agents[0].agent_id = "n0-1";
  job.agents[0].nproc = 2;
  EXPECT_EQ(StatusJson({job}),
            R"({"jobs":[{"job_id":"train","round":1,"state":"filling","joined":1,)"
            R"("min_agents":4,"max_agents":4,"world_size":0,"agents":[{"agent_id":"n0-1",)"
            R"("host":"n0","node_index":"0","nproc":2,"rank_offset":-1,"state":""}],)"
            R"("node_list":"","omitted_agents":0,"excluded":[],"server":""}],"omitted_jobs":0})");
  EXPECT_EQ(StatusJson({}), R"({"jobs":[],"omitted_jobs":0})");
  EXPECT_THAT(StatusJson({}, 3), HasSubstr(R"("omitted_jobs":3)"));

  AbortEvent stop;
  stop.cause = AbortCause::kAgentSignalled;
  stop.reason = "aborted with rdzvctl: node maintenance";
  stop.exit_code = 143;
  job.state = "ended";
  job.abort = stop;
  EXPECT_THAT(StatusJson({job}),
              HasSubstr(R"("abort":{"reason":"aborted with rdzvctl: node maintenance",)"
                        R"("exit_code":143,"cause":"ABORT_CAUSE_AGENT_SIGNALLED"})"));
  EXPECT_EQ(AbortJson(stop), R"({"abort":{"reason":"aborted with rdzvctl: node maintenance",)"
                             R"("exit_code":143,"cause":"ABORT_CAUSE_AGENT_SIGNALLED"}})");

  EXPECT_EQ(HealthJson(ServingStatus::kServing), R"({"status":"SERVING"})");
  EXPECT_EQ(HealthJson(ServingStatus::kUnknown), R"({"status":"UNKNOWN"})");
  EXPECT_EQ(ServingStatusName(ServingStatus::kNotServing), "NOT_SERVING");
}

}  // namespace
}  // namespace rdzv
