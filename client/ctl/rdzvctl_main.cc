// rdzvctl: the operator's view of an rdzvd (status, watch, abort, health).
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "client/ctl/ctl_commands.h"
#include "client/ctl/ctl_options.h"
#include "common/logging.h"
#include "common/process_env.h"
#include "common/program_info.h"
#include "common/site_config.h"
#include "common/tls.h"

int main(int argc, char** argv) {
  rdzv::InitOpenSslWithoutExitCleanup();
  absl::StatusOr<rdzv::EnvLookup> env = rdzv::WithSiteConfig(rdzv::ProcessEnv());
  if (!env.ok()) {
    std::fprintf(stderr, "rdzvctl: %s\n", std::string(env.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<rdzv::CtlOptions> options =
      rdzv::ParseCtlOptions(std::vector<std::string>(argv + 1, argv + argc), *env);
  if (!options.ok()) {
    std::fprintf(stderr, "rdzvctl: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  if (rdzv::AnsweredHelpOrVersion(options->help, options->version, "rdzvctl", RDZV_VERSION,
                                  rdzv::CtlHelp)) {
    return 0;
  }
  // gRPC's own log lines (a failed TLS handshake, say) go below the level shown: rdzvctl prints
  // one line of its own for every failure.
  (void)rdzv::SetUpLogging("rdzvctl", "warn");
  return rdzv::RunCtlCommand(*options, std::cout, std::cerr);
}
