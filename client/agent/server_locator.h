// Where an agent finds its rendezvous server: an rdzvd named by --rdzv-endpoint (or
// RDZV_ENDPOINT), the server node 0's agent hosts under Slurm, or the one this agent hosts
// itself. It resolves the server's host (falling back to the address Slurm has for a node name
// that does not resolve), and, for the hosting agent, starts the embedded server on the first
// free port of the candidates.
//
// Runs before the agent's event loop starts: it may block on name resolution and on scontrol.
// Thread-compatible: LocateServer keeps no state; a ServerLocation is used from one thread.
#ifndef RDZV_CLIENT_AGENT_SERVER_LOCATOR_H_
#define RDZV_CLIENT_AGENT_SERVER_LOCATOR_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/agent/core/agent_options.h"
#include "guard/authenticator.h"
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

// What the hosting agent knows when it picks the address its server listens on.
struct ListenFacts {
  // The host the other agents connect to: an address, or a name that resolves.
  std::string server_host;
  // What server_host resolves to on this host (itself, for an address); empty when it does not.
  std::vector<std::string> resolved;
  // This host's own addresses, loopback excepted.
  std::vector<std::string> local;
  // The address Slurm has for the node (NodeAddr), or "" when it cannot tell; asked only when
  // server_host is a name that resolves to loopback here. May be empty.
  std::function<std::string()> slurm_address;
};

struct ListenChoice {
  std::string address;  // to listen on: one address, or 0.0.0.0
  std::string note;     // why it is 0.0.0.0; "" otherwise
};

// The one address the other nodes reach this host at, so that the server listens there only: the
// first address server_host resolves to that belongs to this host. A name that resolves to
// loopback here (a test cluster whose nodes all share one host) keeps loopback, unless Slurm
// gives the node one of this host's other addresses (a hosts file that maps the host's own name
// to 127.0.1.1, which other nodes resolve to its real address). Every address (0.0.0.0), with a
// note, when the host resolves to no address of this host. Pure.
ListenChoice EmbeddedListenAddress(const ListenFacts& facts);

// Whom a server or relay that an agent hosts serves: callers who prove they are this agent's
// user (MUNGE) or hold the job's token, as `auth` (resolved) says; without either, anyone, which
// may listen on loopback only.
AuthPolicy ServerPolicyFor(const ClientAuth& auth);

// The address other nodes connect to node `node` at, numeric: `node` itself when it is an
// address, else the first address it resolves to, else the address Slurm has for it (NodeAddr).
// Unavailable naming the node when none of these works.
absl::StatusOr<std::string> NodeConnectAddress(const std::string& node);

// The one address a server or relay on this host, node `node`, listens on so that the other
// nodes reach it (EmbeddedListenAddress), with a line in the log when that is every address.
std::string NodeListenAddress(const std::string& node);

// Finds (or starts) the server for a configuration that is not standalone. Unavailable, with
// the fix, when the host cannot be resolved or no candidate port is free. An embedded server
// serves only callers that prove what `auth` proves (this user, or the job's token).
absl::StatusOr<ServerLocation> LocateServer(const AgentConfig& config, const ClientAuth& auth);

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_SERVER_LOCATOR_H_
