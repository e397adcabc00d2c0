#include "client/agent/output_forwarder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace rdzv {
namespace {

constexpr size_t kTailLines = 20;
// "\n[... N more lines cut]" with N of up to 20 digits.
constexpr size_t kStackCutNoteBytes = 48;

void WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the terminal or pipe went away; output is best effort
    data.remove_prefix(static_cast<size_t>(n));
  }
}

// Opens `dir`/`name` for appending, refusing what another user could have set up to make the
// agent write elsewhere or block: a directory of another user (root's, like /tmp, is fine), a
// symbolic link, or anything but a regular file (a FIFO would block the agent).
absl::StatusOr<int> OpenLogFile(const std::string& dir, const std::string& name) {
  const std::string path = absl::StrCat(dir, "/", name);
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "--log-dir %s cannot be opened: %s; give a directory you can write", dir, strerror(errno)));
  }
  struct stat st;
  if (fstat(dir_fd, &st) != 0 || (st.st_uid != 0 && st.st_uid != geteuid())) {
    close(dir_fd);
    return absl::FailedPreconditionError(absl::StrFormat(
        "--log-dir %s belongs to another user (uid %d); give a directory of your own", dir,
        st.st_uid));
  }
  const int fd = openat(dir_fd, name.c_str(),
                        O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  const int open_errno = errno;
  close(dir_fd);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot write %s: %s; remove it or choose another --log-dir", path,
                        open_errno == ELOOP ? "it is a symbolic link" : strerror(open_errno)));
  }
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot write %s: not a regular file; remove it or choose another --log-dir", path));
  }
  return fd;
}

// `line` as the stderr tail keeps it: control characters escaped, at most kMaxTailLineBytes.
std::string TailLine(absl::string_view line) {
  std::string out;
  for (char c : line.substr(0, kMaxTailLineBytes)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 && c != '\t') {
      absl::StrAppend(&out, absl::StrFormat("\\x%02x", u));
    } else if (u == 0x7f) {
      out += "\\x7f";
    } else {
      out += c;
    }
  }
  if (line.size() > kMaxTailLineBytes) out += "...";
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerOutput>> WorkerOutput::Open(asio::io_context& io,
                                                                 const OutputOptions& options,
                                                                 int32_t rank, int32_t local_rank) {
  int log_fd = -1;
  if (!options.log_dir.empty()) {
    absl::StatusOr<int> fd = OpenLogFile(options.log_dir, absl::StrCat("rank-", rank, ".log"));
    if (!fd.ok()) return fd.status();
    log_fd = *fd;
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
    : options_(std::move(options)),
      rank_(rank),
      prefix_(options_.rank_prefix ? absl::StrCat("[", rank, "]: ") : ""),
      log_fd_(log_fd) {}

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

void WorkerOutput::CaptureStack() { capturing_ = true; }

std::string WorkerOutput::StderrTail() const {
  if (!stack_started_) return absl::StrJoin(err_tail_, "\n");
  if (stack_lines_cut_ == 0) return stack_;
  return absl::StrCat(stack_, "\n[... ", stack_lines_cut_, " more lines cut]");
}

void WorkerOutput::KeepStderrLine(const std::string& line, bool redraw) {
  // A redrawn line replaces what it redraws, as on the screen.
  if (redraw && !err_tail_.empty()) {
    err_tail_.back() = TailLine(line);
  } else {
    err_tail_.push_back(TailLine(line));
    if (err_tail_.size() > kTailLines) err_tail_.pop_front();
  }
  if (!capturing_) return;
  if (!stack_started_) {
    stack_started_ = absl::StartsWith(line, "Fatal Python error") ||
                     absl::StartsWith(line, "Thread 0x") ||
                     absl::StartsWith(line, "Current thread 0x");
    if (!stack_started_) return;
  }
  const std::string kept = TailLine(line);
  // Room for the newline and for the note of what was cut.
  if (stack_lines_cut_ > 0 ||
      stack_.size() + kept.size() + 1 + kStackCutNoteBytes > kMaxStackBytes) {
    ++stack_lines_cut_;
    return;
  }
  if (!stack_.empty()) stack_ += '\n';
  stack_ += kept;
}

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
  Batch batch;
  // Only the new bytes are searched: what came before is in pipe.line, with no line end in it.
  while (!data.empty()) {
    const size_t end = data.find_first_of("\r\n");
    if (end == absl::string_view::npos) {
      Append(pipe, data, batch);
      break;
    }
    Append(pipe, data.substr(0, end), batch);
    EndLine(pipe, data[end], batch);
    data.remove_prefix(end + 1);
  }
  if (eof && !pipe.line.empty()) EndLine(pipe, '\n', batch);
  // A line being redrawn shows on the console now, as it would on a terminal, not when the next
  // redraw ends it; the cursor goes back to the start of the line for the next one.
  if (pipe.console_fd >= 0 && pipe.after_cr && !pipe.line.empty() && !pipe.line_shown) {
    absl::StrAppend(&batch.console, prefix_, pipe.line, "\r");
    pipe.line_shown = true;
  }
  if (log_fd_ >= 0) WriteAll(log_fd_, batch.log);
  if (pipe.console_fd >= 0) WriteAll(pipe.console_fd, batch.console);
}

void WorkerOutput::Append(Pipe& pipe, absl::string_view text, Batch& batch) {
  if (!text.empty()) pipe.line_shown = false;
  while (pipe.line.size() + text.size() > kMaxLineBytes) {
    const size_t room = kMaxLineBytes - pipe.line.size();
    pipe.line.append(text.data(), room);
    text.remove_prefix(room);
    EndLine(pipe, '\n', batch);
  }
  pipe.line.append(text.data(), text.size());
}

void WorkerOutput::EndLine(Pipe& pipe, char end, Batch& batch) {
  const absl::string_view end_text(&end, 1);
  if (end == '\n' && pipe.after_cr && pipe.line.empty()) {
    // "\r\n": the line was drawn already; only move on to the next one.
    if (log_fd_ >= 0) batch.log += '\n';
    if (pipe.console_fd >= 0) batch.console += '\n';
    pipe.after_cr = false;
    return;
  }
  if (log_fd_ >= 0) absl::StrAppend(&batch.log, pipe.line, end_text);
  if (pipe.console_fd >= 0) {
    if (!pipe.line_shown) {
      absl::StrAppend(&batch.console, prefix_, pipe.line, end_text);
    } else if (end == '\n') {
      // Shown already, with the cursor back at its start.
      batch.console += '\n';
    }
  }
  if (pipe.is_stderr) KeepStderrLine(pipe.line, pipe.after_cr);
  pipe.after_cr = end == '\r';
  pipe.line_shown = false;
  pipe.line.clear();
}

}  // namespace rdzv
