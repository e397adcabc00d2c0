// A real rdzvd on a free port of 127.0.0.1, for the tests that run one.
//
//   rdzv::testing::RdzvdProcess rdzvd({"--auth", "none"});
//   ... agents meet at rdzvd.endpoint() ...
//   EXPECT_EQ(rdzvd.Stop(absl::Seconds(20)), 0) << rdzvd.process().Stderr();
//
// A free port is only free until someone binds it: when rdzvd finds the port it was given taken
// ("cannot listen"), it is started again on another one. Any other failure to start is a gtest
// failure that shows rdzvd's stderr. Not thread-safe.
#ifndef RDZV_TESTS_TESTING_RDZVD_FIXTURE_H_
#define RDZV_TESTS_TESTING_RDZVD_FIXTURE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "tests/testing/subprocess.h"

namespace rdzv::testing {

// Starts `rdzvd --listen 127.0.0.1:PORT args...` (this build's rdzvd) through `start`, which
// runs the argv it is given in the caller's way and keeps the process, and waits up to `timeout`
// until rdzvd accepts connections. Returns the port, or 0 after a gtest failure.
int StartRdzvdOnFreePort(const std::vector<std::string>& args,
                         absl::FunctionRef<Subprocess&(std::vector<std::string> argv)> start,
                         absl::Duration timeout);

// An rdzvd process of its own, started by the constructor and SIGKILLed with its process group
// by the destructor unless Stop() ended it first.
class RdzvdProcess {
 public:
  // rdzvd with `args` (after --listen), in an environment that `options` describes (its argv is
  // ignored). On failure started() is false and a gtest failure has been recorded.
  RdzvdProcess(std::vector<std::string> args, SubprocessOptions options = {},
               absl::Duration timeout = absl::Seconds(60));

  bool started() const { return port_ != 0; }
  int port() const { return port_; }
  // "127.0.0.1:PORT".
  std::string endpoint() const;
  Subprocess& process() { return *process_; }

  // SIGTERM, then waits up to `timeout` for rdzvd to end; returns its exit code as
  // Subprocess::Wait does.
  int Stop(absl::Duration timeout);

 private:
  std::unique_ptr<Subprocess> process_;
  int port_ = 0;
};

}  // namespace rdzv::testing

#endif  // RDZV_TESTS_TESTING_RDZVD_FIXTURE_H_
