// AgentRendezvous: what an agent needs of its rendezvous, wherever that lives: join a round,
// report a failure, leave, and hear what happens to the job. Two implementations: the remote
// one talks to an rdzvd (or an embedded server) through rdzv::Client; the in-process one keeps
// a RendezvousState of its own, for a standalone agent that needs no server, port or gRPC.
//
// No method blocks. Every completion and every job event is handed to the `post` function given
// at creation, which runs it on the agent's event loop, so the agent sees them one at a time on
// its own thread. Not thread-safe: call it from that loop.
#ifndef RDZV_CLIENT_AGENT_AGENT_RENDEZVOUS_H_
#define RDZV_CLIENT_AGENT_AGENT_RENDEZVOUS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "common/clock.h"
#include "common/core/rendezvous_types.h"

namespace rdzv {

class AgentRendezvous {
 public:
  // Runs a task on the agent's event loop, later.
  using Post = std::function<void(std::function<void()>)>;

  virtual ~AgentRendezvous() = default;

  // Joins `spec.job_id` (with spec.resume: rejoins the round the workers run in), giving up
  // after `timeout`. `done` gets the assignment, or why there is none. `events` hear what
  // happens to the job after (or while) joining, as rdzv::Client's Handlers say, except that
  // they run through `post`, on the agent's loop. A Join replaces any earlier one: a join still
  // in progress ends (Cancelled) and the earlier events stop.
  virtual void Join(const JoinSpec& spec, absl::Duration timeout, Handlers events,
                    std::function<void(absl::StatusOr<AssignmentEvent>)> done) = 0;

  // Tells the rendezvous that this agent's part of the job failed; `done` gets the job's first
  // failure (which may be another agent's).
  virtual void ReportFailure(const FailureInfo& failure,
                             std::function<void(absl::StatusOr<AbortEvent>)> done) = 0;

  // This agent is done with the job.
  virtual void Leave(std::function<void(absl::Status)> done) = 0;

  // Ends a join in progress (its `done` gets Cancelled) and closes the connection, for good.
  virtual void Cancel() = 0;

  // Where the server is, for the workers' RDZV_ENDPOINT; "" when there is none.
  virtual std::string endpoint() const = 0;

  // Through a relay: the server the relay reached for the last assignment; "" otherwise.
  virtual std::string relayed_server() const { return ""; }
};

// Over rdzv::Client. Joins run on a thread of the object's own (Client::Join blocks), the other
// calls use gRPC's asynchronous API. InvalidArgument for a malformed endpoint.
absl::StatusOr<std::unique_ptr<AgentRendezvous>> NewRemoteRendezvous(ClientOptions options,
                                                                     AgentRendezvous::Post post);

// The relay an agent joins through (node_relay.h), and how to tell that it is there.
struct RelayRoute {
  std::string name;       // for logs: the relay's socket, or its node and endpoint
  ClientOptions options;  // how to reach it and what it must prove
  // Whether the relay listens now. Called off the agent's loop; may block up to a second.
  std::function<bool()> listening;
  // How often a join in progress through the relay checks that it still listens.
  absl::Duration watch_every = absl::Milliseconds(50);
};

// The route to the node's relay on the UNIX socket `socket_path`, for an agent whose server is
// `direct`: the socket's private directory vouches for both ends.
RelayRoute NodeRelayRoute(const std::string& socket_path, const ClientOptions& direct);

// The route to the relay of this node's group at `endpoints` (the first free of which the relay
// listens on: "address:port"), on node `node`: it proves itself as a server of this job would
// (this user's, or the job's token), and every call carries this agent's credential.
RelayRoute GroupRelayRoute(const std::string& node, const std::vector<std::string>& endpoints,
                           const ClientOptions& direct);

// Through `route`'s relay while it listens, else directly as `direct` says. The first Join
// waits up to `wait_for_relay` for the relay to listen (its agent may start a moment later); a
// later Join (a new round, or a resume after the relay lost the server) asks the relay if it
// still listens, and goes directly if not: a relay whose agent died is a lost node like any
// other, and the others hear how the job ended from the server itself. InvalidArgument for a
// malformed endpoint.
absl::StatusOr<std::unique_ptr<AgentRendezvous>> NewRelayedRendezvous(RelayRoute route,
                                                                      absl::Duration wait_for_relay,
                                                                      ClientOptions direct,
                                                                      AgentRendezvous::Post post);

// In this process, over a RendezvousState driven by `clock`.
std::unique_ptr<AgentRendezvous> NewLocalRendezvous(Clock clock, AgentRendezvous::Post post);

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_AGENT_RENDEZVOUS_H_
