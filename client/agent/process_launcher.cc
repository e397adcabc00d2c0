#include "client/agent/process_launcher.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace rdzv {
namespace {

bool IsExecutable(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

// Resolves argv[0] against PATH taken from the worker's environment, as execvp would, but
// before forking, so that a missing program is a clear error and not a dead child.
absl::StatusOr<std::string> FindProgram(const ProcessSpec& spec) {
  const std::string& name = spec.argv.front();
  if (name.find('/') != std::string::npos) {
    if (IsExecutable(name)) return name;
    return absl::NotFoundError(absl::StrFormat("cannot run %s: not an executable file", name));
  }
  std::string path = "/usr/local/bin:/usr/bin:/bin";
  for (const std::string& e : spec.env) {
    if (e.starts_with("PATH=")) path = e.substr(5);
  }
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    if (dir.empty()) dir = ".";
    std::string candidate = absl::StrCat(dir, "/", name);
    if (IsExecutable(candidate)) return candidate;
  }
  return absl::NotFoundError(
      absl::StrFormat("cannot run %s: not found in PATH; give its full path or fix PATH", name));
}

// The signals a guard handles: stop requests, user signals and SIGABRT (a hung worker's request
// for its stack) are passed on to the worker's group; SIGCHLD tells it the worker ended.
// The guard's parent-death signal: one the agent never sends, so that the agent's death cannot
// pass for a SIGTERM to be forwarded. (The kernel sends it as soon as the agent's main thread
// exits, while getppid() may still name the agent, its other threads not yet gone.)
int AgentDiedSignal() { return SIGRTMIN; }

sigset_t GuardSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s :
       {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGABRT, SIGCHLD, AgentDiedSignal()}) {
    sigaddset(&set, s);
  }
  return set;
}

// Kills the processes the guard adopted as a subreaper: descendants of the worker that left
// its process group (setsid) and were orphaned. Reads /proc with plain system calls only.
void KillAdopted() {
  char path[64];
  const pid_t self = getpid();
  // "/proc/<pid>/task/<pid>/children", built without snprintf (not async-signal-safe).
  char digits[16];
  int n = 0;
  for (pid_t v = self; v > 0 && n < 15; v /= 10) digits[n++] = static_cast<char>('0' + v % 10);
  char* p = path;
  auto put = [&p](const char* text) {
    while (*text != '\0') *p++ = *text++;
  };
  put("/proc/");
  for (int i = n - 1; i >= 0; --i) *p++ = digits[i];
  put("/task/");
  for (int i = n - 1; i >= 0; --i) *p++ = digits[i];
  put("/children");
  *p = '\0';
  for (int pass = 0; pass < 3; ++pass) {
    const int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return;
    // Read to the end, however many children there are, in pieces: a pid cut at the end of one
    // piece goes on in the next, so a cut never names another process. Children killed here
    // stay in the list (as zombies) until the waitpid below, so the list does not shift.
    char buf[4096];
    pid_t pid = 0;
    auto kill_it = [](pid_t child) {
      kill(-child, SIGKILL);
      kill(child, SIGKILL);
    };
    for (;;) {
      const ssize_t len = read(fd, buf, sizeof(buf));
      if (len < 0 && errno == EINTR) continue;
      if (len <= 0) break;
      for (ssize_t i = 0; i < len; ++i) {
        if (buf[i] >= '0' && buf[i] <= '9') {
          // A number no pid can be (pid_max is at most 2^22) is skipped whole: -1.
          if (pid >= 0) pid = pid < 100'000'000 ? pid * 10 + (buf[i] - '0') : -1;
        } else {
          if (pid > 0) kill_it(pid);
          pid = 0;
        }
      }
    }
    if (pid > 0) kill_it(pid);  // the list need not end with a separator
    close(fd);
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
  }
}

// Async-signal-safe, unlike the C++ clocks.
int64_t MonotonicNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// How long after a signal reached the guard directly the agent's copy counts as the same one.
constexpr int64_t kSameSignalNanos = 2'000'000'000;

// Ends the guard the way the worker ended, so that the agent sees the worker's exit status.
[[noreturn]] void ExitLike(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);  // the worker dumped core already, if it was allowed to
    signal(sig, SIG_DFL);
    sigset_t only;
    sigemptyset(&only);
    sigaddset(&only, sig);
    sigprocmask(SIG_UNBLOCK, &only, nullptr);
    kill(getpid(), sig);
    _exit(128 + sig);
  }
  _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

