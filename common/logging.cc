#include "common/logging.h"

#include <grpc/support/log.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace rdzv {
namespace {

// gRPC's own log lines are multi-line internals; they go to the debug level, so that users see
// our one-line errors and developers can still ask for gRPC's view with --log-level debug.
void GrpcLogToSpdlog(gpr_log_func_args* args) {
  const spdlog::level::level_enum level =
      args->severity == GPR_LOG_SEVERITY_ERROR ? spdlog::level::debug : spdlog::level::trace;
  spdlog::log(level, "grpc {}:{}: {}", args->file, args->line, args->message);
}

}  // namespace

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
