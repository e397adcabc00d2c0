// ConnectionGuard: the bounds rdzvd keeps on connections before any credential is shown
// (ConnectionTable, which decides): at most so many open connections per host, and of them
// fewer that have not yet carried an accepted (authenticated) call; at a bound an unproven
// connection of that host is dropped to make room (a newcomer is refused only when all of the
// host's connections are proven); and a connection that has carried no accepted call some time
// after it opened is closed, whatever it holds (silence, streams that never send their message,
// refused calls).
//
// It sees each connection gRPC accepts through a socket mutator, the one hook gRPC's listener
// offers at accept, on plaintext and TLS alike (before the handshake); a refused socket is shut
// down there, and gRPC drops it. The calls rdzvd accepts are reported by the service
// (CallAccepted, with the call's peer). A connection past its time is shut down through a
// duplicate of its socket, checked to be the same socket first, so that a number gRPC has
// closed and reused meanwhile is never touched.
//
// Thread-safe. Owned by the server; gRPC's listener holds a reference to its state for as long
// as it needs it.
#ifndef RDZV_GUARD_CONNECTION_GUARD_H_
#define RDZV_GUARD_CONNECTION_GUARD_H_

#include <grpcpp/server_builder.h>

#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "guard/core/connection_table.h"

namespace rdzv {

// How the kernel watches the host at the other end of each accepted connection (TCP keepalive):
// after `idle` without traffic it sends a probe, and another each `idle` (whole seconds, at least
// one); once the peer's host has acknowledged nothing, probe or data, for `idle` + `timeout`, the
// connection is dropped, and gRPC sees it fail. The peer's kernel answers, not its process, so a
// busy peer is never taken for a lost one, and the probes cost this process nothing.
struct TcpKeepalive {
  absl::Duration idle = absl::ZeroDuration();  // zero: no probes
  absl::Duration timeout = absl::ZeroDuration();
};

class ConnectionGuard {
 public:
  explicit ConnectionGuard(ConnectionTable::Limits limits, TcpKeepalive keepalive = {});
  // `max_per_host` for all connections and unproven ones alike, no grace: 0 for no bound;
  // `first_call_within`: zero for no time limit.
  ConnectionGuard(int max_per_host, absl::Duration first_call_within, TcpKeepalive keepalive = {})
      : ConnectionGuard(
            ConnectionTable::Limits{max_per_host, 0, absl::ZeroDuration(), first_call_within},
            keepalive) {}
  ~ConnectionGuard();
  ConnectionGuard(const ConnectionGuard&) = delete;
  ConnectionGuard& operator=(const ConnectionGuard&) = delete;

  // Sees every connection of the server `builder` builds next.
  void InstallOn(grpc::ServerBuilder* builder);

  // A call from `peer` (grpc::ServerContext::peer(), "ipv4:10.0.0.1:41234") was accepted.
  void CallAccepted(absl::string_view peer);

  // Whether the connection of `peer` is still up: open here and not closed by its other end.
  // False when it is gone, closing, or unknown. A few system calls; does not block.
  bool ConnectionUp(absl::string_view peer) const;

  // Closes the connections past their time, and now and then forgets closed ones. Call about
  // once a second; does not block on the network.
  void Tick();

  // Connections refused at accept, unproven ones dropped to make room for a newcomer of their
  // host, and ones closed for carrying no accepted call, since the start.
  int64_t refused() const;
  int64_t dropped() const;
  int64_t closed_unused() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace rdzv

#endif  // RDZV_GUARD_CONNECTION_GUARD_H_