// The descriptors this process had when it started, before main() and its threads: what its
// launcher passed on (srun's PMI_FD, say), which a worker may inherit. Nothing the agent opened
// since reaches a worker, even one opened without O_CLOEXEC, or caught by a fork between another
// thread's socket() and its FD_CLOEXEC (gRPC makes its sockets so): a worker holding the agent's
// connection to rdzvd could speak for the agent.
struct StartFds {
  static constexpr size_t kMax = 256;
  int fds[kMax];
  size_t count = 0;
  bool known = false;  // false: /proc could not say; then nothing is closed by number

  StartFds() {
    DIR* dir = opendir("/proc/self/fd");
    if (dir == nullptr) return;
    const int own = dirfd(dir);
    while (const dirent* entry = readdir(dir)) {
      char* end = nullptr;
      const long fd = std::strtol(entry->d_name, &end, 10);
      if (end == entry->d_name || *end != '\0' || fd <= STDERR_FILENO || fd == own) continue;
      if (count == kMax) {  // a launcher that passes hundreds: leave them all be
        closedir(dir);
        return;
      }
      fds[count++] = static_cast<int>(fd);
    }
    closedir(dir);
    std::sort(fds, fds + count);
    known = true;
  }
};
const StartFds kStartFds;

// Closes [from, to], with only async-signal-safe calls.
void CloseRange(int from, int to) {
  if (from > to) return;
  if (syscall(SYS_close_range, static_cast<unsigned>(from), static_cast<unsigned>(to), 0U) == 0) {
    return;
  }
  // A kernel before 5.9: one by one, up to the descriptor limit.
  struct rlimit limit;
  int last = to;
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
      static_cast<rlim_t>(last) >= limit.rlim_cur) {
    last = static_cast<int>(limit.rlim_cur) - 1;
  }
  for (int fd = from; fd <= last; ++fd) close(fd);
}

// In the worker's process, just before exec: closes every descriptor above stderr but those the
// agent started with and `keep`.
void CloseAllButStartFds(int keep) {
  if (!kStartFds.known) return;
  int next = STDERR_FILENO + 1;
  size_t i = 0;
  bool kept = false;
  while (i < kStartFds.count || !kept) {
    int fd;
    if (!kept && (i == kStartFds.count || keep < kStartFds.fds[i])) {
      fd = keep;
      kept = true;
    } else {
      fd = kStartFds.fds[i++];
    }
    if (fd < next) continue;
    CloseRange(next, fd - 1);
    next = fd + 1;
  }
  CloseRange(next, INT32_MAX);
}

// What the worker gets before exec besides its pipes: descriptors of the agent's that it must
// not inherit, and the environment entry ("NAME=" and room for a pid) to hold its own pid.
struct WorkerFixups {
  const int* close_fds = nullptr;
  size_t close_count = 0;
  char* pid_entry = nullptr;  // null for none
  size_t pid_at = 0;          // where the digits go
};

// Writes `pid` in decimal at `out`, with only async-signal-safe operations.
void PutPid(char* out, pid_t pid) {
  char digits[16];
  int n = 0;
  for (pid_t v = pid; v > 0 && n < 15; v /= 10) digits[n++] = static_cast<char>('0' + v % 10);
  for (int i = n - 1; i >= 0; --i) *out++ = digits[i];
  *out = '\0';
}

