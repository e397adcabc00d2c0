// A node's health checks, which rdzv-agent runs before each join that is not a resume: the
// built-in ones, always (a few system calls), then the user's --health-check command, if any.
//
//   HealthCheck check(options, target, [&](std::optional<Unhealthy> verdict) { ... });
//
// Before them, the checks wait (bounded) for the job's last run's workers on this node to be
// gone, so that no restart begins while one still holds a GPU. The checks run on a thread of
// the object's own; `done` is called there once, unless Cancel
// came first. The command runs as `/bin/sh -c COMMAND` behind the guard the workers run behind
// (process_launcher.h), with the agent's environment, stdin from /dev/null and stdout and stderr
// read by the check; its whole group, and what it started that left the group, are killed when
// it runs past the timeout, when it is cancelled (within 0.1 s), and when it ends (so that
// nothing it started in the background outlives it).
#ifndef RDZV_CLIENT_AGENT_HEALTH_CHECK_H_
#define RDZV_CLIENT_AGENT_HEALTH_CHECK_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/agent/core/agent_options.h"
#include "common/core/rendezvous_types.h"

namespace rdzv {

// What the built-in checks look at.
struct HealthCheckTarget {
  std::vector<std::string> addresses;  // this node's, as it would give them for MASTER_ADDR
  std::string run_parent;              // where the run directory goes ($TMPDIR, else /tmp)
  std::string dev_dir = "/dev";        // where the GPUs' device files are
  // The job's last run's worker processes on this node: the checks wait for them to be gone
  // (with them, their GPUs' device handles), at most previous_wait.
  std::vector<pid_t> previous_workers;
  absl::Duration previous_wait = absl::Seconds(30);
};

// The free space the run directory's file system must have.
inline constexpr int64_t kMinRunDirFreeBytes = 64 << 20;

// The part of a check's output that a report carries: its last line that is not blank, with
// control characters made '?' (a tab a space) and cut to kMaxUnhealthyDetailBytes.
std::string LastOutputLine(absl::string_view output);

// The built-in checks, in order; the first problem found, or none.
std::optional<Unhealthy> BuiltInHealthChecks(const HealthCheckOptions& options,
                                             const HealthCheckTarget& target);

class HealthCheck {
 public:
  HealthCheck(HealthCheckOptions options, HealthCheckTarget target,
              std::function<void(std::optional<Unhealthy>)> done);
  // Cancels, and waits for the thread.
  ~HealthCheck();
  HealthCheck(const HealthCheck&) = delete;
  HealthCheck& operator=(const HealthCheck&) = delete;

  // Stops the checks: the command's group is killed and `done` is not called.
  void Cancel();

 private:
  void Run();
  // Waits for target_.previous_workers to be gone; why not, past previous_wait.
  std::optional<Unhealthy> AwaitPreviousWorkers();
  std::optional<Unhealthy> RunCommand();

  const HealthCheckOptions options_;
  const HealthCheckTarget target_;
  const std::function<void(std::optional<Unhealthy>)> done_;
  std::atomic<bool> cancelled_{false};
  std::thread thread_;
};

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_HEALTH_CHECK_H_
