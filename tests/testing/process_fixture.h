// The fixture of the tests that run real rdzvd, rdzv-agent and worker processes.
//
// Each test gets a unique marker to put in the command lines it starts (a worker's argv, a
// comment in its bash script); TearDown kills whatever the test left running and then expects
// that no process carrying the marker is left. Processes started with Start() run in a scrubbed
// environment, so that a test run inside a Slurm allocation, with RDZV_* set or on a host with
// an /etc/rdzv.conf does not change what the agents do.
//
//   class MyTest : public rdzv::testing::ProcessTest {};
//   TEST_F(MyTest, X) {
//     StartRdzvd();
//     Subprocess& agent = Start({RDZV_AGENT_BIN, "--rdzv-endpoint", endpoint_, ...,
//                                "--", "bash", "-c", "exit 0 # " + marker_});
//   }
#ifndef RDZV_TESTS_TESTING_PROCESS_FIXTURE_H_
#define RDZV_TESTS_TESTING_PROCESS_FIXTURE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace rdzv::testing {

// Success when, within `timeout`, no process whose command line carries `marker` is left; the
// failure lists those that are.
::testing::AssertionResult NoProcessLeft(absl::string_view marker,
                                         absl::Duration timeout = absl::Seconds(10));

class ProcessTest : public ::testing::Test {
 protected:
  // Kills every process started with Start(), then expects none carrying marker_ to be left.
  void TearDown() override;

  // Starts `argv` with the variables named by unset_env_prefixes_ dropped, then `env` and env_
  // set (`env` wins over env_). The process lives until TearDown (or until it is killed or waited
  // for).
  Subprocess& Start(std::vector<std::string> argv,
                    std::vector<std::pair<std::string, std::string>> env = {});

  // A real rdzvd with `--auth none` and `extra_args`, started by Start() on a free loopback
  // port; returns once it accepts connections and sets rdzvd_, port_ and endpoint_. A failure
  // is fatal to the test (use ASSERT_NO_FATAL_FAILURE to stop there).
  void StartRdzvd(std::vector<std::string> extra_args = {});

  const std::string marker_ = UniqueMarker();
  // What Start() drops from this process's environment and sets; a fixture may add to both.
  std::vector<std::string> unset_env_prefixes_ = {"SLURM_", "RDZV_", "TORCHELASTIC_"};
  std::vector<std::pair<std::string, std::string>> env_ = {{"RDZV_CONFIG", "/dev/null"}};
  std::vector<std::unique_ptr<Subprocess>> procs_;
  // Set by StartRdzvd.
  Subprocess* rdzvd_ = nullptr;
  int port_ = 0;
  std::string endpoint_;
};

}  // namespace rdzv::testing

#endif  // RDZV_TESTS_TESTING_PROCESS_FIXTURE_H_
