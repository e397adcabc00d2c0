// Small network helpers: endpoints, the local address other hosts can reach, free ports.
// These touch sockets but send no traffic (a UDP connect only chooses a route).
#ifndef RDZV_COMMON_NET_H_
#define RDZV_COMMON_NET_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/core/host_port.h"

namespace rdzv {

// The local address of the interface that routes to `host`: the address a peer reached
// through that same network can use to reach us. Resolves `host` first.
absl::StatusOr<std::string> LocalAddressToward(absl::string_view host, int port);

// Whether `host` is an IPv4 or IPv6 address as such (not a name).
bool IsIpAddress(const std::string& host);

// The addresses `host` resolves to here, each once, in the resolver's order; none when it
// resolves nowhere. Blocks for the resolver.
std::vector<std::string> ResolveAddresses(const std::string& host);

// Whether `host` is a loopback address, or a name that resolves to loopback addresses only.
bool ReachesOnlyThisHost(const std::string& host);

// Non-loopback addresses of this host's interfaces that are up, IPv4 first.
std::vector<std::string> InterfaceAddresses();

// Whether something accepts TCP connections at any of `endpoints` ("address:port", the address
// numeric): connects to each in turn, closing at once, and waits up to `timeout` for each answer.
// Sends no data.
bool AnyListening(const std::vector<std::string>& endpoints, absl::Duration timeout);

// A TCP port that is free on this host now, kept reserved until the object is destroyed
// (the socket stays bound, with SO_REUSEADDR so a worker can bind it right after).
class ReservedPort {
 public:
  static absl::StatusOr<ReservedPort> Reserve();
  ReservedPort(ReservedPort&& other) noexcept;
  ReservedPort& operator=(ReservedPort&& other) noexcept;
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;
  ~ReservedPort();

  int port() const { return port_; }
  // Lets the port go (before the workers that will bind it start).
  void Release();

 private:
  ReservedPort(int fd, int port) : fd_(fd), port_(port) {}
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace rdzv

#endif  // RDZV_COMMON_NET_H_
