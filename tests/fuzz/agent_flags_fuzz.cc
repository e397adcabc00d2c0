// Fuzzes rdzv-agent's command line: ParseAgentFlags (client/agent/core/agent_options.h) over the
// generic FlagParser (common/core/flags.h). The input is split at NUL bytes into words, as in
// /proc/PID/cmdline, so a word may hold anything else, newlines included. When one word is
// empty, the words before it are the environment (NAME=value, e.g. RDZV_NNODES=2:4) and the
// words after it the arguments; otherwise every word is an argument. Properties checked: no
// crash, hang or leak, and every error is a non-empty one-line InvalidArgument message.
//
// Only ParseAgentFlags and AgentHelp are called, and no field of AgentFlags is read, so that
// the harness does not depend on how the parsed flags are laid out.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "client/agent/core/agent_options.h"
#include "common/core/env.h"
#include "tests/fuzz/fuzz_check.h"

namespace rdzv {
namespace {

void FuzzAgentFlags(std::string_view input) {
  const std::vector<std::string> words =
      absl::StrSplit(absl::string_view(input.data(), input.size()), '\0');
  std::vector<std::string> args;
  EnvList env;
  bool in_env = false;
  for (const std::string& word : words) {
    if (word.empty()) in_env = true;
  }
  for (const std::string& word : words) {
    if (in_env) {
      if (word.empty()) {
        in_env = false;
        continue;
      }
      const std::pair<std::string, std::string> kv = absl::StrSplit(word, absl::MaxSplits('=', 1));
      env.push_back(kv);
    } else {
      args.push_back(word);
    }
  }
  absl::StatusOr<AgentFlags> flags = ParseAgentFlags(args, EnvFromList(std::move(env)));
  if (!flags.ok()) CheckUserError(flags.status());
}

}  // namespace
}  // namespace rdzv

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  rdzv::FuzzCheck(!rdzv::AgentHelp().empty(), "AgentHelp() is empty");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rdzv::FuzzAgentFlags(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
