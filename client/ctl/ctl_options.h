// rdzvctl's command line: the command, its arguments and the options, with the endpoint taken
// from --rdzv-endpoint, RDZV_ENDPOINT or the site configuration (/etc/rdzv.conf), as rdzv-agent
// takes it. Pure: the environment comes in as an EnvLookup.
#ifndef RDZV_CLIENT_CTL_CTL_OPTIONS_H_
#define RDZV_CLIENT_CTL_CTL_OPTIONS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/core/connection_flags.h"
#include "common/core/env.h"

namespace rdzv {

enum class CtlCommand { kStatus, kWatch, kAbort, kHealth };

struct CtlOptions {
  CtlCommand command = CtlCommand::kStatus;
  std::string endpoint;              // host:port of rdzvd, or a list of them
  std::vector<std::string> servers;  // the endpoint's servers, in order
  // status/watch: one job (empty: all; inside a worker RDZV_RUN_ID, its own, unless --all);
  // abort: the job.
  std::string job;
  bool all = false;    // status/watch: every job, even where RDZV_RUN_ID names one
  std::string reason;  // abort
  bool json = false;
  absl::Duration timeout = absl::Seconds(5);   // per call
  absl::Duration interval = absl::Seconds(2);  // watch
  int count = 0;                               // watch: refreshes, 0 for until interrupted
  // status/watch: the job's nodes (a Slurm hostlist), to name the missing ones.
  std::vector<std::string> nodelist;
  // How rdzvctl proves who it is (the job's token when given, else MUNGE when munged runs here),
  // the uid rdzvd must prove it runs as, and TLS.
  ConnectionFlags connection;
  bool help = false;
  bool version = false;
};

// Parses `args` (without argv[0]). InvalidArgument names the word or flag and what to do.
absl::StatusOr<CtlOptions> ParseCtlOptions(const std::vector<std::string>& args,
                                           const EnvLookup& env);

// The --help text.
std::string CtlHelp();

}  // namespace rdzv

#endif  // RDZV_CLIENT_CTL_CTL_OPTIONS_H_
