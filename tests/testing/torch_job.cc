#include "tests/testing/torch_job.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace rdzv::testing {

std::vector<std::string> TorchUnsetEnvPrefixes() {
  return {"SLURM_", "RDZV_", "TORCHELASTIC_", "MASTER_", "PYTHONFAULTHANDLER"};
}

SubprocessOptions TorchAgent(const TorchAgentSpec& spec) {
  SubprocessOptions o;
  o.argv = {RDZV_AGENT_BIN,
            "--rdzv-endpoint",
            absl::StrCat("127.0.0.1:", spec.port),
            "--rdzv-id",
            spec.job,
            "--nnodes",
            absl::StrCat(spec.nnodes),
            "--node-rank",
            absl::StrCat(spec.node),
            "--nproc-per-node",
            absl::StrCat(spec.nproc)};
  o.argv.insert(o.argv.end(), spec.flags.begin(), spec.flags.end());
  o.argv.push_back("--");
  o.argv.push_back(kTorchPython);
  o.argv.insert(o.argv.end(), spec.worker.begin(), spec.worker.end());
  o.unset_env_prefixes = TorchUnsetEnvPrefixes();
  o.env = {{"RDZV_CONFIG", "/dev/null"}};
  return o;
}

void TorchJobTest::SetUp() {
  rdzvd_.emplace(std::vector<std::string>{"--auth", "none"},
                 SubprocessOptions{.unset_env_prefixes = {"RDZV_"}}, absl::Seconds(20));
  ASSERT_TRUE(rdzvd_->started());
}

void TorchJobTest::TearDown() {
  if (!rdzvd_ || !rdzvd_->started()) return;
  EXPECT_EQ(rdzvd_->Stop(absl::Seconds(20)), 0) << rdzvd_->process().Stderr();
}

}  // namespace rdzv::testing
