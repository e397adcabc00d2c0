#include "server/server.h"

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <malloc.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <fstream>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "guard/request_limits.h"
#include "server/rendezvous_service.h"

namespace rdzv {

namespace {

// The service's options, with the memory limits left at 0 derived from gRPC's memory quota.
ServiceOptions ServiceOptionsFor(const ServerOptions& options) {
  ServiceOptions service = options.service;
  if (service.max_memory_bytes == 0) {
    service.max_memory_bytes = static_cast<int64_t>(options.memory_limit_bytes / 4 * 3);
  }
  if (service.max_memory_per_user_bytes == 0) {
    service.max_memory_per_user_bytes = service.max_memory_bytes / 2;
  }
  return service;
}

// The bounds the guard keeps on each host's connections (guard/connection_guard.h).
ConnectionTable::Limits ConnectionLimits(const ServerOptions& options) {
  ConnectionTable::Limits limits;
  limits.max_per_host = options.max_connections_per_host;
  // No bound on a host's connections is no bound on its unproven ones either.
  limits.max_unproven_per_host =
      options.max_connections_per_host == 0 ? 0 : options.max_unproven_connections_per_host;
  limits.grace = kUnprovenGrace;
  limits.first_call_within = options.unused_connection_timeout;
  return limits;
}

// How rdzvd's connections are kept and what each may hold: gRPC's channel arguments, and its
// memory for them all. A change to how rdzvd talks HTTP/2 goes here.
void SetTransport(grpc::ServerBuilder& builder, const ServerOptions& options,
                  grpc::ResourceQuota& quota) {
  // gRPC shares ports by default (SO_REUSEPORT): a second server on a taken port would split
  // a job's agents between two servers that each wait for the rest.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Agents keep one quiet stream open for the whole job; let them ping it to keep it alive.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  if (options.ping_interval > absl::ZeroDuration()) {
    // gRPC takes an int of milliseconds: a longer interval (the flags allow any) is as good as
    // never, and must not wrap around to a negative one, which gRPC would make 1 ms.
    const auto millis = [](absl::Duration d) {
      return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1, INT_MAX));
    };
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, millis(options.ping_interval));
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, millis(options.keepalive_timeout));
  }
  // Bandwidth probing sizes flow-control windows for bulk transfers; our messages are tiny, and
  // each probe is an extra write and read per agent (per assignment and abort too).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  // The full filter stack, not gRPC's minimal one: the minimal stack would save some CPU time
  // and about 1.3 KiB per agent, but it leaves out the message size filter, and then a request
  // of any size (up to 2 GiB) is read whole before rdzvd sees it. The largest real request is a
  // failure report of a few dozen KiB (guard/request_limits.h); larger ones are refused with
  // RESOURCE_EXHAUSTED before they are stored.
  builder.SetMaxReceiveMessageSize(kMaxRequestBytes);
  // What the full stack adds that rdzvd has no use for: server-side deadline timers (clients
  // enforce their own deadlines, and a Join stream's is a month away: one timer per agent) and
  // per-message compression (rdzvd's messages are a few hundred bytes; its clients never
  // compress). Without them a join costs about a sixth less CPU time at 10,000 agents.
  builder.AddChannelArgument(GRPC_ARG_ENABLE_DEADLINE_CHECKS, 0);
  builder.AddChannelArgument(GRPC_ARG_ENABLE_PER_MESSAGE_COMPRESSION, 0);
  builder.AddChannelArgument(GRPC_ARG_ENABLE_PER_MESSAGE_DECOMPRESSION, 0);
  // What a caller can make the server hold before it has proved who it is: its headers and one
  // small window per stream; a connection without calls (never authenticated, or done) closes.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, options.stream_window_bytes);
  // The handshake keeps gRPC's own timeout (2 minutes): 10,000 agents connecting at once to a
  // busy server take more than a few seconds, and cutting them off only makes them come back.
  // Connections per host, and connections that never carry an authenticated call, are bounded
  // by the guard, not by gRPC's idle filter, which costs about a tenth more CPU time per agent.
  // An agent has one Join stream and at most a call or two beside it on its connection.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxStreamsPerConnection);
  // All of gRPC's buffers together: past this, new connections and reads wait or fail rather
  // than the process growing until the kernel kills it.
  quota.Resize(options.memory_limit_bytes);
  builder.SetResourceQuota(quota);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  std::unique_ptr<Server> server(new Server());
  ServiceOptions service_options = ServiceOptionsFor(options);
  if (!options.metrics_listen.empty()) {
    server->metrics_ = std::make_unique<Metrics>(RDZV_VERSION);
    server->service_metrics_ = std::make_unique<ServiceMetrics>(server->metrics_.get());
    service_options.metrics = server->service_metrics_.get();
  }
  server->connections_ = std::make_unique<ConnectionGuard>(
      ConnectionLimits(options), TcpKeepalive{options.keepalive, options.keepalive_timeout});
  service_options.connections = server->connections_.get();
  server->service_ = std::make_unique<RendezvousService>(SteadyClock(), service_options);
  if (server->metrics_ != nullptr) {
    server->metrics_->SetJoinStreamsSource([service = server->service_.get()] {
      return static_cast<int64_t>(service->open_streams());
    });
  }

