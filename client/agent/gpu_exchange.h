// How the tasks of a Slurm step on one node learn each other's GPU when Slurm shows each task
// only its own: with --gpus-per-task, Slurm binds the step's GPUs per task, and both
// CUDA_VISIBLE_DEVICES and SLURM_STEP_GPUS name the task's one GPU. To give each worker the
// node's GPUs in local-rank order (so that torch.cuda.set_device(LOCAL_RANK) is its own), every
// task's agent writes its GPU into a directory of the step on this node before it joins. A round
// completes only once every agent has joined, so by the time an agent starts its workers, each
// task of its node in the round has written its GPU.
//
// The directory is made with mode 0700 and must be the caller's own: one made by anyone else is
// not used. An exchange removes its own entry, and the directory once empty, when destroyed.
// Not thread-safe; the agent uses it from one thread.
#ifndef RDZV_CLIENT_AGENT_GPU_EXCHANGE_H_
#define RDZV_CLIENT_AGENT_GPU_EXCHANGE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rdzv {

class GpuExchange {
 public:
  // Writes `device` as the GPU of the task with local id `local_id` into `dir` (made if missing).
  // Fails when the directory cannot be made or used, or the entry not written.
  static absl::StatusOr<std::unique_ptr<GpuExchange>> Publish(const std::string& dir, int local_id,
                                                              const std::string& device);
  ~GpuExchange();
  GpuExchange(const GpuExchange&) = delete;
  GpuExchange& operator=(const GpuExchange&) = delete;

  // The GPUs of local ids 0..count-1, in that order; empty when one of them has written none.
  std::vector<std::string> Collect(int count) const;

 private:
  GpuExchange(std::string dir, std::string entry)
      : dir_(std::move(dir)), entry_(std::move(entry)) {}

  const std::string dir_;
  const std::string entry_;  // this task's file in dir_
};

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_GPU_EXCHANGE_H_
