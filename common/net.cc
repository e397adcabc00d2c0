#include "common/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace rdzv {
namespace {

std::string AddressText(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof(buf));
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

}  // namespace

bool IsIpAddress(const std::string& host) {
  unsigned char buf[sizeof(struct in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

std::vector<std::string> ResolveAddresses(const std::string& host) {
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return {};
  std::vector<std::string> addresses;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) continue;
    std::string text = AddressText(ai->ai_addr);
    if (!text.empty() && std::find(addresses.begin(), addresses.end(), text) == addresses.end()) {
      addresses.push_back(std::move(text));
    }
  }
  freeaddrinfo(found);
  return addresses;
}

bool ReachesOnlyThisHost(const std::string& host) {
  if (IsLoopbackAddress(host)) return true;
  if (IsIpAddress(host)) return false;
  const std::vector<std::string> addresses = ResolveAddresses(host);
  return !addresses.empty() &&
         std::all_of(addresses.begin(), addresses.end(),
                     [](const std::string& a) { return IsLoopbackAddress(a); });
}

bool AnyListening(const std::vector<std::string>& endpoints, absl::Duration timeout) {
  for (const std::string& endpoint : endpoints) {
    absl::StatusOr<HostPort> hp = ParseHostPort(endpoint, 0);
    if (!hp.ok() || hp->port <= 0) continue;
    sockaddr_storage addr = {};
    socklen_t len = 0;
    auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
    if (inet_pton(AF_INET, hp->host.c_str(), &v4->sin_addr) == 1) {
      v4->sin_family = AF_INET;
      v4->sin_port = htons(static_cast<uint16_t>(hp->port));
      len = sizeof(*v4);
    } else if (inet_pton(AF_INET6, hp->host.c_str(), &v6->sin6_addr) == 1) {
      v6->sin6_family = AF_INET6;
      v6->sin6_port = htons(static_cast<uint16_t>(hp->port));
      len = sizeof(*v6);
    } else {
      continue;
    }
    const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    bool up = connect(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0;
    if (!up && errno == EINPROGRESS) {
      pollfd p = {fd, POLLOUT, 0};
      if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) == 1) {
        int err = 0;
        socklen_t err_len = sizeof(err);
        up = getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len) == 0 && err == 0;
      }
    }
    close(fd);
    if (up) return true;
  }
  return false;
}

absl::StatusOr<std::string> LocalAddressToward(absl::string_view host, int port) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const std::string host_str(host);
  const std::string port_str = absl::StrCat(port);
  if (int rc = getaddrinfo(host_str.c_str(), port_str.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(
        absl::StrFormat("cannot resolve \"%s\": %s", host, gai_strerror(rc)));
  }
  absl::StatusOr<std::string> result =
      absl::UnavailableError(absl::StrFormat("no route to \"%s\"", host));
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local = {};
    socklen_t len = sizeof(local);
    // Connecting a UDP socket sends nothing; it only makes the kernel pick the route.
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      result = AddressText(reinterpret_cast<sockaddr*>(&local));
      close(fd);
      break;
    }
    close(fd);
  }
  freeaddrinfo(found);
  return result;
}

std::vector<std::string> InterfaceAddresses() {
  std::vector<std::string> v4, v6;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return {};
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) {
      continue;
    }
    if (i->ifa_addr->sa_family == AF_INET) {
      v4.push_back(AddressText(i->ifa_addr));
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      const auto* a6 = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
      if (!IN6_IS_ADDR_LINKLOCAL(&a6->sin6_addr)) v6.push_back(AddressText(i->ifa_addr));
    }
  }
  freeifaddrs(list);
  v4.insert(v4.end(), v6.begin(), v6.end());
  return v4;
}

absl::StatusOr<ReservedPort> ReservedPort::Reserve() {
  const int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  const int on = 1;
  const int off = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
  sockaddr_in6 addr = {};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_any;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot reserve a free port: ", strerror(err)));
  }
  return ReservedPort(fd, ntohs(addr.sin6_port));
}

ReservedPort::ReservedPort(ReservedPort&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), port_(other.port_) {}

ReservedPort& ReservedPort::operator=(ReservedPort&& other) noexcept {
  if (this != &other) {
    Release();
    fd_ = std::exchange(other.fd_, -1);
    port_ = other.port_;
  }
  return *this;
}

ReservedPort::~ReservedPort() { Release(); }

void ReservedPort::Release() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

}  // namespace rdzv
