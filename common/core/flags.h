// A small command-line parser for rdzvd, rdzv-agent and rdzvctl: --name=value / --name value, with
// every flag also settable through an environment variable (the command line wins). Underscores in
// flag names are accepted as dashes, so torchrun spellings such as --nproc_per_node work.
// Parsing stops at "--" or at the first word that is not a flag: the rest is the command.
// The setters below parse the kinds of value the three programs share, so that each kind is read,
// and refused, the same way everywhere.
#ifndef RDZV_COMMON_CORE_FLAGS_H_
#define RDZV_COMMON_CORE_FLAGS_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/core/env.h"

namespace rdzv {

// Receives a flag's value ("true" for a bare switch); an error names what was expected. The
// parser adds the flag or variable and the value to the message.
using FlagSetter = std::function<absl::Status(absl::string_view value)>;

struct Flag {
  std::string name;        // without dashes, e.g. "nproc-per-node"
  std::string env;         // e.g. "RDZV_NPROC_PER_NODE"; empty for none
  std::string value_name;  // e.g. "N"; empty for a switch that takes no value
  std::string help;
  FlagSetter set;
};

class FlagParser {
 public:
  FlagParser(std::string program, std::string usage)
      : program_(std::move(program)), usage_(std::move(usage)) {}

  void Add(Flag flag) { flags_.push_back(std::move(flag)); }

  // Appended in parentheses to the error for an unknown flag, e.g. where the program's own
  // arguments end.
  void SetUnknownFlagHint(std::string hint) { unknown_flag_hint_ = std::move(hint); }

  // Applies the environment, then `args` (without argv[0]). Returns the words after the flags.
  // An unknown flag or a bad value gives InvalidArgument naming the flag or variable.
  absl::StatusOr<std::vector<std::string>> Parse(const std::vector<std::string>& args,
                                                 const EnvLookup& env) const;

  // The --help text: usage, then one entry per flag with its variable.
  std::string Help() const;

 private:
  const Flag* Find(absl::string_view name) const;

  std::string program_;
  std::string usage_;
  std::string unknown_flag_hint_;
  std::vector<Flag> flags_;
};

// Parses a switch value: true/false/1/0/yes/no/on/off.
absl::StatusOr<bool> ParseBool(absl::string_view value);

// Parses the uid a server must run as (RDZV_SERVER_UID): a number, 0 to 4294967294.
// InvalidArgument, saying what is expected, otherwise.
absl::StatusOr<uid_t> ParseUid(absl::string_view text);

// Parses a whole number from `min` to `max`. InvalidArgument otherwise, saying "expected "
// and then `expected`, or "a whole number in MIN..MAX" when `expected` is empty.
absl::StatusOr<int64_t> ParseInt(absl::string_view text, int64_t min, int64_t max,
                                 absl::string_view expected = "");

// The setters below store a parsed value in `*target`, which must outlive the parser; on an
// error they leave it as it was.

FlagSetter StringSetter(std::string* target);

// ParseBool's result.
FlagSetter BoolSetter(bool* target);

// Sets `*target` whatever the value: a flag such as --help, which --help=no still asks for.
FlagSetter SetWhateverTheValue(bool* target);

// ParseInt's result; `min` and `max` must fit in T (which may be a std::optional of an integer).
// `expected` as for ParseInt.
template <typename T>
FlagSetter IntSetter(T* target, int64_t min, int64_t max, std::string expected = "") {
  return [target, min, max, expected = std::move(expected)](absl::string_view v) {
    absl::StatusOr<int64_t> n = ParseInt(v, min, max, expected);
    if (!n.ok()) return n.status();
    *target = static_cast<T>(*n);
    return absl::OkStatus();
  };
}

// The longest duration DurationSetter takes. Far beyond any real timeout, and small enough
// that microseconds, milliseconds and the deadlines computed from it never overflow.
inline constexpr absl::Duration kMaxFlagDuration = absl::Hours(24 * 365);

// A duration from 0 to kMaxFlagDuration: "30" is seconds; "500ms", "2m", "1.5s" are absl
// durations.
FlagSetter DurationSetter(absl::Duration* target);

// A whole number of milliseconds, 0 or more.
FlagSetter MillisSetter(absl::Duration* target);

// ParseUid's result.
FlagSetter UidSetter(std::optional<uid_t>* target);

}  // namespace rdzv

#endif  // RDZV_COMMON_CORE_FLAGS_H_
