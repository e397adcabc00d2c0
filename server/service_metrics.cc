#include "server/service_metrics.h"

#include <algorithm>
#include <variant>

namespace rdzv {

ServiceMetrics::ServiceMetrics(Metrics* metrics) : metrics_(metrics) {
  metrics_->SetJobsSource([this] { return jobs(); });
  metrics_->SetAgentsAttachedSource([this] { return agents_attached(); });
}

ServiceMetrics::~ServiceMetrics() {
  metrics_->SetJobsSource(nullptr);
  metrics_->SetAgentsAttachedSource(nullptr);
}

void ServiceMetrics::OnJoin(Micros now, StreamId stream, const JoinSpec& spec) {
  metrics_->joins().Inc();
  if (spec.unhealthy) metrics_->unhealthy_nodes(spec.unhealthy->kind).Inc();
  absl::MutexLock lock(&mu_);
  Expire(now);
  const auto [it, is_new] = jobs_.try_emplace(spec.job_id);
  Job& job = it->second;
  if (spec.resume.has_value()) {
    // An agent back in the round it runs in: the round is not completed again.
    job.last_round = std::max(job.last_round, spec.resume->round);
    if (is_new) job.state = JobState::kRunning;
  } else if (is_new) {
    job.round_started = now;
    job.restart_count = spec.restart_count;
  } else if (spec.restart_count > job.restart_count) {
    metrics_->restarts().Inc();
    job.restart_count = spec.restart_count;
    job.state = JobState::kFilling;
    job.round_started = now;
    job.abort_counted = false;
  } else if (job.state == JobState::kFilling && job.round_started < 0) {
    job.round_started = now;
  }
  auto [attached, fresh] = stream_jobs_.try_emplace(stream);
  if (fresh) {
    attached->second.job_id = spec.job_id;
    ++job.streams;
    job.idle_since = -1;
  }
  ++attached->second.agents;
  ++agents_attached_;
}

void ServiceMetrics::OnDecisions(Micros now, const Decisions& decisions,
                                 absl::FunctionRef<StreamId(StreamId)> counted_on) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < decisions.taken_up.size(); ++i) metrics_->failovers().Inc();
  // An event is one job's (a round's assignments, a job's abort): the first stream it goes to
  // that is counted here names the job, and the rest of its sends change nothing more.
  std::vector<bool> seen(decisions.events.size());
  for (const Decisions::Send& send : decisions.sends) {
    if (seen[send.event]) continue;
    const auto stream = stream_jobs_.find(counted_on(send.stream));
    if (stream == stream_jobs_.end()) continue;
    seen[send.event] = true;
    const auto job_it = jobs_.find(stream->second.job_id);
    if (job_it == jobs_.end()) continue;
    Job& job = job_it->second;
    const Event& event = decisions.events[send.event];
    if (const auto* assignment = std::get_if<AssignmentEvent>(&event)) {
      if (assignment->round > job.last_round) {
        metrics_->rounds_completed().Inc();
        if (job.round_started >= 0) {
          metrics_->rendezvous_duration().Observe(static_cast<double>(now - job.round_started) /
                                                  1e6);
        }
        job.last_round = assignment->round;
      }
      if (job.state != JobState::kEnded) job.state = JobState::kRunning;
      job.round_started = -1;
    } else if (const auto* abort = std::get_if<AbortEvent>(&event)) {
      if (!job.abort_counted) {
        metrics_->aborts(abort->cause).Inc();
        job.abort_counted = true;
      }
      job.state = JobState::kEnded;
      job.round_started = -1;
    }
  }
  for (const Decisions::Close& close : decisions.closes) {
    const absl::StatusCode code = close.status.code();
    if (code == absl::StatusCode::kInvalidArgument ||
        code == absl::StatusCode::kFailedPrecondition) {
      metrics_->refused_calls(Metrics::kRefusedInvalid).Inc();
    }
    if (const StreamId counted = counted_on(close.stream); counted != 0) DropAgent(now, counted);
  }
}

void ServiceMetrics::OnStreamGone(Micros now, StreamId stream) {
  absl::MutexLock lock(&mu_);
  DropStream(now, stream);
  Expire(now);
}

void ServiceMetrics::OnAgentGone(Micros now, StreamId stream) {
  absl::MutexLock lock(&mu_);
  DropAgent(now, stream);
  Expire(now);
}

void ServiceMetrics::DropAgent(Micros now, StreamId stream) {
  const auto it = stream_jobs_.find(stream);
  if (it == stream_jobs_.end()) return;
  if (it->second.agents > 1) {
    --it->second.agents;
    --agents_attached_;
    return;
  }
  DropStream(now, stream);
}

void ServiceMetrics::OnRefused(absl::string_view reason) { metrics_->refused_calls(reason).Inc(); }

void ServiceMetrics::OnPeerRefusal() { metrics_->peer_refusals().Inc(); }

void ServiceMetrics::DropStream(Micros now, StreamId stream) {
  const auto it = stream_jobs_.find(stream);
  if (it == stream_jobs_.end()) return;
  agents_attached_ -= it->second.agents;
  const auto job = jobs_.find(it->second.job_id);
  if (job != jobs_.end() && --job->second.streams == 0) {
    if (job->second.state == JobState::kRunning) {
      // Every agent left a running job (or went with it): the job is over.
      jobs_.erase(job);
    } else {
      job->second.idle_since = now;
      idle_.emplace_back(now, it->second.job_id);
    }
  }
  stream_jobs_.erase(it);
}

void ServiceMetrics::Expire(Micros now) {
  while (!idle_.empty() && now - idle_.front().first >= kForgetAfter) {
    const auto job = jobs_.find(idle_.front().second);
    // Still idle since that moment: forget it. Attached again since: keep it.
    if (job != jobs_.end() && job->second.idle_since >= 0 &&
        job->second.idle_since <= idle_.front().first) {
      jobs_.erase(job);
    }
    idle_.pop_front();
  }
}

Metrics::JobCounts ServiceMetrics::jobs() const {
  Metrics::JobCounts counts;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, job] : jobs_) {
    switch (job.state) {
      case JobState::kFilling:
        ++counts.filling;
        break;
      case JobState::kRunning:
        ++counts.running;
        break;
      case JobState::kEnded:
        ++counts.ended;
        break;
    }
  }
  return counts;
}

int64_t ServiceMetrics::agents_attached() const {
  absl::MutexLock lock(&mu_);
  return agents_attached_;
}

}  // namespace rdzv
