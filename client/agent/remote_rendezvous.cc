// The agent's rendezvous in an rdzvd, through rdzv::Client, and how an agent comes by its
// rendezvous.
#include "client/agent/remote_rendezvous.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "common/clock.h"
#include "common/core/host_port.h"

namespace rdzv {
namespace {

// How long a task waits for its node's first task to host the relay before it joins directly.
constexpr absl::Duration kWaitForRelay = absl::Seconds(10);

class RemoteRendezvous final : public AgentRendezvous {
 public:
  RemoteRendezvous(std::unique_ptr<Client> client, Post post)
      : client_(std::move(client)), post_(std::move(post)), joiner_([this] { RunJoins(); }) {}

  ~RemoteRendezvous() override {
    client_->Cancel();  // a join in progress returns at once
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    wake_.notify_one();
    joiner_.join();
  }

  void Join(const JoinSpec& spec, absl::Duration timeout, Handlers events,
            std::function<void(absl::StatusOr<AssignmentEvent>)> done) override {
    // The join before this one, if it still waits, makes way.
    client_->CancelJoin();
    // The client calls them on gRPC threads; the agent hears them on its loop.
    const Handlers handlers = {.on_progress = Posted(std::move(events.on_progress)),
                               .on_abort = Posted(std::move(events.on_abort)),
                               .on_lost = Posted(std::move(events.on_lost)),
                               .on_released = PostedCall(std::move(events.on_released))};
    {
      std::lock_guard<std::mutex> lock(mu_);
      joins_.push_back([this, spec, timeout, handlers, done = std::move(done)] {
        absl::StatusOr<AssignmentEvent> result = client_->Join(spec, handlers, timeout);
        post_([done, result = std::move(result)] { done(result); });
      });
    }
    wake_.notify_one();
  }

  void ReportFailure(const FailureInfo& failure,
                     std::function<void(absl::StatusOr<AbortEvent>)> done) override {
    client_->ReportFailureAsync(
        failure, [post = post_, done = std::move(done)](absl::StatusOr<AbortEvent> result) {
          post([done, result = std::move(result)] { done(result); });
        });
  }

  void Leave(std::function<void(absl::Status)> done) override {
    client_->LeaveAsync([post = post_, done = std::move(done)](absl::Status status) {
      post([done, status = std::move(status)] { done(status); });
    });
  }

  // The agent is done with the server: a report or departure it still waits for is given up.
  void Cancel() override {
    client_->Cancel();
    client_->AbandonCalls();
  }

  // The server the client talks to now: the first of a list, or the one it moved to.
  std::string endpoint() const override { return client_->endpoint(); }
  std::string relayed_server() const override { return client_->relayed_server(); }

 private:
  // `f`, run through post_; empty for an empty `f`.
  template <typename Arg>
  std::function<void(const Arg&)> Posted(std::function<void(const Arg&)> f) const {
    if (!f) return nullptr;
    return [post = post_, f = std::move(f)](const Arg& arg) { post([f, arg] { f(arg); }); };
  }
  std::function<void()> PostedCall(std::function<void()> f) const {
    if (!f) return nullptr;
    return [post = post_, f = std::move(f)] { post(f); };
  }

  // Client::Join blocks until the round completes: joins run here, one after another, and
  // report back through post_.
  void RunJoins() {
    for (;;) {
      std::function<void()> join;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [this] { return stopping_ || !joins_.empty(); });
        if (stopping_) return;
        join = std::move(joins_.front());
        joins_.pop_front();
      }
      join();
    }
  }

  const std::unique_ptr<Client> client_;
  const Post post_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> joins_;
  bool stopping_ = false;
  std::thread joiner_;  // last: it starts running in the constructor
};

}  // namespace

absl::StatusOr<std::unique_ptr<AgentRendezvous>> NewRemoteRendezvous(ClientOptions options,
                                                                     AgentRendezvous::Post post) {
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(std::move(options));
  if (!client.ok()) return client.status();
  return std::make_unique<RemoteRendezvous>(*std::move(client), std::move(post));
}

namespace {

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
                                                      AgentRendezvous::Post post) {
  ConnectedRendezvous connected;
  if (config.mode == "standalone") {
    connected.rendezvous = NewLocalRendezvous(SteadyClock(), std::move(post));
    return connected;
  }
  if (config.mode == "slurm step per node") {
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
    const std::string socket = RelaySocketPath(getuid(), config.join.job_id, config.relay.node);
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
