#include "client/ctl/ctl_commands.h"

#include <unistd.h>

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
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
  auth.munge_socket = options.connection.munge_socket;
  auth.server_uid = options.connection.server_uid;
  return LoadClientAuth(std::move(auth), options.connection.token_file);
}

absl::StatusOr<std::unique_ptr<Client>> CtlClient(const CtlOptions& options,
                                                  const std::string& endpoint, ClientAuth auth) {
  ClientOptions client;
  client.endpoint = endpoint;
  client.rpc_timeout = options.timeout;
  client.tls.ca_file = options.connection.tls_ca;
  client.tls.server_name = options.connection.tls_server_name;
  client.auth = std::move(auth);
  return Client::Create(std::move(client));
}

int Failed(std::ostream& err, const absl::Status& status) {
  err << "rdzvctl: " << status.message() << "\n";
  return 1;
}

// One Client per server of the list (--rdzv-endpoint a:29400,b:29400), in its order.
using Clients = std::vector<std::unique_ptr<Client>>;

// Every server's jobs, each job once: as the server that runs it (or fills it) has it, else the
// first that knows it. `server` names the server of each when there are several. A server that
// does not answer is said on `err`; an error only when none answers.
absl::StatusOr<std::vector<JobStatusView>> ListJobs(Clients& clients, const CtlOptions& options,
                                                    int64_t& omitted_jobs, std::ostream& err) {
  std::vector<JobStatusView> jobs;
  absl::flat_hash_map<std::string, size_t> seen;
  absl::Status last;
  bool answered = false;
  for (std::unique_ptr<Client>& client : clients) {
    int64_t omitted = 0;
    absl::StatusOr<std::vector<JobStatusView>> some = client->Status(options.job, &omitted);
    if (!some.ok()) {
      if (clients.size() == 1) return some.status();
      err << "rdzvctl: " << some.status().message() << "\n";
      last = some.status();
      continue;
    }
    answered = true;
    omitted_jobs += omitted;
    for (JobStatusView& job : *some) {
      // Named here, never taken from the answer.
      job.server = clients.size() > 1 ? client->endpoint() : "";
      auto [it, fresh] = seen.try_emplace(job.job_id, jobs.size());
      if (fresh) {
        jobs.push_back(std::move(job));
      } else if (jobs[it->second].state == "ended" && job.state != "ended") {
        jobs[it->second] = std::move(job);
      }
    }
  }
  if (!answered) return last;
  return jobs;
}

int Status(Clients& clients, const CtlOptions& options, std::ostream& out, std::ostream& err) {
  int64_t omitted_jobs = 0;
  absl::StatusOr<std::vector<JobStatusView>> jobs = ListJobs(clients, options, omitted_jobs, err);
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

int Watch(Clients& clients, const CtlOptions& options, std::ostream& out, std::ostream& err) {
  const bool terminal = !options.json && isatty(STDOUT_FILENO);
  for (int i = 0; options.count == 0 || i < options.count; ++i) {
    if (i > 0) std::this_thread::sleep_for(absl::ToChronoMilliseconds(options.interval));
    // Home and clear on a terminal; elsewhere (a pipe, a log) one block per refresh.
    if (terminal) out << "\x1b[H\x1b[2J";
    if (!options.json)
      out << absl::FormatTime("%H:%M:%S", absl::Now(), absl::LocalTimeZone()) << "  "
          << options.endpoint << "\n";
    // A refresh that fails is shown, and the next one tries again.
    Status(clients, options, out, err);
    out.flush();
  }
  return 0;
}

int Abort(Clients& clients, const CtlOptions& options, std::ostream& out, std::ostream& err) {
  // The server that holds the job ends it; the others of a list do not know it.
  absl::StatusOr<AbortEvent> abort = absl::NotFoundError("no server");
  for (std::unique_ptr<Client>& client : clients) {
    absl::StatusOr<AbortEvent> one = client->AbortJob(options.job, options.reason);
    if (one.ok() || abort.status().code() == absl::StatusCode::kNotFound) abort = std::move(one);
    if (abort.ok()) break;
  }
  if (!abort.ok()) return Failed(err, abort.status());
  if (options.json) {
    out << AbortJson(*abort) << "\n";
  } else {
    out << absl::StrFormat("job %s ended: %s\n", options.job, abort->reason);
  }
  return 0;
}

int Health(Clients& clients, const CtlOptions& options, std::ostream& out, std::ostream& err) {
  // Each server of a list on a line of its own; 0 only when every one serves.
  int code = 0;
  for (std::unique_ptr<Client>& client : clients) {
    absl::StatusOr<ServingStatus> health = client->Health();
    if (!health.ok()) {
      code = Failed(err, health.status());
      continue;
    }
    if (options.json) {
      out << HealthJson(*health) << "\n";
    } else {
      out << absl::StrFormat("%s %s\n", client->endpoint(), ServingStatusName(*health));
    }
    if (*health != ServingStatus::kServing && code == 0) code = 3;
  }
  return code;
}

}  // namespace

int RunCtlCommand(const CtlOptions& options, std::ostream& out, std::ostream& err) {
  // A token file that cannot be used is bad input, as a bad flag is: said once, before any call.
  absl::StatusOr<ClientAuth> auth = CtlAuth(options);
  if (!auth.ok()) {
    err << "rdzvctl: " << auth.status().message() << "\n";
    return 2;
  }
  Clients clients;
  for (const std::string& endpoint : options.servers) {
    absl::StatusOr<std::unique_ptr<Client>> client = CtlClient(options, endpoint, *auth);
    if (!client.ok()) return Failed(err, client.status());
    clients.push_back(*std::move(client));
  }
  switch (options.command) {
    case CtlCommand::kStatus:
      return Status(clients, options, out, err);
    case CtlCommand::kWatch:
      return Watch(clients, options, out, err);
    case CtlCommand::kAbort:
      return Abort(clients, options, out, err);
    case CtlCommand::kHealth:
      return Health(clients, options, out, err);
  }
  return 2;
}

}  // namespace rdzv
