// rdzv-agent: launched by srun (or by hand on each node); joins the rendezvous and runs the
// training processes. See rdzv-agent --help.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "client/agent/agent.h"
#include "client/agent/core/agent_options.h"
#include "client/agent/shaping_launcher.h"
#include "client/client.h"
#include "common/clock.h"
#include "common/host_name.h"
#include "common/logging.h"
#include "common/process_env.h"
#include "common/program_info.h"
#include "common/site_config.h"
#include "common/tls.h"

namespace {

constexpr int kUsageError = 2;

int Fail(absl::string_view message, int code) {
  std::fprintf(stderr, "rdzv-agent: %.*s\n", static_cast<int>(message.size()), message.data());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  rdzv::InitOpenSslWithoutExitCleanup();
  absl::StatusOr<rdzv::EnvLookup> loaded = rdzv::WithSiteConfig(rdzv::ProcessEnv());
  if (!loaded.ok()) return Fail(loaded.status().message(), kUsageError);
  const rdzv::EnvLookup& env = *loaded;
  absl::StatusOr<rdzv::AgentFlags> flags =
      rdzv::ParseAgentFlags(std::vector<std::string>(argv + 1, argv + argc), env);
  if (!flags.ok()) return Fail(flags.status().message(), kUsageError);
  if (rdzv::AnsweredHelpOrVersion(flags->help, flags->version, "rdzv-agent", RDZV_VERSION,
                                  rdzv::AgentHelp)) {
    return 0;
  }
  if (absl::Status s = rdzv::SetUpLogging("rdzv-agent", flags->log_level); !s.ok()) {
    return Fail(s.message(), kUsageError);
  }
  absl::StatusOr<rdzv::AgentConfig> config =
      rdzv::ResolveAgentConfig(*flags, env, {rdzv::HostName(), getpid(), geteuid()});
  if (!config.ok()) return Fail(config.status().message(), kUsageError);
  // A token file that cannot be used is bad input, as a bad flag is. A standalone agent's
  // rendezvous is in-process: it proves nothing and reads no token.
  if (config->mode != rdzv::AgentMode::kStandalone) {
    absl::StatusOr<rdzv::ClientAuth> auth = rdzv::LoadClientAuth(config->auth, config->token_file);
    if (!auth.ok()) return Fail(auth.status().message(), kUsageError);
    config->auth = *std::move(auth);
  }
  for (const std::string& warning : config->warnings) spdlog::warn("{}", warning);
  rdzv::WorkerShape shape = config->worker_shape;
  rdzv::Agent agent(
      std::move(*config),
      rdzv::NewShapingLauncher(std::move(shape), rdzv::NewPosixProcessLauncher()),
      {rdzv::SteadyClock(), [] { return rdzv::WallMicros(); }, rdzv::ProcessEnvList()});
  return agent.Run();
}
