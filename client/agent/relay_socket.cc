#include "client/agent/relay_socket.h"

#include <dirent.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/core/file_names.h"

namespace rdzv {

absl::StatusOr<std::string> RelayDirectory(absl::string_view temp_dir, uid_t uid) {
  const std::string dir = absl::StrCat(temp_dir, "/rdzv-", uid);
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot make %s: %s", dir, std::strerror(errno)));
  }
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot stat %s: %s", dir, std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != uid || (st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is not a directory of uid %d's own that only it may enter (mode %o, owner %d); "
        "remove it",
        dir, uid, st.st_mode & 07777, st.st_uid));
  }
  return dir;
}

std::string RelaySocketPath(absl::string_view temp_dir, uid_t uid, absl::string_view job_key,
                            absl::string_view node) {
  std::string name = FileNamePart(absl::StrCat(job_key, "-", node));
  const std::string dir = absl::StrCat(temp_dir, "/rdzv-", uid, "/relay-");
  // A socket's path has room for 107 bytes; a directory too long leaves the relay unable to
  // listen, and the node's tasks then join directly.
  const size_t limit = sizeof(sockaddr_un::sun_path) - 1;
  const size_t room = dir.size() + 5 + 8 < limit ? limit - dir.size() - 5 : 8;
  if (name.size() > room) name = name.substr(name.size() - room);
  return absl::StrCat(dir, name, ".sock");
}

bool RelayListening(const std::string& socket_path) {
  const size_t slash = socket_path.rfind('/');
  if (slash == std::string::npos) return false;
  struct stat st;
  const std::string dir = socket_path.substr(0, slash);
  if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() ||
      (st.st_mode & 077) != 0) {
    return false;
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(addr.sun_path)) return false;
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;
  const bool up = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 ||
                  errno == EAGAIN || errno == EINPROGRESS;
  close(fd);
  return up;
}

void SweepDeadSockets(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  const time_t made_before = time(nullptr) - 60;
  int looked = 0, removed = 0;
  while (const dirent* entry = readdir(d)) {
    const absl::string_view name = entry->d_name;
    if (!absl::StartsWith(name, "relay-") || !absl::EndsWith(name, ".sock")) continue;
    if (++looked > 256) break;
    const std::string path = absl::StrCat(dir, "/", name);
    struct stat st;
    if (lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_uid != getuid() ||
        st.st_mtime > made_before || RelayListening(path)) {
      continue;
    }
    if (unlink(path.c_str()) == 0) ++removed;
  }
  closedir(d);
  if (removed > 0)
    SPDLOG_DEBUG("removed {} relay sockets no relay listens on from {}", removed, dir);
}

absl::StatusOr<std::string> RelaySocketDirectory(absl::string_view socket_path, uid_t uid) {
  const size_t slash = socket_path.rfind('/');
  if (slash == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the relay socket %s is not a path", socket_path));
  }
  // RelaySocketPath's directory, TEMP/rdzv-UID, checked (and made) as RelayDirectory does.
  const absl::string_view parent = socket_path.substr(0, slash);
  const std::string own = absl::StrCat("/rdzv-", uid);
  if (!absl::EndsWith(parent, own)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the relay socket %s is not in a directory %s", socket_path, own.substr(1)));
  }
  return RelayDirectory(parent.substr(0, parent.size() - own.size()), uid);
}

}  // namespace rdzv
