// Metrics: rdzvd's metrics registry, rendered in Prometheus's text exposition format (version
// 0.0.4) for GET /metrics (see metrics_http.h).
//
// The constructor registers every metric rdzvd exports, with its HELP text, so that the service
// only counts. A hot path keeps the Counter& or Histogram& it got (each lives as long as its
// Metrics) and calls Inc() or Observe() from any thread: relaxed atomic adds, no lock, no
// allocation. A counter with a label (aborts by cause, refused calls by reason) is looked up by
// its label value under a short mutex that allocates only for a value not seen before; the
// values named below exist from the start, so they read 0 before their first event.
//
// Render() runs on the scraping thread: it reads the atomics, calls the sources the service
// set for values computed at scrape time (jobs by state, agents attached) and reads /proc/self.
//
// Thread-safe. Neither copyable nor movable: references into a Metrics stay valid as long as
// it lives.
#ifndef RDZV_SERVER_METRICS_H_
#define RDZV_SERVER_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/core/rendezvous_types.h"

namespace rdzv {

// A count that only goes up.
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Lock-free; never blocks.
  void Inc(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A value that goes up and down.
class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  // Lock-free; never block.
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double delta);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted in fixed buckets, with their sum: Prometheus's histogram.
class Histogram {
 public:
  // `upper_bounds` must be finite and strictly increasing (checked; a bad list aborts); the
  // +Inf bucket is implicit.
  explicit Histogram(std::vector<double> upper_bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Lock-free; never blocks. NaN is ignored.
  void Observe(double value);

  struct Snapshot {
    // Observations <= each upper bound, then all of them (+Inf): Prometheus's cumulative
    // _bucket counts.
    std::vector<uint64_t> cumulative;
    uint64_t count = 0;  // == cumulative.back()
    double sum = 0;
  };
  // The buckets read one by one: an observation made during the read may be in `sum` and not
  // yet in the counts, or the reverse, but count always equals the +Inf bucket.
  Snapshot Read() const;
  const std::vector<double>& upper_bounds() const { return upper_bounds_; }

 private:
  std::vector<double> upper_bounds_;
  // One per upper bound, then +Inf; not cumulative.
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0};
};

// Metrics of one name told apart by the value of one label, e.g. rdzv_aborts_total{cause=...}.
// T is Counter or Gauge.
template <typename T>
class Family {
 public:
  // New label values beyond this many count under kOverflowValue, so that a bug (or a client
  // whose input ends up in a label) cannot grow the family without bound.
  static constexpr size_t kMaxLabelValues = 64;
  static constexpr absl::string_view kOverflowValue = "other";

  Family() = default;
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;

  // The metric for `label_value`, created (at 0) the first time. Takes a mutex for the lookup;
  // allocates only for a new value. Keep the reference to skip the lookup on a hot path.
  T& WithLabel(absl::string_view label_value);

  // Every (label value, metric), sorted by label value.
  std::vector<std::pair<std::string, const T*>> Entries() const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<T>> by_value_ ABSL_GUARDED_BY(mu_);
};

// A gauge computed when scraped, from a source function. Unlike a Gauge it is never stale,
// and nothing has to keep it up to date.
class CallbackGauge {
 public:
  // (label value, value) pairs; the label value is ignored for a gauge without a label.
  using Samples = std::vector<std::pair<std::string, double>>;
  using Source = std::function<Samples()>;

  CallbackGauge() = default;
  CallbackGauge(const CallbackGauge&) = delete;
  CallbackGauge& operator=(const CallbackGauge&) = delete;

  // Replaces the source; nullptr removes it (the gauge then has no samples). Waits for a
  // scrape that is calling the old source: once this returns, the old source is not running
  // and will not run again, so an object can clear the source it set before it goes away.
  void SetSource(Source source);

  // Calls the source (on the caller's thread, under the mutex SetSource takes: a source must be
  // quick and must not call SetSource). Empty without a source.
  Samples Read() const;

 private:
  mutable absl::Mutex mu_;
  Source source_ ABSL_GUARDED_BY(mu_);
};

// The upper bounds of rdzv_rendezvous_duration_seconds, from 5 ms to 10 minutes.
std::vector<double> RendezvousDurationBuckets();

class Metrics {
 public:
  // Label values of rdzv_refused_calls_total{reason}.
  static constexpr absl::string_view kRefusedUnauthenticated = "unauthenticated";
  static constexpr absl::string_view kRefusedPermissionDenied = "permission_denied";
  static constexpr absl::string_view kRefusedLimit = "limit";
  static constexpr absl::string_view kRefusedInvalid = "invalid";

  // Registers rdzvd's metrics; `version` becomes rdzv_build_info{version}.
  explicit Metrics(absl::string_view version);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // ---- rdzvd's metrics. The references live as long as this object.

