#include "guard/connection_guard.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpc/impl/codegen/sync_generic.h>
#include <grpcpp/impl/server_builder_option.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <optional>
#include <random>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"

// gRPC's socket mutator, as gRPC 1.51's core defines it (src/core/lib/iomgr/socket_mutator.h,
// which Debian does not ship): its only hook at a server's accept. guard/CMakeLists.txt refuses
// another gRPC version until this is checked against it.
struct grpc_mutate_socket_info {
  int fd;
  int usage;  // grpc_fd_usage
};
struct grpc_socket_mutator_vtable {
  bool (*mutate_fd)(int fd, grpc_socket_mutator* mutator);
  int (*compare)(grpc_socket_mutator* a, grpc_socket_mutator* b);
  void (*destroy)(grpc_socket_mutator* mutator);
  bool (*mutate_fd_2)(const grpc_mutate_socket_info* info, grpc_socket_mutator* mutator);
};
struct grpc_socket_mutator {
  const grpc_socket_mutator_vtable* vtable;
  gpr_refcount refcount;
};
void grpc_socket_mutator_init(grpc_socket_mutator* mutator,
                              const grpc_socket_mutator_vtable* vtable);

namespace rdzv {
namespace {

constexpr int kServerConnectionUsage = 2;  // GRPC_FD_SERVER_CONNECTION_USAGE
// How often closed connections are forgotten: each sweep checks every recorded one.
constexpr absl::Duration kSweepEvery = absl::Seconds(10);

struct Peer {
  std::string host;
  uint16_t port = 0;
};

// The host and port of an IP socket address; nullopt for other kinds (Unix sockets).
std::optional<Peer> PeerOf(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(addr);
    inet_ntop(AF_INET, &in.sin_addr, text, sizeof(text));
    return Peer{text, ntohs(in.sin_port)};
  }
  if (addr.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(addr);
    if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) {
      inet_ntop(AF_INET, &in6.sin6_addr.s6_addr[12], text, sizeof(text));
    } else {
      inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof(text));
    }
    return Peer{text, ntohs(in6.sin6_port)};
  }
  return std::nullopt;
}

// gRPC's name of a call's peer ("ipv4:10.0.0.1:41234", "ipv6:[::1]:41234", "ipv6:[fe80::1%25
// eth0]:5") in PeerOf's terms; nullopt for other kinds.
std::optional<Peer> PeerOf(absl::string_view uri) {
  if (!absl::ConsumePrefix(&uri, "ipv4:") && !absl::ConsumePrefix(&uri, "ipv6:")) {
    return std::nullopt;
  }
  const size_t colon = uri.rfind(':');
  uint32_t port;
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(uri.substr(colon + 1), &port) ||
      port > 65535) {
    return std::nullopt;
  }
  absl::string_view host = uri.substr(0, colon);
  absl::ConsumePrefix(&host, "[");
  absl::ConsumeSuffix(&host, "]");
  host = host.substr(0, host.find('%'));
  sockaddr_storage addr = {};
  const std::string text(host);
  if (inet_pton(AF_INET, text.c_str(), &reinterpret_cast<sockaddr_in&>(addr).sin_addr) == 1) {
    addr.ss_family = AF_INET;
  } else if (inet_pton(AF_INET6, text.c_str(), &reinterpret_cast<sockaddr_in6&>(addr).sin6_addr) ==
             1) {
    addr.ss_family = AF_INET6;
  } else {
    return std::nullopt;
  }
  std::optional<Peer> peer = PeerOf(addr);
  if (peer) peer->port = static_cast<uint16_t>(port);
  return peer;
}

std::optional<uint64_t> InodeOf(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return std::nullopt;
  return st.st_ino;
}

bool IsOpen(const ConnectionTable::Handle& handle) { return InodeOf(handle.fd) == handle.inode; }

