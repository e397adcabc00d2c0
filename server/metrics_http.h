// MetricsHttpServer: serves a Metrics registry over HTTP for Prometheus, as rdzvd does for
// --metrics-listen: GET /metrics (text exposition format 0.0.4) and GET /healthz ("ok").
//
// Bounded by construction, so that a scraper (or anyone who can reach the port) cannot take
// resources from the rendezvous service, nor keep the metrics from others: every connection is
// read and written by one thread without blocking, and a request reaches one of the four
// workers only once it has been read whole (headers of at most 8 KiB, a body of at most 1 KiB,
// within 2 s of the accept); the worker renders the answer to memory and that thread writes it
// back (within 2 s), so that neither a client that sends part of a request (or none) nor one
// that does not read its answer holds a worker. One request per connection; at most 256
// connections per host are held (past that the host's oldest is closed) and 4,096 in all (past
// that the oldest of the host holding the most), so a flood from one host delays no other
// host's scrape.
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

  // Stops accepting, closes every connection (answers being made are dropped) and joins the
  // threads. Returns within about a second.
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
