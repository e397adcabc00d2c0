// Endpoints as text: "host:port" parsed and written, and whether an address is loopback. Pure:
// no name is resolved (common/net.h holds the helpers that touch sockets).
#ifndef RDZV_COMMON_CORE_HOST_PORT_H_
#define RDZV_COMMON_CORE_HOST_PORT_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rdzv {

// The most servers one server list names (a primary and its backups: --rdzv-endpoint a,b and
// rdzvd --peers), wherever a list is taken.
inline constexpr size_t kMaxServerList = 8;

// The servers of a list "host:port,host:port" (a primary and its backups, in order) as written,
// each without the white space around it. `taken` places of the list are held by servers not in
// `text` (rdzvd itself, for its --peers). InvalidArgument naming the list as `what` (the flag it
// came from) and saying the fix, for an empty entry or for more servers than the list has room
// for.
absl::StatusOr<std::vector<std::string>> SplitServerList(absl::string_view what,
                                                         absl::string_view text, size_t taken = 0);

struct HostPort {
  std::string host;  // without brackets for IPv6
  int port = 0;
};

// Parses "host:port", "[v6addr]:port" or "host" (then `default_port`). InvalidArgument with
// the expected form on anything else.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view text, int default_port);

// "host:port", bracketing IPv6 literals; what gRPC and MASTER_ADDR-style consumers expect.
std::string FormatHostPort(absl::string_view host, int port);

// Whether `address` is "localhost", ::1 or in 127.0.0.0/8 (brackets allowed); names are not
// resolved.
bool IsLoopbackAddress(absl::string_view address);

}  // namespace rdzv

#endif  // RDZV_COMMON_CORE_HOST_PORT_H_
