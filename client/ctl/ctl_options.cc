#include "client/ctl/ctl_options.h"

#include <limits>

#include "absl/algorithm/container.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/auth.h"
#include "common/core/connection_flags.h"
#include "common/core/flags.h"
#include "common/core/host_port.h"
#include "common/core/hostlist.h"

namespace rdzv {
namespace {

constexpr char kUsage[] =
    R"(rdzvctl: look at and control the jobs of an rdzvd.

Usage:
  rdzvctl [OPTIONS] status [JOB]    jobs, state, round, agents joined/expected, missing, failure
                                    (in a worker JOB is its own, RDZV_RUN_ID; --all for every job)
  rdzvctl [OPTIONS] watch [JOB]     the same, refreshed every --interval
  rdzvctl [OPTIONS] abort JOB --reason TEXT
                                    end JOB for all of its agents (its owner or root)
  rdzvctl [OPTIONS] health          is rdzvd serving? (grpc.health.v1; exit 0 when it is)
Example: rdzvctl --rdzv-endpoint head:29400 status
The endpoint comes from --rdzv-endpoint, RDZV_ENDPOINT or /etc/rdzv.conf (RDZV_CONFIG).)";

absl::Status ParseSeconds(absl::string_view v, absl::Duration* out) {
  double seconds = 0;
  if (!absl::SimpleAtod(v, &seconds) || !(seconds > 0)) {
    return absl::InvalidArgumentError("expected seconds, a number > 0, e.g. 2 or 0.5");
  }
  *out = absl::Seconds(seconds);
  return absl::OkStatus();
}

FlagParser MakeParser(CtlOptions& o) {
  FlagParser p("rdzvctl", kUsage);
  p.Add({"rdzv-endpoint", "RDZV_ENDPOINT", "HOST:PORT[,HOST:PORT...]",
         "the rdzvd to talk to, or every server of a list (status shows each job once)",
         StringSetter(&o.endpoint)});
  AddConnectionFlags(p, &o.connection);
  p.Add({"json", "", "", "print JSON instead of a table", BoolSetter(&o.json)});
  p.Add({"timeout", "RDZVCTL_TIMEOUT", "SECONDS", "deadline of each call (default 5)",
         [&o](absl::string_view v) { return ParseSeconds(v, &o.timeout); }});
  p.Add({"interval", "", "SECONDS", "watch: seconds between refreshes (default 2)",
         [&o](absl::string_view v) { return ParseSeconds(v, &o.interval); }});
  p.Add({"count", "", "N", "watch: stop after N refreshes (default: until interrupted)",
         IntSetter(&o.count, 0, std::numeric_limits<int>::max(), "a whole number >= 0")});
  p.Add({"nodelist", "", "HOSTLIST",
         "status/watch: the job's nodes, e.g. $(squeue -h -o %N -j ID), to name the missing "
         "(default: the nodes its agents named, under Slurm)",
         [&o](absl::string_view v) {
           absl::StatusOr<std::vector<std::string>> hosts =
               ExpandHostlist(std::string_view(v.data(), v.size()));
           if (!hosts.ok()) return hosts.status();
           o.nodelist = *std::move(hosts);
           return absl::OkStatus();
         }});
  p.Add({"all", "", "", "status/watch: every job, even in a worker (where JOB is its own)",
         BoolSetter(&o.all)});
  p.Add({"reason", "", "TEXT", "abort: why, in a few words (the agents print it)",
         StringSetter(&o.reason)});
  p.Add({"help", "", "", "print this help", SetWhateverTheValue(&o.help)});
  p.Add({"version", "", "", "print the version", BoolSetter(&o.version)});
  return p;
}

}  // namespace

std::string CtlHelp() {
  CtlOptions unused;
  return MakeParser(unused).Help();
}

absl::StatusOr<CtlOptions> ParseCtlOptions(const std::vector<std::string>& args,
                                           const EnvLookup& env) {
  CtlOptions o;
  const FlagParser parser = MakeParser(o);
  // Options may come before or after the command and its words: parse up to each word, take
  // it, and go on (the environment applies once, first).
  std::vector<std::string> words;
  absl::StatusOr<std::vector<std::string>> rest = parser.Parse(args, env);
  const EnvLookup no_env = EnvFromList({});
  while (rest.ok() && !rest->empty()) {
    words.push_back(rest->front());
    rest = parser.Parse(std::vector<std::string>(rest->begin() + 1, rest->end()), no_env);
  }
  if (!rest.ok()) return rest.status();
  if (o.help || o.version) return o;

  if (words.empty()) {
    return absl::InvalidArgumentError(
        "no command; use status, watch, abort or health (see "
        "rdzvctl --help)");
  }
  const std::string& command = words.front();
  const size_t max_words = command == "health" ? 1 : 2;
  if (command == "status") {
    o.command = CtlCommand::kStatus;
  } else if (command == "watch") {
    o.command = CtlCommand::kWatch;
  } else if (command == "abort") {
    o.command = CtlCommand::kAbort;
    if (words.size() < 2) {
      return absl::InvalidArgumentError(
          "abort needs the job: rdzvctl abort JOB --reason TEXT (see rdzvctl status)");
    }
    if (o.reason.empty()) {
      return absl::InvalidArgumentError(
          "abort needs --reason TEXT, which the job's agents print when they stop");
    }
  } else if (command == "health") {
    o.command = CtlCommand::kHealth;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown command \"", command, "\"; use status, watch, abort or health"));
  }
  if (words.size() > max_words) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", words[max_words],
                                                   "\" after ", command, "; see rdzvctl --help"));
  }
  if (words.size() == 2) o.job = words[1];
  if (o.command == CtlCommand::kStatus || o.command == CtlCommand::kWatch) {
    if (o.all && !o.job.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--all shows every job; drop it or the job \"", o.job, "\""));
    }
    // A worker's environment names its job (RDZV_RUN_ID, set by its agent): rdzvctl run there
    // shows that job.
    if (!o.all && o.job.empty()) o.job = env("RDZV_RUN_ID").value_or("");
  }
  if (absl::Status s = CheckTlsServerName(o.connection.tls_ca, o.connection.tls_server_name);
      !s.ok()) {
    return s;
  }
  if (o.endpoint.empty()) {
    return absl::InvalidArgumentError(
        "no rdzvd to talk to: pass --rdzv-endpoint HOST:PORT, set RDZV_ENDPOINT, or set "
        "RDZV_ENDPOINT in /etc/rdzv.conf");
  }
  absl::StatusOr<std::vector<std::string>> servers = SplitServerList("--rdzv-endpoint", o.endpoint);
  if (!servers.ok()) return servers.status();
  o.servers = *std::move(servers);
  return o;
}

}  // namespace rdzv
