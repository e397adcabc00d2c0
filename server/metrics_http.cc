#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/net.h"

namespace rdzv {
namespace {

constexpr int kThreads = 4;
// How long a connection has for its whole request, from its accept, and for the answer, from
// when it is ready. Shutdown() waits for neither: it closes what is left.
constexpr absl::Duration kTimeout = absl::Seconds(2);
// A request is read whole before any worker sees it: its request line and headers, and a body of
// at most kMaxBodyBytes. Past kMaxHeadBytes without the end of its headers it is closed.
constexpr size_t kMaxHeadBytes = 8 * 1024;
constexpr size_t kMaxBodyBytes = 1024;
// Connections held (reading their request, or being answered), per host and in all. Past a
// bound the oldest of that host is closed, or past kMaxHeld the oldest of the host that holds
// the most: one host's connections never push out another's.
constexpr size_t kMaxPerHost = 256;
constexpr size_t kMaxHeld = 4096;
constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// httplib hands each accepted connection to its task queue on the accepting thread; this one
// runs the task there at once (it only gives the socket to the Gate below), so that accepting
// never waits for a worker.
class InlineQueue final : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> task) override { task(); }
  void shutdown() override {}
};

// The workers: they only turn a request read whole into an answer (a render of the metrics),
// never touch the network, and so never wait on a client. Their queue holds at most what the Gate
// holds.
class Workers {
 public:
  explicit Workers(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
  }
  ~Workers() { Stop(); }

  void Run(std::function<void()> task) {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    tasks_.push_back(std::move(task));
  }

  // Runs what is queued, then joins the workers.
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    for (std::thread& thread : threads_) thread.join();
    threads_.clear();
  }

 private:
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !tasks_.empty() || stopping_; }

  void Work() {
    for (;;) {
      std::function<void()> task;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &Workers::HasWork));
        if (tasks_.empty()) return;  // stopping, nothing left
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// A request as httplib reads it, from memory, and its answer as httplib writes it, to memory.
class MemoryStream final : public httplib::Stream {
 public:
  MemoryStream(int fd, const std::string& request, std::string& answer)
      : fd_(fd), request_(request), answer_(answer) {}

  bool is_readable() const override { return read_ < request_.size(); }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, request_.size() - read_);
    std::memcpy(ptr, request_.data() + read_, n);
    read_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    answer_.append(ptr, size);
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    Address(getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    Address(getsockname, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
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
  const std::string& request_;
  std::string& answer_;
  size_t read_ = 0;
};

// Whether `data` holds a whole request: its headers' end, and the body they announce (at most
// kMaxBodyBytes of it: httplib refuses a longer one from its headers alone). Nullopt while more
// is to come; false for one that will never be whole within the bounds.
std::optional<bool> WholeRequest(const std::string& data) {
  const size_t end = data.find("\r\n\r\n");
  if (end == std::string::npos) {
    if (data.size() > kMaxHeadBytes) return false;
    return std::nullopt;
  }
  if (end > kMaxHeadBytes) return false;
  size_t body = 0;
  const std::string head = absl::AsciiStrToLower(absl::string_view(data).substr(0, end));
  if (size_t at = head.find("\r\ncontent-length:"); at != std::string::npos) {
    absl::string_view value = absl::string_view(head).substr(at + 17);
    value = value.substr(0, value.find("\r\n"));
    uint64_t length = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(value), &length)) {
      if (length > kMaxBodyBytes) return true;  // refused from its headers
      body = static_cast<size_t>(length);
    }
  }
  if (data.size() < end + 4 + body) return std::nullopt;
  return true;
}

// The host (address) at the other end of `fd`, or "" when unknown.
std::string HostOf(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  char text[INET6_ADDRSTRLEN] = "";
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr, text, sizeof(text));
  } else if (addr.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr, text,
              sizeof(text));
  }
  return text;
}

