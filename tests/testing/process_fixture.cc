#include "tests/testing/process_fixture.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "tests/testing/rdzvd_fixture.h"

namespace rdzv::testing {

::testing::AssertionResult NoProcessLeft(absl::string_view marker, absl::Duration timeout) {
  const std::vector<std::string> left = WaitUntilNoProcessMatches(marker, timeout);
  if (left.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "processes left behind:\n" << absl::StrJoin(left, "\n");
}

void ProcessTest::TearDown() {
  // Whatever a test left running (it failed, or it did not wait) is killed now, and nothing
  // that carried this test's marker may outlive it.
  procs_.clear();
  rdzvd_ = nullptr;
  EXPECT_TRUE(NoProcessLeft(marker_));
}

Subprocess& ProcessTest::Start(std::vector<std::string> argv,
                               std::vector<std::pair<std::string, std::string>> env) {
  SubprocessOptions options;
  options.argv = std::move(argv);
  options.unset_env_prefixes = unset_env_prefixes_;
  options.env = std::move(env);
  for (const auto& [name, value] : env_) {
    if (std::none_of(options.env.begin(), options.env.end(),
                     [&](const auto& set) { return set.first == name; })) {
      options.env.emplace_back(name, value);
    }
  }
  procs_.push_back(std::make_unique<Subprocess>(std::move(options)));
  return *procs_.back();
}

void ProcessTest::StartRdzvd(std::vector<std::string> extra_args) {
  rdzvd_ = nullptr;
  port_ = 0;
  endpoint_.clear();
  std::vector<std::string> args = {"--auth", "none"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  Subprocess* started = nullptr;
  const int port = StartRdzvdOnFreePort(
      args,
      [&](std::vector<std::string> argv) -> Subprocess& {
        started = &Start(std::move(argv));
        return *started;
      },
      absl::Seconds(60));
  if (port == 0) FAIL() << "rdzvd did not start";
  rdzvd_ = started;
  port_ = port;
  endpoint_ = absl::StrCat("127.0.0.1:", port);
}

}  // namespace rdzv::testing
