#include "server/peer_servers.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/auth.h"
#include "common/core/host_port.h"
#include "common/logging.h"
#include "common/tls.h"

namespace rdzv {

// One question to every peer: the answers still to come, and the first peer that holds the job.
struct PeerServers::Question {
  std::string job_id;
  std::string owner;
  std::string nonce;
  std::function<void(std::string)> done;
  std::atomic<size_t> left{0};
  absl::Mutex mu;
  std::string holder ABSL_GUARDED_BY(mu);
};

absl::StatusOr<std::unique_ptr<PeerServers>> PeerServers::Create(PeerOptions options) {
  if (options.mode == AuthMode::kToken) {
    return absl::InvalidArgumentError(
        "--peers needs --auth munge (or none on loopback): the servers of a list prove "
        "themselves to each other with MUNGE");
  }
  uint64_t instance = 0;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&instance), sizeof(instance)) != 1) {
    return absl::InternalError("OpenSSL cannot make a random instance number");
  }
  std::unique_ptr<PeerServers> peers(new PeerServers(std::move(options), instance));
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      peers->options_.tls_ca_pem.empty() ? grpc::InsecureChannelCredentials()
                                         : ChannelCredentials(peers->options_.tls_ca_pem);
  for (const std::string& endpoint : peers->options_.endpoints) {
    absl::StatusOr<HostPort> hp = ParseHostPort(endpoint, 29400);
    if (!hp.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--peers: ", hp.status().message()));
    }
    Peer peer;
    peer.endpoint = FormatHostPort(hp->host, hp->port);
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // A connection attempt to a peer whose host is down (not refusing) gives up within a second
    // (gRPC's default is 20 s): a question asked meanwhile would wait out its whole kAskTimeout,
    // and every new job of this server waits for its question.
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
    peer.channel = grpc::CreateCustomChannel(peer.endpoint, credentials, args);
    peer.stub = v1::Rendezvous::NewStub(peer.channel);
    peers->peers_.push_back(std::move(peer));
  }
  return peers;
}

PeerServers::PeerServers(PeerOptions options, uint64_t instance)
    : options_(std::move(options)), instance_(instance) {}

PeerServers::~PeerServers() {
  std::vector<std::shared_ptr<grpc::ClientContext>> open;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    for (const auto& weak : contexts_) {
      if (std::shared_ptr<grpc::ClientContext> c = weak.lock()) open.push_back(std::move(c));
    }
  }
  for (const auto& c : open) c->TryCancel();
  open.clear();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int64_t* n) { return *n == 0; }, &in_flight_));
}

void PeerServers::Ask(const std::string& job_id, const std::string& owner,
                      std::function<void(std::string holder)> done) {
  auto q = std::make_shared<Question>();
  q->job_id = job_id;
  q->owner = owner;
  q->nonce = NewNonce();
  q->done = std::move(done);
  q->left = peers_.size();
  if (peers_.empty()) {
    q->done("");
    return;
  }
  std::string credential;
  if (options_.mode == AuthMode::kMunge) {
    absl::StatusOr<std::string> made = MungeEncode(
        CallPayload("HoldsJob", job_id), options_.munge_socket, absl::Now() + kAskTimeout);
    if (!made.ok()) {
      // Nobody can be asked; a peer that serves the job refuses this one's agents in turn when
      // they reach it, as it asks back.
      spdlog::warn("job {}: cannot ask the other servers whether they serve it: {}",
                   EscapeControl(job_id), made.status().message());
      q->left = 0;
      q->done("");
      return;
    }
    credential = *std::move(made);
  }
  for (size_t i = 0; i < peers_.size(); ++i) {
    auto context = std::make_shared<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(absl::Now() + kAskTimeout));
    if (!credential.empty()) context->AddMetadata(kMungeMetadata, credential);
    bool closing;
    {
      absl::MutexLock lock(&mu_);
      closing = closing_;
      if (!closing) {
        ++in_flight_;
        std::erase_if(contexts_, [](const auto& weak) { return weak.expired(); });
        contexts_.push_back(context);
      }
    }
    if (closing) {
      Answered(q, i, false);
      continue;
    }
    auto request = std::make_shared<v1::HoldsJobRequest>();
    request->set_job_id(job_id);
    request->set_owner(owner);
    request->set_asker(instance_);
    request->set_nonce(q->nonce);
    auto response = std::make_shared<v1::HoldsJobResponse>();
    peers_[i].stub->async()->HoldsJob(
        context.get(), request.get(), response.get(),
        [this, q, i, context, request, response](grpc::Status status) {
          bool holds = false;
          if (!status.ok()) {
            spdlog::debug("job {}: the server at {} did not answer whether it serves it: {}",
                          EscapeControl(q->job_id), peers_[i].endpoint, status.error_message());
          } else if (response->holds()) {
            holds = true;
            if (options_.mode == AuthMode::kMunge) {
              absl::StatusOr<MungeIdentity> id =
                  MungeDecode(response->proof(), options_.munge_socket, absl::Now() + kAskTimeout);
              holds = id.ok() && id->uid == geteuid() &&
                      id->payload == HoldsProofPayload(q->nonce, q->job_id, q->owner, true);
              if (!holds) {
                spdlog::warn(
                    "job {}: the server at {} says it serves the job but does not prove that it "
                    "runs as uid {} ({}); not taken into account",
                    EscapeControl(q->job_id), peers_[i].endpoint, geteuid(),
                    id.ok() ? "another uid or another answer" : id.status().message());
              }
            }
          }
          Answered(q, i, holds);
          absl::MutexLock lock(&mu_);
          --in_flight_;
        });
  }
}

void PeerServers::Answered(const std::shared_ptr<Question>& q, size_t peer, bool holds) {
  if (holds) {
    absl::MutexLock lock(&q->mu);
    if (q->holder.empty()) q->holder = peers_[peer].endpoint;
  }
  if (q->left.fetch_sub(1) != 1) return;
  std::string holder;
  {
    absl::MutexLock lock(&q->mu);
    holder = q->holder;
  }
  q->done(std::move(holder));
}

}  // namespace rdzv