// Every connection, from its accept to its close, is read and written here, on one thread, with
// non-blocking calls: its request is read whole (WholeRequest) within kTimeout of its accept
// before a worker answers it, and the answer is written back here within kTimeout, so that
// neither a client that trickles its request (or sends none) nor one that does not read its
// answer holds a worker. Per host at most kMaxPerHost connections are held, and kMaxHeld in all.
class Gate {
 public:
  // `answer` turns a whole request into the bytes of its answer; it runs on a worker (`run`).
  Gate(std::function<void(std::function<void()>)> run,
       std::function<std::string(int fd, const std::string& request)> answer)
      : run_(std::move(run)), answer_(std::move(answer)) {
    if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) wake_[0] = wake_[1] = -1;
    thread_ = std::thread([this] { Loop(); });
  }
  ~Gate() { Stop(); }

  // Takes `fd` over.
  void Add(int fd) {
    const int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    std::string host = HostOf(fd);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        close(fd);
        return;
      }
      std::deque<uint64_t>& mine = by_host_[host];
      if (mine.size() >= kMaxPerHost) CloseLocked(mine.front());
      if (held_.size() >= kMaxHeld) {
        // The oldest connection of the host that holds the most.
        auto most = std::max_element(
            by_host_.begin(), by_host_.end(),
            [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
        if (most != by_host_.end() && !most->second.empty()) CloseLocked(most->second.front());
      }
      const uint64_t id = ++next_id_;
      Connection& c = held_[id];
      c.fd = fd;
      c.host = std::move(host);
      c.deadline = absl::Now() + kTimeout;
      by_host_[c.host].push_back(id);
    }
    Wake();
  }

  // Closes every connection and joins the thread. Answers still being made are dropped.
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    Wake();
    thread_.join();
    absl::MutexLock lock(&mu_);
    while (!held_.empty()) CloseLocked(held_.begin()->first);
    close(wake_[0]);
    close(wake_[1]);
  }

 private:
  enum class Phase { kReading, kAnswering, kWriting };
  struct Connection {
    int fd = -1;
    std::string host;
    absl::Time deadline;
    Phase phase = Phase::kReading;
    std::string data;  // the request as read, then the answer being written
    size_t written = 0;
  };

  void Wake() {
    const char byte = 0;
    [[maybe_unused]] ssize_t n = write(wake_[1], &byte, 1);
  }

  void CloseLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = held_.find(id);
    if (it == held_.end()) return;
    close(it->second.fd);
    auto host = by_host_.find(it->second.host);
    if (host != by_host_.end()) {
      std::deque<uint64_t>& ids = host->second;
      ids.erase(std::find(ids.begin(), ids.end(), id));
      if (ids.empty()) by_host_.erase(host);
    }
    held_.erase(it);
  }

  // A worker made the answer of connection `id`: it is written from here.
  void Answered(uint64_t id, std::string answer) {
    {
      absl::MutexLock lock(&mu_);
      auto it = held_.find(id);
      if (it == held_.end()) return;  // closed meanwhile (pushed out, or stopping)
      it->second.phase = Phase::kWriting;
      it->second.data = std::move(answer);
      it->second.written = 0;
      it->second.deadline = absl::Now() + kTimeout;
    }
    Wake();
  }

  // Reads what connection `c` has sent; true when it is to be closed.
  bool ReadSome(uint64_t id, Connection& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    char buf[4096];
    for (;;) {
      const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
      if (n == 0) return true;  // gone before its request was whole
      if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
      c.data.append(buf, static_cast<size_t>(n));
      const std::optional<bool> whole = WholeRequest(c.data);
      if (!whole) continue;
      if (!*whole) return true;
      c.phase = Phase::kAnswering;
      run_([this, id, fd = c.fd, request = std::move(c.data)] {
        Answered(id, answer_(fd, request));
      });
      c.data.clear();
      return false;
    }
  }

  // Writes what connection `c` can take of its answer; true when it is to be closed.
  bool WriteSome(Connection& c) {
    while (c.written < c.data.size()) {
      const ssize_t n =
          send(c.fd, c.data.data() + c.written, c.data.size() - c.written, MSG_NOSIGNAL);
      if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
      c.written += static_cast<size_t>(n);
    }
    shutdown(c.fd, SHUT_WR);
    return true;
  }

  void Loop() {
    std::vector<pollfd> fds;
    std::vector<uint64_t> ids;
    for (;;) {
      const absl::Time now = absl::Now();
      absl::Time next = now + absl::Seconds(1);
      fds.assign(1, pollfd{wake_[0], POLLIN, 0});
      ids.assign(1, 0);
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
        std::vector<uint64_t> late;
        for (auto& [id, c] : held_) {
          if (c.phase == Phase::kAnswering) continue;  // a worker has it
          if (c.deadline <= now) {
            late.push_back(id);
            continue;
          }
          next = std::min(next, c.deadline);
          fds.push_back(pollfd{c.fd, static_cast<short>(c.phase == Phase::kReading ? POLLIN
                                                                                   : POLLOUT),
                               0});
          ids.push_back(id);
        }
        for (uint64_t id : late) CloseLocked(id);
      }
      const int timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(next - now)) + 1;
      if (poll(fds.data(), fds.size(), timeout_ms) <= 0) continue;
      if (fds[0].revents != 0) {
        char buf[64];
        while (read(wake_[0], buf, sizeof(buf)) > 0) {
        }
      }
      absl::MutexLock lock(&mu_);
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        auto it = held_.find(ids[i]);
        if (it == held_.end() || it->second.fd != fds[i].fd) continue;  // closed meanwhile
        Connection& c = it->second;
        const bool done = c.phase == Phase::kReading   ? ReadSome(ids[i], c)
                          : c.phase == Phase::kWriting ? WriteSome(c)
                                                       : false;
        if (done) CloseLocked(ids[i]);
      }
    }
  }

  const std::function<void(std::function<void()>)> run_;
  const std::function<std::string(int, const std::string&)> answer_;
  int wake_[2];
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Connection> held_ ABSL_GUARDED_BY(mu_);
  // Each host's connections, oldest first.
  absl::flat_hash_map<std::string, std::deque<uint64_t>> by_host_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: it starts running in the constructor
};

}  // namespace

