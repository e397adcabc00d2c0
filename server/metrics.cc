#include "server/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/metrics_text.h"
#include "server/process_metrics.h"

namespace rdzv {
namespace {

// Registration mistakes are bugs in rdzvd itself, found by the first test that builds a
// Metrics; there is nothing a user could do about them.
[[noreturn]] void Fatal(absl::string_view message) {
  std::fprintf(stderr, "rdzv metrics: %.*s\n", static_cast<int>(message.size()), message.data());
  std::abort();
}

bool IsMetricName(absl::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok =
        absl::ascii_isalpha(c) || c == '_' || c == ':' || (i > 0 && absl::ascii_isdigit(c));
    if (!ok) return false;
  }
  return true;
}

bool IsLabelName(absl::string_view name) {
  if (name.empty() || name == "le" || absl::StartsWith(name, "__")) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (!(absl::ascii_isalpha(c) || c == '_' || (i > 0 && absl::ascii_isdigit(c)))) return false;
  }
  return true;
}

uint64_t ValueOf(const Counter& counter) { return counter.value(); }
double ValueOf(const Gauge& gauge) { return gauge.value(); }

// A lock-free add for an atomic double (what C++20's fetch_add does, spelled out so that it
// does not depend on the standard library having it).
void AtomicAdd(std::atomic<double>& target, double delta) {
  double current = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(current, current + delta, std::memory_order_relaxed)) {
  }
}

}  // namespace

// ---- Gauge, Histogram, Family, CallbackGauge

void Gauge::Add(double delta) { AtomicAdd(value_, delta); }

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)),
      counts_(new std::atomic<uint64_t>[upper_bounds_.size() + 1]) {
  for (size_t i = 0; i < upper_bounds_.size(); ++i) {
    if (!std::isfinite(upper_bounds_[i]) || (i > 0 && upper_bounds_[i] <= upper_bounds_[i - 1])) {
      Fatal("histogram bounds must be finite and strictly increasing");
    }
  }
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) counts_[i].store(0);
}

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  // Prometheus's buckets are "less than or equal": the first bound >= value.
  const size_t bucket =
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin();
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, value);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot snapshot;
  snapshot.cumulative.reserve(upper_bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
    snapshot.cumulative.push_back(total);
  }
  snapshot.count = total;
  snapshot.sum = sum_.load(std::memory_order_relaxed);
  return snapshot;
}

template <typename T>
T& Family<T>::WithLabel(absl::string_view label_value) {
  absl::MutexLock lock(&mu_);
  if (auto it = by_value_.find(label_value); it != by_value_.end()) return *it->second;
  if (by_value_.size() >= kMaxLabelValues) {
    std::unique_ptr<T>& overflow = by_value_[kOverflowValue];
    if (overflow == nullptr) overflow = std::make_unique<T>();
    return *overflow;
  }
  std::unique_ptr<T>& metric = by_value_[label_value];
  metric = std::make_unique<T>();
  return *metric;
}

template <typename T>
std::vector<std::pair<std::string, const T*>> Family<T>::Entries() const {
  std::vector<std::pair<std::string, const T*>> entries;
  {
    absl::MutexLock lock(&mu_);
    entries.reserve(by_value_.size());
    for (const auto& [value, metric] : by_value_) entries.emplace_back(value, metric.get());
  }
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return entries;
}

template class Family<Counter>;
template class Family<Gauge>;

void CallbackGauge::SetSource(Source source) {
  absl::MutexLock lock(&mu_);
  source_ = std::move(source);
}

CallbackGauge::Samples CallbackGauge::Read() const {
  absl::MutexLock lock(&mu_);
  if (!source_) return {};
  return source_();
}

std::vector<double> RendezvousDurationBuckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
}

// ---- Collectors: one per metric family (the process metrics share one)

class Metrics::Collector {
 public:
  Collector(std::string name, std::string help, absl::string_view type)
      : name_(std::move(name)), help_(std::move(help)), type_(type) {}
  virtual ~Collector() = default;

  virtual void Render(std::string& out) const {
    AppendHeader(out, name_, help_, type_);
    AppendSamples(out);
  }

 protected:
  virtual void AppendSamples(std::string&) const {}
  const std::string& name() const { return name_; }

 private:
  const std::string name_;
  const std::string help_;
  const absl::string_view type_;
};

