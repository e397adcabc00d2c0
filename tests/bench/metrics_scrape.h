// For rdzv-bench --metrics-scrape-ms: scrapes rdzvd's /metrics from a thread of the bench, as a
// Prometheus would, so that a run measures rdzvd with its metrics served and read.
//
// One scraper per process, aimed at the current rdzvd's port; thread-safe.
#ifndef RDZV_TESTS_BENCH_METRICS_SCRAPE_H_
#define RDZV_TESTS_BENCH_METRICS_SCRAPE_H_

#include <cstdint>

namespace rdzv::bench {

// Scrapes http://127.0.0.1:`port`/metrics every `interval_ms` from now on, instead of the earlier
// port (whose tally goes to stderr: scrapes, failures, size of the last one).
void ScrapeMetrics(int port, int64_t interval_ms);

// Stops the scraper (and prints its tally). Also runs at exit.
void StopScrapingMetrics();

}  // namespace rdzv::bench

#endif  // RDZV_TESTS_BENCH_METRICS_SCRAPE_H_
