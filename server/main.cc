// rdzvd: the rendezvous server as a service (one per cluster head node, many jobs at once).
#include <signal.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/logging.h"
#include "common/process_env.h"
#include "common/program_info.h"
#include "common/tls.h"
#include "guard/authenticator.h"
#include "server/metrics_http.h"
#include "server/server.h"
#include "server/server_flags.h"
#include "server/systemd_notify.h"

namespace {

// Prints the one-line error; returns the exit code: 2 for a setup to fix, 1 for no server.
int Fail(absl::string_view message, int code = 2) {
  std::fprintf(stderr, "rdzvd: %s\n", std::string(message).c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  rdzv::InitOpenSslWithoutExitCleanup();
  absl::StatusOr<rdzv::ServerFlags> flags =
      rdzv::ParseServerFlags(std::vector<std::string>(argv + 1, argv + argc), rdzv::ProcessEnv());
  if (!flags.ok()) return Fail(flags.status().message());
  if (rdzv::AnsweredHelpOrVersion(flags->help, flags->version, "rdzvd", RDZV_VERSION,
                                  rdzv::ServerHelp)) {
    return 0;
  }
  absl::Status s = rdzv::SetUpLogging("rdzvd", flags->log_level);
  if (!s.ok()) return Fail(s.message());
  rdzv::ServerOptions& options = flags->options;
  rdzv::AuthPolicy& auth = options.service.auth;
  if (s = rdzv::ResolveGroups(flags->admin_groups, &auth.admin_gids); !s.ok()) {
    return Fail(absl::StrCat("--admin-group: ", s.message()));
  }
  if (s = rdzv::CheckServerAuth(auth, options.listen); !s.ok()) return Fail(s.message());
  if (!flags->tls_cert.empty()) {
    absl::StatusOr<rdzv::TlsServerIdentity> tls =
        rdzv::LoadTlsServerIdentity(flags->tls_cert, flags->tls_key, "--tls-cert", "--tls-key");
    if (!tls.ok()) return Fail(tls.status().message());
    options.tls = *std::move(tls);
  }
  if (!flags->peer_tls_ca.empty()) {
    absl::StatusOr<std::string> ca = rdzv::LoadTlsCa(flags->peer_tls_ca, "--peer-tls-ca");
    if (!ca.ok()) return Fail(ca.status().message());
    options.service.peer_tls_ca_pem = *std::move(ca);
  }

  // Block the stop signals in every thread so that only sigwait below sees them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  options.serve_metrics = &rdzv::MetricsHttpServer::StartEndpoint;
  absl::StatusOr<std::unique_ptr<rdzv::Server>> server = rdzv::Server::Start(options);
  if (!server.ok()) return Fail(server.status().message(), 1);
  spdlog::info("serving on {} (port {}), authentication: {}{}", options.listen, (*server)->port(),
               rdzv::AuthModeName(auth.mode), options.tls.cert_chain_pem.empty() ? "" : ", TLS");
  if (!options.service.peers.empty()) {
    spdlog::info("takes up no job that {} serves", absl::StrJoin(options.service.peers, " or "));
  }
  if ((*server)->metrics_port() != 0) {
    spdlog::info("metrics on http://{}/metrics (port {})", options.metrics_listen,
                 (*server)->metrics_port());
  }
  const std::string notify_socket = rdzv::ProcessEnv()("NOTIFY_SOCKET").value_or("");
  if (s = rdzv::NotifySystemd(notify_socket, "READY=1"); !s.ok()) {
    spdlog::warn("{}", s.message());
  }
  int sig = 0;
  sigwait(&stop, &sig);
  spdlog::info("{}: shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  (void)rdzv::NotifySystemd(notify_socket, "STOPPING=1");
  (*server)->Shutdown();
  return 0;
}
