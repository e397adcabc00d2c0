// MetricsHttpServer: serves a Metrics registry over HTTP for Prometheus, as rdzvd does for
// --metrics-listen: GET /metrics (text exposition format 0.0.4) and GET /healthz ("ok").
//
// Bounded by construction, so that a scraper (or anyone who can reach the port) cannot take
// resources from the rendezvous service, nor keep the metrics from others: four worker threads
// behind a short queue (when all are busy the accepting thread waits, and further connections
// wait in the kernel's backlog), one request per connection, request bodies of at most 1 KiB,
// and 2 s for a request and its answer. A connection that has sent nothing yet waits on one
// thread of its own, not on a worker, and is closed after 1 s; thousands of idle connections
// delay nobody's scrape.
// It uses cpp-httplib (Debian's libcpp-httplib-dev), hidden from this header.
//
// Does not own the Metrics, which must outlive the server. Thread-safe; Shutdown() is
// idempotent and runs from the destructor.
#ifndef RDZV_SERVER_METRICS_HTTP_H_
#define RDZV_SERVER_METRICS_HTTP_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/metrics.h"
#include "server/metrics_endpoint.h"

namespace rdzv {

class MetricsHttpServer final : public MetricsEndpoint {
 public:
  // Binds `listen` ("host:port", "[v6addr]:port"; port 0 picks a free one, see port()) and
  // starts serving on threads of its own. InvalidArgument for a malformed address,
  // FailedPrecondition (one line naming the address and why) when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& listen,
                                                                  Metrics* metrics);
  // Start, as a ServerOptions::serve_metrics.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartEndpoint(const std::string& listen,
                                                                        Metrics* metrics);
  ~MetricsHttpServer() override;
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // The port actually bound.
  int port() const override { return port_; }

  // Stops accepting, lets the requests in progress finish and joins the threads. Returns
  // within about a second (longer only while a client is in the middle of sending a request
  // or reading a response, up to the 2 s timeouts).
  void Shutdown() override;

 private:
  class Http;  // httplib's server, in the .cc
  MetricsHttpServer();

  std::unique_ptr<Http> http_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<bool> stopped_{false};
};

}  // namespace rdzv

#endif  // RDZV_SERVER_METRICS_HTTP_H_
