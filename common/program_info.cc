#include "common/program_info.h"

#include <cstdio>
#include <string>

namespace rdzv {

bool AnsweredHelpOrVersion(bool help, bool version, absl::string_view program,
                           absl::string_view program_version,
                           absl::FunctionRef<std::string()> help_text) {
  if (help) {
    const std::string text = help_text();
    std::fwrite(text.data(), 1, text.size(), stdout);
    return true;
  }
  if (version) {
    std::printf("%.*s %.*s\n", static_cast<int>(program.size()), program.data(),
                static_cast<int>(program_version.size()), program_version.data());
    return true;
  }
  return false;
}

}  // namespace rdzv
