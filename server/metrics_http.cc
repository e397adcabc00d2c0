#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
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

constexpr int kThreads = 4;
constexpr size_t kMaxQueued = 8;
constexpr time_t kTimeoutSeconds = 2;
// How long a connection may stay open without a request. Shutdown() waits this long at most
// for a connection that sends nothing.
constexpr time_t kIdleSeconds = 1;
// Connections waiting for their request's first bytes, on one thread that holds no worker; past
// this many the one waiting longest is closed.
constexpr size_t kMaxWaiting = 4096;
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

// Connections that have sent nothing yet wait here, on one thread, rather than on a worker: a
// scraper's request arrives with its connection, and connections that send nothing (hundreds, from
// anyone who can reach the port) would otherwise hold every worker for their idle time while real
// scrapes queue behind them. A connection whose bytes arrive goes to `ready`; one silent for
// kIdleSeconds is closed.
class WaitingConnections {
 public:
  explicit WaitingConnections(std::function<void(int)> ready) : ready_(std::move(ready)) {
    if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) wake_[0] = wake_[1] = -1;
    thread_ = std::thread([this] { Run(); });
  }
  ~WaitingConnections() { Stop(); }

  // Takes `fd` over.
  void Add(int fd) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        close(fd);
        return;
      }
      if (waiting_.size() >= kMaxWaiting) {
        close(waiting_.front().first);
        waiting_.pop_front();
      }
      waiting_.emplace_back(fd, absl::Now() + absl::Seconds(kIdleSeconds));
    }
    Wake();
  }

  // Closes what waits and joins the thread.
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    Wake();
    thread_.join();
    for (const auto& [fd, deadline] : waiting_) close(fd);
    waiting_.clear();
    close(wake_[0]);
    close(wake_[1]);
  }

 private:
  void Wake() {
    const char byte = 0;
    [[maybe_unused]] ssize_t n = write(wake_[1], &byte, 1);
  }

  void Run() {
    std::vector<pollfd> fds;
    for (;;) {
      const absl::Time now = absl::Now();
      std::vector<int> ready;
      fds.assign(1, pollfd{wake_[0], POLLIN, 0});
      absl::Time next = now + absl::Seconds(kIdleSeconds);
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
        while (!waiting_.empty() && waiting_.front().second <= now) {
          close(waiting_.front().first);
          waiting_.pop_front();
        }
        for (const auto& [fd, deadline] : waiting_) {
          fds.push_back(pollfd{fd, POLLIN, 0});
          next = std::min(next, deadline);
        }
      }
      const int timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(next - now)) + 1;
      if (poll(fds.data(), fds.size(), timeout_ms) <= 0) continue;
      if (fds[0].revents != 0) {
        char buf[64];
        while (read(wake_[0], buf, sizeof(buf)) > 0) {
        }
      }
      {
        absl::MutexLock lock(&mu_);
        for (size_t i = 1; i < fds.size(); ++i) {
          if (fds[i].revents == 0) continue;
          auto it = std::find_if(waiting_.begin(), waiting_.end(),
                                 [&](const auto& w) { return w.first == fds[i].fd; });
          if (it == waiting_.end()) continue;  // closed meanwhile
          waiting_.erase(it);
          ready.push_back(fds[i].fd);
        }
      }
      for (const int fd : ready) ready_(fd);
    }
  }

  const std::function<void(int)> ready_;
  int wake_[2];
  std::thread thread_;
  absl::Mutex mu_;
  std::deque<std::pair<int, absl::Time>> waiting_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

// A connection as httplib reads and writes it, with one deadline for the whole request and
// answer, so that a client that trickles its bytes holds a worker for kTimeoutSeconds at most.
class DeadlineStream final : public httplib::Stream {
 public:
  DeadlineStream(int fd, absl::Time deadline) : fd_(fd), deadline_(deadline) {}

  bool is_readable() const override { return Wait(POLLIN); }
  bool is_writable() const override { return Wait(POLLOUT); }
  ssize_t read(char* ptr, size_t size) override {
    if (!Wait(POLLIN)) return -1;
    return recv(fd_, ptr, size, 0);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!Wait(POLLOUT)) return -1;
    return send(fd_, ptr, size, MSG_NOSIGNAL);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    Address(getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    Address(getsockname, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  bool Wait(short events) const {
    const int64_t ms = absl::ToInt64Milliseconds(deadline_ - absl::Now());
    if (ms <= 0) return false;
    pollfd p{fd_, events, 0};
    return poll(&p, 1, static_cast<int>(ms)) > 0;
  }

  void Address(int (*get)(int, sockaddr*, socklen_t*), std::string& ip, int& port) const {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    ip.clear();
    port = 0;
    if (get(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return;
    char text[INET6_ADDRSTRLEN] = "";
    if (addr.ss_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
      inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
      port = ntohs(a->sin_port);
    } else if (addr.ss_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
      inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
      port = ntohs(a->sin6_port);
    }
    ip = text;
  }

  const int fd_;
  const absl::Time deadline_;
};

}  // namespace

// httplib's server, with connections that have not sent their request yet kept off the workers
// (WaitingConnections) and one deadline per request (DeadlineStream).
class MetricsHttpServer::Http final : public httplib::Server {
 public:
  Http() : waiting_([this](int fd) { pool_->enqueue([this, fd] { Serve(fd); }); }) {
    new_task_queue = [this] {
      pool_ = new BoundedPool(kThreads, kMaxQueued);
      return pool_;
    };
  }

  // Closes the connections waiting and those that would wait from now on. Before the listening
  // loop ends (it deletes the workers' queue).
  void StopWaiting() { waiting_.Stop(); }

 private:
  // Runs on a worker, for each accepted connection.
  bool process_and_close_socket(socket_t sock) override {
    pollfd p{sock, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) {
      waiting_.Add(sock);
      return true;
    }
    Serve(sock);
    return true;
  }

  void Serve(int fd) {
    DeadlineStream stream(fd, absl::Now() + absl::Seconds(kTimeoutSeconds));
    bool closed = false;
    process_request(stream, /*close_connection=*/true, closed,
                    std::function<void(httplib::Request&)>());
    shutdown(fd, SHUT_RDWR);
    close(fd);
  }

  // Made by httplib's listening loop through new_task_queue, and deleted by it.
  BoundedPool* pool_ = nullptr;
  WaitingConnections waiting_;
};

namespace {

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

MetricsHttpServer::MetricsHttpServer() : http_(std::make_unique<Http>()) {}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, Metrics* metrics) {
  absl::StatusOr<HostPort> address = ParseListen(listen);
  if (!address.ok()) return address.status();

  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  httplib::Server& http = *server->http_;
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

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsHttpServer::StartEndpoint(
    const std::string& listen, Metrics* metrics) {
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server = Start(listen, metrics);
  if (!server.ok()) return server.status();
  return std::unique_ptr<MetricsEndpoint>(*std::move(server));
}

MetricsHttpServer::~MetricsHttpServer() { Shutdown(); }

void MetricsHttpServer::Shutdown() {
  if (stopped_.exchange(true)) return;
  // First, while the workers' queue still exists: a waiting connection goes there when it
  // speaks; once stopped, connections handed to it are closed.
  http_->StopWaiting();
  http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace rdzv
