#include "client/agent/server_locator.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>

#include "absl/algorithm/container.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/net.h"
#include "guard/authenticator.h"

namespace rdzv {
namespace {

bool ResolvesToAddress(const std::string& host) { return !ResolveAddresses(host).empty(); }

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

absl::StatusOr<std::unique_ptr<Server>> StartEmbedded(const AgentConfig& config,
                                                      const std::string& listen_host,
                                                      const ClientAuth& auth) {
  absl::Status last;
  for (int port : config.embedded_ports) {
    ServerOptions options;
    options.listen = FormatHostPort(listen_host, port);
    options.service.log_jobs = false;
    options.service.only_job = config.join.job_id;
    options.service.auth = ServerPolicyFor(auth);
    if (absl::Status s = CheckServerAuth(options.service.auth, options.listen); !s.ok()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "cannot host the rendezvous on %s without authentication: %s; start munged, or give "
          "every agent the same --rdzv-token-file",
          listen_host,
          auth.none_because.empty() ? "munged does not answer on this node" : auth.none_because));
    }
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

ListenChoice EmbeddedListenAddress(const ListenFacts& facts) {
  const auto is_local = [&](const std::string& a) { return absl::c_linear_search(facts.local, a); };
  std::vector<std::string> loopback;
  for (const std::string& a : facts.resolved) {
    if (is_local(a)) return {a, ""};
    if (IsLoopbackAddress(a)) loopback.push_back(a);
  }
  if (!loopback.empty() && loopback.size() == facts.resolved.size()) {
    // An address given as such is where the others connect; only a name may mean more.
    const std::string slurm =
        facts.slurm_address && !IsIpAddress(facts.server_host) ? facts.slurm_address() : "";
    if (is_local(slurm)) return {slurm, ""};
    // IPv4 first: it is what a node list of plain names most often resolves to elsewhere.
    absl::c_stable_partition(loopback,
                             [](const std::string& a) { return !absl::StrContains(a, ':'); });
    return {loopback.front(), ""};
  }
  const std::string why =
      facts.resolved.empty()
          ? absl::StrFormat("%s does not resolve here", facts.server_host)
          : absl::StrFormat("%s resolves to %s, none of which is an address of this host",
                            facts.server_host, absl::StrJoin(facts.resolved, ", "));
  return {"0.0.0.0", absl::StrCat(why, "; the rendezvous server listens on every address")};
}

namespace {

// Where a server on this host listens when the others reach it at `host` (resolved from the
// node name `node`).
std::string ListenAddressFor(const std::string& host, const std::string& node) {
  ListenFacts facts;
  facts.server_host = host;
  facts.local = InterfaceAddresses();
  facts.resolved = IsIpAddress(host) ? std::vector<std::string>{host} : ResolveAddresses(host);
  facts.slurm_address = [&] {
    absl::StatusOr<std::string> address = SlurmNodeAddress(node);
    return address.ok() ? *address : std::string();
  };
  ListenChoice choice = EmbeddedListenAddress(facts);
  if (!choice.note.empty()) spdlog::info("{}", choice.note);
  return choice.address;
}

}  // namespace

AuthPolicy ServerPolicyFor(const ClientAuth& auth) {
  AuthPolicy policy;
  policy.munge_socket = auth.munge_socket;
  switch (auth.mode) {
    case ClientAuth::Mode::kMunge:
      policy.mode = AuthMode::kMunge;
      policy.only_uid = getuid();
      break;
    case ClientAuth::Mode::kToken:
      policy.mode = AuthMode::kToken;
      policy.only_token = auth.token;
      break;
    default:
      policy.mode = AuthMode::kNone;
      break;
  }
  return policy;
}

absl::StatusOr<std::string> NodeConnectAddress(const std::string& node) {
  if (IsIpAddress(node)) return node;
  std::vector<std::string> addresses = ResolveAddresses(node);
  // IPv4 first, as EmbeddedListenAddress prefers it.
  absl::c_stable_partition(addresses,
                           [](const std::string& a) { return !absl::StrContains(a, ':'); });
  if (!addresses.empty()) return addresses.front();
  absl::StatusOr<std::string> address = SlurmNodeAddress(node);
  if (address.ok() && IsIpAddress(*address)) return address;
  return absl::UnavailableError(absl::StrFormat(
      "cannot resolve node %s, and Slurm has no address for it", absl::CHexEscape(node)));
}

std::string NodeListenAddress(const std::string& node) {
  absl::StatusOr<std::string> host = ResolveServerHost(node);
  return ListenAddressFor(host.ok() ? *host : node, node);
}

absl::StatusOr<ServerLocation> LocateServer(const AgentConfig& config, const ClientAuth& auth) {
  ServerLocation location;
  absl::StatusOr<std::string> host = ResolveServerHost(config.rdzv_host);
  if (!host.ok()) return host.status();
  location.server_host = *host;
  if (!config.embedded_server) {
    for (int port : config.rdzv_ports) {
      location.endpoints.push_back(FormatHostPort(location.server_host, port));
    }
    location.endpoints.insert(location.endpoints.end(), config.backup_endpoints.begin(),
                              config.backup_endpoints.end());
    return location;
  }
  // Listen only where the other nodes reach this one.
  std::string listen_host = config.embedded_listen_host;
  if (listen_host == "0.0.0.0" && !location.server_host.empty()) {
    listen_host = ListenAddressFor(location.server_host, config.rdzv_host);
  }
  absl::StatusOr<std::unique_ptr<Server>> server = StartEmbedded(config, listen_host, auth);
  if (!server.ok()) return server.status();
  location.embedded = *std::move(server);
  location.endpoints.push_back(
      FormatHostPort(listen_host == "0.0.0.0" ? std::string("127.0.0.1") : listen_host,
                     location.embedded->port()));
  spdlog::debug("hosting the rendezvous for job {} on port {}", config.join.job_id,
                location.embedded->port());
  return location;
}

}  // namespace rdzv
