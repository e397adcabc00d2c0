// WorkerOutput: forwards one worker's stdout and stderr, line by line, to the agent's console
// (each line prefixed "[RANK]: "), to the rank's log file, or both, and keeps the last lines of
// the worker's stderr for the root cause of a failure.
//
// A line ends at '\n' or at '\r': a carriage return (a progress bar redrawing its line) is
// forwarded as it comes, prefixed, so the console shows what it would without the agent, and a
// line still being redrawn is shown on the console at once. A line over kMaxLineBytes is passed
// on in pieces of that size. Each byte is looked at once and memory per worker is bounded,
// whatever the worker writes.
//
// It owns the read ends of the worker's pipes and its log file, and reads them on the agent's
// io_context. Not thread-safe: use it from the thread that runs that io_context.
//
// A hung worker is sent SIGABRT, and Python's faulthandler prints its stack, innermost frame
// first, with more after it (other threads, the extension modules): the last lines would lose
// the line the worker was stuck on. After CaptureStack, the stack is kept from its first line on
// instead.
#ifndef RDZV_CLIENT_AGENT_OUTPUT_FORWARDER_H_
#define RDZV_CLIENT_AGENT_OUTPUT_FORWARDER_H_

#include <array>
#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/agent/core/agent_options.h"

namespace rdzv {

// The longest line kept whole; a longer one is forwarded in pieces of this size.
inline constexpr size_t kMaxLineBytes = 64 * 1024;
// How much of each stderr line the tail keeps for the root cause.
inline constexpr size_t kMaxTailLineBytes = 4096;
// The most of a captured stack kept, the note that more was cut included: what the server keeps
// of a failure's stderr (guard/request_limits.h kMaxTailBytes), which cuts from the start.
inline constexpr size_t kMaxStackBytes = 16 * 1024;

class WorkerOutput {
 public:
  // The output of the worker at `rank` / `local_rank`: opens its log file (appending) when
  // options.log_dir is set. FailedPrecondition, naming the file or directory, when it cannot be
  // opened, when the directory belongs to another user (not root), or when the file is not a
  // regular file (a symbolic link is not followed).
  static absl::StatusOr<std::unique_ptr<WorkerOutput>> Open(asio::io_context& io,
                                                            const OutputOptions& options,
                                                            int32_t rank, int32_t local_rank);
  ~WorkerOutput();
  WorkerOutput(const WorkerOutput&) = delete;
  WorkerOutput& operator=(const WorkerOutput&) = delete;

  // Starts reading the worker's pipes (taking ownership of both fds). `on_closed` runs on the
  // io_context once both have reached their end; the object may be destroyed from it.
  void Start(int stdout_fd, int stderr_fd, std::function<void()> on_closed);

  // Both pipes have ended (or were never started).
  bool closed() const { return open_pipes_ == 0; }

  // Forwards what the worker has already written and the pipes hold, without waiting: a worker
  // that has ended has written everything, but its pipes may not have been read yet.
  void DrainAvailable();

  // From now on, a line of stderr that opens a Python stack dump ("Fatal Python error: ...",
  // "Thread 0x...", "Current thread 0x...") starts the stack: it and the lines after it are
  // kept, up to kMaxStackBytes.
  void CaptureStack();

  // The stack, once CaptureStack has seen one start; else the last lines the worker wrote to
  // stderr, oldest first. Control characters are escaped (a line redrawn with '\r' counts once,
  // as last drawn).
  std::string StderrTail() const;

 private:
  struct Pipe {
    std::unique_ptr<asio::posix::stream_descriptor> stream;
    std::array<char, 65536> buffer;
    std::string line;         // the current line so far, at most kMaxLineBytes
    bool after_cr = false;    // the last line ended with '\r': `line` redraws it
    bool line_shown = false;  // `line` is on the console already, not yet ended
    int console_fd = -1;      // where its lines go on the console, -1 for nowhere
    bool is_stderr = false;
  };
  // What one read produces, written at once.
  struct Batch {
    std::string console, log;
  };

  WorkerOutput(OutputOptions options, int32_t rank, int log_fd);
  void Read(Pipe& pipe);
  void Emit(Pipe& pipe, absl::string_view data, bool eof);
  // Adds `text` (no line ends in it) to the pipe's current line, passing on full pieces.
  void Append(Pipe& pipe, absl::string_view text, Batch& batch);
  // Ends the current line with `end` ('\n' or '\r').
  void EndLine(Pipe& pipe, char end, Batch& batch);
  // Keeps a line of stderr, escaped, for StderrTail.
  void KeepStderrLine(const std::string& line, bool redraw);

  const OutputOptions options_;
  const int32_t rank_;
  const std::string prefix_;  // "[RANK]: " or ""
  const int log_fd_;          // the rank's log file, -1 for none
  asio::io_context* io_ = nullptr;
  Pipe out_, err_;
  int open_pipes_ = 0;
  std::deque<std::string> err_tail_;
  // The stack: capturing_ after CaptureStack, stack_started_ from its first line on.
  bool capturing_ = false;
  bool stack_started_ = false;
  std::string stack_;
  int64_t stack_lines_cut_ = 0;
  std::function<void()> on_closed_;
};

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_OUTPUT_FORWARDER_H_