namespace {

template <typename T>
class ScalarCollector : public Metrics::Collector {
 public:
  ScalarCollector(std::string name, std::string help, absl::string_view type)
      : Collector(std::move(name), std::move(help), type) {}
  T metric;

 private:
  void AppendSamples(std::string& out) const override {
    AppendSample(out, name(), "", "", ValueOf(metric));
  }
};

template <typename T>
class FamilyCollector : public Metrics::Collector {
 public:
  FamilyCollector(std::string name, std::string help, absl::string_view type, std::string label)
      : Collector(std::move(name), std::move(help), type), label_(std::move(label)) {}
  Family<T> family;

 private:
  void AppendSamples(std::string& out) const override {
    for (const auto& [value, metric] : family.Entries()) {
      AppendSample(out, name(), label_, value, ValueOf(*metric));
    }
  }
  const std::string label_;
};

class CallbackCollector : public Metrics::Collector {
 public:
  CallbackCollector(std::string name, std::string help, std::string label)
      : Collector(std::move(name), std::move(help), "gauge"), label_(std::move(label)) {}
  CallbackGauge gauge;

 private:
  void AppendSamples(std::string& out) const override {
    for (const auto& [value, sample] : gauge.Read()) {
      AppendSample(out, name(), label_, value, sample);
    }
  }
  const std::string label_;
};

class HistogramCollector : public Metrics::Collector {
 public:
  HistogramCollector(std::string name, std::string help, std::vector<double> upper_bounds)
      : Collector(std::move(name), std::move(help), "histogram"),
        histogram(std::move(upper_bounds)),
        le_values_(LeValues(histogram.upper_bounds())) {}
  Histogram histogram;

 private:
  static std::vector<std::string> LeValues(const std::vector<double>& upper_bounds) {
    std::vector<std::string> values;
    for (const double bound : upper_bounds) {
      values.emplace_back();
      AppendDouble(values.back(), bound);
    }
    values.push_back("+Inf");
    return values;
  }

  void AppendSamples(std::string& out) const override {
    const Histogram::Snapshot snapshot = histogram.Read();
    const std::string bucket = absl::StrCat(name(), "_bucket");
    for (size_t i = 0; i < le_values_.size(); ++i) {
      AppendSample(out, bucket, "le", le_values_[i], snapshot.cumulative[i]);
    }
    AppendSample(out, absl::StrCat(name(), "_sum"), "", "", snapshot.sum);
    AppendSample(out, absl::StrCat(name(), "_count"), "", "", snapshot.count);
  }

  const std::vector<std::string> le_values_;
};

// The process_* families, from one read of /proc/self per scrape.
class ProcessCollector : public Metrics::Collector {
 public:
  static constexpr const char* kNames[] = {"process_cpu_seconds_total",
                                           "process_resident_memory_bytes",
                                           "process_virtual_memory_bytes",
                                           "process_start_time_seconds",
                                           "process_threads",
                                           "process_open_fds",
                                           "process_max_fds"};

  ProcessCollector() : Collector("process", "", "") {}

  void Render(std::string& out) const override {
    const absl::StatusOr<ProcessStats> stats = ReadProcessStats();
    // Without /proc (not Linux) the families are left out rather than reported as zero.
    if (!stats.ok()) return;
    const auto gauge = [&](absl::string_view name, absl::string_view help, double value) {
      AppendHeader(out, name, help, "gauge");
      AppendSample(out, name, "", "", value);
    };
    AppendHeader(out, kNames[0], "Total user and system CPU time spent in seconds.", "counter");
    AppendSample(out, kNames[0], "", "", stats->cpu_seconds);
    gauge(kNames[1], "Resident memory size in bytes.",
          static_cast<double>(stats->resident_memory_bytes));
    gauge(kNames[2], "Virtual memory size in bytes.",
          static_cast<double>(stats->virtual_memory_bytes));
    if (stats->start_time_seconds > 0) {
      gauge(kNames[3], "Start time of the process since unix epoch in seconds.",
            stats->start_time_seconds);
    }
    gauge(kNames[4], "Number of OS threads in the process.", static_cast<double>(stats->threads));
    gauge(kNames[5], "Number of open file descriptors.", static_cast<double>(stats->open_fds));
    if (stats->max_fds > 0) {
      gauge(kNames[6], "Maximum number of open file descriptors.",
            static_cast<double>(stats->max_fds));
    }
  }
};

}  // namespace

// ---- Metrics

