// The parts of a JoinSpec that describe this host: the addresses other nodes can reach it at
// (for MASTER_ADDR, should it get rank 0) and a free port for rank 0's TCPStore (MASTER_PORT).
// Part of librdzv, so that a custom launcher chooses them exactly as rdzv-agent does.
//
//   rdzv::JoinSpec spec = ...;
//   absl::StatusOr<rdzv::ReservedPort> port = rdzv::PrepareLocalEndpoint(spec, "head");
//   auto assignment = client->Join(spec, handlers);
//   port->Release();  // just before the workers start, so that rank 0 can bind it
//
// These touch sockets but send no traffic. Thread-safe.
#ifndef RDZV_CLIENT_LOCAL_ENDPOINT_H_
#define RDZV_CLIENT_LOCAL_ENDPOINT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/core/rendezvous_types.h"
#include "common/net.h"

namespace rdzv {

// This host's addresses, best first: the one on the route toward `server_host` (the
// rendezvous server; the other nodes reach the same server, so they can reach that address
// too), then the addresses of every interface that is up. An empty `server_host` means
// loopback.
std::vector<std::string> ReachableAddresses(absl::string_view server_host);

// Sets spec.addresses to ReachableAddresses(server_host) and spec.master_port to a port that is
// free here, reserved until the returned object releases it.
absl::StatusOr<ReservedPort> PrepareLocalEndpoint(JoinSpec& spec, absl::string_view server_host);

}  // namespace rdzv

#endif  // RDZV_CLIENT_LOCAL_ENDPOINT_H_
