#include "client/agent/core/worker_shape.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/agent/shaping_launcher.h"
#include "common/core/env.h"

namespace rdzv {
namespace {

// A worker's launch as the agent builds it: torchrun's variables over the agent's SLURM_*.
ProcessSpec Worker(int rank, int local, int group, int world, int groups, int local_world,
                   const std::string& workers_per_node = "") {
  ProcessSpec spec;
  spec.workers_per_node = workers_per_node;
  spec.argv = {"python3", "train.py"};
  spec.env = {"SLURM_PROCID=1",
              "SLURM_LOCALID=0",
              "SLURM_NTASKS=2",
              "SLURM_JOB_ID=42",
              "PATH=/usr/bin",
              "CUDA_VISIBLE_DEVICES=2",
              absl::StrCat("RANK=", rank),
              absl::StrCat("LOCAL_RANK=", local),
              absl::StrCat("GROUP_RANK=", group),
              absl::StrCat("WORLD_SIZE=", world),
              absl::StrCat("GROUP_WORLD_SIZE=", groups),
              absl::StrCat("LOCAL_WORLD_SIZE=", local_world)};
  return spec;
}

std::string Value(const ProcessSpec& spec, const std::string& name) {
  std::string found = "<unset>";
  int times = 0;
  for (const std::string& e : spec.env) {
    if (e.rfind(name + "=", 0) == 0) {
      found = e.substr(name.size() + 1);
      ++times;
    }
  }
  EXPECT_LE(times, 1) << name << " is set " << times << " times";
  return found;
}

SlurmEnv TwoNodeStep() {
  SlurmEnv s;
  s.job_id = "42";
  s.step_id = "0";
  s.proc_id = 1;
  s.num_nodes = 2;
  s.nodes = {"n1", "n2"};
  s.tasks_per_node = {1, 1};
  return s;
}

TEST(ShapeWorkerTest, NothingAskedLeavesTheLaunchAlone) {
  const ProcessSpec spec = Worker(3, 1, 1, 4, 2, 2);
  absl::StatusOr<ShapedWorker> shaped = ShapeWorker(WorkerShape{}, spec);
  ASSERT_TRUE(shaped.ok()) << shaped.status();
  EXPECT_EQ(shaped->spec.env, spec.env);
  EXPECT_EQ(shaped->spec.argv, spec.argv);
  EXPECT_TRUE(shaped->notes.empty());
}

TEST(ShapeWorkerTest, PerNodeWorkersSeeSlurmTasksMatchingTheirRanks) {
  WorkerShape shape;
  shape.slurm_tasks = TwoNodeStep();
  const struct { int rank, local, group; } workers[] = {{0, 0, 0}, {1, 1, 0}, {2, 0, 1}, {3, 1, 1}};
  for (const auto& w : workers) {
    shape.slurm_tasks->node_name = w.group == 0 ? "n1" : "n2";
    absl::StatusOr<ShapedWorker> shaped =
        ShapeWorker(shape, Worker(w.rank, w.local, w.group, 4, 2, 2, "2(x2)"));
    ASSERT_TRUE(shaped.ok()) << shaped.status();
    const ProcessSpec& s = shaped->spec;
    EXPECT_EQ(Value(s, "SLURM_PROCID"), absl::StrCat(w.rank));
    EXPECT_EQ(Value(s, "SLURM_LOCALID"), absl::StrCat(w.local));
    EXPECT_EQ(Value(s, "SLURM_NODEID"), absl::StrCat(w.group));
    EXPECT_EQ(Value(s, "SLURM_NTASKS"), "4");
    EXPECT_EQ(Value(s, "SLURM_NTASKS_PER_NODE"), "2");
    EXPECT_EQ(Value(s, "SLURM_TASKS_PER_NODE"), "2(x2)");
    EXPECT_EQ(Value(s, "SLURM_NODELIST"), "n[1-2]");
    EXPECT_EQ(Value(s, "SLURM_GTIDS"), w.group == 0 ? "0,1" : "2,3");
    EXPECT_EQ(Value(s, "SLURM_JOB_ID"), "42");  // job-wide ones stay
    EXPECT_EQ(s.own_pid_variable, "SLURM_TASK_PID");
    EXPECT_EQ(s.argv, (std::vector<std::string>{"python3", "train.py"}));
    EXPECT_EQ(shaped->notes.size(), 1u);
    EXPECT_FALSE(shaped->warning);
  }
}

TEST(ShapeWorkerTest, JobNodesNameTheNodesOfAJobOfSeveralSteps) {
  WorkerShape shape;
  shape.slurm_tasks = TwoNodeStep();
  shape.slurm_tasks->nodes = {"n2"};
  shape.slurm_tasks->node_name = "n2";
  shape.job_nodes = {"n1", "n2", "n3"};
  absl::StatusOr<ShapedWorker> shaped = ShapeWorker(shape, Worker(2, 0, 1, 3, 3, 1));
  ASSERT_TRUE(shaped.ok()) << shaped.status();
  EXPECT_EQ(Value(shaped->spec, "SLURM_NODELIST"), "n[1-3]");
  EXPECT_EQ(Value(shaped->spec, "SLURM_STEP_NUM_NODES"), "3");
}

// Nodes running 2, 1 and 3 workers: every worker sees the whole job's counts, from the round's
// assignment, and none sees the agent's SLURM_NTASKS_PER_NODE (srun sets none on uneven nodes).
TEST(ShapeWorkerTest, UnevenNodesEachSeeTheWholeJob) {
  const std::vector<int> counts = {2, 1, 3};
  const std::vector<std::string> nodes = {"n1", "n2", "n3"};
  int rank = 0;
  for (int node = 0; node < 3; ++node) {
    WorkerShape shape;
    shape.slurm_tasks = TwoNodeStep();
    shape.slurm_tasks->num_nodes = 3;
    shape.slurm_tasks->nodes = nodes;
    shape.slurm_tasks->tasks_per_node = {1, 1, 1};
    shape.slurm_tasks->node_name = nodes[node];
    int first = rank;
    for (int local = 0; local < counts[node]; ++local, ++rank) {
      ProcessSpec spec = Worker(rank, local, node, 6, 3, counts[node], "2,1,3");
      spec.env.push_back("SLURM_NTASKS_PER_NODE=1");
      spec.env.push_back("SLURM_TASKS_PER_NODE=1(x3)");
      absl::StatusOr<ShapedWorker> shaped = ShapeWorker(shape, spec);
      ASSERT_TRUE(shaped.ok()) << shaped.status();
      const ProcessSpec& s = shaped->spec;
      EXPECT_EQ(Value(s, "SLURM_PROCID"), absl::StrCat(rank));
      EXPECT_EQ(Value(s, "SLURM_LOCALID"), absl::StrCat(local));
      EXPECT_EQ(Value(s, "SLURM_NODEID"), absl::StrCat(node));
      EXPECT_EQ(Value(s, "SLURM_NTASKS"), "6");
      EXPECT_EQ(Value(s, "SLURM_TASKS_PER_NODE"), "2,1,3");
      EXPECT_EQ(Value(s, "SLURM_NTASKS_PER_NODE"), "<unset>");
      std::vector<std::string> gtids;
      for (int i = 0; i < counts[node]; ++i) gtids.push_back(absl::StrCat(first + i));
      EXPECT_EQ(Value(s, "SLURM_GTIDS"), absl::StrJoin(gtids, ","));
      EXPECT_EQ(Value(s, "SLURM_NODELIST"), "n[1-3]");
    }
  }
}

// --standalone in an sbatch script: the batch step's SLURM_PROCID=0, SLURM_GTIDS=0 and the
// allocation's node list give way to a one-node step of the workers.
TEST(ShapeWorkerTest, StandaloneInABatchScriptIsAOneNodeStep) {
  WorkerShape shape;
  SlurmEnv batch;
  batch.job_id = "42";
  batch.proc_id = 0;
  batch.node_id = 0;
  batch.local_id = 0;
  batch.num_nodes = 3;
  batch.nodes = {"n1", "n2", "n3"};
  batch.tasks_per_node = {1, 1, 1};
  batch.node_name = "n1";
  shape.slurm_tasks = batch;
  shape.job_nodes = {"n1"};
  for (int r = 0; r < 3; ++r) {
    ProcessSpec spec = Worker(r, r, 0, 3, 1, 3, "3");
    spec.env.push_back("SLURM_GTIDS=0");
    spec.env.push_back("SLURM_NODELIST=n[1-3]");
    spec.env.push_back("SLURM_TASK_PID=77");
    absl::StatusOr<ShapedWorker> shaped = ShapeWorker(shape, spec);
    ASSERT_TRUE(shaped.ok()) << shaped.status();
    const ProcessSpec& s = shaped->spec;
    EXPECT_EQ(Value(s, "SLURM_PROCID"), absl::StrCat(r));
    EXPECT_EQ(Value(s, "SLURM_LOCALID"), absl::StrCat(r));
    EXPECT_EQ(Value(s, "SLURM_NODEID"), "0");
    EXPECT_EQ(Value(s, "SLURM_GTIDS"), "0,1,2");
    EXPECT_EQ(Value(s, "SLURM_NTASKS"), "3");
    EXPECT_EQ(Value(s, "SLURM_TASKS_PER_NODE"), "3");
    EXPECT_EQ(Value(s, "SLURM_NNODES"), "1");
    EXPECT_EQ(Value(s, "SLURM_NODELIST"), "n1");
    EXPECT_EQ(s.own_pid_variable, "SLURM_TASK_PID");  // the launcher writes the worker's pid
  }
}

TEST(ShapeWorkerTest, LauncherPlaceIsHiddenAndItsSocketClosed) {
  ProcessSpec spec = Worker(1, 1, 0, 2, 1, 2);
  for (const char* e :
       {"PMI_RANK=1", "PMI_SIZE=2", "PMI_FD=7", "PMI_JOBID=5.0", "PMIX_RANK=1",
        "PMIX_NAMESPACE=slurm.pmix.5.0", "OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_LOCAL_RANK=0",
        "OMPI_UNIVERSE_SIZE=2", "OMPI_MCA_ess_base_jobid=3", "OMPI_MCA_orte_hnp_uri=x",
        "MPI_LOCALRANKID=0", "MV2_COMM_WORLD_RANK=1", "OMPI_MCA_btl=self,tcp", "I_MPI_PIN=0",
        "SLURM_MPI_TYPE=pmi2"}) {
    spec.env.push_back(e);
  }
  WorkerShape shape;
  shape.hide_launcher_env = true;
  absl::StatusOr<ShapedWorker> shaped = ShapeWorker(shape, spec);
  ASSERT_TRUE(shaped.ok()) << shaped.status();
  for (const char* gone : {"PMI_RANK", "PMI_SIZE", "PMI_FD", "PMI_JOBID", "PMIX_RANK",
                           "PMIX_NAMESPACE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                           "OMPI_UNIVERSE_SIZE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_hnp_uri",
                           "MPI_LOCALRANKID", "MV2_COMM_WORLD_RANK"}) {
    EXPECT_EQ(Value(shaped->spec, gone), "<unset>") << gone;
  }
  // The user's settings for MPI itself stay.
  EXPECT_EQ(Value(shaped->spec, "OMPI_MCA_btl"), "self,tcp");
  EXPECT_EQ(Value(shaped->spec, "I_MPI_PIN"), "0");
  EXPECT_EQ(Value(shaped->spec, "SLURM_MPI_TYPE"), "pmi2");
  EXPECT_EQ(Value(shaped->spec, "RANK"), "1");
  EXPECT_EQ(shaped->spec.close_fds, std::vector<int>{7});
  ASSERT_EQ(shaped->notes.size(), 1u);
  EXPECT_NE(shaped->notes[0].find("PMI_FD, PMI_JOBID, PMI_RANK"), std::string::npos)
      << shaped->notes[0];
  EXPECT_NE(shaped->notes[0].find("--mpi-env keep"), std::string::npos) << shaped->notes[0];

  // Per-task mode, or --mpi-env keep: as they were.
  shaped = ShapeWorker(WorkerShape{}, spec);
  ASSERT_TRUE(shaped.ok()) << shaped.status();
  EXPECT_EQ(shaped->spec.env, spec.env);
  EXPECT_TRUE(shaped->spec.close_fds.empty());
  // Nothing to hide: no note; a descriptor that cannot be the launcher's is left alone.
  ProcessSpec plain = Worker(0, 0, 0, 1, 1, 1);
  shaped = ShapeWorker(shape, plain);
  ASSERT_TRUE(shaped.ok()) << shaped.status();
  EXPECT_TRUE(shaped->notes.empty());
  plain.env.push_back("PMI_FD=1");
  shaped = ShapeWorker(shape, plain);
  ASSERT_TRUE(shaped.ok()) << shaped.status();
  EXPECT_TRUE(shaped->spec.close_fds.empty());
  EXPECT_EQ(Value(shaped->spec, "PMI_FD"), "<unset>");
}

TEST(ShapeWorkerTest, PassLocalRankAppendsIt) {
  WorkerShape shape;
  shape.pass_local_rank = true;
  absl::StatusOr<ShapedWorker> shaped = ShapeWorker(shape, Worker(3, 1, 1, 4, 2, 2));
  ASSERT_TRUE(shaped.ok()) << shaped.status();
  EXPECT_EQ(shaped->spec.argv, (std::vector<std::string>{"python3", "train.py", "--local_rank=1"}));
  EXPECT_EQ(Value(shaped->spec, "SLURM_PROCID"), "1");  // not asked for: the agent's
}

TEST(ShapeWorkerTest, OneGpuPerTaskDeviceView) {
  const struct {
    const char* name;
    std::string task_device;
    std::vector<std::string> node_devices;
    int local_rank;
    std::string expected_cvd;
    bool warning;
  } cases[] = {
      {"local rank 0 keeps its device", "0", {"0", "1", "2", "3"}, 0, "0", false},
      {"own GPU at index LOCAL_RANK", "2", {"0", "1", "2", "3"}, 2, "0,1,2,3", false},
      {"out of order", "3", {"0", "1", "2", "3"}, 1, "0,3,1,2", false},
      {"renumbered by cgroups: no view", "0", {"0", "1", "2", "3"}, 2, "0", true},
      {"node GPUs unknown", "2", {}, 2, "2", true},
      {"too few node GPUs", "1", {"0", "1"}, 3, "1", true},
      // The step holds GPUs 1-3 of the node. Without cgroups its tasks see the node's numbers;
      // confined with step cgroups they see 0-2, and "2" is then the node's GPU 3.
      {"node numbering, step without GPU 0", "2", {"1", "2", "3"}, 1, "1,2,3", false},
      {"node numbering past the step's count", "3", {"1", "2", "3"}, 2, "1,2,3", false},
      {"renumbered by step cgroups: no view", "2", {"1", "2", "3"}, 2, "2", true},
      {"renumbered, own not a step GPU", "1", {"2", "3"}, 1, "1", true},
      {"both numberings name the GPU, not the others", "1", {"0", "1", "3"}, 1, "1", true},
  };
  for (const auto& c : cases) {
    WorkerShape shape;
    shape.task_device = c.task_device;
    shape.node_devices = c.node_devices;
    ProcessSpec spec = Worker(c.local_rank, c.local_rank, 0, 4, 1, 4);
    for (std::string& e : spec.env) {
      if (e.rfind("CUDA_VISIBLE_DEVICES=", 0) == 0) e = "CUDA_VISIBLE_DEVICES=" + c.task_device;
    }
    absl::StatusOr<ShapedWorker> shaped = ShapeWorker(shape, spec);
    ASSERT_TRUE(shaped.ok()) << c.name << ": " << shaped.status();
    EXPECT_EQ(Value(shaped->spec, "CUDA_VISIBLE_DEVICES"), c.expected_cvd) << c.name;
    EXPECT_EQ(shaped->warning, c.warning) << c.name;
    if (c.warning) {
      ASSERT_EQ(shaped->notes.size(), 1u) << c.name;
      EXPECT_NE(shaped->notes[0].find("torch.cuda.set_device(LOCAL_RANK) fails"), std::string::npos)
          << shaped->notes[0];
    }
    if (c.expected_cvd.find(',') != std::string::npos) {
      const std::vector<std::string> view = absl::StrSplit(c.expected_cvd, ',');
      EXPECT_EQ(view[c.local_rank], c.task_device) << c.name;
    }
  }
}

TEST(ShapeWorkerTest, MissingRankVariableIsAnError) {
  WorkerShape shape;
  shape.pass_local_rank = true;
  ProcessSpec spec;
  spec.argv = {"x"};
  spec.env = {"PATH=/bin"};
  EXPECT_EQ(ShapeWorker(shape, spec).status().message(), "RANK is not set");
}

TEST(ResolveWorkerShapeTest, FromTheEnvironment) {
  SlurmEnv step = TwoNodeStep();
  const EnvLookup env = EnvFromList(
      {{"CUDA_VISIBLE_DEVICES", "2"}, {"SLURM_STEP_GPUS", "0,1,2,3"}, {"SLURM_JOB_GPUS", "9"}});
  WorkerShape shape = ResolveWorkerShape(true, false, step, env);
  EXPECT_TRUE(shape.slurm_tasks.has_value());
  EXPECT_EQ(shape.task_device, "2");
  EXPECT_EQ(shape.node_devices, (std::vector<std::string>{"0", "1", "2", "3"}));
  EXPECT_FALSE(ResolveWorkerShape(false, false, step, env).slurm_tasks.has_value());
  EXPECT_FALSE(ResolveWorkerShape(true, false, std::nullopt, env).slurm_tasks.has_value());
  EXPECT_EQ(ResolveWorkerShape(true, false, std::nullopt, env).task_device, "");
  // A batch script or salloc shell: its workers are described too (--standalone, mpirun).
  SlurmEnv batch = step;
  batch.step_id.clear();
  EXPECT_TRUE(ResolveWorkerShape(true, false, batch, env).slurm_tasks.has_value());
  const EnvLookup several = EnvFromList({{"CUDA_VISIBLE_DEVICES", "0,1"}});
  EXPECT_EQ(ResolveWorkerShape(true, false, step, several).task_device, "");
}

// What srun --ntasks-per-node=4 --gpus-per-task=1 gives the task with local id `local_id` on
// node n1 (Slurm binds per task: SLURM_STEP_GPUS names the task's GPU only).
SlurmEnv FourTasksOnANode(int local_id) {
  SlurmEnv s;
  s.job_id = "42";
  s.step_id = "0";
  s.proc_id = local_id;
  s.local_id = local_id;
  s.node_id = 0;
  s.num_nodes = 1;
  s.num_tasks = 4;
  s.nodes = {"n1"};
  s.node_name = "n1";
  s.tasks_per_node = {4};
  return s;
}

TEST(ResolveWorkerShapeTest, GpusBoundPerTaskAreSharedOnTheNode) {
  const EnvLookup own_only = EnvFromList(
      {{"CUDA_VISIBLE_DEVICES", "6"}, {"SLURM_STEP_GPUS", "6"}, {"TMPDIR", "/scratch/job42"}});
  WorkerShape shape = ResolveWorkerShape(true, false, FourTasksOnANode(2), own_only);
  EXPECT_EQ(shape.task_device, "6");
  EXPECT_EQ(shape.gpu_exchange_dir, "/scratch/job42/rdzv-gpus-42.0-n1");
  EXPECT_EQ(shape.local_id, 2);
  // Without TMPDIR, under /tmp.
  shape =
      ResolveWorkerShape(true, false, FourTasksOnANode(2),
                         EnvFromList({{"CUDA_VISIBLE_DEVICES", "6"}, {"SLURM_STEP_GPUS", "6"}}));
  EXPECT_EQ(shape.gpu_exchange_dir, "/tmp/rdzv-gpus-42.0-n1");
  // Nothing to share: the step's GPUs are all named, the task's GPU is renumbered (cgroups), or
  // the task is alone on its node.
  EXPECT_EQ(ResolveWorkerShape(
                true, false, FourTasksOnANode(2),
                EnvFromList({{"CUDA_VISIBLE_DEVICES", "6"}, {"SLURM_STEP_GPUS", "4,5,6,7"}}))
                .gpu_exchange_dir,
            "");
  EXPECT_EQ(
      ResolveWorkerShape(true, false, FourTasksOnANode(2),
                         EnvFromList({{"CUDA_VISIBLE_DEVICES", "0"}, {"SLURM_STEP_GPUS", "6"}}))
          .gpu_exchange_dir,
      "");
  SlurmEnv alone = FourTasksOnANode(0);
  alone.tasks_per_node = {1};
  alone.num_tasks = 1;
  EXPECT_EQ(ResolveWorkerShape(true, false, alone, own_only).gpu_exchange_dir, "");
}

// Records what it was asked to spawn; spawns nothing.
class RecordingLauncher : public ProcessLauncher {
 public:
  explicit RecordingLauncher(std::vector<ProcessSpec>* spawned) : spawned_(spawned) {}
  absl::StatusOr<SpawnedProcess> Spawn(const ProcessSpec& spec) override {
    spawned_->push_back(spec);
    return SpawnedProcess{};
  }
  absl::Status SignalGroup(pid_t, int) override { return absl::OkStatus(); }
  std::vector<ProcessExit> Reap() override { return {}; }

