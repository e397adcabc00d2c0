// Taking up a job with peers (rdzvd --peers): a join of a job this server does not know waits
// while the other servers of the list are asked whether they serve it (PeerServers), and the
// answers to the same question from them (HoldsJob).
//
// Which server of the list takes the job up is JobClaims' to decide (server/core/job_claims.h).
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/auth.h"
#include "common/grpc_status.h"
#include "guard/request_limits.h"
#include "server/metrics.h"
#include "server/rendezvous_service.h"

namespace rdzv {
static_assert(absl::Microseconds(JobClaims::kConcedeFor) > PeerServers::kAskTimeout,
              "a server must refuse a job it yielded until its own question has its answers");

std::string RendezvousService::ParkKey(absl::string_view owner, absl::string_view job_id) {
  return absl::StrCat(owner, "\n", job_id);
}

void RendezvousService::ParkLocked(StreamId id, RendezvousState& state, const Caller& caller,
                                   const v1::JoinRequest& request, const std::string& peer,
                                   std::optional<PeerQuestion>& ask) {
  const std::string key = ParkKey(caller.owner, request.job_id());
  auto [it, first] = parked_.try_emplace(key);
  if (first) {
    it->second.state = &state;
    it->second.owner = caller.owner;
    it->second.job_id = request.job_id();
    ask = PeerQuestion{request.job_id(), caller.owner};
    ledger_.JobParked(&state);
  }
  it->second.joins.push_back(ParkedJoin{id, request, peer});
}

void RendezvousService::AskPeers(const PeerQuestion& ask) {
  const std::string key = ParkKey(ask.second, ask.first);
  peers_->Ask(ask.first, ask.second,
              [this, key](std::string holder) { PeersAnswered(key, holder); });
}

void RendezvousService::PeersAnswered(const std::string& key, const std::string& holder) {
  std::vector<JoinStream*> writers;
  {
    absl::MutexLock lock(&mu_);
    auto it = parked_.find(key);
    if (it == parked_.end()) return;
    Parked parked = std::move(it->second);
    parked_.erase(it);
    if (shut_down_) return;
    ledger_.JobUnparked(parked.state);
    const JobClaims::Verdict verdict = claims_->Decide(key, !holder.empty(), clock_());
    Decisions decisions;
    if (verdict != JobClaims::Verdict::kTakeUp) {
      const absl::Status elsewhere = absl::NotFoundError(
          verdict == JobClaims::Verdict::kServedElsewhere
              ? absl::StrFormat("job %s is served by the rdzvd at %s; its agents go back to it",
                                parked.job_id, holder)
              : absl::StrFormat("job %s is being taken up by another rdzvd of the list",
                                parked.job_id));
      for (const ParkedJoin& join : parked.joins) {
        if (!streams_.contains(join.id)) continue;  // its agent went meanwhile
        decisions.closes.push_back({join.id, elsewhere});
        if (options_.metrics != nullptr) options_.metrics->OnPeerRefusal();
      }
    } else {
      // A job taken up from its resuming agents is counted and logged where any is (Apply).
      for (const ParkedJoin& join : parked.joins) {
        if (!streams_.contains(join.id)) continue;
        JoinStateLocked(join.id, *parked.state, join.request, join.peer, nullptr, decisions);
      }
      ChargeExcluded(*parked.state);
    }
    // The closes above are the streams' end; the state saw none of them.
    Apply(decisions, writers);
  }
  StartWrites(std::move(writers));
}

grpc::ServerUnaryReactor* RendezvousService::HoldsJob(grpc::CallbackServerContext* context,
                                                      const v1::HoldsJobRequest* request,
                                                      v1::HoldsJobResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<Caller> caller =
      Authenticate(context, "HoldsJob", request->job_id(), CheckHoldsJobRequest(*request));
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  const uid_t self = geteuid();
  if (options_.auth.mode != AuthMode::kNone && caller->owner != absl::StrCat("uid:", self) &&
      caller->owner != "uid:0") {
    CountRefused(Metrics::kRefusedPermissionDenied);
    reactor->Finish(grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        absl::StrFormat("HoldsJob is for the other rdzvds of a server list, which run as uid %d "
                        "as this one does; %s may not ask it",
                        self, caller->name)));
    return reactor;
  }
  const std::string key = ParkKey(request->owner(), request->job_id());
  bool holds = false;
  {
    absl::MutexLock lock(&mu_);
    auto state = states_.find(request->owner());
    const bool serves = state != states_.end() && state->second->has_job(request->job_id());
    holds = claims_
                ? claims_->Answer(key, serves, parked_.contains(key), request->asker(), clock_())
                : serves;
  }
  response->set_holds(holds);
  if (options_.auth.mode == AuthMode::kMunge) {
    absl::StatusOr<std::string> proof =
        MungeEncode(HoldsProofPayload(request->nonce(), request->job_id(), request->owner(), holds),
                    options_.auth.munge_socket, absl::Now() + PeerServers::kAskTimeout);
    if (!proof.ok()) {
      reactor->Finish(ToGrpcStatus(proof.status()));
      return reactor;
    }
    response->set_proof(*std::move(proof));
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace rdzv
