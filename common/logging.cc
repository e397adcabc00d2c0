#include "common/logging.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace rdzv {

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
  return absl::OkStatus();
}

}  // namespace rdzv
