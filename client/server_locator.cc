#include "client/server_locator.h"

#include <netdb.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/net.h"

namespace rdzv {
namespace {

bool ResolvesToAddress(const std::string& host) {
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  freeaddrinfo(found);
  return true;
}

// The address slurm.conf gives a node (NodeAddr), from scontrol.
absl::StatusOr<std::string> SlurmNodeAddress(const std::string& node) {
  if (node.empty() || node.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                             "0123456789._-") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("not a node name: ", node));
  }
  const std::string command = absl::StrCat("scontrol show node -o ", node, " 2>/dev/null");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::UnavailableError("cannot run scontrol");
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) out.append(buf, n);
  const int rc = pclose(pipe);
  const size_t at = out.find("NodeAddr=");
  if (rc != 0 || at == std::string::npos) {
    return absl::NotFoundError("scontrol does not know its address either");
  }
  const size_t start = at + 9;
  const size_t end = out.find_first_of(" \n", start);
  return out.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

// The server's host as an address: the name may not resolve (inside containers, or with Slurm
// node names that only slurm.conf knows), so ask Slurm for the node's address then.
absl::StatusOr<std::string> ResolveServerHost(const std::string& host) {
  if (host.empty() || ResolvesToAddress(host)) return host;
  absl::StatusOr<std::string> address = SlurmNodeAddress(host);
  if (!address.ok()) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot resolve the rendezvous host %s (%s); pass --rdzv-endpoint ADDRESS:PORT", host,
        address.status().message()));
  }
  spdlog::debug("{} does not resolve; Slurm knows it as {}", host, *address);
  return address;
}

absl::StatusOr<std::unique_ptr<Server>> StartEmbedded(const AgentConfig& config) {
  absl::Status last;
  for (int port : config.embedded_ports) {
    ServerOptions options;
    options.listen = FormatHostPort(config.embedded_listen_host, port);
    options.service.log_jobs = false;
    options.service.only_job = config.join.job_id;
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
    if (server.ok()) return server;
    last = server.status();
    spdlog::debug("{}; trying the next port", last.message());
  }
  return absl::UnavailableError(absl::StrFormat(
      "cannot host the rendezvous: %s (tried %d ports); pass --rdzv-endpoint to use an "
      "rdzvd instead",
      last.message(), config.embedded_ports.size()));
}

}  // namespace

absl::StatusOr<ServerLocation> LocateServer(const AgentConfig& config) {
  ServerLocation location;
  absl::StatusOr<std::string> host = ResolveServerHost(config.rdzv_host);
  if (!host.ok()) return host.status();
  location.server_host = *host;
  if (!config.embedded_server) {
    for (int port : config.rdzv_ports) {
      location.endpoints.push_back(FormatHostPort(location.server_host, port));
    }
    return location;
  }
  absl::StatusOr<std::unique_ptr<Server>> server = StartEmbedded(config);
  if (!server.ok()) return server.status();
  location.embedded = *std::move(server);
  const std::string self = config.embedded_listen_host == "0.0.0.0" ? std::string("127.0.0.1")
                                                                    : config.embedded_listen_host;
  location.endpoints.push_back(FormatHostPort(self, location.embedded->port()));
  spdlog::debug("hosting the rendezvous for job {} on port {}", config.join.job_id,
                location.embedded->port());
  return location;
}

}  // namespace rdzv
