#include "server/process_metrics.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace rdzv {
namespace {

// Fields of /proc/PID/stat counted from the state (field 3), which follows the command name.
constexpr size_t kUtime = 14 - 3;
constexpr size_t kStime = 15 - 3;
constexpr size_t kNumThreads = 20 - 3;
constexpr size_t kStartTime = 22 - 3;
constexpr size_t kVsize = 23 - 3;
constexpr size_t kRss = 24 - 3;

absl::StatusOr<std::string> ReadSmallFile(const char* path) {
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrFormat("cannot open %s: %s", path, strerror(errno)));
  }
  std::string text;
  char buffer[4096];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return absl::UnavailableError(absl::StrFormat("cannot read %s: %s", path, strerror(error)));
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return text;
}

absl::StatusOr<int64_t> CountOpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) {
    return absl::UnavailableError(
        absl::StrFormat("cannot list /proc/self/fd: %s", strerror(errno)));
  }
  int64_t count = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count - 1;  // the descriptor that lists the directory
}

}  // namespace

absl::StatusOr<ProcStat> ParseProcStat(absl::string_view text) {
  const size_t close = text.rfind(')');
  if (close == absl::string_view::npos) {
    return absl::InvalidArgumentError("/proc/PID/stat has no ')' after the command name");
  }
  const std::vector<absl::string_view> fields =
      absl::StrSplit(text.substr(close + 1), ' ', absl::SkipWhitespace());
  ProcStat stat;
  const auto field = [&](size_t index, int64_t* out) -> absl::Status {
    if (index >= fields.size() || !absl::SimpleAtoi(fields[index], out)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("/proc/PID/stat field %d is missing or not a number", index + 3));
    }
    return absl::OkStatus();
  };
  for (const auto& [index, out] : {std::pair{kUtime, &stat.utime_ticks},
                                   {kStime, &stat.stime_ticks},
                                   {kNumThreads, &stat.num_threads},
                                   {kStartTime, &stat.start_ticks},
                                   {kVsize, &stat.vsize_bytes},
                                   {kRss, &stat.rss_pages}}) {
    if (absl::Status status = field(index, out); !status.ok()) return status;
  }
  return stat;
}

absl::StatusOr<int64_t> ParseBootTime(absl::string_view proc_stat) {
  for (absl::string_view line : absl::StrSplit(proc_stat, '\n')) {
    if (!absl::ConsumePrefix(&line, "btime ")) continue;
    int64_t seconds = 0;
    if (!absl::SimpleAtoi(line, &seconds)) {
      return absl::InvalidArgumentError("the btime line of /proc/stat is not a number");
    }
    return seconds;
  }
  return absl::InvalidArgumentError("/proc/stat has no btime line");
}

absl::StatusOr<ProcessStats> ReadProcessStats() {
  static const long ticks_per_second = sysconf(_SC_CLK_TCK);
  static const long page_size = sysconf(_SC_PAGESIZE);
  // The boot time does not change: read it once.
  static const absl::StatusOr<int64_t> boot_time = []() -> absl::StatusOr<int64_t> {
    absl::StatusOr<std::string> text = ReadSmallFile("/proc/stat");
    if (!text.ok()) return text.status();
    return ParseBootTime(*text);
  }();
  if (ticks_per_second <= 0 || page_size <= 0) {
    return absl::UnavailableError("sysconf does not know the clock tick or page size");
  }

  absl::StatusOr<std::string> text = ReadSmallFile("/proc/self/stat");
  if (!text.ok()) return text.status();
  absl::StatusOr<ProcStat> stat = ParseProcStat(*text);
  if (!stat.ok()) return stat.status();
  absl::StatusOr<int64_t> open_fds = CountOpenFds();
  if (!open_fds.ok()) return open_fds.status();

  ProcessStats stats;
  const double ticks = static_cast<double>(ticks_per_second);
  stats.cpu_seconds = static_cast<double>(stat->utime_ticks + stat->stime_ticks) / ticks;
  stats.resident_memory_bytes = stat->rss_pages * page_size;
  stats.virtual_memory_bytes = stat->vsize_bytes;
  stats.threads = stat->num_threads;
  if (boot_time.ok()) {
    stats.start_time_seconds =
        static_cast<double>(*boot_time) + static_cast<double>(stat->start_ticks) / ticks;
  }
  stats.open_fds = *open_fds;
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    stats.max_fds = static_cast<int64_t>(limit.rlim_cur);
  }
  return stats;
}

}  // namespace rdzv
