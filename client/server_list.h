// How a client reaches a rendezvous server, the one way librdzv's Client and a node's relay
// (client/agent/node_relay.h) both go: a list of servers tried in order (ServerList), each call
// made with the caller's credential and a nonce, and an answer taken only from a server that
// proves itself (OpenJoin for a Join stream, CallProven for a unary call). What to do when a
// server fails is the caller's (MovesOn says when the next server is worth a try).
//
// Internal to librdzv and rdzv-agent; not installed. Thread-safe: a ServerList changes nothing
// but the server in use, atomically. The calls block: on munged for a credential or a proof, and
// on the server's answer up to their deadline.
#ifndef RDZV_CLIENT_SERVER_LIST_H_
#define RDZV_CLIENT_SERVER_LIST_H_

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/join_stream.h"
#include "common/auth.h"
#include "rdzv/v1/rdzv.grpc.pb.h"

namespace rdzv {

class ServerList {
 public:
  struct Server {
    std::string name;  // "host:port", or "unix:PATH" for a node's relay
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Rendezvous::Stub> stub;
  };

  // The servers of options.endpoint (a server list, or one unix: socket of a node's relay), then
  // options.alternate_endpoints, one channel each (MakeClientChannelSetup, client_channel.h);
  // the first is in use. InvalidArgument for a malformed endpoint; FailedPrecondition for a
  // server off this host when options.auth proves nothing (ClientAuth::none_because); the
  // channel setup's error for a TLS CA that cannot be used. Connects lazily.
  static absl::StatusOr<std::unique_ptr<ServerList>> Make(const ClientOptions& options);

  ServerList(const ServerList&) = delete;
  ServerList& operator=(const ServerList&) = delete;

  size_t size() const { return servers_.size(); }
  // Candidates to choose from: a server that does not answer soon, or serves another job, is
  // passed over for the next.
  bool several() const { return servers_.size() > 1; }
  const Server& at(size_t i) const { return servers_[i]; }
  // The server in use, and its place in the list.
  size_t current() const { return current_; }
  const Server& server() const { return servers_[current_]; }
  // Moves from server `from` to the one after it (the first after the last), unless another
  // thread has moved on from `from` already; returns the server in use then.
  size_t MoveOn(size_t from);

  // Whether a join at server `i` must prove itself: every candidate among several, else as
  // ProofRequiredAt (client/client.h) says of its address.
  bool JoinProofRequired(size_t i) const;

  // The servers' names for a message: "a or b", or "host ports 29400-29407" for one host's
  // consecutive ports (an embedded server's candidates).
  std::string Names() const;

 private:
  explicit ServerList(std::vector<Server> servers) : servers_(std::move(servers)) {}

  const std::vector<Server> servers_;
  std::atomic<size_t> current_{0};
};

// Whether a call that failed with `code` at one server is worth trying at the next: the server
// did not answer (Unavailable), or, among candidates, it serves another job (NotFound).
bool MovesOn(absl::StatusCode code, bool several);

// What became of a Join stream OpenJoin opened.
struct JoinOpening {
  // kArrived: the server answered, and `proof` says whether it proved itself; the stream waits
  // for the caller's Proceed when it did, and has been abandoned when it did not. kNone: the
  // server refused at once (the stream has ended, its status given to OnEnd) and `proof` is that
  // of the refusal. kWaiting: no answer came in time (FailedPrecondition in `proof`); the stream
  // has been abandoned.
  JoinStream::Headers headers = JoinStream::Headers::kWaiting;
  absl::Status proof;
};

// Opens `stream` (not yet started) at server `i` of `servers` with `request` of job
// request.job_id(): with the credential `auth` calls for and a new nonce, then waits up to
// `wait_until` for the server's answer and checks its proof (required as JoinProofRequired
// says). The credential's error when none can be made (the stream is not started then).
absl::StatusOr<JoinOpening> OpenJoin(JoinStream& stream, const ServerList& servers, size_t i,
                                     const ClientAuth& auth, const v1::JoinRequest& request,
                                     absl::Time wait_until);

// What a unary call made with CallProven came back with: its status, and the check of its
// server's proof (required as ProofRequiredAt says of the server's address).
struct ProvenCall {
  grpc::Status status;
  absl::Status proof;
};

// One unary call of `method` on `job` at `server`, blocking up to `timeout`: `call` makes it on
// the server's stub with the context it is given, which carries the credential `auth` calls for
// and a new nonce. The credential's error when none can be made.
template <typename Call>
absl::StatusOr<ProvenCall> CallProven(const ServerList::Server& server, const ClientAuth& auth,
                                      absl::string_view method, absl::string_view job,
                                      absl::Duration timeout, Call call) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  const std::string nonce = NewNonce();
  if (absl::Status s = AttachCredential(ctx, auth, method, job, nonce); !s.ok()) return s;
  ProvenCall answer;
  answer.status = call(*server.stub, &ctx);
  answer.proof = CheckServerProof(ctx, auth, method, job, nonce, ProofRequiredAt(server.name));
  return answer;
}

}  // namespace rdzv

#endif  // RDZV_CLIENT_SERVER_LIST_H_
