#include "server/server_flags.h"

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/core/flags.h"
#include "common/core/host_port.h"
#include "guard/authenticator.h"

namespace rdzv {
namespace {

constexpr char kUsage[] =
    R"(rdzvd: rendezvous server for rdzv-agent; serves many jobs at once, keyed by job id.

Usage: rdzvd [--listen HOST:PORT] [--auth munge|token|none] [--metrics-listen HOST:PORT]
             [--tls-cert FILE --tls-key FILE] [--log-level LEVEL]
Example: rdzvd --listen 0.0.0.0:29400    (agents then use --rdzv-endpoint head:29400)
Every call is authenticated (MUNGE by default) and each job belongs to the user who created
it: other users can neither see nor touch it. Serves grpc.health.v1 beside the rendezvous
service, tells systemd when it is ready (Type=notify), and stops cleanly on SIGTERM or SIGINT.)";

// rdzvd's limits have always been worded "from MIN to MAX".
FlagSetter CountSetter(int64_t* target, int64_t min, int64_t max) {
  return IntSetter(target, min, max, absl::StrFormat("a whole number from %d to %d", min, max));
}

// The values that ServerOptions keeps in other units than the flags take.
struct Converted {
  absl::Duration progress_interval;
  int64_t memory_mb = 0;
  int64_t max_memory_mb = 0;  // 0: the server's default share of memory_mb
  int64_t max_memory_per_user_mb = 0;
  int64_t max_queued_kb = 0;
  int64_t stream_window_kb = 0;
};

FlagParser MakeParser(ServerFlags& f, Converted& c) {
  ServerOptions& o = f.options;
  FlagParser p("rdzvd", kUsage);
  p.Add({"auth", "RDZV_AUTH", "MODE",
         "how callers prove who they are: munge (default; munged on every host),\n"
         "token (each job's agents share a --rdzv-token-file; the job is theirs) or none\n"
         "(refused unless --listen is a loopback address)",
         [&o](absl::string_view v) {
           absl::StatusOr<AuthMode> mode = ParseAuthMode(v);
           if (!mode.ok()) return mode.status();
           o.service.auth.mode = *mode;
           return absl::OkStatus();
         }});
  p.Add({"munge-socket", "RDZV_MUNGE_SOCKET", "PATH",
         "munged's socket (default: libmunge's, /run/munge/munge.socket.2)",
         StringSetter(&o.service.auth.munge_socket)});
  p.Add({"admin-group", "RDZV_ADMIN_GROUP", "GROUP,...",
         "groups whose members see every user's jobs (root always does)",
         StringSetter(&f.admin_groups)});
  p.Add({"listen", "RDZV_LISTEN", "HOST:PORT", "address to serve on (default 0.0.0.0:29400)",
         StringSetter(&o.listen)});
  p.Add({"tls-cert", "RDZV_TLS_CERT", "FILE",
         "serve TLS with this PEM certificate (chain); needs --tls-key, and agents then\n"
         "pass --tls-ca with the CA that signed it (default: plaintext)",
         StringSetter(&f.tls_cert)});
  p.Add({"tls-key", "RDZV_TLS_KEY", "FILE",
         "the private key of --tls-cert, PEM, readable by rdzvd's user only (chmod 600)",
         StringSetter(&f.tls_key)});
  p.Add({"peers", "RDZV_PEERS", "HOST:PORT,...",
         "the other rdzvds of the agents' server list (RDZV_ENDPOINT=a:29400,b:29400):\n"
         "a job one of them serves is never taken up here (default: none)",
         [&f](absl::string_view v) {
           f.options.service.peers.clear();
           if (absl::StripAsciiWhitespace(v).empty()) return absl::OkStatus();
           absl::StatusOr<std::vector<std::string>> peers = SplitServerList("--peers", v, 1);
           if (!peers.ok()) return peers.status();
           for (const std::string& e : *peers) {
             absl::StatusOr<HostPort> hp = ParseHostPort(e, 29400);
             if (!hp.ok()) return hp.status();
             f.options.service.peers.push_back(FormatHostPort(hp->host, hp->port));
           }
           return absl::OkStatus();
         }});
  p.Add({"peer-tls-ca", "RDZV_PEER_TLS_CA", "FILE",
         "the peers serve TLS: verify them with this CA (PEM)", StringSetter(&f.peer_tls_ca)});
  p.Add({"metrics-listen", "RDZV_METRICS_LISTEN", "HOST:PORT",
         "serve Prometheus metrics over HTTP at /metrics (default: off)",
         StringSetter(&o.metrics_listen)});
  p.Add({"log-level", "RDZV_LOG_LEVEL", "LEVEL",
         "trace, debug, info, warn, error or off (default info)", StringSetter(&f.log_level)});
  p.Add({"progress-interval-ms", "RDZV_PROGRESS_INTERVAL_MS", "MS",
         "how often waiting agents hear how their round fills (default 3000)",
         MillisSetter(&c.progress_interval)});
  p.Add({"keepalive-ms", "RDZV_KEEPALIVE_MS", "MS",
         "probe each agent's idle connection this often (TCP keepalive, answered by its\n"
         "host's kernel, in whole seconds); an agent whose host answers nothing for this plus\n"
         "--keepalive-timeout-ms is lost and its job ends (default 1000; 0 turns probes off)",
         MillisSetter(&o.keepalive)});
  p.Add({"keepalive-timeout-ms", "RDZV_KEEPALIVE_TIMEOUT_MS", "MS",
         "how long a probe or a ping may wait for its answer (default 1000)",
         MillisSetter(&o.keepalive_timeout)});
  p.Add({"ping-ms", "RDZV_PING_MS", "MS",
         "ping each agent this often (answered by the agent itself, so a frozen one is\n"
         "lost once a ping goes unanswered for --keepalive-timeout-ms; default 30000;\n"
         "0 turns pings off)",
         MillisSetter(&o.ping_interval)});
  p.Add({"max-jobs-per-user", "RDZV_MAX_JOBS_PER_USER", "N",
         "jobs one user may have on this server at once (default 1000)",
         CountSetter(&o.service.max_jobs_per_user, 1, 1'000'000)});
  p.Add({"max-agents-per-user", "RDZV_MAX_AGENTS_PER_USER", "N",
         "agents one user may have attached at once (default 100000)",
         CountSetter(&o.service.max_agents_per_user, 1, 10'000'000)});
  p.Add({"memory-limit-mb", "RDZV_MEMORY_LIMIT_MB", "MB",
         "memory gRPC may use for all connections and calls together (default 4096)",
         CountSetter(&c.memory_mb, 64, 1 << 24)});
  p.Add({"max-memory-mb", "RDZV_MAX_MEMORY_MB", "MB",
         "memory all users' attached agents may hold together; a join past it is refused\n"
         "(default: three quarters of --memory-limit-mb)",
         CountSetter(&c.max_memory_mb, 1, 1 << 24)});
  p.Add({"max-memory-per-user-mb", "RDZV_MAX_MEMORY_PER_USER_MB", "MB",
         "memory one user's attached agents may hold; that user's next join is refused\n"
         "past it (default: half of --max-memory-mb)",
         CountSetter(&c.max_memory_per_user_mb, 1, 1 << 24)});
  p.Add({"max-queued-kb", "RDZV_MAX_QUEUED_KB", "KB",
         "events queued for an agent that does not read them before its stream is ended\n"
         "(default 1024)",
         CountSetter(&c.max_queued_kb, 16, 1 << 20)});
  p.Add({"max-connections-per-host", "RDZV_MAX_CONNECTIONS_PER_HOST", "N",
         "connections one host (one address) may hold open; past it one of the host's\n"
         "connections that has not authenticated is dropped for the next one (refused\n"
         "only when all have) (default 512; 0: no bound, nor on unauthenticated ones)",
         IntSetter(&o.max_connections_per_host, 0, 1'000'000, "a whole number from 0 to 1000000")});
  p.Add({"max-unproven-connections-per-host", "RDZV_MAX_UNPROVEN_CONNECTIONS_PER_HOST", "N",
         "of those, how many may not have carried an authenticated call yet; past it one of\n"
         "them is dropped for the next one (default 128; 0: --max-connections-per-host)",
         IntSetter(&o.max_unproven_connections_per_host, 0, 1'000'000,
                   "a whole number from 0 to 1000000")});
  p.Add({"unused-connection-timeout-ms", "RDZV_UNUSED_CONNECTION_TIMEOUT_MS", "MS",
         "close a connection that has carried no authenticated call this long after it\n"
         "opened (default 60000; 0: never)",
         MillisSetter(&o.unused_connection_timeout)});
  p.Add({"stream-window-kb", "RDZV_STREAM_WINDOW_KB", "KB",
         "what gRPC reads ahead on one stream before the server asks for it (default 16)",
         CountSetter(&c.stream_window_kb, 1, 1024)});
  // A value is ignored, as it always was: --help=no still prints the help.
  p.Add({"help", "", "", "print this help", SetWhateverTheValue(&f.help)});
  p.Add({"version", "", "", "print the version", BoolSetter(&f.version)});
  return p;
}

}  // namespace

