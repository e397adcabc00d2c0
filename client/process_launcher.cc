#include "client/process_launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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
    for (const std::string& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);

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
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
      CloseAll({out[0], out[1], err[0], err[1], status_pipe[0], status_pipe[1]});
      return Errno("fork");
    }
    if (pid == 0) {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);  // the agent died before the line above
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      for (int s : {SIGPIPE, SIGINT, SIGTERM, SIGUSR1, SIGUSR2, SIGCHLD, SIGHUP}) {
        signal(s, SIG_DFL);
      }
      dup2(out[1], STDOUT_FILENO);
      dup2(err[1], STDERR_FILENO);
      execve(program->c_str(), argv.data(), envp.data());
      const int e = errno;
      (void)!write(status_pipe[1], &e, sizeof(e));
      _exit(127);
    }
    // Also from the parent, so that a signal sent right after Spawn reaches the group.
    setpgid(pid, pid);
    CloseAll({out[1], err[1], status_pipe[1]});
    int child_errno = 0;
    ssize_t n;
    do {
      n = read(status_pipe[0], &child_errno, sizeof(child_errno));
    } while (n < 0 && errno == EINTR);
    close(status_pipe[0]);
    if (n == sizeof(child_errno)) {
      waitpid(pid, nullptr, 0);
      CloseAll({out[0], err[0]});
      return absl::FailedPreconditionError(
          absl::StrFormat("cannot run %s: %s", *program, strerror(child_errno)));
    }
    return SpawnedProcess{pid, out[0], err[0]};
  }

  absl::Status SignalGroup(pid_t pid, int sig) override {
    if (killpg(pid, sig) != 0 && errno != ESRCH) return Errno("killpg");
    return absl::OkStatus();
  }

  std::vector<ProcessExit> Reap() override {
    std::vector<ProcessExit> exits;
    for (;;) {
      int status = 0;
      const pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
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
    }
    return exits;
  }

 private:
  static absl::Status Errno(absl::string_view what) {
    return absl::InternalError(absl::StrCat(what, ": ", strerror(errno)));
  }
  static void CloseAll(std::initializer_list<int> fds) {
    for (int fd : fds) close(fd);
  }
};

}  // namespace

std::unique_ptr<ProcessLauncher> NewPosixProcessLauncher() {
  return std::make_unique<PosixProcessLauncher>();
}

}  // namespace rdzv
