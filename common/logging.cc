#include "common/logging.h"

#include <grpc/support/log.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace rdzv {
namespace {

// gRPC's own log lines are multi-line internals; they go to the debug level, so that users see
// our one-line errors and developers can still ask for gRPC's view with --log-level debug.
void GrpcLogToSpdlog(gpr_log_func_args* args) {
  // gRPC's errors are mostly a peer's doing (a reset, a bad handshake) and stay at debug; but an
  // assertion of its own is the process's last line before abort(), and must be seen.
  const absl::string_view message = args->message != nullptr ? args->message : "";
  if (args->severity == GPR_LOG_SEVERITY_ERROR &&
      (absl::StartsWith(message, "assertion failed") ||
       absl::StartsWith(message, "Should never reach here"))) {
    spdlog::critical("gRPC failed its own check at {}:{}: {}", args->file, args->line, message);
    if (spdlog::default_logger_raw() != nullptr) spdlog::default_logger_raw()->flush();
    return;
  }
  const spdlog::level::level_enum level =
      args->severity == GPR_LOG_SEVERITY_ERROR ? spdlog::level::debug : spdlog::level::trace;
  spdlog::log(level, "grpc {}:{}: {}", args->file, args->line, message);
}

// Bytes written to the pipe `fd` that its reader has not taken yet; 0 when fd is no pipe.
int Unread(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) return 0;
  int queued = 0;
  return ioctl(fd, FIONREAD, &queued) == 0 ? queued : 0;
}

}  // namespace

void AwaitOutputRead(absl::Duration limit) {
  if (spdlog::default_logger_raw() != nullptr) spdlog::default_logger_raw()->flush();
  std::fflush(stdout);
  std::fflush(stderr);
  const absl::Time deadline = absl::Now() + limit;
  while (Unread(STDOUT_FILENO) > 0 || Unread(STDERR_FILENO) > 0) {
    if (absl::Now() >= deadline) return;
    absl::SleepFor(absl::Milliseconds(1));
  }
}

std::string EscapeControl(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (absl::ascii_iscntrl(static_cast<unsigned char>(c))) {
          absl::StrAppend(&out, "\\x", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
        } else {
          out += c;
        }
    }
  }
  return out;
}

absl::Status SetUpLogging(absl::string_view program, absl::string_view level) {
  const spdlog::level::level_enum parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--log-level \"", level, "\" is unknown; expected trace, debug, info, warn, error or off"));
  }
  auto logger = spdlog::stderr_logger_mt(std::string(program));
  logger->set_pattern(absl::StrCat(program, " %L %H:%M:%S.%e %v"));
  logger->set_level(parsed);
  spdlog::set_default_logger(logger);
  gpr_set_log_function(GrpcLogToSpdlog);
  gpr_set_log_verbosity(GPR_LOG_SEVERITY_ERROR);
  return absl::OkStatus();
}

}  // namespace rdzv
