// Checks shared by the libFuzzer harnesses in tests/fuzz. A violated property aborts with a
// one-line reason on stderr, which libFuzzer reports as a crash and saves the input for.
// Header-only, no state; each harness is single-threaded.
#ifndef RDZV_TESTS_FUZZ_FUZZ_CHECK_H_
#define RDZV_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace rdzv {

// Aborts with `what` (and `detail`, escaped) unless `ok`.
inline void FuzzCheck(bool ok, absl::string_view what, absl::string_view detail = {}) {
  if (ok) return;
  const std::string shown = absl::CHexEscape(detail);
  std::fprintf(stderr, "property violated: %.*s: %s\n", static_cast<int>(what.size()), what.data(),
               shown.c_str());
  std::abort();
}

// The same for the std::string_view the parsers take (Debian's abseil has its own
// string_view type), and for std::string, which converts to both.
inline void FuzzCheck(bool ok, absl::string_view what, std::string_view detail) {
  FuzzCheck(ok, what, absl::string_view(detail.data(), detail.size()));
}
inline void FuzzCheck(bool ok, absl::string_view what, const std::string& detail) {
  FuzzCheck(ok, what, absl::string_view(detail));
}

// What every parser error must look like to the user: InvalidArgument with a non-empty
// message on one line.
inline void CheckUserError(const absl::Status& status) {
  FuzzCheck(!status.ok(), "an error was expected");
  FuzzCheck(status.code() == absl::StatusCode::kInvalidArgument, "error is not InvalidArgument",
            status.ToString());
  FuzzCheck(!status.message().empty(), "error message is empty");
  FuzzCheck(!absl::StrContains(status.message(), '\n'), "error message spans lines",
            status.message());
}

}  // namespace rdzv

#endif  // RDZV_TESTS_FUZZ_FUZZ_CHECK_H_
