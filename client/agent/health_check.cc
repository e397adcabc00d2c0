#include "client/agent/health_check.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/core/rendezvous_types.h"

extern char** environ;

namespace rdzv {
namespace {

// The output a check keeps, at most: its last lines are what a report shows.
constexpr size_t kKeptOutputBytes = 8192;

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

std::string EndText(int status) {
  if (WIFSIGNALED(status)) return absl::StrCat("killed by ", SignalName(WTERMSIG(status)));
  return absl::StrCat("exit code ", WEXITSTATUS(status));
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

void HealthCheck::Cancel() {
  cancelled_ = true;
  if (const pid_t group = group_.load(); group > 0) kill(-group, SIGKILL);
}

void HealthCheck::Run() {
  std::optional<Unhealthy> verdict = BuiltInHealthChecks(options_, target_);
  if (!verdict && !options_.command.empty() && !cancelled_) verdict = RunCommand();
  if (!cancelled_) done_(std::move(verdict));
}

std::optional<Unhealthy> HealthCheck::RunCommand() {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return Unhealthy{ExclusionKind::kHealthCheckFailed,
                     absl::StrCat("could not start it: ", Errno(errno))};
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  sigset_t defaults;
  sigemptyset(&defaults);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGUSR1, SIGUSR2, SIGCHLD}) {
    sigaddset(&defaults, s);
  }
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::string command = options_.command;
  char sh[] = "/bin/sh";
  char dash_c[] = "-c";
  char* argv[] = {sh, dash_c, command.data(), nullptr};
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, sh, &actions, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(pipe_fds[1]);
  if (spawned != 0) {
    close(pipe_fds[0]);
    return Unhealthy{ExclusionKind::kHealthCheckFailed,
                     absl::StrCat("could not start /bin/sh: ", Errno(spawned))};
  }
  group_ = pid;
  if (cancelled_) kill(-pid, SIGKILL);

  std::string output;
  int out_fd = pipe_fds[0];
  const absl::Time deadline = absl::Now() + options_.timeout;
  bool timed_out = false;
  int status = 0;
  while (true) {
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      timed_out = true;
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    const int wait_ms = static_cast<int>(
        std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, out_fd >= 0 ? 100 : 20));
    if (out_fd < 0) {
      absl::SleepFor(absl::Milliseconds(wait_ms));
      continue;
    }
    pollfd p{out_fd, POLLIN, 0};
    if (poll(&p, 1, wait_ms) <= 0) continue;
    char buffer[4096];
    const ssize_t n = read(out_fd, buffer, sizeof(buffer));
    if (n > 0) {
      output.append(buffer, static_cast<size_t>(n));
      if (output.size() > kKeptOutputBytes) output.erase(0, output.size() - kKeptOutputBytes);
    } else if (n == 0 || errno != EINTR) {
      close(out_fd);
      out_fd = -1;
    }
  }
  // What it left in the background goes with it.
  kill(-pid, SIGKILL);
  group_ = 0;
  if (out_fd >= 0) {
    // Whatever it wrote last, unless a process it started still holds the pipe open.
    const int flags = fcntl(out_fd, F_GETFL);
    fcntl(out_fd, F_SETFL, flags | O_NONBLOCK);
    char buffer[4096];
    ssize_t n;
    while ((n = read(out_fd, buffer, sizeof(buffer))) > 0) {
      output.append(buffer, static_cast<size_t>(n));
      if (output.size() > kKeptOutputBytes) output.erase(0, output.size() - kKeptOutputBytes);
    }
    close(out_fd);
  }
  const std::string line = LastOutputLine(output);
  if (timed_out) {
    std::string detail =
        absl::StrFormat("did not finish within %s", absl::FormatDuration(options_.timeout));
    if (!line.empty()) detail = absl::StrCat(line, " (", detail, ")");
    detail.resize(std::min(detail.size(), kMaxUnhealthyDetailBytes));
    return Unhealthy{ExclusionKind::kHealthCheckTimedOut, detail};
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return std::nullopt;
  std::string detail =
      line.empty() ? EndText(status) : absl::StrCat(line, " (", EndText(status), ")");
  detail.resize(std::min(detail.size(), kMaxUnhealthyDetailBytes));
  return Unhealthy{ExclusionKind::kHealthCheckFailed, detail};
}

}  // namespace rdzv
