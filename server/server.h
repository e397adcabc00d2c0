// Server: rdzvd as an object. Listens on an address, serves the rendezvous service and the
// standard gRPC health service (grpc.health.v1, SERVING from Start() until Shutdown()), drives
// its timers from an Asio steady_timer on a thread of its own, and optionally serves Prometheus
// metrics over HTTP. rdzvd's main() runs one;
// rdzv-agent embeds one in the agent of node 0 (or with --standalone).
//
// Thread-safe. Shutdown() is idempotent and also runs from the destructor.
#ifndef RDZV_SERVER_SERVER_H_
#define RDZV_SERVER_SERVER_H_

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "guard/authenticator.h"
#include "guard/connection_guard.h"
#include "guard/header_auth.h"
#include "server/core/memory_return.h"
#include "server/metrics.h"
#include "server/metrics_endpoint.h"
#include "server/rendezvous_service.h"
#include "server/service_metrics.h"

namespace rdzv {

// How long a new connection is spared when its host is at a bound and room is made among the
// unproven connections, if an older one can go instead: its time to authenticate.
inline constexpr absl::Duration kUnprovenGrace = absl::Seconds(2);

struct ServerOptions {
  // "host:port"; port 0 picks a free one (see Server::port()).
  std::string listen = "0.0.0.0:29400";
  ServiceOptions service;
  absl::Duration tick_interval = absl::Milliseconds(100);
  // A node that vanishes without closing its connection (power, network): the kernel probes
  // each agent's idle connection every `keepalive` (whole seconds, at least 1) and drops it once
  // the agent's host has answered nothing for keepalive + keepalive_timeout; the agent is then
  // lost and its job ends (2 s by default). The host's kernel answers, not the agent, so an agent
  // too busy to run is never taken for a lost one, and the probes cost rdzvd nothing. Zero turns
  // the probes off.
  absl::Duration keepalive = absl::Seconds(1);
  absl::Duration keepalive_timeout = absl::Seconds(1);
  // An agent frozen on a live host (stopped, or hung past gRPC's own threads): rdzvd pings each
  // agent's connection this often (an HTTP/2 ping the agent's gRPC answers) and drops it when an
  // answer takes longer than keepalive_timeout. Each ping is a timer, a write and a read in rdzvd:
  // one a second for each of 10,000 agents kept a fifth of a core busy, and gRPC 1.51 sometimes
  // failed its own check under such pings during a burst of connections. Zero turns pings off.
  absl::Duration ping_interval = absl::Seconds(30);
  // "host:port" to serve Prometheus metrics on (GET /metrics); empty for none. Port 0 picks a
  // free one (see Server::metrics_port()).
  std::string metrics_listen;
  // What serves metrics_listen: MetricsHttpServer::StartEndpoint (server/metrics_http.h, library
  // rdzv_metrics_http), which rdzvd passes. Without it a metrics_listen is refused.
  MetricsEndpointStarter serve_metrics = nullptr;
  // gRPC's memory for all connections and calls together (its resource quota). The service
  // refuses joins past three quarters of it (ServiceOptions::max_memory_bytes, unless set), so
  // that attached agents never press it.
  size_t memory_limit_bytes = size_t{4} << 30;
  // Connections one host (one address) may hold open at once, refused at accept past it; 0: any
  // number. Bounds what a host that shows no credential can open: connections, and on each at
  // most request_limits.h's kMaxStreamsPerConnection streams. An agent needs one; a node's
  // per-task agents one each.
  int max_connections_per_host = 512;
  // Of those, how many may not have carried an authenticated call yet (0: the same bound). Past
  // either bound one of the host's unproven connections is dropped for the newcomer (a random one
  // past kUnprovenGrace, else the oldest: guard/core/connection_table.h), so that a host's user
  // without credentials cannot keep its other users out; the newcomer is refused only when all
  // of the host's connections are authenticated.
  int max_unproven_connections_per_host = 128;
  // A connection that has carried no authenticated call this long after it opened is closed,
  // whatever it holds (silence, refused calls, streams that never send their message); zero:
  // never. Long enough for a burst of joins to a busy server to be answered.
  absl::Duration unused_connection_timeout = absl::Seconds(60);
  // What gRPC reads ahead of the server on one stream: the flow-control window of each stream.
  // A caller's message arrives whole whatever its size (gRPC widens the window for the message
  // it is reading), but one that has not proved who it is gets no more than this buffered.
  int stream_window_bytes = 16 * 1024;
  // Serve TLS with this certificate and key (LoadTlsServerIdentity); empty: plaintext.
  TlsServerIdentity tls;
};

class Server {
 public:
  // Starts listening and serving. FailedPrecondition (with the address) when the address
  // cannot be bound.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The port actually bound.
  int port() const { return port_; }
  // The metrics port actually bound; 0 without metrics.
  int metrics_port() const;

  // Closes every stream with UNAVAILABLE, stops accepting calls and waits (bounded) for the
  // calls in flight to end.
  void Shutdown();

  // Join streams open now: agents still attached to some job.
  size_t open_streams() const;
  // Agents joined since the start, and attached now (a group join's members each).
  int64_t agents_joined() const;
  int64_t agents_attached() const;

 private:
  Server() = default;
  // The credentials the server listens with: TLS or plaintext, checked on each call's headers
  // (HeaderAuth) unless `mode` is kNone.
  std::shared_ptr<grpc::ServerCredentials> Credentials(AuthMode mode, const ServerOptions& options);
  // Serves metrics at options.metrics_listen, when the server keeps them.
  absl::Status ServeMetrics(const ServerOptions& options);
  // The tick of the service and the guard, and (under MUNGE) the renewal of the server's key.
  void StartTimers(AuthMode mode, absl::Duration tick_interval);
  void ArmTimer();
  // Hands freed memory back to the kernel when MemoryReturn says so (on the timer's thread).
  void ReturnMemory();

  // Declared before the service, which reports to them: they go after it.
  std::unique_ptr<ConnectionGuard> connections_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<ServiceMetrics> service_metrics_;
  std::unique_ptr<MetricsEndpoint> metrics_http_;
  std::unique_ptr<RendezvousService> service_;
  // Checks credentials on headers; after the grpc::Server, which calls it, goes.
  std::unique_ptr<HeaderAuth> header_auth_;
  std::unique_ptr<grpc::Server> grpc_server_;
  asio::io_context io_;
  asio::steady_timer timer_{io_};
  absl::Duration tick_interval_;
  std::thread timer_thread_;
  // The guard's work is done every kGuardEveryTicks ticks (about once a second).
  static constexpr int kGuardEveryTicks = 10;
  int64_t ticks_ = 0;
  // What the guard had refused and dropped when the metrics last counted it.
  int64_t counted_refused_ = 0;
  int64_t counted_dropped_ = 0;
  // Renews the credential vouching for the server's key (Authenticator::RefreshServerKey) on a
  // thread of its own, so that a munged that does not answer never holds up the timer.
  void RenewServerKey();
  std::thread key_thread_;
  absl::Notification stop_key_thread_;
  MemoryReturn memory_return_;
  int port_ = 0;
  bool stopped_ = false;
};

}  // namespace rdzv

#endif  // RDZV_SERVER_SERVER_H_
