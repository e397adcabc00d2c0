// PeerServers: the other rdzvds of the agents' server list (rdzvd --peers), asked before this
// server takes up a job it does not know, so that one job is never served by two servers.
//
// A server that is asked answers from its own jobs (server/rendezvous_service.h HoldsJob); this
// class is the asking side. Each question goes to every peer at once and ends within kAskTimeout:
// a peer that does not answer in time, refuses, or cannot prove that it runs as this server's uid
// counts as one that does not serve the job. Under MUNGE the question carries this server's
// credential and the answer must carry the peer's, made for the question's nonce.
//
// Thread-safe. Destroying it cancels the questions still out and waits for their callbacks.
#ifndef RDZV_SERVER_PEER_SERVERS_H_
#define RDZV_SERVER_PEER_SERVERS_H_

#include <grpcpp/channel.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "guard/authenticator.h"
#include "rdzv/v1/rdzv.grpc.pb.h"

namespace rdzv {

struct PeerOptions {
  // "host:port" of each other server of the list.
  std::vector<std::string> endpoints;
  // How this server proves itself to them (their --auth must be the same); kToken is not
  // supported (ParsePeers refuses it).
  AuthMode mode = AuthMode::kMunge;
  std::string munge_socket;
  // PEM of the CA that signed the peers' TLS certificates; empty for plaintext.
  std::string tls_ca_pem;
};

class PeerServers {
 public:
  // How long a question waits for the peers' answers.
  static constexpr absl::Duration kAskTimeout = absl::Seconds(2);

  // InvalidArgument for an endpoint that does not parse, or for token authentication.
  static absl::StatusOr<std::unique_ptr<PeerServers>> Create(PeerOptions options);
  ~PeerServers();
  PeerServers(const PeerServers&) = delete;
  PeerServers& operator=(const PeerServers&) = delete;

  // This server's instance number, random: when two servers decide about one job at once, the
  // lower number takes it.
  uint64_t instance() const { return instance_; }
  const std::vector<std::string>& endpoints() const { return options_.endpoints; }

  // Asks every peer whether it serves `owner`'s job `job_id`; `done` runs once, on a gRPC thread
  // (or on this one, when nothing could be asked), with the endpoint of a peer that does, or ""
  // when none does. Blocks on munged to make the credential.
  void Ask(const std::string& job_id, const std::string& owner,
           std::function<void(std::string holder)> done);

 private:
  struct Peer {
    std::string endpoint;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Rendezvous::Stub> stub;
  };
  struct Question;
  PeerServers(PeerOptions options, uint64_t instance);
  // One peer's answer to `q` (`holds` only when proven).
  void Answered(const std::shared_ptr<Question>& q, size_t peer, bool holds);

  const PeerOptions options_;
  const uint64_t instance_;
  std::vector<Peer> peers_;
  absl::Mutex mu_;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::weak_ptr<grpc::ClientContext>> contexts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rdzv

#endif  // RDZV_SERVER_PEER_SERVERS_H_