#ifdef NDEBUG
  // Debian builds abseil without NDEBUG, which leaves absl::Mutex's deadlock detector on in
  // release builds too: every lock, gRPC's own included, then updates one global lock-order
  // graph under a global lock. With thousands of agents connecting that is a fifth of the
  // server's CPU time. Debug builds keep the detector.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif

  // grpc.health.v1.Health, answered by gRPC itself; the server reports SERVING once started.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, server->Credentials(service_options.auth.mode, options),
                           &server->port_);
  builder.RegisterService(server->service_.get());
  grpc::ResourceQuota quota("rdzvd");
  SetTransport(builder, options, quota);
  server->connections_->InstallOn(&builder);
  server->grpc_server_ = builder.BuildAndStart();
  if (server->grpc_server_ == nullptr || server->port_ == 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot listen on %s (address in use or not local); choose another --listen address",
        options.listen));
  }
  if (absl::Status s = server->ServeMetrics(options); !s.ok()) return s;
  if (auto* health = server->grpc_server_->GetHealthCheckService(); health != nullptr) {
    health->SetServingStatus(true);
  }
  server->StartTimers(service_options.auth.mode, options.tick_interval);
  return server;
}

std::shared_ptr<grpc::ServerCredentials> Server::Credentials(AuthMode mode,
                                                             const ServerOptions& options) {
  // Credentials are checked on each call's headers, before its message is read, except without
  // authentication (loopback only).
  if (mode == AuthMode::kNone) return ServerCredentials(options.tls);
  RendezvousService* service = service_.get();
  header_auth_ =
      std::make_unique<HeaderAuth>(&service->authenticator(), [service](absl::StatusCode code) {
        service->CountRefused(code == absl::StatusCode::kPermissionDenied
                                  ? Metrics::kRefusedPermissionDenied
                                  : Metrics::kRefusedUnauthenticated);
      });
  return header_auth_->Credentials(options.tls);
}

absl::Status Server::ServeMetrics(const ServerOptions& options) {
  if (metrics_ == nullptr) return absl::OkStatus();
  if (options.serve_metrics == nullptr) {
    return absl::FailedPreconditionError("this program serves no metrics; leave out the address");
  }
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> http =
      options.serve_metrics(options.metrics_listen, metrics_.get());
  if (!http.ok()) return http.status();  // the destructor stops what started
  metrics_http_ = *std::move(http);
  return absl::OkStatus();
}

void Server::StartTimers(AuthMode mode, absl::Duration tick_interval) {
  if (mode == AuthMode::kMunge) {
    if (absl::Status s = service_->authenticator().RefreshServerKey(absl::Now()); !s.ok()) {
      spdlog::warn("cannot have this server's key vouched for yet: {}", std::string(s.message()));
    }
    key_thread_ = std::thread([this] { RenewServerKey(); });
  }
  tick_interval_ = tick_interval;
  ArmTimer();
  timer_thread_ = std::thread([io = &io_] { io->run(); });
}

void Server::ArmTimer() {
  timer_.expires_after(absl::ToChronoMicroseconds(tick_interval_));
  timer_.async_wait([this](const std::error_code& ec) {
    if (ec) return;
    service_->Tick();
    if (++ticks_ % kGuardEveryTicks == 0) {
      connections_->Tick();
      if (metrics_ != nullptr) {
        const int64_t refused = connections_->refused();
        const int64_t dropped = connections_->dropped();
        metrics_->connections_refused().Inc(static_cast<uint64_t>(refused - counted_refused_));
        metrics_->connections_dropped().Inc(static_cast<uint64_t>(dropped - counted_dropped_));
        counted_refused_ = refused;
        counted_dropped_ = dropped;
      }
      ReturnMemory();
    }
    ArmTimer();
  });
}

void Server::RenewServerKey() {
  bool failing = false;
  while (!stop_key_thread_.WaitForNotificationWithTimeout(absl::Seconds(1))) {
    const absl::Status s = service_->authenticator().RefreshServerKey(absl::Now());
    if (!s.ok() && !failing) {
      spdlog::warn("cannot renew the credential vouching for this server's key: {}",
                   std::string(s.message()));
    } else if (s.ok() && failing) {
      spdlog::info("the credential vouching for this server's key is renewed again");
    }
    failing = !s.ok();
  }
}

void Server::ReturnMemory() {
  // statm's second field: resident pages.
  std::ifstream statm("/proc/self/statm");
  int64_t size_pages = 0, resident_pages = 0;
  if (!(statm >> size_pages >> resident_pages)) return;
  static const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t rss = resident_pages * page;
  const int64_t held = service_->memory_held();
  const absl::Time now = absl::Now();
  if (!memory_return_.Check(now, held, rss)) return;
  malloc_trim(0);
  std::ifstream after("/proc/self/statm");
  if (after >> size_pages >> resident_pages) {
    SPDLOG_DEBUG("returned {} MiB to the system", (rss - resident_pages * page) >> 20);
    memory_return_.Trimmed(absl::Now(), held, resident_pages * page);
  }
}

Server::~Server() { Shutdown(); }

size_t Server::open_streams() const { return service_->open_streams(); }
int64_t Server::agents_joined() const { return service_->agents_joined(); }
int64_t Server::agents_attached() const { return service_->agents_attached(); }

int Server::metrics_port() const { return metrics_http_ != nullptr ? metrics_http_->port() : 0; }

void Server::Shutdown() {
  if (stopped_) return;
  stopped_ = true;
  if (metrics_http_ != nullptr) metrics_http_->Shutdown();
  if (metrics_ != nullptr) metrics_->SetJoinStreamsSource(nullptr);
  if (grpc_server_ != nullptr) {
    if (auto* health = grpc_server_->GetHealthCheckService(); health != nullptr) {
      health->SetServingStatus(false);
    }
  }
  service_->Shutdown();
  if (grpc_server_ != nullptr) {
    grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    grpc_server_->Wait();
  }
  if (header_auth_ != nullptr) header_auth_->Stop();
  service_->StopWriters();
  io_.stop();
  if (timer_thread_.joinable()) timer_thread_.join();
  if (key_thread_.joinable()) {
    stop_key_thread_.Notify();
    key_thread_.join();
  }
}

}  // namespace rdzv