absl::StatusOr<ServerFlags> ParseServerFlags(const std::vector<std::string>& args,
                                             const EnvLookup& env) {
  ServerFlags f;
  ServerOptions& o = f.options;
  Converted c{absl::Microseconds(o.service.state.progress_interval),
              static_cast<int64_t>(o.memory_limit_bytes >> 20),
              o.service.max_memory_bytes >> 20,
              o.service.max_memory_per_user_bytes >> 20,
              o.service.max_queued_bytes_per_stream >> 10,
              o.stream_window_bytes >> 10};
  absl::StatusOr<std::vector<std::string>> rest = MakeParser(f, c).Parse(args, env);
  if (!rest.ok()) return rest.status();
  if (f.help || f.version) return f;
  if (!rest->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument \"", rest->front(), "\"; see rdzvd --help"));
  }
  // Saturates rather than overflows for a value in milliseconds beyond any use.
  o.service.state.progress_interval = absl::ToInt64Microseconds(c.progress_interval);
  o.memory_limit_bytes = static_cast<size_t>(c.memory_mb) << 20;
  o.service.max_memory_bytes = c.max_memory_mb << 20;
  o.service.max_memory_per_user_bytes = c.max_memory_per_user_mb << 20;
  o.service.max_queued_bytes_per_stream = c.max_queued_kb << 10;
  o.stream_window_bytes = static_cast<int>(c.stream_window_kb << 10);

  if ((o.keepalive > absl::ZeroDuration() || o.ping_interval > absl::ZeroDuration()) &&
      o.keepalive_timeout == absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--keepalive-timeout-ms is 0; give probes and pings at least 1 ms to be answered");
  }
  // For --auth none the check is only whether --listen is loopback, which needs no I/O, so it is
  // made here too; main() runs CheckServerAuth again, which for --auth munge asks munged.
  if (o.service.auth.mode == AuthMode::kNone) {
    if (absl::Status s = CheckServerAuth(o.service.auth, o.listen); !s.ok()) {
      return absl::InvalidArgumentError(s.message());
    }
  }
  if (f.tls_cert.empty() != f.tls_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        f.tls_cert.empty() ? "--tls-key without --tls-cert" : "--tls-cert without --tls-key",
        "; give both --tls-cert and --tls-key, or neither"));
  }
  if (!o.service.peers.empty() && o.service.auth.mode == AuthMode::kToken) {
    return absl::InvalidArgumentError(
        "--peers needs --auth munge (or none on loopback): the rdzvds of a list prove themselves "
        "to each other with MUNGE");
  }
  return f;
}

std::string ServerHelp() {
  ServerFlags f;
  Converted c;
  return MakeParser(f, c).Help();
}

}  // namespace rdzv
