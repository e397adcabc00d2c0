#include "tests/testing/subprocess.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

extern char** environ;

namespace rdzv::testing {
namespace {

constexpr absl::Duration kPollInterval = absl::Milliseconds(10);
constexpr size_t kTailBytes = 4000;

std::string Tail(const std::string& text) {
  if (text.size() <= kTailBytes) return text;
  return absl::StrCat("...", text.substr(text.size() - kTailBytes));
}

bool IsExecutable(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

// Resolves the program before forking, so that a typo is a clear test failure.
std::string FindProgram(const std::string& name, const std::vector<std::string>& env) {
  if (name.find('/') != std::string::npos) return IsExecutable(name) ? name : "";
  std::string path = "/usr/local/bin:/usr/bin:/bin";
  for (const std::string& e : env) {
    if (absl::StartsWith(e, "PATH=")) path = e.substr(5);
  }
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    if (IsExecutable(candidate)) return candidate;
  }
  return "";
}

std::vector<std::string> ChildEnv(const SubprocessOptions& options) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    absl::string_view entry(*e);
    const absl::string_view name = entry.substr(0, entry.find('='));
    bool drop = false;
    for (const std::string& prefix : options.unset_env_prefixes) {
      if (absl::StartsWith(name, prefix)) drop = true;
    }
    for (const auto& [k, v] : options.env) {
      if (name == k) drop = true;
    }
    if (!drop) env.emplace_back(entry);
  }
  for (const auto& [k, v] : options.env) env.push_back(absl::StrCat(k, "=", v));
  return env;
}

int ExitCode(int status) {
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

}  // namespace

ScopedTempDir::ScopedTempDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/rdzv-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp(" << pattern << "): " << std::strerror(errno);
  }
  path_ = pattern;
}

ScopedTempDir::~ScopedTempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string ScopedTempDir::File(absl::string_view name) const {
  return absl::StrCat(path_, "/", name);
}

Subprocess::Subprocess(SubprocessOptions options) : options_(std::move(options)) {
  stdout_path_ = options_.stdout_path;
  stderr_path_ = options_.stderr_path;
  if (stdout_path_.empty() || stderr_path_.empty()) {
    capture_dir_.emplace();
    if (stdout_path_.empty()) stdout_path_ = capture_dir_->File("stdout");
    if (stderr_path_.empty()) stderr_path_ = capture_dir_->File("stderr");
  }
  if (options_.argv.empty()) {
    ADD_FAILURE() << "Subprocess: empty argv";
    exit_code_ = 127;
    return;
  }

  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls
  // are allowed (gRPC's threads may hold the allocator's locks).
  const std::vector<std::string> env = ChildEnv(options_);
  const std::string program = FindProgram(options_.argv.front(), env);
  if (program.empty()) {
    ADD_FAILURE() << "Subprocess: cannot find an executable " << options_.argv.front();
    exit_code_ = 127;
    return;
  }
  std::vector<char*> argv, envp;
  for (std::string& a : options_.argv) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_copy = env;
  for (std::string& e : env_copy) envp.push_back(e.data());
  envp.push_back(nullptr);
  const char* cwd = options_.cwd.empty() ? nullptr : options_.cwd.c_str();

  const int out = open(stdout_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err = open(stderr_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
  int status_pipe[2] = {-1, -1};
  if (out < 0 || err < 0 || in < 0 || pipe2(status_pipe, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "Subprocess: cannot open " << stdout_path_ << " or " << stderr_path_ << ": "
                  << std::strerror(errno);
    for (int fd : {out, err, in, status_pipe[0], status_pipe[1]}) {
      if (fd >= 0) close(fd);
    }
    exit_code_ = 127;
    return;
  }

  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int s = 1; s < NSIG; ++s) {
      if (s != SIGKILL && s != SIGSTOP) signal(s, SIG_DFL);
    }
    dup2(in, STDIN_FILENO);
    dup2(out, STDOUT_FILENO);
    dup2(err, STDERR_FILENO);
    int e = 0;
    if (cwd != nullptr && chdir(cwd) != 0) {
      e = errno;
    } else {
      execve(program.c_str(), argv.data(), envp.data());
      e = errno;
    }
    (void)!write(status_pipe[1], &e, sizeof(e));
    _exit(127);
  }
  for (int fd : {out, err, in, status_pipe[1]}) close(fd);
  if (pid < 0) {
    close(status_pipe[0]);
    ADD_FAILURE() << "Subprocess: fork: " << std::strerror(errno);
    exit_code_ = 127;
    return;
  }
  // Also from the parent, so that a signal sent right after the constructor reaches the group.
  setpgid(pid, pid);
  pid_ = pid;
  int child_errno = 0;
  ssize_t n;
  do {
    n = read(status_pipe[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  close(status_pipe[0]);
  if (n == sizeof(child_errno)) {
    int status = 0;
    waitpid(pid_, &status, 0);
    Reaped(status);
    ADD_FAILURE() << "Subprocess: cannot run " << CommandLine() << ": "
                  << std::strerror(child_errno);
  }
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !exit_code_) Kill();
}

void Subprocess::Reaped(int status) { exit_code_ = ExitCode(status); }

bool Subprocess::Running() {
  if (exit_code_) return false;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    Reaped(status);
    return false;
  }
  if (r < 0) {
    // Someone else reaped it (should not happen in tests): treat it as gone.
    exit_code_ = 127;
    return false;
  }
  return true;
}

int Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (Running()) {
    if (absl::Now() >= deadline) {
      Kill();
      ADD_FAILURE() << "Subprocess did not exit within " << absl::FormatDuration(timeout)
                    << " and was killed: " << CommandLine() << "\n--- stdout:\n"
                    << Tail(Stdout()) << "\n--- stderr:\n"
                    << Tail(Stderr());
      return kTimedOut;
    }
    absl::SleepFor(kPollInterval);
  }
  return *exit_code_;
}

void Subprocess::Signal(int sig) {
  if (pid_ > 0 && !exit_code_) kill(pid_, sig);
}

void Subprocess::SignalGroup(int sig) {
  if (pid_ > 0 && !exit_code_) killpg(pid_, sig);
}

void Subprocess::Kill() {
  if (pid_ <= 0 || exit_code_) return;
  killpg(pid_, SIGKILL);
  kill(pid_, SIGKILL);  // in case it moved itself to another group
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, 0);
  } while (r < 0 && errno == EINTR);
  exit_code_ = r == pid_ ? ExitCode(status) : 128 + SIGKILL;
}