  // rdzv_joins_total: join calls accepted (first joins and rejoins).
  Counter& joins() { return *joins_; }
  // rdzv_rounds_completed_total: rounds that reached an assignment.
  Counter& rounds_completed() { return *rounds_completed_; }
  // rdzv_restarts_total: rounds started again after a failure (--max-restarts).
  Counter& restarts() { return *restarts_; }
  // rdzv_failovers_total: jobs this server took up from their resuming agents: after the
  // server that ran them was lost (a failover to this one), or after this one restarted.
  Counter& failovers() { return *failovers_; }
  // rdzv_connections_refused_total: connections refused at accept (their host's were all
  // authenticated and at --max-connections-per-host).
  Counter& connections_refused() { return *connections_refused_; }
  // rdzv_connections_dropped_total: connections that had not authenticated, dropped to make room
  // for a newer one of their host.
  Counter& connections_dropped() { return *connections_dropped_; }
  // rdzv_peer_refusals_total: joins refused because another server of the list serves the job.
  Counter& peer_refusals() { return *peer_refusals_; }
  // rdzv_rendezvous_duration_seconds: from a round's first join to its assignment.
  Histogram& rendezvous_duration() { return *rendezvous_duration_; }
  // rdzv_aborts_total{cause}: jobs ended by an abort, by AbortCauseName (every cause reads 0
  // from the start).
  Counter& aborts(AbortCause cause) { return aborts_->WithLabel(AbortCauseName(cause)); }
  Counter& aborts(absl::string_view cause) { return aborts_->WithLabel(cause); }
  // rdzv_unhealthy_nodes_total{reason}: agents that reported their node unhealthy, by
  // ExclusionKindName.
  Counter& unhealthy_nodes(ExclusionKind kind) {
    return unhealthy_nodes_->WithLabel(ExclusionKindName(kind));
  }
  // rdzv_refused_calls_total{reason}: calls refused before reaching a job (kRefused*).
  Counter& refused_calls(absl::string_view reason) { return refused_calls_->WithLabel(reason); }

  struct JobCounts {
    int64_t filling = 0;  // waiting for agents
    int64_t running = 0;  // assigned, workers running
    int64_t ended = 0;    // ended, kept for agents that come back to learn how
  };
  // The sources of rdzv_jobs{state} and rdzv_agents_attached, called at each scrape; nullptr
  // removes one. See CallbackGauge::SetSource for when they run and what they must not do.
  void SetJobsSource(std::function<JobCounts()> source);
  void SetAgentsAttachedSource(std::function<int64_t()> source);
  // The source of rdzv_join_streams, the same way.
  void SetJoinStreamsSource(std::function<int64_t()> source);

  // ---- Other metrics. A name (or label) must match [a-zA-Z_:][a-zA-Z0-9_:]* ([a-zA-Z_]
  // [a-zA-Z0-9_]*, not "le") and be new: anything else is a programming error and aborts.
  // Takes a mutex; meant for start-up. Metrics render in the order they were added.

  Counter& AddCounter(std::string name, std::string help);
  Family<Counter>& AddCounterFamily(std::string name, std::string help, std::string label);
  Gauge& AddGauge(std::string name, std::string help);
  Family<Gauge>& AddGaugeFamily(std::string name, std::string help, std::string label);
  // `label` may be empty for a gauge with one unlabelled sample.
  CallbackGauge& AddCallbackGauge(std::string name, std::string help, std::string label);
  Histogram& AddHistogram(std::string name, std::string help, std::vector<double> upper_bounds);

  // Every metric in text exposition format 0.0.4, with this process's process_* metrics read
  // from /proc/self. Calls the scrape-time sources; does not block the counting threads.
  std::string Render() const;

  // One metric family: its HELP and TYPE lines and samples. Defined in metrics.cc.
  class Collector;

 private:
  // Aborts when `name` is taken.
  void Claim(absl::string_view name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Claims `name` and keeps `collector`, which holds `metric`; returns `metric`.
  template <typename T>
  T& Add(absl::string_view name, std::unique_ptr<Collector> collector, T& metric);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Collector>> collectors_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> names_ ABSL_GUARDED_BY(mu_);

  Counter* joins_ = nullptr;
  Counter* rounds_completed_ = nullptr;
  Counter* restarts_ = nullptr;
  Counter* failovers_ = nullptr;
  Counter* connections_refused_ = nullptr;
  Counter* connections_dropped_ = nullptr;
  Counter* peer_refusals_ = nullptr;
  Histogram* rendezvous_duration_ = nullptr;
  Family<Counter>* aborts_ = nullptr;
  Family<Counter>* refused_calls_ = nullptr;
  Family<Counter>* unhealthy_nodes_ = nullptr;
  CallbackGauge* jobs_ = nullptr;
  CallbackGauge* agents_attached_ = nullptr;
  CallbackGauge* join_streams_ = nullptr;
};

}  // namespace rdzv

#endif  // RDZV_SERVER_METRICS_H_
