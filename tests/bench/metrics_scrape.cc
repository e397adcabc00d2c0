#include "tests/bench/metrics_scrape.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace rdzv::bench {
namespace {

class Scraper {
 public:
  Scraper(int port, int64_t interval_ms) : port_(port) {
    thread_ = std::thread([this, interval_ms] {
      httplib::Client client("127.0.0.1", port_);
      client.set_connection_timeout(2);
      client.set_read_timeout(5);
      while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(interval_ms))) {
        const httplib::Result result = client.Get("/metrics");
        if (result && result->status == 200) {
          ++ok_;
          bytes_ = result->body.size();
        } else {
          ++failed_;
        }
      }
    });
  }

  ~Scraper() {
    stop_.Notify();
    thread_.join();
    std::fprintf(stderr,
                 "rdzv-bench: metrics of port %d: %ld scrapes (%ld failed), %zu bytes each\n",
                 port_, static_cast<long>(ok_ + failed_), static_cast<long>(failed_), bytes_);
  }

 private:
  const int port_;
  absl::Notification stop_;
  int64_t ok_ = 0;
  int64_t failed_ = 0;
  size_t bytes_ = 0;
  std::thread thread_;
};

absl::Mutex mu(absl::kConstInit);
Scraper* current ABSL_GUARDED_BY(mu) = nullptr;

}  // namespace

void StopScrapingMetrics() {
  absl::MutexLock lock(&mu);
  delete current;
  current = nullptr;
}

void ScrapeMetrics(int port, int64_t interval_ms) {
  static const bool registered = [] { return std::atexit(StopScrapingMetrics) == 0; }();
  (void)registered;
  absl::MutexLock lock(&mu);
  delete current;
  current = new Scraper(port, interval_ms);
}

}  // namespace rdzv::bench