std::string Subprocess::Stdout() const { return ReadFileOrEmpty(stdout_path_); }
std::string Subprocess::Stderr() const { return ReadFileOrEmpty(stderr_path_); }

bool Subprocess::WaitForOutput(absl::string_view needle, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    if (absl::StrContains(Stdout(), needle) || absl::StrContains(Stderr(), needle)) return true;
    if (!Running() || absl::Now() >= deadline) {
      // One last look: the process may have written it just before exiting.
      return absl::StrContains(Stdout(), needle) || absl::StrContains(Stderr(), needle);
    }
    absl::SleepFor(kPollInterval);
  }
}

std::string Subprocess::CommandLine() const { return absl::StrJoin(options_.argv, " "); }

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    ADD_FAILURE() << "socket: " << std::strerror(errno);
    return 0;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  } else {
    ADD_FAILURE() << "cannot bind a loopback port: " << std::strerror(errno);
  }
  close(fd);
  return port;
}

bool WaitForLoopbackPort(int port, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool connected = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (connected) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(kPollInterval);
  }
}

std::vector<std::string> ProcessesMatching(absl::string_view marker) {
  std::vector<std::string> found;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) {
    ADD_FAILURE() << "cannot list /proc: " << std::strerror(errno);
    return found;
  }
  const pid_t self = getpid();
  while (dirent* entry = readdir(proc)) {
    int pid;
    if (!absl::SimpleAtoi(entry->d_name, &pid) || pid == self) continue;
    const std::string dir = absl::StrCat("/proc/", pid);
    // The state follows the command name in parentheses, which may itself hold ") ".
    const std::string stat = ReadFileOrEmpty(absl::StrCat(dir, "/stat"));
    const size_t paren = stat.rfind(')');
    if (stat.empty() || paren == std::string::npos || paren + 2 >= stat.size() ||
        stat[paren + 2] == 'Z' || stat[paren + 2] == 'X') {
      continue;
    }
    std::string cmdline = ReadFileOrEmpty(absl::StrCat(dir, "/cmdline"));
    absl::StrReplaceAll({{absl::string_view("\0", 1), " "}}, &cmdline);
    absl::StripTrailingAsciiWhitespace(&cmdline);
    if (absl::StrContains(cmdline, marker)) found.push_back(absl::StrCat(pid, ": ", cmdline));
  }
  closedir(proc);
  return found;
}

std::vector<std::string> WaitUntilNoProcessMatches(absl::string_view marker,
                                                   absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    std::vector<std::string> found = ProcessesMatching(marker);
    if (found.empty() || absl::Now() >= deadline) return found;
    absl::SleepFor(kPollInterval);
  }
}

std::string UniqueMarker() {
  static std::atomic<int> counter{0};
  return absl::StrCat("rdzvtest-", getpid(), "-", counter.fetch_add(1));
}

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string Describe(const Subprocess& process) {
  return absl::StrCat(process.CommandLine(), "\n--- stdout:\n", process.Stdout(), "\n--- stderr:\n",
                      process.Stderr());
}

}  // namespace rdzv::testing
