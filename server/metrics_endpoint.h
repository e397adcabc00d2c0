// MetricsEndpoint: what serves a server's metrics to scrapers, as the server holds it. rdzvd
// serves them over HTTP (MetricsHttpServer); a program that passes no starter serves none and
// does not link the HTTP library, whose start-up (OpenSSL's, with all its error strings) costs
// a process about 3 MiB: rdzv-agent, which embeds a server, is one.
#ifndef RDZV_SERVER_METRICS_ENDPOINT_H_
#define RDZV_SERVER_METRICS_ENDPOINT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/metrics.h"

namespace rdzv {

class MetricsEndpoint {
 public:
  virtual ~MetricsEndpoint() = default;
  // The port actually bound.
  virtual int port() const = 0;
  // Stops serving; idempotent.
  virtual void Shutdown() = 0;
};

// Starts serving `metrics` (not owned; must outlive the endpoint) at `listen`.
using MetricsEndpointStarter = absl::StatusOr<std::unique_ptr<MetricsEndpoint>> (*)(
    const std::string& listen, Metrics* metrics);

}  // namespace rdzv

#endif  // RDZV_SERVER_METRICS_ENDPOINT_H_
