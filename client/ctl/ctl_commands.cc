#include "client/ctl/ctl_commands.h"

#include <unistd.h>

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/ctl/status_format.h"

namespace rdzv {
namespace {

// How rdzvctl proves who it is, as an agent would: rdzvd authenticates every call, and shows or
// lets abort only the caller's own jobs (every job for root and its admin groups). Health asks
// for no credential.
absl::StatusOr<ClientAuth> CtlAuth(const CtlOptions& options) {
  ClientAuth auth;
  if (options.command == CtlCommand::kHealth) {
    auth.mode = ClientAuth::Mode::kNone;
    return auth;
  }
  auth.munge_socket = options.munge_socket;
  auth.server_uid = options.server_uid;
  return LoadClientAuth(std::move(auth), options.token_file);
}

absl::StatusOr<std::unique_ptr<Client>> CtlClient(const CtlOptions& options, ClientAuth auth) {
  ClientOptions client;
  client.endpoint = options.endpoint;
  client.rpc_timeout = options.timeout;
  client.tls.ca_file = options.tls_ca;
  client.tls.server_name = options.tls_server_name;
  client.auth = std::move(auth);
  return Client::Create(std::move(client));
}

int Failed(std::ostream& err, const absl::Status& status) {
  err << "rdzvctl: " << status.message() << "\n";
  return 1;
}

int Status(Client& client, const CtlOptions& options, std::ostream& out, std::ostream& err) {
  int64_t omitted_jobs = 0;
  absl::StatusOr<std::vector<JobStatusView>> jobs = client.Status(options.job, &omitted_jobs);
  if (!jobs.ok()) return Failed(err, jobs.status());
  if (options.json) {
    out << StatusJson(*jobs, omitted_jobs) << "\n";
  } else if (!options.job.empty() && jobs->empty()) {
    err << absl::StrFormat("rdzvctl: rdzvd knows no job %s; rdzvctl status lists the jobs\n",
                           options.job);
    return 1;
  } else {
    out << FormatStatusTable(*jobs, options.nodelist, omitted_jobs);
  }
  return 0;
}

int Watch(Client& client, const CtlOptions& options, std::ostream& out, std::ostream& err) {
  const bool terminal = !options.json && isatty(STDOUT_FILENO);
  for (int i = 0; options.count == 0 || i < options.count; ++i) {
    if (i > 0) std::this_thread::sleep_for(absl::ToChronoMilliseconds(options.interval));
    // Home and clear on a terminal; elsewhere (a pipe, a log) one block per refresh.
    if (terminal) out << "\x1b[H\x1b[2J";
    if (!options.json)
      out << absl::FormatTime("%H:%M:%S", absl::Now(), absl::LocalTimeZone()) << "  "
          << options.endpoint << "\n";
    // A refresh that fails is shown, and the next one tries again.
    Status(client, options, out, err);
    out.flush();
  }
  return 0;
}

int Abort(Client& client, const CtlOptions& options, std::ostream& out, std::ostream& err) {
  absl::StatusOr<AbortEvent> abort = client.AbortJob(options.job, options.reason);
  if (!abort.ok()) return Failed(err, abort.status());
  if (options.json) {
    out << AbortJson(*abort) << "\n";
  } else {
    out << absl::StrFormat("job %s ended: %s\n", options.job, abort->reason);
  }
  return 0;
}

int Health(Client& client, const CtlOptions& options, std::ostream& out, std::ostream& err) {
  absl::StatusOr<ServingStatus> health = client.Health();
  if (!health.ok()) return Failed(err, health.status());
  if (options.json) {
    out << HealthJson(*health) << "\n";
  } else {
    out << absl::StrFormat("%s %s\n", options.endpoint, ServingStatusName(*health));
  }
  return *health == ServingStatus::kServing ? 0 : 3;
}

}  // namespace

int RunCtlCommand(const CtlOptions& options, std::ostream& out, std::ostream& err) {
  // A token file that cannot be used is bad input, as a bad flag is: said once, before any call.
  absl::StatusOr<ClientAuth> auth = CtlAuth(options);
  if (!auth.ok()) {
    err << "rdzvctl: " << auth.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Client>> client = CtlClient(options, *std::move(auth));
  if (!client.ok()) return Failed(err, client.status());
  switch (options.command) {
    case CtlCommand::kStatus:
      return Status(**client, options, out, err);
    case CtlCommand::kWatch:
      return Watch(**client, options, out, err);
    case CtlCommand::kAbort:
      return Abort(**client, options, out, err);
    case CtlCommand::kHealth:
      return Health(**client, options, out, err);
  }
  return 2;
}

}  // namespace rdzv