// The process between the agent and one worker. It runs in the child of a fork from a
// multithreaded process, so it makes only async-signal-safe calls. It puts the worker in a
// process group of its own, passes the agent's signals on to that group, and when the worker
// ends or the agent dies (PR_SET_PDEATHSIG) kills whatever is left in the group: a worker's
// children never outlive the job, even when the agent is killed with SIGKILL.
[[noreturn]] void GuardWorker(const char* program, char* const argv[], char* const envp[],
                              char* const orphan_paths[], int out_fd, int err_fd, int status_fd,
                              pid_t agent, const WorkerFixups& fixups) {
  setpgid(0, 0);
  const sigset_t handled = GuardSignals();
  sigprocmask(SIG_BLOCK, &handled, nullptr);
  prctl(PR_SET_PDEATHSIG, AgentDiedSignal());
  if (getppid() != agent) _exit(127);  // the agent died before the line above
  prctl(PR_SET_CHILD_SUBREAPER, 1);

  const pid_t worker = fork();
  if (worker < 0) {
    const int message[2] = {-1, errno};
    (void)!write(status_fd, message, sizeof(message));
    _exit(127);
  }
  if (worker == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // should the guard itself be killed outright
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int s : {SIGPIPE, SIGINT, SIGTERM, SIGQUIT, SIGUSR1, SIGUSR2, SIGCHLD, SIGHUP}) {
      signal(s, SIG_DFL);
    }
    dup2(out_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    for (size_t i = 0; i < fixups.close_count; ++i) {
      const int fd = fixups.close_fds[i];
      // The guard's own pipes are closed at exec already; the status pipe must stay open until
      // then to report a failed exec.
      if (fd > STDERR_FILENO && fd != status_fd) close(fd);
    }
    // The status pipe closes at exec (O_CLOEXEC): until then it reports a failed one.
    CloseAllButStartFds(status_fd);
    if (fixups.pid_entry != nullptr) PutPid(fixups.pid_entry + fixups.pid_at, getpid());
    execve(program, argv, envp);
    const int message[2] = {getpid(), errno};
    (void)!write(status_fd, message, sizeof(message));
    _exit(127);
  }
  setpgid(worker, worker);
  // Nor does the guard need them: a launcher that waits for its socket to close sees it close
  // when the agent's copy does.
  for (size_t i = 0; i < fixups.close_count; ++i) {
    const int fd = fixups.close_fds[i];
    if (fd > STDERR_FILENO && fd != status_fd && fd != out_fd && fd != err_fd) close(fd);
  }
  const int pid_message = worker;
  (void)!write(status_fd, &pid_message, sizeof(pid_message));
  close(out_fd);
  close(err_fd);
  close(status_fd);

  int64_t direct_at[NSIG] = {};
  for (;;) {
    siginfo_t info;
    const int sig = sigwaitinfo(&handled, &info);
    if (sig < 0) continue;
    if (sig == SIGCHLD) {
      int status = 0;
      if (waitpid(worker, &status, WNOHANG) == worker) {
        kill(-worker, SIGKILL);  // what the worker left behind in its group
        KillAdopted();
        ExitLike(status);
      }
      continue;
    }
    if (sig == AgentDiedSignal() || getppid() != agent) {
      kill(-worker, SIGKILL);  // the agent is gone: so is the job
      kill(worker, SIGKILL);
      while (waitpid(worker, nullptr, 0) < 0 && errno == EINTR) {
      }
      KillAdopted();
      // Each worker's guard removes its own files, then tries the shared directory: the last
      // one to get there finds it empty.
      for (char* const* path = orphan_paths; *path != nullptr; ++path) {
        if (unlink(*path) != 0) rmdir(*path);
      }
      _exit(128 + SIGKILL);
    }
    // Pass on what the agent sends. A signal from anyone else (Slurm signalling every process
    // of the step, as scancel does) reached the worker directly too: pass on neither it nor the
    // agent's copy of it that follows, so that a checkpoint handler runs once.
    const int64_t now = MonotonicNanos();
    if (info.si_pid != agent) {
      direct_at[sig] = now;
    } else if (direct_at[sig] == 0 || now - direct_at[sig] > kSameSignalNanos) {
      kill(-worker, sig);
    }
  }
}