Metrics::Metrics(absl::string_view version) {
  joins_ = &AddCounter("rdzv_joins_total",
                       "Join calls accepted by the rendezvous server, first joins and rejoins.");
  rounds_completed_ = &AddCounter(
      "rdzv_rounds_completed_total",
      "Rendezvous rounds that reached an assignment (every agent of the round got its ranks).");
  restarts_ = &AddCounter("rdzv_restarts_total",
                          "Rounds started again after a failure, within --max-restarts.");
  failovers_ = &AddCounter("rdzv_failovers_total",
                           "Jobs this server took up from their resuming agents: after the server "
                           "that ran them was lost, or after this server restarted.");
  connections_refused_ = &AddCounter(
      "rdzv_connections_refused_total",
      "Connections refused at accept: their host's connections were all authenticated and at "
      "--max-connections-per-host.");
  connections_dropped_ = &AddCounter(
      "rdzv_connections_dropped_total",
      "Connections that had not authenticated, dropped to make room for a newer one of their "
      "host (--max-unproven-connections-per-host, --max-connections-per-host).");
  peer_refusals_ = &AddCounter(
      "rdzv_peer_refusals_total",
      "Joins refused because another rdzvd of the server list serves the job (--peers).");
  rendezvous_duration_ =
      &AddHistogram("rdzv_rendezvous_duration_seconds",
                    "Time from the first join of a round to its assignment, in seconds.",
                    RendezvousDurationBuckets());
  aborts_ = &AddCounterFamily(
      "rdzv_aborts_total",
      "Jobs ended by an abort, by cause: worker_failed (a worker exited non-zero or was killed), "
      "agent_signalled (an agent was told to stop), agent_lost (an agent or its node went away), "
      "resume_timed_out (agents did not come back after the server restarted), worker_hung (a "
      "worker's watchdog fired), node_unhealthy (a node failed its health check and the job "
      "could no longer reach its minimum size).",
      "cause");
  for (int32_t cause = 0; cause <= kMaxAbortCause; ++cause) {
    aborts_->WithLabel(AbortCauseName(static_cast<AbortCause>(cause)));
  }
  unhealthy_nodes_ = &AddCounterFamily(
      "rdzv_unhealthy_nodes_total",
      "Agents that reported their node unhealthy instead of joining, by reason: health_check "
      "(--health-check exited non-zero), health_check_timeout, gpus (a GPU the worker count "
      "relies on is missing), run_dir (not writable or full), address (the node has no address "
      "other nodes could reach), rank_requested (a rank exited with code 83, or asked on the "
      "watchdog FIFO), workers_stuck (the last run's workers did not end).",
      "reason");
  for (int32_t kind = 1; kind <= kMaxExclusionKind; ++kind) {
    // Reported by agents only: the server's own (a node left out with another, a lost one)
    // show in the aborts and in rdzvctl status.
    if (!AgentMayReport(static_cast<ExclusionKind>(kind))) continue;
    unhealthy_nodes_->WithLabel(ExclusionKindName(static_cast<ExclusionKind>(kind)));
  }
  refused_calls_ = &AddCounterFamily(
      "rdzv_refused_calls_total",
      "Calls refused before they reached a job, by reason: unauthenticated, permission_denied, "
      "limit (a server limit was reached), invalid (a malformed or inconsistent request).",
      "reason");
  for (const absl::string_view reason :
       {kRefusedUnauthenticated, kRefusedPermissionDenied, kRefusedLimit, kRefusedInvalid}) {
    refused_calls_->WithLabel(reason);
  }
  jobs_ = &AddCallbackGauge("rdzv_jobs",
                            "Jobs the server holds, by state: filling (waiting for agents), "
                            "running (assigned), ended (kept for agents that come back).",
                            "state");
  agents_attached_ = &AddCallbackGauge("rdzv_agents_attached",
                                       "Agents with an open join stream to the server.", "");
  join_streams_ = &AddCallbackGauge(
      "rdzv_join_streams",
      "Join streams the server holds: one per agent, or one per node whose tasks join through "
      "the node's relay.",
      "");
  AddGaugeFamily("rdzv_build_info", "The rdzvd version; always 1.", "version")
      .WithLabel(version)
      .Set(1);

  absl::MutexLock lock(&mu_);
  for (const char* name : ProcessCollector::kNames) Claim(name);
  collectors_.push_back(std::make_unique<ProcessCollector>());
}

Metrics::~Metrics() = default;

