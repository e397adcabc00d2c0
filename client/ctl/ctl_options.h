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
#include "common/core/env.h"

namespace rdzv {

enum class CtlCommand { kStatus, kWatch, kAbort, kHealth };

struct CtlOptions {
  CtlCommand command = CtlCommand::kStatus;
  std::string endpoint;  // host:port of rdzvd
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
  // How rdzvctl proves who it is: the job's token when given, else MUNGE when munged runs here.
  std::string token_file;
  std::string munge_socket;
  // Under MUNGE, the uid rdzvd must prove it runs as (unset: any uid munged vouches for).
  std::optional<uid_t> server_uid;
  // TLS: verify rdzvd's certificate with this CA (PEM); empty for plaintext.
  std::string tls_ca;
  std::string tls_server_name;  // the name the certificate must hold; "" for the endpoint's host
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
