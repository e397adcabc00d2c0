// How an agent comes by its rendezvous: in-process, directly at the server, or through a relay.
#include "client/agent/connect_rendezvous.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <utility>

#include "common/core/host_port.h"

namespace rdzv {
namespace {

// How long a task waits for its node's first task to host the relay before it joins directly.
constexpr absl::Duration kWaitForRelay = absl::Seconds(10);

// Under --fan-in: this node joins through its group's relay, which the group's first node hosts
// (this agent, perhaps), else directly.
absl::StatusOr<ConnectedRendezvous> JoinThroughGroup(const AgentConfig& config,
                                                     ClientOptions options,
                                                     ConnectedRendezvous connected,
                                                     AgentRendezvous::Post post) {
  const AgentConfig::GroupRelayConfig& group = config.group;
  absl::StatusOr<std::string> address = NodeConnectAddress(group.relay_node);
  if (!address.ok()) {
    spdlog::warn("node {} joins the server itself: its group's relay on {} cannot be found ({})",
                 config.join.agent.node_index, group.relay_node,
                 std::string(address.status().message()));
    absl::StatusOr<std::unique_ptr<AgentRendezvous>> remote =
        NewRemoteRendezvous(std::move(options), std::move(post));
    if (!remote.ok()) return remote.status();
    connected.rendezvous = *std::move(remote);
    return connected;
  }
  std::vector<std::string> endpoints;
  for (int port : group.ports) endpoints.push_back(FormatHostPort(*address, port));
  if (group.host) {
    NodeRelayOptions relay;
    const std::string listen = NodeListenAddress(group.relay_node);
    for (int port : group.ports) relay.listen.push_back(FormatHostPort(listen, port));
    relay.job_id = config.join.job_id;
    relay.expected = static_cast<int>(group.last_node - group.first_node + 1);
    relay.first_node = group.first_node;
    relay.last_node = group.last_node;
    relay.callers = ServerPolicyFor(config.auth);
    relay.gather = kGroupGather;
    relay.rejoin_gather = config.term_timeout + absl::Seconds(2);
    relay.upstream = options;
    absl::StatusOr<std::unique_ptr<NodeRelay>> started = NodeRelay::Start(std::move(relay));
    if (started.ok()) {
      spdlog::debug("relaying the joins of nodes {}..{} at {}", group.first_node, group.last_node,
                    (*started)->endpoint());
      connected.relay = *std::move(started);
    } else {
      spdlog::warn("nodes {}..{} join the server each on its own: {}", group.first_node,
                   group.last_node, std::string(started.status().message()));
    }
  }
  RelayRoute route = GroupRelayRoute(group.relay_node, endpoints, options);
  absl::StatusOr<std::unique_ptr<AgentRendezvous>> relayed =
      NewRelayedRendezvous(std::move(route), kWaitForRelay, std::move(options), std::move(post));
  if (!relayed.ok()) return relayed.status();
  connected.rendezvous = *std::move(relayed);
  return connected;
}

}  // namespace

absl::StatusOr<ConnectedRendezvous> ConnectRendezvous(const AgentConfig& config,
                                                      const ConnectEnv& env,
                                                      AgentRendezvous::Post post) {
  ConnectedRendezvous connected;
  if (config.mode == AgentMode::kStandalone) {
    connected.rendezvous = NewLocalRendezvous(env.clock, std::move(post));
    return connected;
  }
  if (config.mode == AgentMode::kSlurmStepPerNode) {
    spdlog::info(
        "one step per node: this step joins job {} as node {} of {}, at the rendezvous on the "
        "allocation's first node {}; it waits up to --join-timeout for the other steps",
        config.join.job_id, config.join.agent.node_index, config.join.max_agents, config.rdzv_host);
  }
  absl::StatusOr<ServerLocation> location = LocateServer(config, config.auth);
  if (!location.ok()) return location.status();
  connected.location = *std::move(location);
  const std::vector<std::string>& endpoints = connected.location.endpoints;
  ClientOptions options;
  options.auth = config.auth;
  options.tls = config.tls;
  options.endpoint = endpoints.front();
  options.alternate_endpoints.assign(endpoints.begin() + 1, endpoints.end());
  options.join_timeout = config.join_timeout;
  options.failover_after = config.failover_after;
  if (config.relay.tasks_on_node > 1) {
    const std::string socket =
        RelaySocketPath(env.temp_dir, getuid(), config.join.job_id, config.relay.node);
    if (config.relay.host) {
      NodeRelayOptions relay;
      relay.socket_path = socket;
      relay.job_id = config.join.job_id;
      relay.expected = config.relay.tasks_on_node;
      relay.rejoin_gather = config.term_timeout + absl::Seconds(2);
      relay.upstream = options;
      absl::StatusOr<std::unique_ptr<NodeRelay>> started = NodeRelay::Start(std::move(relay));
      if (started.ok()) {
        connected.relay = *std::move(started);
      } else {
        spdlog::warn("this node's tasks join the server each on its own: {}",
                     std::string(started.status().message()));
      }
    }
    RelayRoute route = NodeRelayRoute(socket, options);
    absl::StatusOr<std::unique_ptr<AgentRendezvous>> relayed =
        NewRelayedRendezvous(std::move(route), kWaitForRelay, std::move(options), std::move(post));
    if (!relayed.ok()) return relayed.status();
    connected.rendezvous = *std::move(relayed);
    return connected;
  }
  if (config.group.fan_in > 0) {
    return JoinThroughGroup(config, std::move(options), std::move(connected), std::move(post));
  }
  absl::StatusOr<std::unique_ptr<AgentRendezvous>> remote =
      NewRemoteRendezvous(std::move(options), std::move(post));
  if (!remote.ok()) return remote.status();
  connected.rendezvous = *std::move(remote);
  return connected;
}

}  // namespace rdzv
