// The operator's side of the rendezvous service: AbortJob (rdzvctl abort), who may call it, and
// the record of how each job ended that GetStatus reports.
#include <signal.h>
#include <spdlog/spdlog.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/proto_convert.h"
#include "guard/request_limits.h"
#include "server/metrics.h"
#include "server/rendezvous_service.h"

namespace rdzv {
namespace {

// How many ended jobs' aborts are kept for GetStatus, and for how long.
constexpr size_t kMaxRecordedAborts = 4096;
constexpr Micros kKeepAbortFor = 600'000'000;

}  // namespace

void RendezvousService::RecordAbort(const std::string& owner, const std::string& job_id,
                                    const AbortEvent& abort) {
  const Micros now = clock_();
  const std::string key = absl::StrCat(owner, "\n", job_id);
  if (aborts_.contains(key)) return;  // the first one is how the job ended
  if (aborts_.size() >= kMaxRecordedAborts) {
    absl::erase_if(aborts_,
                   [&](const auto& entry) { return now - entry.second.at > kKeepAbortFor; });
  }
  if (aborts_.size() < kMaxRecordedAborts) {
    aborts_.emplace(key, RecordedAbort{owner, job_id, abort, now});
  }
}

void RendezvousService::AddRecordedAborts(const Caller& caller, const std::string& job_id,
                                          const std::vector<const std::string*>& owners,
                                          std::vector<JobStatusView>& jobs,
                                          std::vector<std::pair<size_t, AbortEvent>>& aborts) {
  const Micros now = clock_();
  absl::erase_if(aborts_, [&](const auto& entry) { return now - entry.second.at > kKeepAbortFor; });
  absl::flat_hash_set<std::string> listed;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const std::string key = absl::StrCat(*owners[i], "\n", jobs[i].job_id);
    listed.insert(key);
    if (auto it = aborts_.find(key); it != aborts_.end()) {
      aborts.emplace_back(i, it->second.abort);
    }
  }
  // Jobs that ended and that the state has forgotten since (every agent left).
  for (const auto& [key, recorded] : aborts_) {
    if (!caller.admin && recorded.owner != caller.owner) continue;
    if ((!job_id.empty() && recorded.job_id != job_id) || listed.contains(key)) continue;
    JobStatusView ended;
    ended.job_id = recorded.job_id;
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
  // Only the job's owner, root or an admin group may abort it.
  absl::StatusOr<Caller> caller =
      Authenticate(context, "AbortJob", job_id, CheckAbortJobRequest(*request));
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  const std::string reason = request->reason().empty() ? "no reason given" : request->reason();

  absl::StatusOr<AbortEvent> abort =
      absl::NotFoundError(absl::StrFormat("rdzvd has no job %s; see rdzvctl status", job_id));
  std::vector<JoinStream*> writers;
  {
    absl::MutexLock lock(&mu_);
    // The caller's own job of that id; for root and admins, anyone's.
    RendezvousState* state = nullptr;
    std::string owner;
    for (auto& [o, s] : states_) {
      if ((!caller->admin && o != caller->owner) || !s->has_job(job_id)) continue;
      state = s.get();
      owner = o;
      if (o == caller->owner) break;
    }
    if (state != nullptr) {
      // The operator's stop, as the agents hear it: what an agent's SIGTERM would say, in the
      // operator's words.
      AbortEvent stop;
      stop.cause = AbortCause::kAgentSignalled;
      stop.reason = absl::StrFormat("aborted with rdzvctl: %s", reason);
      stop.exit_code = 128 + SIGTERM;
      Decisions decisions;
      abort = state->Abort(clock_(), job_id, stop, decisions);
      if (abort.ok()) {
        RecordAbort(owner, job_id, *abort);
        if (options_.log_jobs && *abort == stop) {  // this abort ended the job
          spdlog::info("job {}: {}", EscapeControl(job_id), EscapeControl(abort->reason));
        }
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
