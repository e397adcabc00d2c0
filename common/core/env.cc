#include "common/core/env.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace rdzv {

EnvLookup EnvFromList(EnvList vars) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    for (auto it = vars.rbegin(); it != vars.rend(); ++it) {
      if (it->first == name) return it->second;
    }
    return std::nullopt;
  };
}

absl::StatusOr<EnvList> ParseConfigText(absl::string_view text) {
  EnvList vars;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    const size_t eq = line.find('=');
    absl::string_view name = eq == absl::string_view::npos
                                 ? absl::string_view()
                                 : absl::StripAsciiWhitespace(line.substr(0, eq));
    if (name.empty() || name.find_first_of(" \t\"'") != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "line %d \"%s\" is not NAME=value; expected e.g. RDZV_ENDPOINT=head:29400", line_number,
          line));
    }
    absl::string_view value = absl::StripAsciiWhitespace(line.substr(eq + 1));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      value = value.substr(1, value.size() - 2);
    }
    vars.emplace_back(std::string(name), std::string(value));
  }
  return vars;
}

EnvLookup EnvWithFallback(EnvLookup first, EnvLookup fallback) {
  return [first = std::move(first),
          fallback = std::move(fallback)](std::string_view name) -> std::optional<std::string> {
    if (std::optional<std::string> v = first(name)) return v;
    return fallback(name);
  };
}

}  // namespace rdzv