class PosixProcessLauncher final : public ProcessLauncher {
 public:
  absl::StatusOr<SpawnedProcess> Spawn(const ProcessSpec& spec) override {
    if (spec.argv.empty()) return absl::InvalidArgumentError("empty command");
    absl::StatusOr<std::string> program = FindProgram(spec);
    if (!program.ok()) return program.status();

    // Everything the child needs is prepared before fork: after it, only async-signal-safe
    // calls are allowed (other threads may hold the allocator's locks).
    std::vector<char*> argv, envp;
    for (const std::string& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    // The worker's own pid is known only after fork: its entry gets room for the digits now.
    std::string pid_entry;
    WorkerFixups fixups;
    for (const std::string& e : spec.env) {
      if (!spec.own_pid_variable.empty() && e.starts_with(spec.own_pid_variable + "=")) continue;
      envp.push_back(const_cast<char*>(e.c_str()));
    }
    if (!spec.own_pid_variable.empty()) {
      pid_entry = spec.own_pid_variable + "=";
      fixups.pid_at = pid_entry.size();
      pid_entry.append(16, '\0');
      fixups.pid_entry = pid_entry.data();
      envp.push_back(pid_entry.data());
    }
    envp.push_back(nullptr);
    fixups.close_fds = spec.close_fds.data();
    fixups.close_count = spec.close_fds.size();
    std::vector<char*> orphan_paths;
    for (const std::string& p : spec.remove_if_orphaned) {
      orphan_paths.push_back(const_cast<char*>(p.c_str()));
    }
    orphan_paths.push_back(nullptr);

    int out[2], err[2], status_pipe[2];
    if (pipe2(out, O_CLOEXEC) != 0) return Errno("pipe");
    if (pipe2(err, O_CLOEXEC) != 0) {
      CloseAll({out[0], out[1]});
      return Errno("pipe");
    }
    if (pipe2(status_pipe, O_CLOEXEC) != 0) {
      CloseAll({out[0], out[1], err[0], err[1]});
      return Errno("pipe");
    }
    const pid_t agent = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
      CloseAll({out[0], out[1], err[0], err[1], status_pipe[0], status_pipe[1]});
      return Errno("fork");
    }
    if (pid == 0) {
      close(out[0]);
      close(err[0]);
      close(status_pipe[0]);
      GuardWorker(program->c_str(), argv.data(), envp.data(), orphan_paths.data(), out[1], err[1],
                  status_pipe[1], agent, fixups);
    }
    // Also from the parent, so that a signal sent right after Spawn reaches the guard.
    setpgid(pid, pid);
    CloseAll({out[1], err[1], status_pipe[1]});
    // The guard sends the worker's pid; then the pipe closes (exec worked) or carries errno.
    int message[2] = {0, 0};
    size_t got = 0;
    while (got < sizeof(message)) {
      const ssize_t n =
          read(status_pipe[0], reinterpret_cast<char*>(message) + got, sizeof(message) - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    close(status_pipe[0]);
    if (got == sizeof(message)) {
      waitpid(pid, nullptr, 0);
      CloseAll({out[0], err[0]});
      return absl::FailedPreconditionError(
          absl::StrFormat("cannot run %s: %s", *program, strerror(message[1])));
    }
    if (got < sizeof(int)) {
      waitpid(pid, nullptr, 0);
      CloseAll({out[0], err[0]});
      return absl::InternalError(absl::StrFormat("cannot start %s: the guard failed", *program));
    }
    worker_of_[pid] = message[0];
    return SpawnedProcess{pid, out[0], err[0], message[0]};
  }

  absl::Status SignalGroup(pid_t pid, int sig) override {
    // The guard passes signals on to the worker's group; SIGKILL cannot be passed on, so it
    // goes to both groups directly.
    if (killpg(pid, sig) != 0 && errno != ESRCH) return Errno("killpg");
    if (sig == SIGKILL) {
      auto it = worker_of_.find(pid);
      if (it != worker_of_.end()) killpg(it->second, SIGKILL);
    }
    return absl::OkStatus();
  }

  std::vector<ProcessExit> Reap() override {
    std::vector<ProcessExit> exits;
    // Only the launcher's own children: another part of the agent (a health check) waits for
    // its own.
    std::vector<pid_t> ended;
    for (const auto& [guard, worker] : worker_of_) {
      int status = 0;
      const pid_t pid = waitpid(guard, &status, WNOHANG);
      if (pid != guard) continue;
      ProcessExit e;
      e.pid = pid;
      if (WIFEXITED(status)) {
        e.exit_status = WEXITSTATUS(status);
      } else if (WIFSIGNALED(status)) {
        e.signal = WTERMSIG(status);
      } else {
        continue;
      }
      exits.push_back(e);
      ended.push_back(pid);
    }
    for (const pid_t pid : ended) worker_of_.erase(pid);
    return exits;
  }

 private:
  static absl::Status Errno(absl::string_view what) {
    return absl::InternalError(absl::StrCat(what, ": ", strerror(errno)));
  }
  static void CloseAll(std::initializer_list<int> fds) {
    for (int fd : fds) close(fd);
  }

  absl::flat_hash_map<pid_t, pid_t> worker_of_;  // guard pid -> worker pid (= its group)
};

}  // namespace

std::unique_ptr<ProcessLauncher> NewPosixProcessLauncher() {
  return std::make_unique<PosixProcessLauncher>();
}

}  // namespace rdzv
