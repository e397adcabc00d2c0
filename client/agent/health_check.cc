#include "client/agent/health_check.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/agent/process_launcher.h"
#include "common/core/rendezvous_types.h"

extern char** environ;

namespace rdzv {
namespace {

// The output a check keeps, at most: its last lines are what a report shows.
constexpr size_t kKeptOutputBytes = 8192;
// How long a killed command's guard gets to see it end and kill what it started.
constexpr absl::Duration kGuardGrace = absl::Seconds(5);

std::string Errno(int error) { return strerror(error); }

std::optional<Unhealthy> CheckRunDir(const HealthCheckTarget& target) {
  const std::string& dir = target.run_parent;
  std::string path = dir + "/rdzv-health-XXXXXX";
  const int fd = mkstemp(path.data());
  if (fd < 0) {
    return Unhealthy{ExclusionKind::kRunDir,
                     absl::StrFormat("cannot create a file in %s: %s", dir, Errno(errno))};
  }
  const char block[4096] = {};
  const ssize_t wrote = write(fd, block, sizeof(block));
  const int write_error = errno;
  close(fd);
  unlink(path.c_str());
  if (wrote != static_cast<ssize_t>(sizeof(block))) {
    return Unhealthy{ExclusionKind::kRunDir,
                     absl::StrFormat("cannot write to %s: %s", dir,
                                     wrote < 0 ? Errno(write_error) : "short write")};
  }
  struct statvfs fs;
  if (statvfs(dir.c_str(), &fs) == 0) {
    const int64_t free = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
    if (free < kMinRunDirFreeBytes) {
      return Unhealthy{ExclusionKind::kRunDir,
                       absl::StrFormat("%s has %d MiB free; the agent needs %d MiB", dir,
                                       free >> 20, kMinRunDirFreeBytes >> 20)};
    }
  }
  return std::nullopt;
}

// NVIDIA's device files, /dev/nvidia0, /dev/nvidia1, ...: checked only where the driver's
// control device shows the driver is there at all.
std::optional<Unhealthy> CheckGpus(const HealthCheckOptions& options,
                                   const HealthCheckTarget& target) {
  if (options.gpus <= 0) return std::nullopt;
  std::error_code error;
  if (!std::filesystem::exists(target.dev_dir + "/nvidiactl", error)) return std::nullopt;
  int found = 0;
  for (const auto& entry : std::filesystem::directory_iterator(target.dev_dir, error)) {
    const std::string name = entry.path().filename().string();
    absl::string_view rest = name;
    if (!absl::ConsumePrefix(&rest, "nvidia") || rest.empty()) continue;
    bool digits = true;
    for (const char c : rest) digits = digits && absl::ascii_isdigit(static_cast<unsigned char>(c));
    if (digits) ++found;
  }
  if (found >= options.gpus) return std::nullopt;
  return Unhealthy{ExclusionKind::kGpusMissing,
                   absl::StrFormat("the worker count relies on %d GPUs but %s has %d of NVIDIA's "
                                   "device files",
                                   options.gpus, target.dev_dir, found)};
}

std::string EndText(const ProcessExit& exit) {
  if (exit.signal != 0) return absl::StrCat("killed by ", SignalName(exit.signal));
  return absl::StrCat("exit code ", exit.exit_status);
}

}  // namespace

std::string LastOutputLine(absl::string_view output) {
  std::string line;
  for (absl::string_view l : absl::StrSplit(output, absl::ByAnyChar("\r\n"))) {
    if (!absl::StripAsciiWhitespace(l).empty()) line = std::string(absl::StripAsciiWhitespace(l));
  }
  for (char& c : line) {
    if (c == '\t') {
      c = ' ';
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      c = '?';
    }
  }
  if (line.size() > kMaxUnhealthyDetailBytes) line.resize(kMaxUnhealthyDetailBytes);
  return line;
}

std::optional<Unhealthy> BuiltInHealthChecks(const HealthCheckOptions& options,
                                             const HealthCheckTarget& target) {
  if (target.addresses.empty()) {
    return Unhealthy{ExclusionKind::kAddress,
                     "this node has no address that other nodes could reach it at"};
  }
  if (std::optional<Unhealthy> run_dir = CheckRunDir(target)) return run_dir;
  return CheckGpus(options, target);
}

HealthCheck::HealthCheck(HealthCheckOptions options, HealthCheckTarget target,
                         std::function<void(std::optional<Unhealthy>)> done)
    : options_(std::move(options)), target_(std::move(target)), done_(std::move(done)) {
  thread_ = std::thread([this] { Run(); });
}

HealthCheck::~HealthCheck() {
  Cancel();
  if (thread_.joinable()) thread_.join();
}

void HealthCheck::Cancel() { cancelled_ = true; }

namespace {

// Whether `pid` is still a process that holds what it opened: alive, or stopped, or stuck in
// the kernel; not a zombie (whose descriptors are closed) nor gone.
bool Holds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  if (!std::getline(in, stat)) return false;
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z' &&
         stat[close + 2] != 'X';
}

}  // namespace

