// ConnectionTable: the connections rdzvd holds open, by the host they come from, for two bounds
// that no credential is needed to reach: how many connections one host may hold at once, and how
// long a connection may stay open before it carries a call rdzvd accepted (an authenticated
// one). A host past its bound is refused its next connection; a connection past its time is
// handed back to be closed.
//
// It sees connections open (Admit) but not close: gRPC closes them without telling. Whether a
// recorded one is still open is asked of the caller (`is_open`) when a host reaches its bound and
// in Sweep(). Each connection is named by its host and port, as gRPC names a call's peer, and
// carries the caller's handle for it (a socket and its inode, in rdzvd).
//
// Pure: no clock, no I/O; the time is passed in. Not thread-safe.
#ifndef RDZV_SERVER_CORE_CONNECTION_TABLE_H_
#define RDZV_SERVER_CORE_CONNECTION_TABLE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

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

  // `max_per_host`: connections one host may hold open (0: any number). `first_call_within`: a
  // connection that has carried no accepted call this long after it opened is overdue (zero:
  // never).
  ConnectionTable(int max_per_host, absl::Duration first_call_within);

  // Records a connection from `host` (its address as text) and `port`, opened at `now`. False,
  // and nothing recorded, when `host` already holds max_per_host connections that `is_open`
  // confirms.
  bool Admit(absl::string_view host, uint16_t port, Handle handle, absl::Time now,
             const IsOpen& is_open);

  // The connection from `host`:`port` carried a call that rdzvd accepted: it is never overdue.
  void CallAccepted(absl::string_view host, uint16_t port);

  // The handle of the connection from `host`:`port`, if recorded.
  std::optional<Handle> Find(absl::string_view host, uint16_t port) const;

  // The connections open since before now - first_call_within that carried no accepted call,
  // forgotten here: the caller closes those `is_open` still confirms.
  std::vector<Handle> TakeOverdue(absl::Time now);

  // Forgets every connection `is_open` no longer confirms. The caller runs it now and then (its
  // cost is one check per recorded connection), so that hosts that have gone leave nothing.
  void Sweep(const IsOpen& is_open);

  // Connections recorded (open, or closed since the last check).
  size_t size() const { return size_; }
  // Connections refused since the start.
  int64_t refused() const { return refused_; }

 private:
  struct Connection {
    Handle handle;
    bool called = false;
  };
  using Ports = absl::flat_hash_map<uint16_t, Connection>;

  // Forgets `host`'s connections that are no longer open.
  void Prune(Ports& ports, const IsOpen& is_open);

  const int max_per_host_;
  const absl::Duration first_call_within_;
  absl::flat_hash_map<std::string, Ports> hosts_;
  // Connections in the order they opened, for TakeOverdue: one not found (or found with another
  // handle) has closed or been replaced since.
  struct Opened {
    absl::Time at;
    std::string host;
    uint16_t port;
    Handle handle;
  };
  std::deque<Opened> opened_;
  size_t size_ = 0;
  int64_t refused_ = 0;
};

}  // namespace rdzv

#endif  // RDZV_SERVER_CORE_CONNECTION_TABLE_H_
