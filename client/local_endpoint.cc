#include "client/local_endpoint.h"

#include <utility>

namespace rdzv {

std::vector<std::string> ReachableAddresses(absl::string_view server_host) {
  std::vector<std::string> addresses;
  const absl::string_view toward = server_host.empty() ? "127.0.0.1" : server_host;
  // The port only selects a route; nothing is sent.
  if (absl::StatusOr<std::string> a = LocalAddressToward(toward, 29400); a.ok()) {
    addresses.push_back(*std::move(a));
  }
  for (std::string& a : InterfaceAddresses()) addresses.push_back(std::move(a));
  return addresses;
}

absl::StatusOr<ReservedPort> PrepareLocalEndpoint(JoinSpec& spec, absl::string_view server_host) {
  absl::StatusOr<ReservedPort> port = ReservedPort::Reserve();
  if (!port.ok()) return port.status();
  spec.addresses = ReachableAddresses(server_host);
  spec.master_port = port->port();
  return port;
}

}  // namespace rdzv
