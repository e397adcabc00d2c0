#include "server/systemd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace rdzv {

absl::Status NotifySystemd(const std::string& socket_path, absl::string_view state) {
  if (socket_path.empty()) return absl::OkStatus();
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(address.sun_path) ||
      (socket_path[0] != '/' && socket_path[0] != '@')) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "NOTIFY_SOCKET=\"%s\" is not a unix socket path; unset it or start rdzvd from systemd",
        socket_path));
  }
  std::memcpy(address.sun_path, socket_path.data(), socket_path.size());
  if (socket_path[0] == '@') address.sun_path[0] = '\0';  // abstract namespace
  const socklen_t length =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + socket_path.size());

  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", strerror(errno)));
  const ssize_t sent = sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
                              reinterpret_cast<const sockaddr*>(&address), length);
  const int error = errno;
  close(fd);
  if (sent != static_cast<ssize_t>(state.size())) {
    return absl::UnavailableError(absl::StrFormat("cannot notify systemd at %s: %s", socket_path,
                                                  sent < 0 ? strerror(error) : "short write"));
  }
  return absl::OkStatus();
}

}  // namespace rdzv
