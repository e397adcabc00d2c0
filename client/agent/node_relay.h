// NodeRelay: the tasks of one node reach the rendezvous server through one connection, one
// stream and one credential. Under `srun --ntasks-per-node=G rdzv-agent`, each task's agent is
// one rank; without a relay the server would hold G streams per node and check G credentials.
//
// The node's first task runs the relay: a gRPC server for the node's agents on a UNIX socket in
// a directory only this user may enter (RelayDirectory), which is what authenticates the tasks
// to it and it to them. Every agent of the node, the first task's own included, joins through
// it with the usual rdzv.v1 calls. The relay gathers their joins and sends them to the server as
// one group join (JoinRequest.members), made with the relay's credential; the server answers
// each member on the group stream, and the relay hands every event to its member's local stream.
// A member's ReportExit and Leave go up with the relay's credential; a member whose task ends
// without a word is reported lost (ReportExitRequest.member_lost), as its own dropped stream
// would have been. When the relay's group stream to the server ends, every member on it hears
// that the server was lost, and rejoins through the relay if it is still there, or directly
// (RelayedRendezvous, agent_rendezvous.h).
//
// The same relay also serves a group of nodes over TCP (NodeRelayOptions::listen): the tree of a
// large job, where each group's first node relays its group's joins and rdzvd holds a stream per
// group instead of one per node. There the socket's directory vouches for no one: every call
// carries its agent's credential, which the relay checks as a server of the job would (this
// user, or the job's token), and the relay proves itself to its callers in each answer.
//
// What the relay decides (when a batch goes up, what each member hears) is RelayMembers'
// (core/relay_members.h); where it listens is relay_socket.h's; it reaches the server as librdzv
// does (client/server_list.h). Thread-safe. Owns a thread that makes the upstream calls
// (credentials may wait for munged).
#ifndef RDZV_CLIENT_AGENT_NODE_RELAY_H_
#define RDZV_CLIENT_AGENT_NODE_RELAY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/agent/core/relay_members.h"
#include "client/agent/relay_socket.h"
#include "client/client.h"
#include "guard/authenticator.h"

namespace rdzv {

// How long a relay of a group of nodes waits, after the first of a batch of joins, for the rest
// of its group: nodes start over a few seconds, and the job completes only once the last has
// joined anyway.
inline constexpr absl::Duration kGroupGather = absl::Seconds(5);

struct NodeRelayOptions {
  // The UNIX socket the node's agents join at (RelaySocketPath).
  std::string socket_path;
  // The job the node's agents join; joins of another job are refused.
  std::string job_id;
  // The node's task count: once that many agents wait, their joins go up at once.
  int expected = 1;
  // How long the relay waits, after the first of a batch of joins, for the rest of the node's
  // tasks before it sends the joins it has.
  absl::Duration gather = absl::Milliseconds(500);
  // The same for a later round (a restart, or a resume): the first agent back waits up to this
  // long for the others, which stop their workers before they rejoin (--term-timeout and more).
  absl::Duration rejoin_gather = absl::Seconds(5);
  // Served on TCP instead of a UNIX socket: on the first of these "host:port" that is free. The
  // callers must then prove who they are as `callers` says (which may be kNone on loopback
  // only), and only agents of nodes first_node..last_node are relayed; others hear NOT_FOUND,
  // as from a server of another job, and try their next candidate.
  std::vector<std::string> listen;
  AuthPolicy callers;
  int64_t first_node = 0;
  int64_t last_node = 0;
  // How often a TCP relay pings its callers, and how long it waits for the answer: a node that
  // vanishes is reported lost after their sum.
  absl::Duration ping = absl::Seconds(1);
  absl::Duration ping_timeout = absl::Seconds(1);
  // A TCP connection that has carried no call the relay lets in this long after it opened is
  // closed, so that strangers cannot use up the relay's connections.
  absl::Duration unused_connection_timeout = absl::Seconds(10);
  // How many TCP connections one host may hold open to the relay: -1 for a few more than the
  // group needs (2 * expected + 16, of which expected + 16 not yet let in), 0 for no bound. At
  // the bound one that the relay has not let in is dropped for the newcomer, as rdzvd does.
  int max_connections_per_host = -1;
  // The server and how to reach it: endpoint and alternates (tried in turn when one is
  // unreachable, serves another job or does not prove itself), auth, TLS and rpc_timeout.
  ClientOptions upstream;
};

class NodeRelay {
 public:
  // Listens on options.socket_path (replacing a stale socket there) after checking its directory
  // (RelayDirectory), and removes the sockets there that killed relays left (this user's, made
  // over a minute ago, that no one listens on). Errors name the socket and why. With
  // options.listen, listens on the first free candidate instead: Unavailable naming the last
  // candidate's failure when none is free, FailedPrecondition when the callers' check cannot
  // work (no authentication off loopback, munged not answering).
  static absl::StatusOr<std::unique_ptr<NodeRelay>> Start(NodeRelayOptions options);

  // Stops serving: the node's agents still attached lose the relay (and rejoin directly).
  ~NodeRelay();
  NodeRelay(const NodeRelay&) = delete;
  NodeRelay& operator=(const NodeRelay&) = delete;

  // Blocks until every agent that joined has left or ended, or until `timeout`: the first task's
  // agent, which hosts the relay, waits here before it exits so that the node's other agents keep
  // their way to the server. False at the timeout.
  bool WaitIdle(absl::Duration timeout);

  // Where a TCP relay listens ("host:port"); "" for one on a UNIX socket.
  std::string endpoint() const;

  // Group streams opened to the server so far (for logs and tests).
  int upstream_streams() const;

  class Impl;

 private:
  explicit NodeRelay(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_NODE_RELAY_H_
