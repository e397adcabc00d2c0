// rdzvd: the rendezvous server as a service (one per cluster head node, many jobs at once).
#include <signal.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/core/flags.h"
#include "common/logging.h"
#include "common/process_env.h"
#include "common/tls.h"
#include "server/authenticator.h"
#include "server/server.h"
#include "server/systemd_notify.h"

namespace {

constexpr char kUsage[] =
    R"(rdzvd: rendezvous server for rdzv-agent; serves many jobs at once, keyed by job id.

Usage: rdzvd [--listen HOST:PORT] [--auth munge|token|none] [--metrics-listen HOST:PORT]
             [--tls-cert FILE --tls-key FILE] [--log-level LEVEL]
Example: rdzvd --listen 0.0.0.0:29400    (agents then use --rdzv-endpoint head:29400)
Every call is authenticated (MUNGE by default) and each job belongs to the user who created
it: other users can neither see nor touch it. Serves grpc.health.v1 beside the rendezvous
service, tells systemd when it is ready (Type=notify), and stops cleanly on SIGTERM or SIGINT.)";

absl::Status ParseMillis(absl::string_view v, int64_t* out) {
  if (!absl::SimpleAtoi(v, out) || *out < 0) {
    return absl::InvalidArgumentError("expected milliseconds, a whole number >= 0");
  }
  return absl::OkStatus();
}