void Metrics::SetJobsSource(std::function<JobCounts()> source) {
  if (!source) {
    jobs_->SetSource(nullptr);
    return;
  }
  jobs_->SetSource([source = std::move(source)] {
    const JobCounts counts = source();
    return CallbackGauge::Samples{{"filling", static_cast<double>(counts.filling)},
                                  {"running", static_cast<double>(counts.running)},
                                  {"ended", static_cast<double>(counts.ended)}};
  });
}

void Metrics::SetAgentsAttachedSource(std::function<int64_t()> source) {
  if (!source) {
    agents_attached_->SetSource(nullptr);
    return;
  }
  agents_attached_->SetSource([source = std::move(source)] {
    return CallbackGauge::Samples{{"", static_cast<double>(source())}};
  });
}

void Metrics::SetJoinStreamsSource(std::function<int64_t()> source) {
  if (!source) {
    join_streams_->SetSource(nullptr);
    return;
  }
  join_streams_->SetSource([source = std::move(source)] {
    return CallbackGauge::Samples{{"", static_cast<double>(source())}};
  });
}

void Metrics::Claim(absl::string_view name) {
  if (!names_.insert(std::string(name)).second) {
    Fatal(absl::StrCat("metric ", name, " is added twice"));
  }
}

template <typename T>
T& Metrics::Add(absl::string_view name, std::unique_ptr<Collector> collector, T& metric) {
  absl::MutexLock lock(&mu_);
  Claim(name);
  collectors_.push_back(std::move(collector));
  return metric;
}

namespace {

void CheckNames(absl::string_view name, absl::string_view label, bool label_required) {
  if (!IsMetricName(name)) Fatal(absl::StrCat("\"", name, "\" is not a valid metric name"));
  if ((label_required || !label.empty()) && !IsLabelName(label)) {
    Fatal(absl::StrCat("\"", label, "\" is not a valid label name (metric ", name, ")"));
  }
}

}  // namespace

// Each metric lives in its collector, which the registry owns.
Counter& Metrics::AddCounter(std::string name, std::string help) {
  CheckNames(name, "", false);
  auto collector = std::make_unique<ScalarCollector<Counter>>(name, std::move(help), "counter");
  Counter& metric = collector->metric;
  return Add(name, std::move(collector), metric);
}

Family<Counter>& Metrics::AddCounterFamily(std::string name, std::string help, std::string label) {
  CheckNames(name, label, true);
  auto collector = std::make_unique<FamilyCollector<Counter>>(name, std::move(help), "counter",
                                                              std::move(label));
  Family<Counter>& family = collector->family;
  return Add(name, std::move(collector), family);
}

Gauge& Metrics::AddGauge(std::string name, std::string help) {
  CheckNames(name, "", false);
  auto collector = std::make_unique<ScalarCollector<Gauge>>(name, std::move(help), "gauge");
  Gauge& metric = collector->metric;
  return Add(name, std::move(collector), metric);
}

Family<Gauge>& Metrics::AddGaugeFamily(std::string name, std::string help, std::string label) {
  CheckNames(name, label, true);
  auto collector =
      std::make_unique<FamilyCollector<Gauge>>(name, std::move(help), "gauge", std::move(label));
  Family<Gauge>& family = collector->family;
  return Add(name, std::move(collector), family);
}

CallbackGauge& Metrics::AddCallbackGauge(std::string name, std::string help, std::string label) {
  CheckNames(name, label, false);
  auto collector = std::make_unique<CallbackCollector>(name, std::move(help), std::move(label));
  CallbackGauge& gauge = collector->gauge;
  return Add(name, std::move(collector), gauge);
}

Histogram& Metrics::AddHistogram(std::string name, std::string help,
                                 std::vector<double> upper_bounds) {
  CheckNames(name, "", false);
  auto collector =
      std::make_unique<HistogramCollector>(name, std::move(help), std::move(upper_bounds));
  Histogram& histogram = collector->histogram;
  return Add(name, std::move(collector), histogram);
}

std::string Metrics::Render() const {
  // Collectors are never removed, so the pointers stay valid after the lock is released; the
  // lock is not held while rendering, so a scrape-time source may even add a metric.
  std::vector<const Collector*> collectors;
  {
    absl::MutexLock lock(&mu_);
    collectors.reserve(collectors_.size());
    for (const auto& collector : collectors_) collectors.push_back(collector.get());
  }
  std::string out;
  out.reserve(4096);
  for (const Collector* collector : collectors) collector->Render(out);
  return out;
}

}  // namespace rdzv
