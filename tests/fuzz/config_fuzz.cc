// Fuzzes the site configuration file parser, ParseConfigText (common/core/env.h, the /etc/rdzv.conf
// reader), and then rdzv-agent's flags (client/agent/core/agent_options.h) with the parsed file as
// their only environment, as the agent reads a config file that sets RDZV_* variables. Properties
// checked: no crash, hang or leak; every error is a non-empty one-line InvalidArgument
// message; a parsed NAME is non-empty, without spaces, tabs, quotes or '=', and no value spans
// lines.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "client/agent/core/agent_options.h"
#include "common/core/env.h"
#include "tests/fuzz/fuzz_check.h"

namespace rdzv {
namespace {

void FuzzConfig(std::string_view input) {
  absl::StatusOr<EnvList> vars = ParseConfigText(absl::string_view(input.data(), input.size()));
  if (!vars.ok()) {
    CheckUserError(vars.status());
    return;
  }
  for (const auto& [name, value] : *vars) {
    FuzzCheck(!name.empty(), "an empty NAME", input);
    for (char c : name) {
      FuzzCheck(c != ' ' && c != '\t' && c != '"' && c != '\'' && c != '=',
                "a NAME with a space, a tab, a quote or '='", name);
    }
    FuzzCheck(!absl::StrContains(value, '\n'), "a value spans lines", value);
  }
  const std::vector<std::string> args = {"--", "python3", "train.py"};
  absl::StatusOr<AgentFlags> flags = ParseAgentFlags(args, EnvFromList(*std::move(vars)));
  if (!flags.ok()) CheckUserError(flags.status());
}

}  // namespace
}  // namespace rdzv

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rdzv::FuzzConfig(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
