// ServiceMetrics: turns what the rendezvous service sees (joins, the core's decisions, streams
// that end) into rdzvd's metrics (metrics.h): joins, completed rounds and how long they took to
// fill, restarts, aborts by cause, refused calls, and at scrape time the jobs by state and the
// agents attached.
//
// It follows each job from the service's calls alone (the core stays as it is): which stream
// belongs to which job, whether the job is filling, running or ended, when its round started
// filling and the last round it completed. A job is kept while an agent is attached; a running
// job goes with its last agent, a filling or ended one is kept for kForgetAfter more, so that
// agents reconnecting for the next round find it.
// Time comes in as an argument (Micros on the service's clock).
//
// Does not own the Metrics, which must outlive it. Thread-safe: the service calls it under its
// own lock and the scraping thread reads it; one short mutex of its own covers both.
#ifndef RDZV_SERVER_SERVICE_METRICS_H_
#define RDZV_SERVER_SERVICE_METRICS_H_

#include <cstdint>
#include <deque>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/core/rendezvous_state.h"
#include "server/metrics.h"

namespace rdzv {

class ServiceMetrics {
 public:
  static constexpr Micros kForgetAfter = 60'000'000;

  // Sets the scrape-time sources of `metrics` (jobs by state, agents attached) to this object;
  // the destructor removes them.
  explicit ServiceMetrics(Metrics* metrics);
  ~ServiceMetrics();
  ServiceMetrics(const ServiceMetrics&) = delete;
  ServiceMetrics& operator=(const ServiceMetrics&) = delete;

  // A join on `stream` reached the core (call it before passing on the join's decisions). The
  // members of a group join are each a join on the group's stream: an agent attached on it.
  void OnJoin(Micros now, StreamId stream, const JoinSpec& spec);
  // The decisions the core returned: assignments, aborts, closed streams, refused joins.
  // `counted_on` maps a stream the decisions name to the one its agent was counted on here (a
  // group member's to its group's; 0 for one never counted).
  void OnDecisions(Micros now, const Decisions& decisions,
                   absl::FunctionRef<StreamId(StreamId)> counted_on);
  void OnDecisions(Micros now, const Decisions& decisions) {
    OnDecisions(now, decisions, [](StreamId id) { return id; });
  }
  // `stream` ended from the agent's side, with every agent on it.
  void OnStreamGone(Micros now, StreamId stream);
  // One agent on `stream` (a group's) went from the agent's side.
  void OnAgentGone(Micros now, StreamId stream);
  // A call refused before it reached a job (Metrics::kRefused*).
  void OnRefused(absl::string_view reason);
  // A join refused because another server of the list serves its job.
  void OnPeerRefusal();

  Metrics::JobCounts jobs() const;
  int64_t agents_attached() const;

 private:
  enum class JobState { kFilling, kRunning, kEnded };
  struct Job {
    JobState state = JobState::kFilling;
    int64_t streams = 0;
    Micros round_started = -1;  // first join of the filling round; -1 when not filling
    int32_t last_round = 0;     // the last round seen completed
    int32_t restart_count = 0;
    bool abort_counted = false;  // the current round's abort is counted
    Micros idle_since = -1;      // when its last stream went; -1 while one is attached
  };

  // One agent of `stream` is gone; the stream goes with its last.
  void DropAgent(Micros now, StreamId stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropStream(Micros now, StreamId stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets jobs idle for kForgetAfter.
  void Expire(Micros now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Metrics* const metrics_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  // Each stream's job and the agents attached on it (a group's members, else 1), and their sum.
  struct Attached {
    std::string job_id;
    int64_t agents = 0;
  };
  absl::flat_hash_map<StreamId, Attached> stream_jobs_ ABSL_GUARDED_BY(mu_);
  int64_t agents_attached_ ABSL_GUARDED_BY(mu_) = 0;
  // Jobs whose last stream went, oldest first (a job may be in it more than once).
  std::deque<std::pair<Micros, std::string>> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rdzv

#endif  // RDZV_SERVER_SERVICE_METRICS_H_
