// What each program's main() answers before doing anything: --help and --version.
//
// Thread-compatible (writes to stdout).
#ifndef RDZV_COMMON_PROGRAM_INFO_H_
#define RDZV_COMMON_PROGRAM_INFO_H_

#include <string>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"

namespace rdzv {

// Prints the text `help_text` makes when `help`, else "PROGRAM VERSION" when `version`, on
// stdout; says whether it printed either (main() then exits 0).
bool AnsweredHelpOrVersion(bool help, bool version, absl::string_view program,
                           absl::string_view program_version,
                           absl::FunctionRef<std::string()> help_text);

}  // namespace rdzv

#endif  // RDZV_COMMON_PROGRAM_INFO_H_
