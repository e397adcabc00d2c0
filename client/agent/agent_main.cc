// rdzv-agent: launched by srun (or by hand on each node); joins the rendezvous and runs the
// training processes. See rdzv-agent --help.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "client/agent/agent.h"
#include "client/agent/core/agent_options.h"
#include "client/agent/shaping_launcher.h"
#include "common/logging.h"
#include "common/process_env.h"

namespace {

constexpr int kUsageError = 2;

int Fail(absl::string_view message, int code) {
  std::fprintf(stderr, "rdzv-agent: %.*s\n", static_cast<int>(message.size()), message.data());
  return code;
}

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

}  // namespace

// The site configuration (/etc/rdzv.conf, or the file RDZV_CONFIG names) under the process
// environment: admins set RDZV_ENDPOINT for everyone there, and users can still override it.
absl::StatusOr<rdzv::EnvLookup> LoadEnv() {
  const rdzv::EnvLookup process = rdzv::ProcessEnv();
  const std::optional<std::string> named = process("RDZV_CONFIG");
  const std::string path = named.value_or("/etc/rdzv.conf");
  std::ifstream file(path);
  if (!file) {
    if (named) return absl::NotFoundError("RDZV_CONFIG=" + path + " cannot be read");
    return process;
  }
  std::stringstream text;
  text << file.rdbuf();
  absl::StatusOr<rdzv::EnvList> vars = rdzv::ParseConfigText(text.str());
  if (!vars.ok()) {
    return absl::InvalidArgumentError(path + ": " + std::string(vars.status().message()));
  }
  return rdzv::EnvWithFallback(process, rdzv::EnvFromList(std::move(*vars)));
}

int main(int argc, char** argv) {
  absl::StatusOr<rdzv::EnvLookup> loaded = LoadEnv();
  if (!loaded.ok()) return Fail(loaded.status().message(), kUsageError);
  const rdzv::EnvLookup& env = *loaded;
  absl::StatusOr<rdzv::AgentFlags> flags =
      rdzv::ParseAgentFlags(std::vector<std::string>(argv + 1, argv + argc), env);
  if (!flags.ok()) return Fail(flags.status().message(), kUsageError);
  if (flags->help) {
    std::printf("%s", rdzv::AgentHelp().c_str());
    return 0;
  }
  if (flags->version) {
    std::printf("rdzv-agent %s\n", RDZV_VERSION);
    return 0;
  }
  if (absl::Status s = rdzv::SetUpLogging("rdzv-agent", flags->log_level); !s.ok()) {
    return Fail(s.message(), kUsageError);
  }
  absl::StatusOr<rdzv::AgentConfig> config =
      rdzv::ResolveAgentConfig(*flags, env, {HostName(), getpid(), geteuid()});
  if (!config.ok()) return Fail(config.status().message(), kUsageError);
  for (const std::string& warning : config->warnings) spdlog::warn("{}", warning);
  rdzv::WorkerShape shape = config->worker_shape;
  rdzv::Agent agent(std::move(*config),
                    rdzv::NewShapingLauncher(std::move(shape), rdzv::NewPosixProcessLauncher()));
  return agent.Run();
}
