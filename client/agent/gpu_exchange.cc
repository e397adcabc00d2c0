#include "client/agent/gpu_exchange.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace rdzv {
namespace {

// A GPU as CUDA_VISIBLE_DEVICES names it: an index, or a UUID such as GPU-5d6f...; anything else
// read back from the directory is not taken for one.
constexpr size_t kMaxDeviceBytes = 96;
// More entries than any node has GPUs: a count above it is not read.
constexpr int kMaxEntries = 4096;

bool IsDeviceName(const std::string& device) {
  if (device.empty() || device.size() > kMaxDeviceBytes) return false;
  for (char ch : device) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(ch)) && ch != '-') return false;
  }
  return true;
}

absl::Status Errno(const std::string& what) {
  return absl::FailedPreconditionError(absl::StrCat(what, ": ", std::strerror(errno)));
}

std::string EntryPath(const std::string& dir, int local_id) {
  return absl::StrCat(dir, "/", local_id);
}

}  // namespace

absl::StatusOr<std::unique_ptr<GpuExchange>> GpuExchange::Publish(const std::string& dir,
                                                                  int local_id,
                                                                  const std::string& device) {
  if (local_id < 0 || local_id >= kMaxEntries || !IsDeviceName(device)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("no GPU to share for local id %d (\"%s\")", local_id, device));
  }
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return Errno("mkdir " + dir);
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0) return Errno("stat " + dir);
  // Anyone may make a directory of that name in /tmp first: only one of our own, that no one
  // else may write to, is trusted to hold the step's GPUs.
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, " is not a directory of this user's with mode 0700"));
  }
  const std::string entry = EntryPath(dir, local_id);
  const std::string tmp = absl::StrCat(entry, ".", getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("open " + tmp);
  const std::string text = device + "\n";
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  if (close(fd) != 0 || !written || rename(tmp.c_str(), entry.c_str()) != 0) {
    absl::Status s = Errno("write " + entry);
    unlink(tmp.c_str());
    return s;
  }
  return std::unique_ptr<GpuExchange>(new GpuExchange(dir, entry));
}

GpuExchange::~GpuExchange() {
  unlink(entry_.c_str());
  // The last task of the node to go removes the directory; the others find it not yet empty.
  rmdir(dir_.c_str());
}

std::vector<std::string> GpuExchange::Collect(int count) const {
  if (count < 1 || count > kMaxEntries) return {};
  std::vector<std::string> devices;
  for (int i = 0; i < count; ++i) {
    const int fd = open(EntryPath(dir_, i).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return {};
    char buf[kMaxDeviceBytes + 2];
    const ssize_t n = read(fd, buf, sizeof(buf));
    close(fd);
    if (n <= 0) return {};
    std::string device(absl::StripAsciiWhitespace(absl::string_view(buf, n)));
    if (!IsDeviceName(device)) return {};
    devices.push_back(std::move(device));
  }
  return devices;
}

}  // namespace rdzv
