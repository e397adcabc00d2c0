// Environment access through an injected lookup, so that parsers stay pure and tests can hand
// them any environment they like. The real process environment is in process_env.h.
#ifndef RDZV_COMMON_CORE_ENV_H_
#define RDZV_COMMON_CORE_ENV_H_

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rdzv {

// Variables as (name, value) pairs, in order.
using EnvList = std::vector<std::pair<std::string, std::string>>;

using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;

// An EnvLookup over a fixed list, for tests and for environments built in memory.
EnvLookup EnvFromList(EnvList vars);

// Parses a site configuration file's text: "NAME=value" lines, '#' comments and blank lines
// ignored, values optionally in double quotes. InvalidArgument names the first bad line.
absl::StatusOr<EnvList> ParseConfigText(absl::string_view text);

// Looks in `first`, then in `fallback`: the environment overrides the site configuration.
EnvLookup EnvWithFallback(EnvLookup first, EnvLookup fallback);

}  // namespace rdzv

#endif  // RDZV_COMMON_CORE_ENV_H_
