// The operator's side of the rendezvous service: AbortJob (rdzvctl abort), who may call it, and
// the record of how each job ended that GetStatus reports.
#include <signal.h>
#include <spdlog/spdlog.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/proto_convert.h"
#include "server/metrics.h"
#include "server/rendezvous_service.h"

namespace rdzv {
namespace {

// How many ended jobs' aborts are kept for GetStatus, and for how long.
constexpr size_t kMaxRecordedAborts = 4096;
constexpr Micros kKeepAbortFor = 600'000'000;

// A caller on this host: a loopback address or a unix socket.
bool IsLocalPeer(absl::string_view peer) {
  if (absl::StartsWith(peer, "unix:")) return true;
  if (absl::ConsumePrefix(&peer, "ipv4:")) return absl::StartsWith(peer, "127.");
  if (absl::ConsumePrefix(&peer, "ipv6:")) {
    return absl::StartsWith(peer, "[::1]") || absl::StartsWith(peer, "[::ffff:127.");
  }
  return false;
}

}  // namespace

absl::Status RendezvousService::AuthorizeJobControl(const grpc::CallbackServerContext& context,
                                                    const std::string& job_id) const {
  // Until calls carry an authenticated identity (the MUNGE uid of the caller), there is no owner
  // to compare with: a caller on the server's own host is taken as allowed, anyone else is
  // refused. With an identity, this becomes: allowed when the caller's uid is 0 or the uid
  // that owns `job_id` (the uid of its first join).
  if (IsLocalPeer(context.peer())) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrFormat(
      "only the owner of job %s or root may abort it, and this rdzvd cannot yet tell who is "
      "calling from %s; run rdzvctl on the rdzvd host",
      job_id, context.peer()));
}

void RendezvousService::RecordAbort(const std::string& job_id, const AbortEvent& abort) {
  const Micros now = clock_();
  if (aborts_.contains(job_id)) return;  // the first one is how the job ended
  if (aborts_.size() >= kMaxRecordedAborts) {
    absl::erase_if(aborts_,
                   [&](const auto& entry) { return now - entry.second.at > kKeepAbortFor; });
  }
  if (aborts_.size() < kMaxRecordedAborts) aborts_.emplace(job_id, RecordedAbort{abort, now});
}

void RendezvousService::AddRecordedAborts(const std::string& job_id,
                                          std::vector<JobStatusView>& jobs,
                                          std::vector<std::pair<size_t, AbortEvent>>& aborts) {
  const Micros now = clock_();
  absl::erase_if(aborts_, [&](const auto& entry) { return now - entry.second.at > kKeepAbortFor; });
  absl::flat_hash_set<std::string> listed;
  for (size_t i = 0; i < jobs.size(); ++i) {
    listed.insert(jobs[i].job_id);
    if (auto it = aborts_.find(jobs[i].job_id); it != aborts_.end()) {
      aborts.emplace_back(i, it->second.abort);
    }
  }
  // Jobs that ended and that the state has forgotten since (every agent left).
  for (const auto& [id, recorded] : aborts_) {
    if ((!job_id.empty() && id != job_id) || listed.contains(id)) continue;
    JobStatusView ended;
    ended.job_id = id;
    ended.state = "ended";
    aborts.emplace_back(jobs.size(), recorded.abort);
    jobs.push_back(std::move(ended));
  }
}

grpc::ServerUnaryReactor* RendezvousService::AbortJob(grpc::CallbackServerContext* context,
                                                      const v1::AbortJobRequest* request,
                                                      v1::AbortJobResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const std::string& job_id = request->job_id();
  if (job_id.empty()) {
    CountRefused(Metrics::kRefusedInvalid);
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "AbortJob needs a job id; see rdzvctl status for the jobs"));
    return reactor;
  }
  if (absl::Status allowed = AuthorizeJobControl(*context, job_id); !allowed.ok()) {
    CountRefused(Metrics::kRefusedPermissionDenied);
    reactor->Finish(ToGrpcStatus(allowed));
    return reactor;
  }
  const std::string reason = request->reason().empty() ? "no reason given" : request->reason();

  absl::StatusOr<AbortEvent> abort;
  std::vector<JoinStream*> writers;
  {
    absl::MutexLock lock(&mu_);
    const std::vector<JobStatusView> views = state_.Status(job_id);
    if (views.empty() || views.front().agents.empty()) {
      abort = absl::NotFoundError(
          absl::StrFormat("rdzvd has no job %s with agents; see rdzvctl status", job_id));
    } else {
      const bool already_ended = views.front().state == "ended";
      // The core ends a job on a stop request from one of its agents; the operator's request
      // goes in as one, in the name of the job's first agent, and the abort the agents receive
      // is then worded as the operator's.
      FailureInfo stop;
      stop.cause = AbortCause::kAgentSignalled;
      stop.host = "rdzvctl";
      stop.group_rank = -1;
      stop.signal = SIGTERM;
      stop.exit_code = 128 + SIGTERM;
      stop.error_message = reason;
      stop.time_us = absl::ToUnixMicros(absl::Now());
      Decisions decisions;
      abort = state_.ReportFailure(clock_(), job_id, views.front().agents.front().agent_id, stop,
                                   decisions);
      if (abort.ok() && !already_ended) {
        abort->reason = absl::StrFormat("aborted with rdzvctl: %s", reason);
        abort->first_failure.reset();
        for (Decisions::Send& send : decisions.sends) {
          if (auto* event = std::get_if<AbortEvent>(&send.event)) *event = *abort;
        }
        RecordAbort(job_id, *abort);
        if (options_.log_jobs) spdlog::info("job {}: {}", job_id, abort->reason);
      } else if (abort.ok()) {
        if (auto it = aborts_.find(job_id); it != aborts_.end()) abort = it->second.abort;
      }
      Apply(decisions, writers);
    }
  }
  StartWrites(std::move(writers));
  if (abort.ok()) *response->mutable_abort() = ToProto(*abort);
  reactor->Finish(ToGrpcStatus(abort.status()));
  return reactor;
}

}  // namespace rdzv