// Shuts down the connection of `handle` if it is still that socket; true when it was. A
// duplicate pins the socket: once its inode matches, the shutdown reaches that socket even if
// gRPC closes the number meanwhile.
bool ShutDown(const ConnectionTable::Handle& handle) {
  const int dup = fcntl(handle.fd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return false;
  const bool same = InodeOf(dup) == handle.inode;
  if (same) shutdown(dup, SHUT_RDWR);
  close(dup);
  return same;
}

// Turns TCP keepalive on for `fd` as `k` says; a failure leaves the socket as it was (gRPC's
// own pings, when on, still watch it).
void ApplyKeepalive(int fd, const TcpKeepalive& k) {
  if (k.idle <= absl::ZeroDuration()) return;
  const int idle_s = static_cast<int>(
      std::clamp<int64_t>(absl::ToInt64Seconds(absl::Ceil(k.idle, absl::Seconds(1))), 1, 32767));
  const int64_t timeout_ms = absl::ToInt64Milliseconds(k.timeout);
  // The bound itself is TCP_USER_TIMEOUT, which Linux applies to probes as to data; the count is
  // what an older kernel would go by instead.
  const unsigned user_timeout_ms =
      static_cast<unsigned>(std::min<int64_t>(idle_s * int64_t{1000} + timeout_ms, INT32_MAX));
  const int count = static_cast<int>(std::clamp<int64_t>(timeout_ms / (idle_s * 1000) + 1, 1, 127));
  const int on = 1;
  if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof(idle_s)) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &idle_s, sizeof(idle_s)) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count)) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms)) !=
          0) {
    SPDLOG_DEBUG("cannot turn on TCP keepalive on a connection: {}", std::strerror(errno));
  }
}

}  // namespace

struct ConnectionGuard::State {
  State(ConnectionTable::Limits limits, TcpKeepalive keepalive)
      : table(limits), keepalive(keepalive) {}

  // At accept, on one of gRPC's threads. A refused socket is shut down here, and gRPC, finding
  // it closed, drops it: returning false would stop gRPC 1.51's listener from accepting anything
  // more.
  void Accepted(int fd) {
    sockaddr_storage addr = {};
    socklen_t len = sizeof(addr);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return;
    const std::optional<Peer> peer = PeerOf(addr);
    const std::optional<uint64_t> inode = InodeOf(fd);
    if (!peer || !inode) return;
    absl::MutexLock lock(&mu);
    const ConnectionTable::Admission admission = table.Admit(
        peer->host, peer->port, {fd, *inode}, absl::ToUnixMicros(absl::Now()), IsOpen, rng());
    for (const ConnectionTable::Handle& handle : admission.dropped) ShutDown(handle);
    if (!admission.dropped.empty() &&
        (table.dropped() == 1 || absl::Now() - last_drop_log >= absl::Seconds(10))) {
      last_drop_log = absl::Now();
      spdlog::warn(
          "dropped a connection from {} that had not authenticated, to make room for a new one: "
          "that host is at its bound of connections (--max-unproven-connections-per-host, "
          "--max-connections-per-host); {} dropped so far",
          peer->host, table.dropped());
    }
    if (admission.admitted) {
      ApplyKeepalive(fd, keepalive);
      return;
    }
    shutdown(fd, SHUT_RDWR);
    if (table.refused() == 1 || absl::Now() - last_refusal_log >= absl::Seconds(10)) {
      last_refusal_log = absl::Now();
      spdlog::warn(
          "refused a connection from {}: that host holds the most connections one host may "
          "(--max-connections-per-host), all of them authenticated; {} refused so far",
          peer->host, table.refused());
    }
  }

  absl::Mutex mu;
  ConnectionTable table ABSL_GUARDED_BY(mu);
  const TcpKeepalive keepalive;
  absl::Time last_refusal_log ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  absl::Time last_drop_log ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  std::mt19937_64 rng ABSL_GUARDED_BY(mu){std::random_device{}()};
  absl::Time last_sweep ABSL_GUARDED_BY(mu) = absl::Now();
  int64_t closed_unused ABSL_GUARDED_BY(mu) = 0;
};

