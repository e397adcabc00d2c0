#include "tests/testing/rdzvd_fixture.h"

#include <signal.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace rdzv::testing {

int StartRdzvdOnFreePort(const std::vector<std::string>& args,
                         absl::FunctionRef<Subprocess&(std::vector<std::string> argv)> start,
                         absl::Duration timeout) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    const int port = FreeLoopbackPort();
    std::vector<std::string> argv = {RDZVD_BIN, "--listen", absl::StrCat("127.0.0.1:", port)};
    argv.insert(argv.end(), args.begin(), args.end());
    Subprocess& rdzvd = start(std::move(argv));
    const absl::Time deadline = absl::Now() + timeout;
    while (rdzvd.Running() && absl::Now() < deadline) {
      if (WaitForLoopbackPort(port, absl::Milliseconds(100)) && rdzvd.Running()) return port;
    }
    if (rdzvd.Running()) {
      rdzvd.Kill();
      ADD_FAILURE() << "rdzvd did not listen within " << timeout << ": " << rdzvd.Stderr();
      return 0;
    }
    if (!absl::StrContains(rdzvd.Stderr(), "cannot listen")) {
      ADD_FAILURE() << "rdzvd did not start: " << rdzvd.Stderr();
      return 0;
    }
    // Someone took the port between picking and binding it: try another.
  }
  ADD_FAILURE() << "rdzvd did not start: every port picked was taken";
  return 0;
}

RdzvdProcess::RdzvdProcess(std::vector<std::string> args, SubprocessOptions options,
                           absl::Duration timeout) {
  port_ = StartRdzvdOnFreePort(
      args,
      [&](std::vector<std::string> argv) -> Subprocess& {
        options.argv = std::move(argv);
        process_ = std::make_unique<Subprocess>(options);
        return *process_;
      },
      timeout);
}

std::string RdzvdProcess::endpoint() const { return absl::StrCat("127.0.0.1:", port_); }

int RdzvdProcess::Stop(absl::Duration timeout) {
  process_->Signal(SIGTERM);
  return process_->Wait(timeout);
}

}  // namespace rdzv::testing
