#include "client/agent/core/worker_shape.h"

#include <algorithm>
#include <cstddef>
#include <string_view>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "client/agent/core/launcher_env.h"
#include "client/agent/core/slurm_worker_env.h"
#include "client/agent/core/worker_env.h"
#include "common/core/file_names.h"

namespace rdzv {
namespace {

EnvList ToList(const std::vector<std::string>& entries) {
  EnvList vars;
  vars.reserve(entries.size());
  for (const std::string& entry : entries) {
    const std::size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    vars.emplace_back(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return vars;
}

// Removes every entry named in `names`, then appends `vars`.
void Replace(std::vector<std::string>& entries, const EnvList& vars,
             const std::vector<std::string_view>& names) {
  std::erase_if(entries, [&](const std::string& entry) {
    const std::string_view name = std::string_view(entry).substr(0, entry.find('='));
    return std::find(names.begin(), names.end(), name) != names.end();
  });
  for (const auto& [name, value] : vars) entries.push_back(absl::StrCat(name, "=", value));
}

// Whether `own` may be numbered among the step's GPUs rather than among the node's. Slurm
// names the step's GPUs by the node's numbering (SLURM_STEP_GPUS=1,2,3), but where it confines
// the step with cgroups, CUDA_VISIBLE_DEVICES counts only what the step can open (0,1,2). A
// view built from both would mix the two: for the third GPU, "2" would be taken for the node's
// GPU 2 and the view would name "3", which does not exist for the task. The two numberings agree
// when the step holds the node's first GPUs; otherwise `own` is taken for the node's numbering
// only when it cannot be a position among the step's GPUs, or when it is the GPU Slurm gives a
// task of this local rank (the step's GPUs are handed out in order) and the position reading
// would not be.
bool MaybeRenumbered(const std::string& own, const std::vector<std::string>& devices,
                     int local_rank) {
  const int count = static_cast<int>(devices.size());
  bool first_gpus = true;
  for (int i = 0; i < count && first_gpus; ++i) {
    first_gpus = std::find(devices.begin(), devices.end(), absl::StrCat(i)) != devices.end();
  }
  if (first_gpus) return false;
  int position = 0;
  if (!absl::SimpleAtoi(own, &position) || position < 0 || position >= count) return false;
  const bool in_order = local_rank < count && devices[local_rank] == own;
  return !in_order || position == local_rank;
}

// The device list in which index `local_rank` is `own`: the other devices keep their order
// around it. Empty when `devices` does not hold `own` or has too few entries, when `own` is the
// node's first device (where Slurm confines each task with cgroups it renumbers the task's GPU
// to 0, and the others are out of reach, so no wider view exists), and when `own` may be
// numbered among the step's GPUs only (MaybeRenumbered; not a question when the node's tasks
// named their GPUs themselves, `from_tasks`).
std::vector<std::string> DeviceView(const std::string& own, const std::vector<std::string>& devices,
                                    int local_rank, bool from_tasks) {
  if (devices.empty() || own == devices.front() ||
      std::find(devices.begin(), devices.end(), own) == devices.end() ||
      static_cast<int>(devices.size()) <= local_rank ||
      (!from_tasks && MaybeRenumbered(own, devices, local_rank))) {
    return {};
  }
  std::vector<std::string> view;
  for (const std::string& d : devices) {
    if (d != own) view.push_back(d);
  }
  view.insert(view.begin() + local_rank, own);
  return view;
}

// Drops the launcher's place variables from the worker's environment, and has the descriptors
// they name closed in it.
void HideLauncherEnv(ShapedWorker& out) {
  std::vector<std::string> dropped;
  std::erase_if(out.spec.env, [&](const std::string& entry) {
    const std::size_t eq = entry.find('=');
    const std::string_view name = std::string_view(entry).substr(0, eq);
    if (!IsLauncherPlaceVariable(name)) return false;
    dropped.emplace_back(name);
    const bool descriptor =
        std::find(std::begin(kLauncherDescriptorVariables), std::end(kLauncherDescriptorVariables),
                  name) != std::end(kLauncherDescriptorVariables);
    int fd = -1;
    if (descriptor && eq != std::string::npos &&
        absl::SimpleAtoi(absl::string_view(entry).substr(eq + 1), &fd) &&
        fd > 2) {  // not stdin, stdout or stderr
      out.spec.close_fds.push_back(fd);
    }
    return true;
  });
  if (dropped.empty()) return;
  std::sort(dropped.begin(), dropped.end());
  out.notes.push_back(
      absl::StrCat("workers do not see this agent's place in the launcher that started it (",
                   absl::StrJoin(dropped, ", "),
                   "): it is the agent's, not theirs; --mpi-env keep passes it on"));
}

}  // namespace

absl::StatusOr<ShapedWorker> ShapeWorker(const WorkerShape& shape, const ProcessSpec& spec) {
  ShapedWorker out;
  out.spec = spec;
  if (shape.hide_launcher_env) HideLauncherEnv(out);
  const bool needs_place = shape.slurm_tasks || shape.pass_local_rank || !shape.task_device.empty();
  if (!needs_place) return out;
  const EnvList vars = ToList(spec.env);
  static const SlurmEnv kNoSlurm;
  absl::StatusOr<SlurmWorkerPlace> place = PlaceFromWorkerVariables(
      vars, shape.slurm_tasks ? *shape.slurm_tasks : kNoSlurm, spec.workers_per_node);
  if (!place.ok()) return place.status();

  if (shape.slurm_tasks) {
    if (shape.job_nodes.size() == static_cast<std::size_t>(place->num_nodes)) {
      place->node_names = shape.job_nodes;
    }
    absl::StatusOr<EnvList> slurm = SlurmWorkerVariables(*place, *shape.slurm_tasks);
    if (!slurm.ok()) return slurm.status();
    Replace(out.spec.env, *slurm,
            {kSlurmTaskLayoutVariables.begin(), kSlurmTaskLayoutVariables.end()});
    out.spec.own_pid_variable = "SLURM_TASK_PID";
    out.notes.push_back(
        "workers see Slurm task variables that match their ranks (SLURM_PROCID=RANK, "
        "SLURM_LOCALID=LOCAL_RANK, SLURM_NODEID=GROUP_RANK, SLURM_NTASKS=WORLD_SIZE); "
        "--slurm-env keep leaves the agent's");
  }

  if (!shape.task_device.empty() && place->local_rank > 0) {
    const std::vector<std::string> view = DeviceView(
        shape.task_device, shape.node_devices, place->local_rank, shape.node_devices_from_tasks);
    if (!view.empty()) {
      const std::string joined = absl::StrJoin(view, ",");
      Replace(out.spec.env, {{"CUDA_VISIBLE_DEVICES", joined}}, {"CUDA_VISIBLE_DEVICES"});
      out.notes.push_back(absl::StrCat("this task's GPU is ", shape.task_device,
                                       "; its worker sees the step's GPUs as "
                                       "CUDA_VISIBLE_DEVICES=",
                                       joined, " so that device LOCAL_RANK=", place->local_rank,
                                       " is that GPU"));
    } else {
      out.warning = true;
      out.notes.push_back(absl::StrCat(
          "this task sees one GPU (CUDA_VISIBLE_DEVICES=", shape.task_device,
          ") but LOCAL_RANK=", place->local_rank,
          ", so torch.cuda.set_device(LOCAL_RANK) fails: use device 0 "
          "(torch.cuda.set_device(0)), or launch one agent per node with all its GPUs (srun "
          "--ntasks-per-node=1 --gpus-per-node=N rdzv-agent)"));
    }
  }

  if (shape.pass_local_rank) {
    out.spec.argv.push_back(absl::StrCat("--local_rank=", place->local_rank));
  }
  return out;
}

WorkerShape ResolveWorkerShape(bool slurm_tasks, bool pass_local_rank,
                               const std::optional<SlurmEnv>& slurm, const EnvLookup& env) {
  WorkerShape shape;
  if (slurm_tasks && slurm) shape.slurm_tasks = *slurm;
  shape.pass_local_rank = pass_local_rank;
  const auto list = [&env](const char* name) {
    std::vector<std::string> out;
    for (absl::string_view d :
         absl::StrSplit(env(name).value_or(""), ',', absl::SkipWhitespace())) {
      out.emplace_back(absl::StripAsciiWhitespace(d));
    }
    return out;
  };
  const std::vector<std::string> visible = list("CUDA_VISIBLE_DEVICES");
  if (slurm && visible.size() == 1) {
    shape.task_device = visible.front();
    shape.node_devices = list("SLURM_STEP_GPUS");
    if (shape.node_devices.empty()) shape.node_devices = list("SLURM_JOB_GPUS");
    // --gpus-per-task binds the step's GPUs per task: Slurm names only the task's own GPU, in
    // SLURM_STEP_GPUS too. The node's other tasks know theirs.
    const bool known_node =
        slurm->node_id >= 0 && static_cast<size_t>(slurm->node_id) < slurm->tasks_per_node.size();
    const int tasks_here = known_node ? slurm->tasks_per_node[slurm->node_id] : 0;
    if (shape.node_devices == visible && slurm->in_step() && slurm->local_id >= 0 &&
        tasks_here > 1) {
      shape.gpu_exchange_dir =
          absl::StrCat(TempDirectory(env), "/",
                       FileNamePart(absl::StrCat("rdzv-gpus-", slurm->job_id, ".", slurm->step_id,
                                                 "-", slurm->node_name)));
      shape.local_id = slurm->local_id;
    }
  }
  return shape;
}

}  // namespace rdzv
