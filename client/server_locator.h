// Where an agent finds its rendezvous server: an rdzvd named by --rdzv-endpoint (or
// RDZV_ENDPOINT), the server node 0's agent hosts under Slurm, or the one this agent hosts
// itself. It resolves the server's host (falling back to the address Slurm has for a node name
// that does not resolve), and, for the hosting agent, starts the embedded server on the first
// free port of the candidates.
//
// Runs before the agent's event loop starts: it may block on name resolution and on scontrol.
// Thread-compatible: LocateServer keeps no state; a ServerLocation is used from one thread.
#ifndef RDZV_CLIENT_SERVER_LOCATOR_H_
#define RDZV_CLIENT_SERVER_LOCATOR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/agent_options.h"
#include "server/server.h"

namespace rdzv {

struct ServerLocation {
  // The server this agent hosts; null when another process hosts it.
  std::unique_ptr<Server> embedded;
  // Where to join, in the order to try them.
  std::vector<std::string> endpoints;
  // The server's host as an address or a name that resolves ("" when it is not known): the
  // route toward it picks this host's own address for the other nodes.
  std::string server_host;
};

// Finds (or starts) the server for a configuration that is not standalone. Unavailable, with
// the fix, when the host cannot be resolved or no candidate port is free. An embedded server
// serves only callers that prove what `auth` proves (this user, or the job's token).
absl::StatusOr<ServerLocation> LocateServer(const AgentConfig& config, const ClientAuth& auth);

}  // namespace rdzv

#endif  // RDZV_CLIENT_SERVER_LOCATOR_H_
