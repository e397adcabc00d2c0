// Logging setup shared by rdzvd and rdzv-agent: one spdlog logger on stderr whose lines name
// the program, so that interleaved output from srun stays attributable.
#ifndef RDZV_COMMON_LOGGING_H_
#define RDZV_COMMON_LOGGING_H_

#include <spdlog/fmt/fmt.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace rdzv {

// Installs the default logger for `program` at `level` (trace, debug, info, warn, error, off).
// InvalidArgument for an unknown level.
absl::Status SetUpLogging(absl::string_view program, absl::string_view level);

// `text` with its control characters written out (\n, \r, \t, else \xNN) and nothing else
// changed: text from the wire (names, reasons, a worker's last lines) stays one line in a log and
// cannot move a terminal's cursor or clear its screen.
std::string EscapeControl(absl::string_view text);

// Flushes stdout and stderr and, where they are pipes, waits up to `limit` until the reader has
// taken everything written to them. For a process about to exit with its last words: once a task
// of a job step has been killed by a signal, srun stops forwarding output when the last task
// has exited, and lines that slurmstepd had not yet read from a pipe are lost.
void AwaitOutputRead(absl::Duration limit);

}  // namespace rdzv

// Lets spdlog format absl::string_view (such as absl::Status::message()), which this abseil
// build keeps as a type of its own.
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  template <typename Context>
  auto format(absl::string_view s, Context& ctx) const {
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(s.data(), s.size()), ctx);
  }
};

#endif  // RDZV_COMMON_LOGGING_H_
