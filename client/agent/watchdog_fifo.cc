#include "client/agent/watchdog_fifo.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <asio/post.hpp>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"

namespace rdzv {
namespace {

constexpr std::chrono::milliseconds kPollInterval(100);
// Reads of the FIFO's buffer in one go.
constexpr int kMaxReadsAtOnce = 64;

// The parent of `pid` from /proc/PID/stat ("PID (COMM) STATE PPID ..."; COMM may hold spaces
// and parentheses, so the fields are counted from the last ')'); 0 when it cannot be read.
int64_t ParentOf(int64_t pid) {
  std::ifstream in(absl::StrFormat("/proc/%d/stat", pid));
  if (!in) return 0;
  std::stringstream content;
  content << in.rdbuf();
  const std::string stat = content.str();
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close + 1));
  std::string state;
  int64_t ppid = 0;
  if (!(rest >> state >> ppid)) return 0;
  return ppid;
}

}  // namespace

absl::StatusOr<std::unique_ptr<WatchdogFifo>> WatchdogFifo::Open(asio::io_context& io,
                                                                 std::string path,
                                                                 HangWatchdogOptions options,
                                                                 OnHang on_hang) {
  if (mkfifo(path.c_str(), 0600) != 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot create the watchdog FIFO %s: %s", path, std::strerror(errno)));
  }
  // Read and write: the FIFO then always has a writer (no end-of-file between workers) and a
  // reader (a worker's O_NONBLOCK open for writing succeeds).
  // What is opened must be the FIFO just made: not a link, nor anything put in its place.
  const int fd = open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    const int err = errno;
    unlink(path.c_str());
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot open the watchdog FIFO %s: %s", path,
                        err == ELOOP ? "it was replaced by a symbolic link" : std::strerror(err)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) {
    close(fd);
    unlink(path.c_str());
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot open the watchdog FIFO %s: it was replaced by something that is "
                        "not a FIFO",
                        path));
  }
  return std::unique_ptr<WatchdogFifo>(
      new WatchdogFifo(io, std::move(path), fd, std::move(options), std::move(on_hang)));
}

WatchdogFifo::WatchdogFifo(asio::io_context& io, std::string path, int fd,
                           HangWatchdogOptions options, OnHang on_hang)
    : io_(io),
      path_(std::move(path)),
      stream_(io, fd),
      on_hang_(std::move(on_hang)),
      watchdog_(std::move(options)),
      poll_timer_(io) {
  WaitReadable();
}

WatchdogFifo::~WatchdogFifo() {
  if (malformed_ > 0 || foreign_ > 0) {
    spdlog::info("watchdog FIFO: ignored {} malformed requests and {} from other processes",
                 malformed_, foreign_);
  }
  std::error_code ignored;
  poll_timer_.cancel();
  stream_.close(ignored);
  unlink(path_.c_str());
}

void WatchdogFifo::StartRound(std::vector<pid_t> pids, int32_t first_rank, int32_t first_local_rank,
                              Micros job_longest_interval, std::vector<pid_t> processes) {
  pids_ = std::move(pids);
  processes_ = std::move(processes);
  first_rank_ = first_rank;
  first_local_rank_ = first_local_rank;
  owner_cache_.clear();
  watchdog_.Start(static_cast<int32_t>(pids_.size()), WallMicros(), job_longest_interval);
  round_live_ = true;
  Poll();
}

void WatchdogFifo::StopRound() {
  round_live_ = false;
  poll_timer_.cancel();
}

void WatchdogFifo::WorkerEnded(int32_t worker) { watchdog_.WorkerEnded(worker); }

void WatchdogFifo::WaitReadable() {
  stream_.async_wait(asio::posix::stream_descriptor::wait_read, [this](const std::error_code& ec) {
    if (ec == asio::error::operation_aborted) return;
    if (ec || !ReadAvailable()) {
      spdlog::warn("watchdog FIFO {}: {}; timers and heartbeats are no longer watched", path_,
                   ec ? ec.message() : std::strerror(errno));
      return;
    }
    WaitReadable();
  });
}

