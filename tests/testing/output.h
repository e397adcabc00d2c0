// Assertions on what processes print: a needle in a text, and the one line that names something.
//
//   EXPECT_TRUE(Contains(LineWith(agent.Stderr(), "job j failed"), "rank 4"));
#ifndef RDZV_TESTS_TESTING_OUTPUT_H_
#define RDZV_TESTS_TESTING_OUTPUT_H_

#include <string>

#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace rdzv::testing {

// Success when `text` contains `needle`; the failure shows the whole text.
::testing::AssertionResult Contains(absl::string_view text, absl::string_view needle);

// Success when `text` does not contain `needle`.
::testing::AssertionResult LacksText(absl::string_view text, absl::string_view needle);

// The first line of `text` that contains `needle`, or "".
std::string LineWith(absl::string_view text, absl::string_view needle);

}  // namespace rdzv::testing

#endif  // RDZV_TESTS_TESTING_OUTPUT_H_
