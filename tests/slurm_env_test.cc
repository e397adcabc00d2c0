#include "common/core/slurm_env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/process_env.h"

namespace rdzv {
namespace {

using Vars = std::map<std::string, std::string>;

EnvLookup FakeEnv(Vars vars) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// Renders every field, so that a mismatch shows which one differs.
std::string Describe(const SlurmEnv& s) {
  return absl::StrCat("job_id=", s.job_id, " step_id=", s.step_id, " num_nodes=", s.num_nodes,
                      " node_id=", s.node_id, " proc_id=", s.proc_id, " local_id=", s.local_id,
                      " num_tasks=", s.num_tasks, " tasks_per_node={",
                      absl::StrJoin(s.tasks_per_node, ","), "} nodes={",
                      absl::StrJoin(s.nodes, ","), "} node_name=", s.node_name,
                      " gpus_on_node=", s.gpus_on_node, " cpus_per_task=", s.cpus_per_task,
                      " in_step=", s.in_step());
}

// What `srun -N3 --ntasks-per-node=1` gives the task on the second node.
const Vars kPerNodeStep = {
    {"SLURM_JOB_ID", "1234"},
    {"SLURM_JOBID", "1234"},
    {"SLURM_STEP_ID", "0"},
    {"SLURM_STEPID", "0"},
    {"SLURM_JOB_NUM_NODES", "3"},
    {"SLURM_NNODES", "3"},
    {"SLURM_STEP_NUM_NODES", "3"},
    {"SLURM_JOB_NODELIST", "gpu[001-003]"},
    {"SLURM_NODELIST", "gpu[001-003]"},
    {"SLURM_STEP_NODELIST", "gpu[001-003]"},
    {"SLURM_NTASKS", "3"},
    {"SLURM_NPROCS", "3"},
    {"SLURM_STEP_NUM_TASKS", "3"},
    {"SLURM_TASKS_PER_NODE", "1(x3)"},
    {"SLURM_STEP_TASKS_PER_NODE", "1(x3)"},
    {"SLURM_NODEID", "1"},
    {"SLURM_PROCID", "1"},
    {"SLURM_LOCALID", "0"},
    {"SLURMD_NODENAME", "gpu002"},
    {"SLURM_GPUS_ON_NODE", "8"},
    {"SLURM_CPUS_PER_TASK", "16"},
};

// What `srun -N2 -n4` gives the last task, the second on the second node.
const Vars kPerTaskStep = {
    {"SLURM_JOB_ID", "77"},
    {"SLURM_STEP_ID", "3"},
    {"SLURM_JOB_NUM_NODES", "2"},
    {"SLURM_NNODES", "2"},
    {"SLURM_STEP_NUM_NODES", "2"},
    {"SLURM_JOB_NODELIST", "n[1-2]"},
    {"SLURM_NODELIST", "n[1-2]"},
    {"SLURM_STEP_NODELIST", "n[1-2]"},
    {"SLURM_NTASKS", "4"},
    {"SLURM_STEP_NUM_TASKS", "4"},
    {"SLURM_TASKS_PER_NODE", "2(x2)"},
    {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
    {"SLURM_NODEID", "1"},
    {"SLURM_PROCID", "3"},
    {"SLURM_LOCALID", "1"},
    {"SLURMD_NODENAME", "n2"},
};

// What `srun -N2 -n3` gives the second task: two tasks land on the first node.
const Vars kUnevenStep = {
    {"SLURM_JOB_ID", "78"},          {"SLURM_STEP_ID", "0"},
    {"SLURM_NNODES", "2"},           {"SLURM_STEP_NUM_NODES", "2"},
    {"SLURM_NODELIST", "n[1-2]"},    {"SLURM_STEP_NODELIST", "n[1-2]"},
    {"SLURM_NTASKS", "3"},           {"SLURM_STEP_NUM_TASKS", "3"},
    {"SLURM_TASKS_PER_NODE", "2,1"}, {"SLURM_STEP_TASKS_PER_NODE", "2,1"},
    {"SLURM_NODEID", "0"},           {"SLURM_PROCID", "1"},
    {"SLURM_LOCALID", "1"},          {"SLURMD_NODENAME", "n1"},
};

// What a batch script of `sbatch -N4 --ntasks-per-node=4` sees: the job, but no step.
const Vars kBatchScript = {
    {"SLURM_JOB_ID", "90"},           {"SLURM_JOBID", "90"},
    {"SLURM_JOB_NUM_NODES", "4"},     {"SLURM_NNODES", "4"},
    {"SLURM_JOB_NODELIST", "n[1-4]"}, {"SLURM_NODELIST", "n[1-4]"},
    {"SLURM_NTASKS", "16"},           {"SLURM_TASKS_PER_NODE", "4(x4)"},
    {"SLURMD_NODENAME", "n1"},        {"SLURM_CPUS_ON_NODE", "64"},
};

Vars With(Vars vars, const Vars& changes) {
  for (const auto& [name, value] : changes) vars[name] = value;
  return vars;
}

Vars Without(Vars vars, const std::vector<std::string>& names) {
  for (const std::string& name : names) vars.erase(name);
  return vars;
}

SlurmEnv Env(std::string job_id, std::string step_id, int num_nodes, int node_id, int proc_id,
             int local_id, int num_tasks, std::vector<int> tasks_per_node,
             std::vector<std::string> nodes, std::string node_name, int gpus_on_node = -1,
             int cpus_per_task = -1) {
  SlurmEnv s;
  s.job_id = std::move(job_id);
  s.step_id = std::move(step_id);
  s.num_nodes = num_nodes;
  s.node_id = node_id;
  s.proc_id = proc_id;
  s.local_id = local_id;
  s.num_tasks = num_tasks;
  s.tasks_per_node = std::move(tasks_per_node);
  s.nodes = std::move(nodes);
  s.node_name = std::move(node_name);
  s.gpus_on_node = gpus_on_node;
  s.cpus_per_task = cpus_per_task;
  return s;
}

struct ParseCase {
  std::string name;
  Vars vars;
  SlurmEnv expected;
};

const ParseCase kParseCases[] = {
    {"per_node_step", kPerNodeStep,
     Env("1234", "0", 3, 1, 1, 0, 3, {1, 1, 1}, {"gpu001", "gpu002", "gpu003"}, "gpu002", 8, 16)},
    {"per_task_step", kPerTaskStep, Env("77", "3", 2, 1, 3, 1, 4, {2, 2}, {"n1", "n2"}, "n2")},
    {"uneven_step", kUnevenStep, Env("78", "0", 2, 0, 1, 1, 3, {2, 1}, {"n1", "n2"}, "n1")},
    {"uneven_step_last_task",
     With(kUnevenStep, {{"SLURM_NODEID", "1"},
                        {"SLURM_PROCID", "2"},
                        {"SLURM_LOCALID", "0"},
                        {"SLURMD_NODENAME", "n2"}}),
     Env("78", "0", 2, 1, 2, 0, 3, {2, 1}, {"n1", "n2"}, "n2")},
    {"batch_script_without_step", kBatchScript,
     Env("90", "", 4, -1, -1, -1, 16, {4, 4, 4, 4}, {"n1", "n2", "n3", "n4"}, "n1")},
    // The batch shell is itself task 0 on node 0, and Slurm says so, but it is not in a step.
    {"batch_script_with_task_ids",
     With(kBatchScript, {{"SLURM_NODEID", "0"}, {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}}),
     Env("90", "", 4, 0, 0, 0, 16, {4, 4, 4, 4}, {"n1", "n2", "n3", "n4"}, "n1")},
    {"salloc_without_ntasks", Without(kBatchScript, {"SLURM_NTASKS"}),
     Env("90", "", 4, -1, -1, -1, 0, {4, 4, 4, 4}, {"n1", "n2", "n3", "n4"}, "n1")},
    {"job_id_only", {{"SLURM_JOB_ID", "5"}}, Env("5", "", 0, -1, -1, -1, 0, {}, {}, "")},
    {"legacy_names",
     {{"SLURM_JOBID", "6"},
      {"SLURM_STEPID", "1"},
      {"SLURM_NNODES", "2"},
      {"SLURM_NPROCS", "2"},
      {"SLURM_NODELIST", "a,b"},
      {"SLURM_TASKS_PER_NODE", "1(x2)"},
      {"SLURM_PROCID", "0"}},
     Env("6", "1", 2, -1, 0, -1, 2, {1, 1}, {"a", "b"}, "")},
    // srun -N2 inside a 4-node allocation: the step, not the job, describes this task.
    {"step_inside_larger_job",
     With(kPerTaskStep,
          {{"SLURM_JOB_NUM_NODES", "4"}, {"SLURM_JOB_NODELIST", "n[1-4]"}, {"SLURM_NNODES", "2"}}),
     Env("77", "3", 2, 1, 3, 1, 4, {2, 2}, {"n1", "n2"}, "n2")},
    // Older srun without the SLURM_STEP_* copies still rewrites SLURM_NNODES and SLURM_NODELIST.
    {"step_without_step_copies",
     {{"SLURM_JOB_ID", "8"},
      {"SLURM_STEP_ID", "0"},
      {"SLURM_JOB_NUM_NODES", "4"},
      {"SLURM_JOB_NODELIST", "n[1-4]"},
      {"SLURM_NNODES", "2"},
      {"SLURM_NODELIST", "n[1-2]"},
      {"SLURM_TASKS_PER_NODE", "1(x2)"},
      {"SLURM_NODEID", "1"},
      {"SLURM_PROCID", "1"}},
     Env("8", "0", 2, 1, 1, -1, 0, {1, 1}, {"n1", "n2"}, "")},
    {"empty_values_are_unset",
     With(kPerNodeStep, {{"SLURM_STEP_ID", ""}, {"SLURM_STEPID", ""}, {"SLURM_GPUS_ON_NODE", ""}}),
     Env("1234", "", 3, 1, 1, 0, 3, {1, 1, 1}, {"gpu001", "gpu002", "gpu003"}, "gpu002", -1, 16)},
    {"zero_gpus", With(kPerNodeStep, {{"SLURM_GPUS_ON_NODE", "0"}}),
     Env("1234", "0", 3, 1, 1, 0, 3, {1, 1, 1}, {"gpu001", "gpu002", "gpu003"}, "gpu002", 0, 16)},
};

TEST(ParseSlurmEnvTest, Parses) {
  for (const ParseCase& c : kParseCases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<std::optional<SlurmEnv>> env = ParseSlurmEnv(FakeEnv(c.vars));
    ASSERT_TRUE(env.ok()) << env.status();
    ASSERT_TRUE(env->has_value());
    EXPECT_EQ(Describe(**env), Describe(c.expected));
  }
}

// `srun -N1 -n1 -w n2` inside a 3-node allocation: the step has one node, the job three.
TEST(ParseSlurmEnvTest, KeepsTheAllocationBesideTheStep) {
  const Vars one_node_step = {
      {"SLURM_JOB_ID", "40"},       {"SLURM_STEP_ID", "1"},
      {"SLURM_JOB_NUM_NODES", "3"}, {"SLURM_JOB_NODELIST", "n[1-3]"},
      {"SLURM_NNODES", "1"},        {"SLURM_STEP_NUM_NODES", "1"},
      {"SLURM_NODELIST", "n2"},     {"SLURM_STEP_NODELIST", "n2"},
      {"SLURM_NTASKS", "1"},        {"SLURM_STEP_TASKS_PER_NODE", "1"},
      {"SLURM_NODEID", "0"},        {"SLURM_PROCID", "0"},
      {"SLURM_LOCALID", "0"},       {"SLURMD_NODENAME", "n2"},
  };
  absl::StatusOr<std::optional<SlurmEnv>> env = ParseSlurmEnv(FakeEnv(one_node_step));
  ASSERT_TRUE(env.ok()) << env.status();
  ASSERT_TRUE(env->has_value());
  EXPECT_EQ((*env)->num_nodes, 1);
  EXPECT_EQ((*env)->nodes, std::vector<std::string>{"n2"});
  EXPECT_EQ((*env)->job_num_nodes, 3);
  EXPECT_EQ((*env)->job_nodes, (std::vector<std::string>{"n1", "n2", "n3"}));
  // Without the job's variables the allocation is unknown, not guessed from the step.
  env =
      ParseSlurmEnv(FakeEnv(Without(one_node_step, {"SLURM_JOB_NUM_NODES", "SLURM_JOB_NODELIST"})));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ((*env)->job_num_nodes, 0);
  EXPECT_TRUE((*env)->job_nodes.empty());
}

TEST(ParseSlurmEnvTest, InStepOnlyUnderSrun) {
  EXPECT_TRUE((*ParseSlurmEnv(FakeEnv(kPerNodeStep)))->in_step());
  EXPECT_TRUE((*ParseSlurmEnv(FakeEnv(kUnevenStep)))->in_step());
  EXPECT_FALSE((*ParseSlurmEnv(FakeEnv(kBatchScript)))->in_step());
  EXPECT_FALSE((*ParseSlurmEnv(FakeEnv(With(kBatchScript, {{"SLURM_PROCID", "0"}}))))->in_step());
  EXPECT_FALSE((*ParseSlurmEnv(FakeEnv(Without(kPerNodeStep, {"SLURM_PROCID"}))))->in_step());
}

TEST(ParseSlurmEnvTest, OutsideSlurm) {
  for (const Vars& vars :
       {Vars{}, Vars{{"SLURM_NODEID", "1"}, {"SLURM_PROCID", "x"}}, Vars{{"SLURM_JOB_ID", ""}}}) {
    absl::StatusOr<std::optional<SlurmEnv>> env = ParseSlurmEnv(FakeEnv(vars));
    ASSERT_TRUE(env.ok()) << env.status();
    EXPECT_FALSE(env->has_value());
  }
}

struct ErrorCase {
  std::string name;
  Vars vars;
  // Each must appear in the message: the variable, its bad value, and what was wrong.
  std::vector<std::string> wants;
};

const ErrorCase kErrorCases[] = {
    {"node_id_not_numeric",
     With(kPerNodeStep, {{"SLURM_NODEID", "1a"}}),
     {"SLURM_NODEID=\"1a\" is malformed (not all digits); expected a non-negative integer"}},
    {"proc_id_negative",
     With(kPerNodeStep, {{"SLURM_PROCID", "-1"}}),
     {"SLURM_PROCID=\"-1\" is malformed", "non-negative integer"}},
    {"local_id_with_space",
     With(kPerNodeStep, {{"SLURM_LOCALID", " 0"}}),
     {"SLURM_LOCALID=\" 0\" is malformed"}},
    {"node_id_huge",
     With(kPerNodeStep, {{"SLURM_NODEID", "99999999999"}}),
     {"SLURM_NODEID=\"99999999999\" is too large"}},
    {"num_nodes_zero",
     With(kBatchScript, {{"SLURM_NNODES", "0"}}),
     {"SLURM_NNODES=\"0\" is invalid (below 1); expected a positive integer"}},
    {"step_num_nodes_text",
     With(kPerNodeStep, {{"SLURM_STEP_NUM_NODES", "three"}}),
     {"SLURM_STEP_NUM_NODES=\"three\" is malformed"}},
    {"num_tasks_text",
     With(kBatchScript, {{"SLURM_NTASKS", "x"}}),
     {"SLURM_NTASKS=\"x\" is malformed"}},
    {"step_num_tasks_float",
     With(kPerNodeStep, {{"SLURM_STEP_NUM_TASKS", "3.0"}}),
     {"SLURM_STEP_NUM_TASKS=\"3.0\" is malformed"}},
    {"gpus_text",
     With(kPerNodeStep, {{"SLURM_GPUS_ON_NODE", "eight"}}),
     {"SLURM_GPUS_ON_NODE=\"eight\" is malformed"}},
    {"cpus_per_task_zero",
     With(kPerNodeStep, {{"SLURM_CPUS_PER_TASK", "0"}}),
     {"SLURM_CPUS_PER_TASK=\"0\" is invalid"}},
    {"tasks_per_node_missing_paren",
     With(kBatchScript, {{"SLURM_TASKS_PER_NODE", "2(x3"}}),
     {"SLURM_TASKS_PER_NODE=\"2(x3\" is malformed (missing ')'); expected e.g. 2(x3),1"}},
    {"step_tasks_per_node_missing_x",
     With(kPerNodeStep, {{"SLURM_STEP_TASKS_PER_NODE", "1(3)"}}),
     {"SLURM_STEP_TASKS_PER_NODE=\"1(3)\" is malformed", "missing 'x'"}},
    {"tasks_per_node_zero",
     With(kBatchScript, {{"SLURM_TASKS_PER_NODE", "0(x4)"}}),
     {"SLURM_TASKS_PER_NODE=\"0(x4)\" is invalid", "task count 0"}},
    {"job_nodelist_missing_bracket",
     Without(With(kBatchScript, {{"SLURM_JOB_NODELIST", "n["}}), {"SLURM_NODELIST"}),
     {"SLURM_JOB_NODELIST=\"n[\" is malformed (missing ']')"}},
    {"step_nodelist_descending",
     With(kPerNodeStep, {{"SLURM_STEP_NODELIST", "gpu[003-001]"}}),
     {"SLURM_STEP_NODELIST=\"gpu[003-001]\" is malformed", "descending range"}},
    {"node_id_beyond_nodes",
     With(kPerNodeStep, {{"SLURM_NODEID", "3"}}),
     {"SLURM_NODEID=\"3\" contradicts SLURM_STEP_NUM_NODES=\"3\"", "below the node count 3"}},
    {"node_id_beyond_nodelist",
     {{"SLURM_JOB_ID", "1"}, {"SLURM_NODELIST", "n[1-2]"}, {"SLURM_NODEID", "2"}},
     {"SLURM_NODEID=\"2\" contradicts SLURM_NODELIST=\"n[1-2]\""}},
    {"nodelist_longer_than_node_count",
     With(kBatchScript, {{"SLURM_NNODES", "3"}}),
     {"SLURM_NODELIST=\"n[1-4]\" contradicts SLURM_NNODES=\"3\"", "names 4 nodes"}},
    {"tasks_per_node_longer_than_nodelist",
     With(kUnevenStep, {{"SLURM_STEP_TASKS_PER_NODE", "1(x3)"}}),
     {"SLURM_STEP_TASKS_PER_NODE=\"1(x3)\" contradicts SLURM_STEP_NODELIST=\"n[1-2]\"",
      "3 task counts for 2 nodes"}},
    {"tasks_per_node_against_node_count",
     {{"SLURM_JOB_ID", "1"}, {"SLURM_NNODES", "3"}, {"SLURM_TASKS_PER_NODE", "2,1"}},
     {"SLURM_TASKS_PER_NODE=\"2,1\" contradicts SLURM_NNODES=\"3\""}},
    {"local_id_beyond_node_tasks",
     With(kUnevenStep, {{"SLURM_NODEID", "1"}, {"SLURM_PROCID", "2"}, {"SLURM_LOCALID", "1"}}),
     {"SLURM_LOCALID=\"1\" contradicts SLURM_STEP_TASKS_PER_NODE=\"2,1\"",
      "node 1 has 1 task(s), so local ids stop at 0"}},
    {"proc_id_beyond_tasks",
     With(kPerTaskStep, {{"SLURM_PROCID", "4"}}),
     {"SLURM_PROCID=\"4\" contradicts SLURM_STEP_NUM_TASKS=\"4\"", "task ids stop at 3"}},
    {"job_nodelist_shorter_than_job_node_count",
     With(kPerNodeStep, {{"SLURM_JOB_NODELIST", "gpu[001-002]"}}),
     {"SLURM_JOB_NODELIST=\"gpu[001-002]\" contradicts SLURM_JOB_NUM_NODES=\"3\"",
      "the list names 2 nodes"}},
    {"job_node_count_zero",
     With(kPerNodeStep, {{"SLURM_JOB_NUM_NODES", "0"}}),
     {"SLURM_JOB_NUM_NODES=\"0\" is invalid (below 1)"}},
};

TEST(ParseSlurmEnvTest, RefusesMalformedOrContradictoryValues) {
  for (const ErrorCase& c : kErrorCases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<std::optional<SlurmEnv>> env = ParseSlurmEnv(FakeEnv(c.vars));
    ASSERT_FALSE(env.ok());
    EXPECT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(env.status().message());
    EXPECT_FALSE(absl::StrContains(message, "\n")) << message;
    for (const std::string& want : c.wants) {
      EXPECT_TRUE(absl::StrContains(message, want)) << message << "\nwanted: " << want;
    }
  }
}

TEST(ParseSlurmEnvTest, MessageMatchesTheModelLine) {
  absl::StatusOr<std::optional<SlurmEnv>> env =
      ParseSlurmEnv(FakeEnv(With(kBatchScript, {{"SLURM_TASKS_PER_NODE", "2(x3"}})));
  EXPECT_EQ(env.status().message(),
            "SLURM_TASKS_PER_NODE=\"2(x3\" is malformed (missing ')'); expected e.g. 2(x3),1");
}

TEST(ProcessEnvTest, ReadsTheProcessEnvironment) {
  constexpr char kName[] = "RDZV_SLURM_ENV_TEST_VARIABLE";
  ASSERT_EQ(setenv(kName, "value", 1), 0);
  EXPECT_EQ(ProcessEnv()(kName), "value");
  ASSERT_EQ(unsetenv(kName), 0);
  EXPECT_EQ(ProcessEnv()(kName), std::nullopt);
}

}  // namespace
}  // namespace rdzv