bool WatchdogFifo::ReadAvailable() {
  // Bounded, so that a flood of requests cannot hold up the agent's loop; the rest is read when
  // the loop comes back here.
  for (int i = 0; i < kMaxReadsAtOnce; ++i) {
    const ssize_t n = read(stream_.native_handle(), buffer_.data(), buffer_.size());
    if (n < 0 && errno == EINTR) continue;
    // The agent holds a writer open itself, so the FIFO never ends; empty is EAGAIN.
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
    if (n == 0) return true;
    Consume(absl::string_view(buffer_.data(), static_cast<size_t>(n)));
  }
  return true;
}

void WatchdogFifo::Consume(absl::string_view data) {
  while (!data.empty()) {
    const size_t nl = data.find('\n');
    const absl::string_view piece = data.substr(0, nl);
    if (!discarding_) {
      if (partial_.size() + piece.size() > kMaxWatchdogLine) {
        ++malformed_;
        if (malformed_ == 1) {
          spdlog::warn("watchdog FIFO: ignoring a request longer than {} bytes", kMaxWatchdogLine);
        }
        partial_.clear();
        discarding_ = true;
      } else {
        partial_.append(piece.data(), piece.size());
      }
    }
    if (nl == absl::string_view::npos) return;
    if (!discarding_) HandleLine(partial_);
    partial_.clear();
    discarding_ = false;
    data.remove_prefix(nl + 1);
  }
}

void WatchdogFifo::HandleLine(absl::string_view line) {
  if (line.find_first_not_of(" \t\r") == absl::string_view::npos) return;
  absl::StatusOr<WatchdogRequest> request = ParseWatchdogLine(line);
  if (!request.ok()) {
    if (++malformed_ == 1) {
      spdlog::warn("watchdog FIFO: ignoring a malformed request ({}): {}",
                   std::string(request.status().message()), std::string(line.substr(0, 200)));
    }
    return;
  }
  std::optional<int32_t> worker;
  if (auto it = owner_cache_.find(request->pid); it != owner_cache_.end()) {
    worker = it->second;
  } else {
    for (size_t i = 0; i < processes_.size() && !worker; ++i) {
      if (processes_[i] > 0 && processes_[i] == request->pid) worker = static_cast<int32_t>(i);
    }
    if (!worker) worker = OwningWorker(request->pid, pids_, ParentOf);
    if (worker) owner_cache_.emplace(request->pid, *worker);
  }
  if (!worker) {
    if (++foreign_ == 1) {
      spdlog::warn(
          "watchdog FIFO: ignoring a request from pid {}, which is not one of this agent's "
          "workers",
          request->pid);
    }
    return;
  }
  if (request->kind == WatchdogRequest::Kind::kRankRequest) {
    if (requests_.size() >= kMaxPendingRequests) return;
    requests_.push_back(
        RankAsk{first_rank_ + *worker, request->request, std::move(request->reason)});
    if (on_request_) asio::post(io_, on_request_);
    return;
  }
  if (std::optional<std::string> full = watchdog_.Apply(*worker, *request, WallMicros())) {
    spdlog::warn("watchdog FIFO: {}", *full);
  }
}

std::vector<WatchdogFifo::RankAsk> WatchdogFifo::TakeRequests() {
  ReadAvailable();
  return std::exchange(requests_, {});
}

std::optional<WorkerHang> WatchdogFifo::CheckNow() {
  if (!round_live_) return std::nullopt;
  // Requests still in the FIFO (a heartbeat, a released timer) count: a worker is judged on
  // everything it has written.
  ReadAvailable();
  std::optional<WorkerHang> hang = watchdog_.Check(WallMicros());
  if (hang) {
    hang->rank = first_rank_ + hang->worker;
    hang->local_rank = first_local_rank_ + hang->worker;
  }
  return hang;
}

void WatchdogFifo::Poll() {
  if (!round_live_) return;
  if (std::optional<WorkerHang> hang = CheckNow()) {
    asio::post(io_, [on_hang = on_hang_, hang = *std::move(hang)] { on_hang(hang); });
  }
  poll_timer_.expires_after(kPollInterval);
  poll_timer_.async_wait([this](const std::error_code& ec) {
    if (!ec) Poll();
  });
}

}  // namespace rdzv