absl::Status ParseCount(absl::string_view v, int64_t min, int64_t max, int64_t* out) {
  if (!absl::SimpleAtoi(v, out) || *out < min || *out > max) {
    return absl::InvalidArgumentError(
        absl::StrFormat("expected a whole number from %d to %d", min, max));
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  rdzv::ServerOptions options;
  std::string log_level = "info";
  bool help = false;
  int64_t progress_ms = options.service.state.progress_interval / 1000;
  int64_t keepalive_ms = absl::ToInt64Milliseconds(options.keepalive);
  int64_t keepalive_timeout_ms = absl::ToInt64Milliseconds(options.keepalive_timeout);

  std::string auth = "munge";
  std::string admin_groups;

  rdzv::FlagParser parser("rdzvd", kUsage);
  parser.Add({"auth", "RDZV_AUTH", "MODE",
              "how callers prove who they are: munge (default; munged on every host),\n"
              "token (each job's agents share a --rdzv-token-file; the job is theirs) or none\n"
              "(refused unless --listen is a loopback address)",
              [&](absl::string_view v) {
                auth = std::string(v);
                return rdzv::ParseAuthMode(v).status();
              }});
  parser.Add({"munge-socket", "RDZV_MUNGE_SOCKET", "PATH",
              "munged's socket (default: libmunge's, /run/munge/munge.socket.2)",
              [&](absl::string_view v) {
                options.service.auth.munge_socket = std::string(v);
                return absl::OkStatus();
              }});
  parser.Add({"admin-group", "RDZV_ADMIN_GROUP", "GROUP,...",
              "groups whose members see every user's jobs (root always does)",
              [&](absl::string_view v) {
                admin_groups = std::string(v);
                return absl::OkStatus();
              }});
  parser.Add({"listen", "RDZV_LISTEN", "HOST:PORT", "address to serve on (default 0.0.0.0:29400)",
              [&](absl::string_view v) {
                options.listen = std::string(v);
                return absl::OkStatus();
              }});
  std::string tls_cert, tls_key;
  parser.Add({"tls-cert", "RDZV_TLS_CERT", "FILE",
              "serve TLS with this PEM certificate (chain); needs --tls-key, and agents then\n"
              "pass --tls-ca with the CA that signed it (default: plaintext)",
              [&](absl::string_view v) {
                tls_cert = std::string(v);
                return absl::OkStatus();
              }});
  parser.Add({"tls-key", "RDZV_TLS_KEY", "FILE",
              "the private key of --tls-cert, PEM, readable by rdzvd's user only (chmod 600)",
              [&](absl::string_view v) {
                tls_key = std::string(v);
                return absl::OkStatus();
              }});
  parser.Add({"metrics-listen", "RDZV_METRICS_LISTEN", "HOST:PORT",
              "serve Prometheus metrics over HTTP at /metrics (default: off)",
              [&](absl::string_view v) {
                options.metrics_listen = std::string(v);
                return absl::OkStatus();
              }});
  parser.Add({"log-level", "RDZV_LOG_LEVEL", "LEVEL",
              "trace, debug, info, warn, error or off (default info)", [&](absl::string_view v) {
                log_level = std::string(v);
                return absl::OkStatus();
              }});
  parser.Add({"progress-interval-ms", "RDZV_PROGRESS_INTERVAL_MS", "MS",
              "how often waiting agents hear how their round fills (default 3000)",
              [&](absl::string_view v) { return ParseMillis(v, &progress_ms); }});
  parser.Add({"keepalive-ms", "RDZV_KEEPALIVE_MS", "MS",
              "ping each agent this often; one that does not answer within\n"
              "--keepalive-timeout-ms is lost and its job ends (default 1000; 0 turns pings off)",
              [&](absl::string_view v) { return ParseMillis(v, &keepalive_ms); }});
  parser.Add({"keepalive-timeout-ms", "RDZV_KEEPALIVE_TIMEOUT_MS", "MS",
              "how long a ping may wait for its answer (default 1000)",
              [&](absl::string_view v) { return ParseMillis(v, &keepalive_timeout_ms); }});
  int64_t max_jobs = options.service.max_jobs_per_user;
  int64_t max_agents = options.service.max_agents_per_user;
  int64_t memory_mb = static_cast<int64_t>(options.memory_limit_bytes >> 20);
  parser.Add({"max-jobs-per-user", "RDZV_MAX_JOBS_PER_USER", "N",
              "jobs one user may have on this server at once (default 1000)",
              [&](absl::string_view v) { return ParseCount(v, 1, 1'000'000, &max_jobs); }});
  parser.Add({"max-agents-per-user", "RDZV_MAX_AGENTS_PER_USER", "N",
              "agents one user may have attached at once (default 100000)",
              [&](absl::string_view v) { return ParseCount(v, 1, 10'000'000, &max_agents); }});
  parser.Add({"memory-limit-mb", "RDZV_MEMORY_LIMIT_MB", "MB",
              "memory gRPC may use for all connections and calls together (default 4096)",
              [&](absl::string_view v) { return ParseCount(v, 64, 1 << 24, &memory_mb); }});
  parser.Add({"help", "", "", "print this help", [&](absl::string_view) {
                help = true;
                return absl::OkStatus();
              }});

  absl::StatusOr<std::vector<std::string>> rest =
      parser.Parse(std::vector<std::string>(argv + 1, argv + argc), rdzv::ProcessEnv());
  if (!rest.ok()) {
    std::fprintf(stderr, "rdzvd: %s\n", std::string(rest.status().message()).c_str());
    return 2;
  }
  if (help) {
    std::printf("%s", parser.Help().c_str());
    return 0;
  }
  if (!rest->empty()) {
    std::fprintf(stderr, "rdzvd: unexpected argument \"%s\"; see rdzvd --help\n",
                 rest->front().c_str());
    return 2;
  }
  if (absl::Status s = rdzv::SetUpLogging("rdzvd", log_level); !s.ok()) {
    std::fprintf(stderr, "rdzvd: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  options.service.state.progress_interval = progress_ms * 1000;
  options.service.max_jobs_per_user = max_jobs;
  options.service.max_agents_per_user = max_agents;
  options.memory_limit_bytes = static_cast<size_t>(memory_mb) << 20;
  options.keepalive = absl::Milliseconds(keepalive_ms);
  options.keepalive_timeout = absl::Milliseconds(keepalive_timeout_ms);
  if (keepalive_ms > 0 && keepalive_timeout_ms == 0) {
    std::fprintf(stderr, "rdzvd: --keepalive-timeout-ms is 0; give a ping at least 1 ms\n");
    return 2;
  }

  options.service.auth.mode = *rdzv::ParseAuthMode(auth);
  if (absl::Status s = rdzv::ResolveGroups(admin_groups, &options.service.auth.admin_gids);
      !s.ok()) {
    std::fprintf(stderr, "rdzvd: --admin-group: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (absl::Status s = rdzv::CheckServerAuth(options.service.auth, options.listen); !s.ok()) {
    std::fprintf(stderr, "rdzvd: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (tls_cert.empty() != tls_key.empty()) {
    std::fprintf(
        stderr, "rdzvd: %s; give both --tls-cert and --tls-key, or neither\n",
        tls_cert.empty() ? "--tls-key without --tls-cert" : "--tls-cert without --tls-key");
    return 2;
  }
  if (!tls_cert.empty()) {
    absl::StatusOr<rdzv::TlsServerIdentity> tls =
        rdzv::LoadTlsServerIdentity(tls_cert, tls_key, "--tls-cert", "--tls-key");
    if (!tls.ok()) {
      std::fprintf(stderr, "rdzvd: %s\n", std::string(tls.status().message()).c_str());
      return 2;
    }
    options.tls = *std::move(tls);
  }

  // Block the stop signals in every thread so that only sigwait below sees them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  absl::StatusOr<std::unique_ptr<rdzv::Server>> server = rdzv::Server::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "rdzvd: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  spdlog::info("serving on {} (port {}), authentication: {}{}", options.listen, (*server)->port(),
               rdzv::AuthModeName(options.service.auth.mode),
               options.tls.cert_chain_pem.empty() ? "" : ", TLS");
  if ((*server)->metrics_port() != 0) {
    spdlog::info("metrics on http://{}/metrics (port {})", options.metrics_listen,
                 (*server)->metrics_port());
  }
  const std::string notify_socket = rdzv::ProcessEnv()("NOTIFY_SOCKET").value_or("");
  if (absl::Status s = rdzv::NotifySystemd(notify_socket, "READY=1"); !s.ok()) {
    spdlog::warn("{}", s.message());
  }
  int sig = 0;
  sigwait(&stop, &sig);
  spdlog::info("{}: shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  (void)rdzv::NotifySystemd(notify_socket, "STOPPING=1");
  (*server)->Shutdown();
  return 0;
}
