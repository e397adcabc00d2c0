// A small command-line parser for rdzvd and rdzv-agent: --name=value / --name value, with every
// flag also settable through an environment variable (the command line wins). Underscores in
// flag names are accepted as dashes, so torchrun spellings such as --nproc_per_node work.
// Parsing stops at "--" or at the first word that is not a flag: the rest is the command.
#ifndef RDZV_COMMON_CORE_FLAGS_H_
#define RDZV_COMMON_CORE_FLAGS_H_

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/core/env.h"

namespace rdzv {

struct Flag {
  std::string name;        // without dashes, e.g. "nproc-per-node"
  std::string env;         // e.g. "RDZV_NPROC_PER_NODE"; empty for none
  std::string value_name;  // e.g. "N"; empty for a switch that takes no value
  std::string help;
  // Receives the value ("true" for a bare switch); an error names what was expected.
  std::function<absl::Status(absl::string_view value)> set;
};

class FlagParser {
 public:
  FlagParser(std::string program, std::string usage)
      : program_(std::move(program)), usage_(std::move(usage)) {}

  void Add(Flag flag) { flags_.push_back(std::move(flag)); }

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
  std::vector<Flag> flags_;
};

// Parses a switch value: true/false/1/0/yes/no/on/off.
absl::StatusOr<bool> ParseBool(absl::string_view value);

// Parses the uid a server must run as (RDZV_SERVER_UID): a number, 0 to 4294967294.
// InvalidArgument, saying what is expected, otherwise.
absl::StatusOr<uid_t> ParseUid(absl::string_view text);

// A flag's setter that stores ParseUid's result in `*target`.
std::function<absl::Status(absl::string_view)> UidSetter(std::optional<uid_t>* target);

}  // namespace rdzv

#endif  // RDZV_COMMON_CORE_FLAGS_H_
