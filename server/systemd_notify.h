// Readiness for systemd's Type=notify services: the sd_notify protocol (one datagram such as
// "READY=1" to the unix socket named by $NOTIFY_SOCKET), spoken directly so that rdzvd needs no
// libsystemd. A name starting with '@' is an abstract socket.
//
// Thread-safe; each call opens and closes its own socket.
#ifndef RDZV_SERVER_SYSTEMD_NOTIFY_H_
#define RDZV_SERVER_SYSTEMD_NOTIFY_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace rdzv {

// Sends `state` (e.g. "READY=1\nSTATUS=serving on :29400") to `socket_path`, the value of
// $NOTIFY_SOCKET. Does nothing and returns OK when `socket_path` is empty (not started by
// systemd, or not as Type=notify). InvalidArgument for a path too long for a unix socket;
// Unavailable when the datagram cannot be sent.
absl::Status NotifySystemd(const std::string& socket_path, absl::string_view state);

}  // namespace rdzv

#endif  // RDZV_SERVER_SYSTEMD_NOTIFY_H_
