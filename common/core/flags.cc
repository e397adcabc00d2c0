#include "common/core/flags.h"

#include <cstdint>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"

namespace rdzv {
namespace {

// Error messages repeat what the user typed, but a huge value would drown the one line that
// says what to fix.
constexpr size_t kMaxShown = 200;

// `text` as an error message shows it: escaped, so that a newline or other control character
// in an argument or variable cannot break the message over several lines, and shortened.
std::string Shown(absl::string_view text) {
  if (text.size() <= kMaxShown) return absl::CHexEscape(text);
  return absl::StrCat(absl::CHexEscape(text.substr(0, kMaxShown)), "...");
}

}  // namespace

absl::StatusOr<bool> ParseBool(absl::string_view value) {
  const std::string v = absl::AsciiStrToLower(value);
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  return absl::InvalidArgumentError(
      absl::StrFormat("\"%s\" is not a switch value; expected true or false", Shown(value)));
}

const Flag* FlagParser::Find(absl::string_view name) const {
  const std::string normal = absl::StrReplaceAll(name, {{"_", "-"}});
  for (const Flag& f : flags_) {
    if (f.name == normal) return &f;
  }
  return nullptr;
}

absl::StatusOr<std::vector<std::string>> FlagParser::Parse(const std::vector<std::string>& args,
                                                           const EnvLookup& env) const {
  // First read the command line, then apply the variables of the flags it did not give, then
  // the command line: it wins, and a stale variable it overrides is never even parsed.
  std::vector<std::pair<const Flag*, std::string>> given;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (!absl::StartsWith(arg, "-") || arg == "-") break;
    absl::string_view body = arg;
    body.remove_prefix(absl::StartsWith(body, "--") ? 2 : 1);
    std::optional<std::string> value;
    if (const size_t eq = body.find('='); eq != absl::string_view::npos) {
      value = std::string(body.substr(eq + 1));
      body = body.substr(0, eq);
    }
    const Flag* flag = Find(body);
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown flag ", Shown(arg), "; see ", program_, " --help",
          unknown_flag_hint_.empty() ? "" : absl::StrCat(" (", unknown_flag_hint_, ")")));
    }
    if (!value) {
      if (flag->value_name.empty()) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(
            absl::StrFormat("--%s needs a value (%s)", flag->name, flag->value_name));
      }
    }
    given.emplace_back(flag, std::move(*value));
  }

  for (const Flag& f : flags_) {
    if (f.env.empty()) continue;
    if (absl::c_any_of(given, [&f](const auto& g) { return g.first == &f; })) continue;
    std::optional<std::string> v = env(f.env);
    if (!v || v->empty()) continue;
    if (absl::Status s = f.set(*v); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(f.env, "=\"", Shown(*v), "\": ", s.message()));
    }
  }
  for (const auto& [flag, value] : given) {
    if (absl::Status s = flag->set(value); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag->name, "=\"", Shown(value), "\": ", s.message()));
    }
  }
  return std::vector<std::string>(args.begin() + static_cast<long>(i), args.end());
}

std::string FlagParser::Help() const {
  std::string out = absl::StrCat(usage_, "\n\nFlags (each also settable through its variable):\n");
  for (const Flag& f : flags_) {
    std::string head = absl::StrCat("  --", f.name);
    if (!f.value_name.empty()) absl::StrAppend(&head, " ", f.value_name);
    if (!f.env.empty()) absl::StrAppend(&head, "  [", f.env, "]");
    absl::StrAppend(&out, head, "\n      ", absl::StrReplaceAll(f.help, {{"\n", "\n      "}}),
                    "\n");
  }
  return out;
}

absl::StatusOr<uid_t> ParseUid(absl::string_view text) {
  uint32_t uid = 0;
  // (uid_t)-1 means "no uid" to the system calls that take one.
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &uid) || uid == UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "\"%s\" is not a uid; expected a number (id -u USER prints one)", absl::CHexEscape(text)));
  }
  return static_cast<uid_t>(uid);
}

absl::StatusOr<int64_t> ParseInt(absl::string_view text, int64_t min, int64_t max,
                                 absl::string_view expected) {
  int64_t n = 0;
  if (!absl::SimpleAtoi(text, &n) || n < min || n > max) {
    return absl::InvalidArgumentError(
        expected.empty() ? absl::StrFormat("expected a whole number in %d..%d", min, max)
                         : absl::StrCat("expected ", expected));
  }
  return n;
}

FlagSetter StringSetter(std::string* target) {
  return [target](absl::string_view v) {
    *target = std::string(v);
    return absl::OkStatus();
  };
}

FlagSetter BoolSetter(bool* target) {
  return [target](absl::string_view v) {
    absl::StatusOr<bool> b = ParseBool(v);
    if (!b.ok()) return b.status();
    *target = *b;
    return absl::OkStatus();
  };
}

FlagSetter SetWhateverTheValue(bool* target) {
  return [target](absl::string_view) {
    *target = true;
    return absl::OkStatus();
  };
}

FlagSetter DurationSetter(absl::Duration* target) {
  return [target](absl::string_view v) {
    double seconds;
    absl::Duration d;
    if (absl::SimpleAtod(v, &seconds)) {
      // NaN fails both comparisons; infinity is over the maximum.
      if (!(seconds >= 0)) return absl::InvalidArgumentError("expected a duration of 0 or more");
      d = seconds > absl::ToDoubleSeconds(kMaxFlagDuration) ? absl::InfiniteDuration()
                                                            : absl::Seconds(seconds);
    } else if (!absl::ParseDuration(v, &d)) {
      return absl::InvalidArgumentError("expected a duration such as 30, 30s, 500ms or 2m");
    } else if (d < absl::ZeroDuration()) {
      return absl::InvalidArgumentError("expected a duration of 0 or more");
    }
    if (d > kMaxFlagDuration) {
      return absl::InvalidArgumentError("expected a duration of at most 365 days (8760h)");
    }
    *target = d;
    return absl::OkStatus();
  };
}

FlagSetter MillisSetter(absl::Duration* target) {
  return [target](absl::string_view v) {
    absl::StatusOr<int64_t> ms = ParseInt(v, 0, INT64_MAX, "milliseconds, a whole number >= 0");
    if (!ms.ok()) return ms.status();
    *target = absl::Milliseconds(*ms);
    return absl::OkStatus();
  };
}

FlagSetter UidSetter(std::optional<uid_t>* target) {
  return [target](absl::string_view v) {
    absl::StatusOr<uid_t> uid = ParseUid(v);
    if (!uid.ok()) return uid.status();
    *target = *uid;
    return absl::OkStatus();
  };
}

}  // namespace rdzv
