#include "client/agent/core/hang_watchdog.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"

namespace rdzv {
namespace {

std::string Seconds(Micros us) { return absl::StrFormat("%.1fs", static_cast<double>(us) / 1e6); }

}  // namespace

HangWatchdog::HangWatchdog(HangWatchdogOptions options) : options_(std::move(options)) {}

void HangWatchdog::Start(int32_t workers, Micros /*now*/, Micros job_longest_interval) {
  workers_.assign(std::max(workers, 0), Worker{});
  longest_interval_ = std::max(longest_interval_, job_longest_interval);
  job_knew_interval_ = longest_interval_ > 0;
}

std::optional<std::string> HangWatchdog::Apply(int32_t worker, const WatchdogRequest& r,
                                               Micros now) {
  if (worker < 0 || worker >= static_cast<int32_t>(workers_.size())) return std::nullopt;
  Worker& w = workers_[worker];
  if (w.ended) return std::nullopt;
  switch (r.kind) {
    case WatchdogRequest::Kind::kAcquire: {
      auto key = std::make_pair(r.pid, r.scope);
      if (w.timers.size() >= kMaxTimersPerWorker && !w.timers.contains(key)) {
        if (w.told_too_many) return std::nullopt;
        w.told_too_many = true;
        return absl::StrFormat(
            "worker %d holds %d watchdog timers, the most an agent keeps for one worker; its "
            "further timers (\"%s\" first) are not watched until it releases some",
            worker, kMaxTimersPerWorker, absl::CHexEscape(r.scope));
      }
      w.timers[std::move(key)] = r.expiration_us;
      break;
    }
    case WatchdogRequest::Kind::kRelease:
      w.timers.erase({r.pid, r.scope});
      break;
    case WatchdogRequest::Kind::kHeartbeat:
      if (w.last_beat && now > *w.last_beat) {
        longest_interval_ = std::max(longest_interval_, now - *w.last_beat);
        ++intervals_seen_;
      }
      w.last_beat = now;
      break;
    case WatchdogRequest::Kind::kRankRequest:
      break;  // the agent's, not the watchdog's
  }
  return std::nullopt;
}

void HangWatchdog::WorkerEnded(int32_t worker) {
  if (worker < 0 || worker >= static_cast<int32_t>(workers_.size())) return;
  workers_[worker] = Worker{};
  workers_[worker].ended = true;
}

absl::Duration HangWatchdog::heartbeat_timeout() const {
  if (!options_.auto_timeout) return options_.heartbeat_timeout;
  if (!job_knew_interval_ && intervals_seen_ < options_.auto_warmup) return absl::ZeroDuration();
  return std::max(options_.auto_floor, absl::Microseconds(static_cast<double>(longest_interval_) *
                                                          options_.auto_factor));
}

std::optional<WorkerHang> HangWatchdog::Check(Micros now) {
  const absl::Duration timeout = heartbeat_timeout();
  const Micros timeout_us = absl::ToInt64Microseconds(timeout);
  std::optional<WorkerHang> first;
  for (int32_t i = 0; i < static_cast<int32_t>(workers_.size()); ++i) {
    const Worker& w = workers_[i];
    if (w.ended || w.reported) continue;
    for (const auto& [key, expiration] : w.timers) {
      if (expiration >= now || (first && first->since_us <= expiration)) continue;
      first = WorkerHang{i, 0, 0, expiration,
                         absl::StrFormat("timer \"%s\" expired %s ago (pid %d)", key.second,
                                         Seconds(now - expiration), key.first)};
    }
    if (timeout_us > 0 && w.last_beat && now - *w.last_beat > timeout_us) {
      const Micros since = *w.last_beat + timeout_us;
      if (!first || since < first->since_us) {
        first =
            WorkerHang{i, 0, 0, since,
                       absl::StrFormat("no heartbeat for %s (timeout %s%s)",
                                       Seconds(now - *w.last_beat), absl::FormatDuration(timeout),
                                       options_.auto_timeout ? ", learned" : "")};
      }
    }
  }
  if (first) workers_[first->worker].reported = true;
  return first;
}

std::optional<int32_t> OwningWorker(int64_t pid, const std::vector<pid_t>& worker_pids,
                                    const std::function<int64_t(int64_t)>& parent_of) {
  for (int generation = 0; generation < 64 && pid > 1; ++generation) {
    for (size_t i = 0; i < worker_pids.size(); ++i) {
      if (worker_pids[i] > 0 && worker_pids[i] == pid) return static_cast<int32_t>(i);
    }
    pid = parent_of(pid);
  }
  return std::nullopt;
}

}  // namespace rdzv