std::optional<Unhealthy> HealthCheck::AwaitPreviousWorkers() {
  const absl::Time deadline = absl::Now() + target_.previous_wait;
  for (;;) {
    std::vector<pid_t> holding;
    for (const pid_t pid : target_.previous_workers) {
      if (pid > 0 && Holds(pid)) holding.push_back(pid);
    }
    if (holding.empty() || cancelled_) return std::nullopt;
    if (absl::Now() >= deadline) {
      return Unhealthy{
          ExclusionKind::kWorkersStuck,
          absl::StrFormat("%d of its processes (pid %s) still there %s after the run ended",
                          holding.size(), absl::StrJoin(holding, ", pid "),
                          absl::FormatDuration(target_.previous_wait))};
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

void HealthCheck::Run() {
  std::optional<Unhealthy> verdict = AwaitPreviousWorkers();
  if (!verdict && !cancelled_) verdict = BuiltInHealthChecks(options_, target_);
  if (!verdict && !options_.command.empty() && !cancelled_) verdict = RunCommand();
  if (!cancelled_) done_(std::move(verdict));
}

std::optional<Unhealthy> HealthCheck::RunCommand() {
  // Behind the workers' guard: the command's group, and whatever it started that left the group
  // (setsid), are killed when it ends, at the timeout, on cancel, and when the agent dies.
  // Its stdin is /dev/null and its stderr goes where its stdout does, in order.
  ProcessSpec spec;
  spec.argv = {"/bin/sh", "-c", absl::StrCat("exec </dev/null 2>&1; ", options_.command)};
  for (char** e = environ; *e != nullptr; ++e) spec.env.emplace_back(*e);
  std::unique_ptr<ProcessLauncher> launcher = NewPosixProcessLauncher();
  absl::StatusOr<SpawnedProcess> spawned = launcher->Spawn(spec);
  if (!spawned.ok()) {
    return Unhealthy{ExclusionKind::kHealthCheckFailed,
                     absl::StrCat("could not start it: ", spawned.status().message())};
  }
  const pid_t guard = spawned->pid;
  std::string output;
  const auto keep = [&output](const char* data, size_t n) {
    output.append(data, n);
    if (output.size() > kKeptOutputBytes) output.erase(0, output.size() - kKeptOutputBytes);
  };
  int fds[2] = {spawned->stdout_fd, spawned->stderr_fd};
  const absl::Time deadline = absl::Now() + options_.timeout;
  bool timed_out = false;
  bool killed = false;
  absl::Time killed_at;
  std::optional<ProcessExit> exit;
  while (!exit) {
    for (const ProcessExit& e : launcher->Reap()) {
      if (e.pid == guard) exit = e;
    }
    if (exit) break;
    const absl::Duration left = deadline - absl::Now();
    if (!killed && (cancelled_ || left <= absl::ZeroDuration())) {
      timed_out = !cancelled_;
      killed = true;
      killed_at = absl::Now();
      // The command's group: its guard, seeing it end, kills what left the group.
      killpg(spawned->worker, SIGKILL);
    } else if (killed && absl::Now() - killed_at > kGuardGrace) {
      // A command the kernel does not let die (stuck in the driver): its guard goes, and the
      // check with it, rather than wait on it.
      (void)launcher->SignalGroup(guard, SIGKILL);
      killed_at = absl::InfiniteFuture();
    }
    pollfd p[2];
    int watched = 0;
    for (const int fd : fds) {
      if (fd >= 0) p[watched++] = pollfd{fd, POLLIN, 0};
    }
    const int wait_ms =
        killed ? 10
               : static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1, 100));
    if (watched == 0) {
      absl::SleepFor(absl::Milliseconds(std::min(wait_ms, 5)));
      continue;
    }
    if (poll(p, watched, wait_ms) <= 0) continue;
    for (int i = 0; i < watched; ++i) {
      if (p[i].revents == 0) continue;
      char buffer[4096];
      const ssize_t n = read(p[i].fd, buffer, sizeof(buffer));
      if (n > 0) {
        keep(buffer, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(p[i].fd);
        for (int& fd : fds) {
          if (fd == p[i].fd) fd = -1;
        }
      }
    }
  }
  // Whatever it wrote last: the guard has killed every writer by now.
  for (int& fd : fds) {
    if (fd < 0) continue;
    const int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    char buffer[4096];
    ssize_t n;
    while ((n = read(fd, buffer, sizeof(buffer))) > 0) keep(buffer, static_cast<size_t>(n));
    close(fd);
    fd = -1;
  }
  const std::string line = LastOutputLine(output);
  if (timed_out) {
    std::string detail =
        absl::StrFormat("did not finish within %s", absl::FormatDuration(options_.timeout));
    if (!line.empty()) detail = absl::StrCat(line, " (", detail, ")");
    detail.resize(std::min(detail.size(), kMaxUnhealthyDetailBytes));
    return Unhealthy{ExclusionKind::kHealthCheckTimedOut, detail};
  }
  if (exit->signal == 0 && exit->exit_status == 0) return std::nullopt;
  std::string detail =
      line.empty() ? EndText(*exit) : absl::StrCat(line, " (", EndText(*exit), ")");
  detail.resize(std::min(detail.size(), kMaxUnhealthyDetailBytes));
  return Unhealthy{ExclusionKind::kHealthCheckFailed, detail};
}

}  // namespace rdzv
