// ConnectionTable: the connections rdzvd holds open, by the host they come from, and who makes
// room when a host reaches its bounds. No credential is needed to open a connection, so the
// bounds must not let one user of a host (a login node, a compute node that runs several jobs)
// keep the host's other users out:
//
//   - A connection that has carried a call rdzvd accepted (an authenticated one) is proven: it
//     is never closed to make room, nor for being unused.
//   - The host's unproven connections share a smaller budget (max_unproven_per_host). When a
//     new connection would take the host past it, or past its bound for all connections
//     (max_per_host), an unproven connection of that host is dropped to make room: one chosen at
//     random among those older than their grace (the time a newcomer has to prove itself), else
//     the oldest. The newcomer is refused only when the host's connections are all proven. This
//     is sshd's MaxStartups (random early drop) and LoginGraceTime, applied per host.
//   - An unproven connection that has carried no accepted call first_call_within after it opened
//     is overdue and handed back to be closed, whatever it holds.
//
// It sees connections open (Admit) but not close: gRPC closes them without telling. Whether a
// recorded one is still open is asked of the caller (`is_open`) when a host reaches a bound and
// in Sweep(). Each connection is named by its host and port, as gRPC names a call's peer, and
// carries the caller's handle for it (a socket and its inode, in rdzvd).
//
// Pure: no clock, no I/O, no randomness of its own; the time (microseconds of a clock the caller
// keeps) and a random number are passed in.
// Not thread-safe.
#ifndef RDZV_GUARD_CORE_CONNECTION_TABLE_H_
#define RDZV_GUARD_CORE_CONNECTION_TABLE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/core/rendezvous_types.h"

namespace rdzv {

class ConnectionTable {
 public:
  // What the caller knows a connection by: its socket and the socket's inode, which tells it
  // from a later socket that reuses the number.
  struct Handle {
    int fd = -1;
    uint64_t inode = 0;
    friend bool operator==(const Handle& a, const Handle& b) {
      return a.fd == b.fd && a.inode == b.inode;
    }
  };
  using IsOpen = std::function<bool(const Handle&)>;

  struct Limits {
    // Connections one host may hold open (0: any number).
    int max_per_host = 0;
    // Of those, how many may not have carried an accepted call yet (0: max_per_host).
    int max_unproven_per_host = 0;
    // How long a new connection is spared when room is made, if an older one can go instead.
    absl::Duration grace = absl::ZeroDuration();
    // An unproven connection this long after it opened is overdue (zero: never).
    absl::Duration first_call_within = absl::ZeroDuration();
  };

  explicit ConnectionTable(Limits limits);
  // `max_per_host` for all connections and unproven ones alike, no grace.
  ConnectionTable(int max_per_host, absl::Duration first_call_within)
      : ConnectionTable(Limits{max_per_host, 0, absl::ZeroDuration(), first_call_within}) {}

  struct Admission {
    // False when the host's connections are all proven and at max_per_host: the newcomer is
    // refused and nothing recorded.
    bool admitted = false;
    // Unproven connections of the host dropped to make room, forgotten here: the caller closes
    // those `is_open` still confirms.
    std::vector<Handle> dropped;
  };

  // Records a connection from `host` (its address as text) and `port`, opened at `now`, making
  // room as the class comment says. `random` is any uniformly random number; it picks the one
  // dropped among several candidates.
  Admission Admit(absl::string_view host, uint16_t port, Handle handle, Micros now,
                  const IsOpen& is_open, uint64_t random = 0);

  // The connection from `host`:`port` carried a call that rdzvd accepted: it is proven, never
  // dropped nor overdue.
  void CallAccepted(absl::string_view host, uint16_t port);

  // The handle of the connection from `host`:`port`, if recorded.
  std::optional<Handle> Find(absl::string_view host, uint16_t port) const;

  // The connections open since before now - first_call_within that carried no accepted call,
  // forgotten here: the caller closes those `is_open` still confirms.
  std::vector<Handle> TakeOverdue(Micros now);

  // Forgets every connection `is_open` no longer confirms. The caller runs it now and then (its
  // cost is one check per recorded connection), so that hosts that have gone leave nothing.
  void Sweep(const IsOpen& is_open);

  // Connections recorded (open, or closed since the last check).
  size_t size() const { return size_; }
  // Connections refused, and unproven connections dropped to make room, since the start.
  int64_t refused() const { return refused_; }
  int64_t dropped() const { return dropped_; }

 private:
  struct Connection {
    Handle handle;
    Micros opened = 0;
    bool called = false;
  };
  using Ports = absl::flat_hash_map<uint16_t, Connection>;

  // Forgets `host`'s connections that are no longer open.
  void Prune(Ports& ports, const IsOpen& is_open);
  // Whether one more connection would take `ports` past a bound.
  bool Full(const Ports& ports) const;

  const Limits limits_;
  absl::flat_hash_map<std::string, Ports> hosts_;
  // Connections in the order they opened, for TakeOverdue: one not found (or found with another
  // handle) has closed or been replaced since.
  struct Opened {
    Micros at = 0;
    std::string host;
    uint16_t port;
    Handle handle;
  };
  std::deque<Opened> opened_;
  size_t size_ = 0;
  int64_t refused_ = 0;
  int64_t dropped_ = 0;
};

}  // namespace rdzv

#endif  // RDZV_GUARD_CORE_CONNECTION_TABLE_H_
