#include "tests/testing/output.h"

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"

namespace rdzv::testing {

::testing::AssertionResult Contains(absl::string_view text, absl::string_view needle) {
  if (absl::StrContains(text, needle)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << needle << "\" not found in:\n" << text;
}

::testing::AssertionResult LacksText(absl::string_view text, absl::string_view needle) {
  if (!absl::StrContains(text, needle)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << needle << "\" unexpectedly in:\n" << text;
}

std::string LineWith(absl::string_view text, absl::string_view needle) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StrContains(line, needle)) return std::string(line);
  }
  return "";
}

}  // namespace rdzv::testing
