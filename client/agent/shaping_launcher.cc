#include "client/agent/shaping_launcher.h"

#include <spdlog/spdlog.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "client/agent/gpu_exchange.h"

namespace rdzv {
namespace {

// LOCAL_WORLD_SIZE of a worker's launch, 0 when not set.
int LocalWorldSize(const ProcessSpec& spec) {
  int n = 0;
  for (const std::string& entry : spec.env) {
    if (absl::StartsWith(entry, "LOCAL_WORLD_SIZE=") &&
        absl::SimpleAtoi(absl::string_view(entry).substr(17), &n)) {
      return n;
    }
  }
  return 0;
}

class ShapingLauncher final : public ProcessLauncher {
 public:
  ShapingLauncher(WorkerShape shape, std::unique_ptr<GpuExchange> exchange,
                  std::unique_ptr<ProcessLauncher> inner)
      : shape_(std::move(shape)), exchange_(std::move(exchange)), inner_(std::move(inner)) {}

  absl::StatusOr<SpawnedProcess> Spawn(const ProcessSpec& spec) override {
    if (exchange_ && !collected_) {
      // The round is complete: every task of this node in it wrote its GPU before joining.
      collected_ = true;
      std::vector<std::string> devices = exchange_->Collect(LocalWorldSize(spec));
      if (!devices.empty()) {
        shape_.node_devices = std::move(devices);
        shape_.node_devices_from_tasks = true;
      }
    }
    absl::StatusOr<ShapedWorker> shaped = ShapeWorker(shape_, spec);
    if (!shaped.ok()) return shaped.status();
    if (!logged_) {
      logged_ = true;
      for (const std::string& note : shaped->notes) {
        if (shaped->warning) {
          spdlog::warn("{}", note);
        } else {
          spdlog::info("{}", note);
        }
      }
    }
    return inner_->Spawn(shaped->spec);
  }
  absl::Status SignalGroup(pid_t pid, int sig) override { return inner_->SignalGroup(pid, sig); }
  std::vector<ProcessExit> Reap() override { return inner_->Reap(); }

 private:
  WorkerShape shape_;
  const std::unique_ptr<GpuExchange> exchange_;  // null when not sharing GPUs
  const std::unique_ptr<ProcessLauncher> inner_;
  bool collected_ = false;
  bool logged_ = false;
};

}  // namespace

std::unique_ptr<ProcessLauncher> NewShapingLauncher(WorkerShape shape,
                                                    std::unique_ptr<ProcessLauncher> inner) {
  std::unique_ptr<GpuExchange> exchange;
  if (!shape.gpu_exchange_dir.empty()) {
    absl::StatusOr<std::unique_ptr<GpuExchange>> published =
        GpuExchange::Publish(shape.gpu_exchange_dir, shape.local_id, shape.task_device);
    if (published.ok()) {
      exchange = *std::move(published);
    } else {
      // Without it the worker sees its own GPU only, and the first spawn warns about that.
      spdlog::debug("cannot share this task's GPU with the node's other tasks: {}",
                    std::string(published.status().message()));
    }
  }
  return std::make_unique<ShapingLauncher>(std::move(shape), std::move(exchange), std::move(inner));
}

}  // namespace rdzv
