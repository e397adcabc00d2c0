#include "client/output_forwarder.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace rdzv {
namespace {

constexpr size_t kTailLines = 20;

void WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the terminal or pipe went away; output is best effort
    data.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerOutput>> WorkerOutput::Open(asio::io_context& io,
                                                                 const OutputOptions& options,
                                                                 int32_t rank, int32_t local_rank) {
  int log_fd = -1;
  if (!options.log_dir.empty()) {
    const std::string path = absl::StrCat(options.log_dir, "/rank-", rank, ".log");
    log_fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      return absl::FailedPreconditionError(
          absl::StrFormat("cannot write %s: %s", path, strerror(errno)));
    }
  }
  std::unique_ptr<WorkerOutput> output(new WorkerOutput(options, rank, log_fd));
  output->io_ = &io;
  const bool console = options.log_dir.empty() || options.tee;
  const bool shown = console && (options.local_ranks_filter.empty() ||
                                 absl::c_linear_search(options.local_ranks_filter, local_rank));
  output->out_.console_fd = shown ? STDOUT_FILENO : -1;
  output->err_.console_fd = shown ? STDERR_FILENO : -1;
  output->err_.is_stderr = true;
  return output;
}

WorkerOutput::WorkerOutput(OutputOptions options, int32_t rank, int log_fd)
    : options_(std::move(options)), rank_(rank), log_fd_(log_fd) {}

WorkerOutput::~WorkerOutput() {
  if (log_fd_ >= 0) close(log_fd_);
}

void WorkerOutput::Start(int stdout_fd, int stderr_fd, std::function<void()> on_closed) {
  on_closed_ = std::move(on_closed);
  out_.stream = std::make_unique<asio::posix::stream_descriptor>(*io_, stdout_fd);
  err_.stream = std::make_unique<asio::posix::stream_descriptor>(*io_, stderr_fd);
  open_pipes_ = 2;
  Read(out_);
  Read(err_);
}

std::string WorkerOutput::StderrTail() const { return absl::StrJoin(err_tail_, "\n"); }

void WorkerOutput::DrainAvailable() {
  for (Pipe* pipe : {&out_, &err_}) {
    if (!pipe->stream || !pipe->stream->is_open()) continue;
    const int fd = pipe->stream->native_handle();
    const int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || (!(flags & O_NONBLOCK) && fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)) {
      continue;
    }
    // Bounded: a worker's descendants may still be writing.
    for (int i = 0; i < 64; ++i) {
      const ssize_t n = read(fd, pipe->buffer.data(), pipe->buffer.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // empty for now, or the end, which the pending read will see too
      Emit(*pipe, absl::string_view(pipe->buffer.data(), static_cast<size_t>(n)), false);
    }
  }
}

void WorkerOutput::Read(Pipe& pipe) {
  pipe.stream->async_read_some(
      asio::buffer(pipe.buffer), [this, &pipe](const std::error_code& ec, size_t n) {
        Emit(pipe, absl::string_view(pipe.buffer.data(), n), ec.value() != 0);
        if (!ec) {
          Read(pipe);
          return;
        }
        pipe.stream->close();
        if (--open_pipes_ == 0 && on_closed_) {
          // Moved out first: the call may destroy this object.
          std::function<void()> closed = std::move(on_closed_);
          closed();
        }
      });
}

void WorkerOutput::Emit(Pipe& pipe, absl::string_view data, bool eof) {
  pipe.partial.append(data.data(), data.size());
  if (eof && !pipe.partial.empty() && pipe.partial.back() != '\n') pipe.partial.push_back('\n');
  const size_t end = pipe.partial.rfind('\n');
  if (end == std::string::npos) return;
  const absl::string_view lines(pipe.partial.data(), end + 1);
  if (log_fd_ >= 0) WriteAll(log_fd_, lines);
  if (pipe.console_fd >= 0 || pipe.is_stderr) {
    const std::string prefix = options_.rank_prefix ? absl::StrCat("[", rank_, "]: ") : "";
    std::string out;
    for (absl::string_view line : absl::StrSplit(lines.substr(0, end), '\n')) {
      if (pipe.console_fd >= 0) absl::StrAppend(&out, prefix, line, "\n");
      if (pipe.is_stderr) {
        err_tail_.emplace_back(line);
        if (err_tail_.size() > kTailLines) err_tail_.pop_front();
      }
    }
    if (pipe.console_fd >= 0) WriteAll(pipe.console_fd, out);
  }
  pipe.partial.erase(0, end + 1);
}

}  // namespace rdzv
