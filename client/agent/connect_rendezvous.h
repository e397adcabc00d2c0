// Where an agent's rendezvous comes from: the whole setup between its configuration and a
// rendezvous to join. A standalone agent keeps one in-process; any other finds or starts the
// server (server_locator.h) and connects to it, proving who it is as config.auth says (loaded
// with its token and resolved by LoadClientAuth, client/client.h, before the agent starts).
//
// Runs before the agent's event loop starts: it may block on name resolution, scontrol and
// munged. Thread-compatible (a free function).
#ifndef RDZV_CLIENT_AGENT_CONNECT_RENDEZVOUS_H_
#define RDZV_CLIENT_AGENT_CONNECT_RENDEZVOUS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/agent/agent_rendezvous.h"
#include "client/agent/core/agent_options.h"
#include "client/agent/node_relay.h"
#include "client/agent/server_locator.h"
#include "common/clock.h"

namespace rdzv {

struct ConnectedRendezvous {
  // Where the server is, holding it when this agent hosts it; empty for a standalone agent.
  ServerLocation location;
  // The node's relay, when this agent is the first task of a node whose tasks join through one
  // (node_relay.h); null otherwise.
  std::unique_ptr<NodeRelay> relay;
  std::unique_ptr<AgentRendezvous> rendezvous;
};

// What the setup takes from the agent's process.
struct ConnectEnv {
  Clock clock;           // an in-process rendezvous runs on it
  std::string temp_dir;  // TempDirectory (common/core/file_names.h): where a relay's socket goes
};

// The rendezvous for `config`, reporting through `post` (AgentRendezvous). The errors name
// what to fix: a server that cannot be found or started, a malformed endpoint.
absl::StatusOr<ConnectedRendezvous> ConnectRendezvous(const AgentConfig& config,
                                                      const ConnectEnv& env,
                                                      AgentRendezvous::Post post);

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_CONNECT_RENDEZVOUS_H_