namespace {

// The mutator gRPC holds: a reference to the guard's state.
struct Mutator {
  grpc_socket_mutator base;  // first: gRPC sees a pointer to it
  std::shared_ptr<ConnectionGuard::State> state;
};

bool MutateLegacy(int /*fd*/, grpc_socket_mutator* /*mutator*/) { return true; }

bool Mutate(const grpc_mutate_socket_info* info, grpc_socket_mutator* mutator) {
  if (info->usage == kServerConnectionUsage) {
    reinterpret_cast<Mutator*>(mutator)->state->Accepted(info->fd);
  }
  return true;
}

int Compare(grpc_socket_mutator* a, grpc_socket_mutator* b) { return a < b ? -1 : (a > b ? 1 : 0); }

void Destroy(grpc_socket_mutator* mutator) { delete reinterpret_cast<Mutator*>(mutator); }

const grpc_socket_mutator_vtable kVtable = {MutateLegacy, Compare, Destroy, Mutate};

class Option final : public grpc::ServerBuilderOption {
 public:
  explicit Option(std::shared_ptr<ConnectionGuard::State> state) : state_(std::move(state)) {}
  void UpdateArguments(grpc::ChannelArguments* args) override {
    auto* mutator = new Mutator{{}, state_};
    grpc_socket_mutator_init(&mutator->base, &kVtable);
    args->SetSocketMutator(&mutator->base);  // takes the reference init made
  }
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>*) override {}

 private:
  std::shared_ptr<ConnectionGuard::State> state_;
};

}  // namespace

ConnectionGuard::ConnectionGuard(ConnectionTable::Limits limits, TcpKeepalive keepalive)
    : state_(std::make_shared<State>(limits, keepalive)) {}

ConnectionGuard::~ConnectionGuard() = default;

void ConnectionGuard::InstallOn(grpc::ServerBuilder* builder) {
  builder->SetOption(std::make_unique<Option>(state_));
}

void ConnectionGuard::CallAccepted(absl::string_view peer) {
  const std::optional<Peer> p = PeerOf(peer);
  if (!p) return;
  absl::MutexLock lock(&state_->mu);
  state_->table.CallAccepted(p->host, p->port);
}

void ConnectionGuard::Tick() {
  std::vector<ConnectionTable::Handle> overdue;
  {
    absl::MutexLock lock(&state_->mu);
    const absl::Time now = absl::Now();
    overdue = state_->table.TakeOverdue(absl::ToUnixMicros(now));
    if (now - state_->last_sweep >= kSweepEvery) {
      state_->last_sweep = now;
      state_->table.Sweep(IsOpen);
    }
  }
  int64_t closed = 0;
  for (const ConnectionTable::Handle& handle : overdue) closed += ShutDown(handle) ? 1 : 0;
  if (closed > 0) {
    absl::MutexLock lock(&state_->mu);
    state_->closed_unused += closed;
  }
}

bool ConnectionGuard::ConnectionUp(absl::string_view peer) const {
  const std::optional<Peer> p = PeerOf(peer);
  if (!p) return false;
  std::optional<ConnectionTable::Handle> handle;
  {
    absl::MutexLock lock(&state_->mu);
    handle = state_->table.Find(p->host, p->port);
  }
  if (!handle) return false;
  const int dup = fcntl(handle->fd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return false;
  bool up = false;
  if (InodeOf(dup) == handle->inode) {
    // A peer that closed (its process ended: FIN) or reset the connection is past ESTABLISHED.
    tcp_info info = {};
    socklen_t len = sizeof(info);
    up = getsockopt(dup, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 &&
         info.tcpi_state == TCP_ESTABLISHED;
  }
  close(dup);
  return up;
}

int64_t ConnectionGuard::refused() const {
  absl::MutexLock lock(&state_->mu);
  return state_->table.refused();
}

int64_t ConnectionGuard::dropped() const {
  absl::MutexLock lock(&state_->mu);
  return state_->table.dropped();
}

int64_t ConnectionGuard::closed_unused() const {
  absl::MutexLock lock(&state_->mu);
  return state_->closed_unused;
}

}  // namespace rdzv
