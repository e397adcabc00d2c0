#include "server/metrics_http.h"

#include <httplib.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/net.h"

namespace rdzv {
namespace {

constexpr int kThreads = 2;
constexpr size_t kMaxQueued = 8;
constexpr time_t kTimeoutSeconds = 2;
// How long a connection may stay open without a request. Shutdown() waits this long at most
// for a connection that sends nothing.
constexpr time_t kIdleSeconds = 1;
constexpr size_t kMaxBodyBytes = 1024;
constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// httplib's own pool queues accepted connections without limit. This one makes the accepting
// thread wait while kMaxQueued connections are waiting for a worker.
class BoundedPool : public httplib::TaskQueue {
 public:
  BoundedPool(int threads, size_t max_queued) : max_queued_(max_queued) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
  }

  void enqueue(std::function<void()> task) override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &BoundedPool::HasRoom));
    tasks_.push_back(std::move(task));
  }

  // Runs what is queued, then joins the workers.
  void shutdown() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (std::thread& thread : threads_) thread.join();
    threads_.clear();
  }

 private:
  bool HasRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return tasks_.size() < max_queued_; }
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !tasks_.empty() || stopping_; }

  void Work() {
    for (;;) {
      std::function<void()> task;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &BoundedPool::HasWork));
        if (tasks_.empty()) return;  // stopping, nothing left
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  const size_t max_queued_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// httplib's default sets SO_REUSEPORT, with which a second server binds a port that is already
// taken and silently gets half of its scrapes. SO_REUSEADDR alone only lets a restarted
// server take its port back from connections in TIME_WAIT.
void SetSocketOptions(socket_t sock) {
  const int yes = 1;
  setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
}

// "host:port" with port 0 allowed (ParseHostPort wants 1..65535).
absl::StatusOr<HostPort> ParseListen(const std::string& listen) {
  absl::string_view text = listen;
  const bool any_port = absl::ConsumeSuffix(&text, ":0");
  absl::StatusOr<HostPort> parsed = ParseHostPort(text, any_port ? 1 : 0);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "metrics address \"%s\" is malformed; expected HOST:PORT, e.g. 127.0.0.1:9400 "
        "(port 0 picks a free one)",
        listen));
  }
  if (any_port) parsed->port = 0;
  return parsed;
}

}  // namespace

MetricsHttpServer::MetricsHttpServer() : http_(std::make_unique<httplib::Server>()) {}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, Metrics* metrics) {
  absl::StatusOr<HostPort> address = ParseListen(listen);
  if (!address.ok()) return address.status();

  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  httplib::Server& http = *server->http_;
  http.new_task_queue = [] { return new BoundedPool(kThreads, kMaxQueued); };
  http.set_socket_options(SetSocketOptions);
  http.set_keep_alive_max_count(1);
  http.set_keep_alive_timeout(kIdleSeconds);
  http.set_read_timeout(kTimeoutSeconds, 0);
  http.set_write_timeout(kTimeoutSeconds, 0);
  http.set_payload_max_length(kMaxBodyBytes);

  http.Get("/metrics", [metrics](const httplib::Request&, httplib::Response& response) {
    response.set_content(metrics->Render(), kContentType);
  });
  http.Get("/healthz", [](const httplib::Request&, httplib::Response& response) {
    response.set_content("ok\n", "text/plain; charset=utf-8");
  });
  http.set_error_handler([](const httplib::Request&, httplib::Response& response) {
    if (response.status == 404) {
      response.set_content("not found; the metrics are at /metrics\n", "text/plain; charset=utf-8");
    }
  });
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& response, std::exception_ptr) {
        response.status = 500;
        response.set_content("internal error while rendering the metrics\n",
                             "text/plain; charset=utf-8");
      });

  // httplib does not say why a bind failed; resolving first tells a name that does not resolve
  // from an address that cannot be bound (then errno says why).
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* resolved = nullptr;
  if (const int error = getaddrinfo(address->host.c_str(), nullptr, &hints, &resolved);
      error != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot serve metrics on %s (%s: %s); choose another --metrics-listen address", listen,
        address->host, gai_strerror(error)));
  }
  freeaddrinfo(resolved);

  errno = 0;
  int port = address->port;
  bool bound = false;
  if (port == 0) {
    port = http.bind_to_any_port(address->host);
    bound = port > 0;
  } else {
    bound = http.bind_to_port(address->host, port);
  }
  if (!bound) {
    const std::string why = errno != 0 ? strerror(errno) : "bind failed";
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot serve metrics on %s (%s); choose another --metrics-listen address", listen, why));
  }
  server->port_ = port;
  auto loop_ended = std::make_shared<std::atomic<bool>>(false);
  server->thread_ = std::thread([&http, loop_ended] {
    http.listen_after_bind();
    loop_ended->store(true);
  });
  // stop() does nothing until the listening loop runs: wait for it, so that a Shutdown() right
  // after Start() cannot miss it. It starts at once (and the socket is already listening, so no
  // connection is lost meanwhile).
  while (!http.is_running() && !loop_ended->load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return server;
}

MetricsHttpServer::~MetricsHttpServer() { Shutdown(); }

void MetricsHttpServer::Shutdown() {
  if (stopped_.exchange(true)) return;
  http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace rdzv
