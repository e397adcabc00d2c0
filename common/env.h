// Environment access through an injected lookup, so that parsers stay pure and tests can hand
// them any environment they like.
#ifndef RDZV_COMMON_ENV_H_
#define RDZV_COMMON_ENV_H_

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/worker_env.h"

namespace rdzv {

using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;

// An EnvLookup over the real process environment (getenv), for main()s.
EnvLookup ProcessEnv();

// An EnvLookup over a fixed list, for tests and for environments built in memory.
EnvLookup EnvFromList(EnvList vars);

// The current process environment as a list, in its own order.
EnvList ProcessEnvList();

// Parses a site configuration file's text: "NAME=value" lines, '#' comments and blank lines
// ignored, values optionally in double quotes. InvalidArgument names the first bad line.
absl::StatusOr<EnvList> ParseConfigText(absl::string_view text);

// Looks in `first`, then in `fallback`: the environment overrides the site configuration.
EnvLookup EnvWithFallback(EnvLookup first, EnvLookup fallback);

}  // namespace rdzv

#endif  // RDZV_COMMON_ENV_H_