 private:
  std::vector<ProcessSpec>* spawned_;
};

TEST(ShapingLauncherTest, TasksSeeingOnlyOwnGpuGetNodesInLocalRankOrder) {
  std::string base = (std::filesystem::temp_directory_path() / "shaping-XXXXXX");
  ASSERT_NE(mkdtemp(base.data()), nullptr);
  const std::string dir = base + "/rdzv-gpus-42.0-n1";
  // Four agents of one node, as srun starts them: each shares its GPU before joining.
  std::vector<ProcessSpec> spawned;
  std::vector<std::unique_ptr<ProcessLauncher>> launchers;
  for (int local = 0; local < 4; ++local) {
    WorkerShape shape;
    shape.task_device = absl::StrCat(4 + local);
    shape.node_devices = {shape.task_device};
    shape.gpu_exchange_dir = dir;
    shape.local_id = local;
    launchers.push_back(NewShapingLauncher(shape, std::make_unique<RecordingLauncher>(&spawned)));
  }
  // The round completes; each starts its worker.
  for (int local = 0; local < 4; ++local) {
    ProcessSpec worker = Worker(local, local, 0, 4, 1, 4);
    for (std::string& e : worker.env) {
      if (e.rfind("CUDA_VISIBLE_DEVICES=", 0) == 0) e = absl::StrCat(e.substr(0, 21), 4 + local);
    }
    ASSERT_TRUE(launchers[local]->Spawn(worker).ok());
  }
  ASSERT_EQ(spawned.size(), 4u);
  EXPECT_EQ(Value(spawned[0], "CUDA_VISIBLE_DEVICES"), "4");  // device 0 is its own already
  for (int local = 1; local < 4; ++local) {
    EXPECT_EQ(Value(spawned[local], "CUDA_VISIBLE_DEVICES"), "4,5,6,7") << local;
  }
  launchers.clear();
  EXPECT_FALSE(std::filesystem::exists(dir));
  std::filesystem::remove_all(base);
}

}  // namespace
}  // namespace rdzv