// httplib's server, fed by the Gate: httplib parses each request whole from memory and writes its
// answer to memory, on a worker.
class MetricsHttpServer::Http final : public httplib::Server {
 public:
  Http()
      : workers_(kThreads),
        gate_([this](std::function<void()> task) { workers_.Run(std::move(task)); },
              [this](int fd, const std::string& request) { return Answer(fd, request); }) {
    new_task_queue = [] { return new InlineQueue(); };
  }

  // Closes every connection and stops the workers. Before the listening loop ends.
  void StopConnections() {
    gate_.Stop();
    workers_.Stop();
  }

  // The listening socket, as httplib made it (its options callback sees it before the bind).
  std::atomic<int> listen_fd{-1};

 private:
  // Runs on the accepting thread, for each accepted connection.
  bool process_and_close_socket(socket_t sock) override {
    gate_.Add(sock);
    return true;
  }

  std::string Answer(int fd, const std::string& request) {
    std::string answer;
    MemoryStream stream(fd, request, answer);
    bool closed = false;
    process_request(stream, /*close_connection=*/true, closed,
                    std::function<void(httplib::Request&)>());
    return answer;
  }

  Workers workers_;
  Gate gate_;
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
  Http& http = *server->http_;
  http.set_socket_options([&http](socket_t sock) {
    SetSocketOptions(sock);
    http.listen_fd = sock;
  });
  http.set_keep_alive_max_count(1);
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
  // httplib listens with a backlog of 5: a burst of connections (a flood from one host) would
  // overflow it and drop other hosts' connection attempts for a second each. The Gate bounds
  // what is held; the kernel may queue as many as it allows.
  if (const int fd = http.listen_fd.load(); fd >= 0) ::listen(fd, SOMAXCONN);
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
  // Every connection is closed and the workers stop; a connection accepted after that is closed
  // at once.
  http_->StopConnections();
  http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace rdzv
