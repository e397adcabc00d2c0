// The tests that run real PyTorch (gloo) under real agents: the agents' command line, with the
// workers run by the Python that has torch (RDZV_TORCH_PYTHON, Debian's /usr/bin/python3 with
// python3-torch, not whatever python3 is first on PATH), and a fixture with an rdzvd to meet at.
//
//   class DdpTest : public rdzv::testing::TorchJobTest {};
//   TEST_F(DdpTest, Trains) {
//     Subprocess node0(TorchAgent({.port = port(), .job = "j", .node = 0, .worker = {script}}));
//     ...
//   }
#ifndef RDZV_TESTS_TESTING_TORCH_JOB_H_
#define RDZV_TESTS_TESTING_TORCH_JOB_H_

#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/rdzvd_fixture.h"
#include "tests/testing/subprocess.h"

namespace rdzv::testing {

// The Python with torch that runs the workers.
inline constexpr char kTorchPython[] = RDZV_TORCH_PYTHON;

// What processes that run torch workers must not inherit: a surrounding Slurm allocation, the
// user's RDZV_*, torchrun's own variables, a MASTER_ADDR/PORT, and PYTHONFAULTHANDLER (which the
// agent sets for the workers itself).
std::vector<std::string> TorchUnsetEnvPrefixes();

// One agent of a job whose workers run Python scripts with torch.
struct TorchAgentSpec {
  int port = 0;  // rdzvd's, on 127.0.0.1
  std::string job;
  int node = 0;  // --node-rank
  int nnodes = 2;
  int nproc = 1;  // --nproc-per-node
  // The agent's other flags.
  std::vector<std::string> flags = {};
  // The workers' script and its arguments, run by kTorchPython.
  std::vector<std::string> worker = {};
};

// How to start that agent (this build's rdzv-agent, a scrubbed environment, no site config).
SubprocessOptions TorchAgent(const TorchAgentSpec& spec);

// An rdzvd on a free loopback port for each test; TearDown stops it with SIGTERM and expects it
// to exit 0.
class TorchJobTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  int port() const { return rdzvd_->port(); }

  std::optional<RdzvdProcess> rdzvd_;
};

}  // namespace rdzv::testing

#endif  // RDZV_TESTS_TESTING_TORCH_JOB_H_
