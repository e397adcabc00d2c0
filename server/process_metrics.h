// Process figures for the process_* metrics (CPU time, memory, threads, file descriptors, start
// time), read from /proc/self the way Prometheus's client libraries define them.
//
// The parsers are pure and unit-tested; ReadProcessStats() is the shell that reads the files.
// All functions are thread-safe.
#ifndef RDZV_SERVER_PROCESS_METRICS_H_
#define RDZV_SERVER_PROCESS_METRICS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rdzv {

// The fields of /proc/PID/stat that the metrics use, in the file's units.
struct ProcStat {
  int64_t utime_ticks = 0;  // user CPU time, in clock ticks
  int64_t stime_ticks = 0;  // system CPU time, in clock ticks
  int64_t num_threads = 0;
  int64_t start_ticks = 0;  // start time, in clock ticks after boot
  int64_t vsize_bytes = 0;
  int64_t rss_pages = 0;
};

// Parses /proc/PID/stat. The command name (field 2) may hold spaces and parentheses, so the
// fields are counted from its last ')'. InvalidArgument when a field is missing or not a number.
absl::StatusOr<ProcStat> ParseProcStat(absl::string_view text);

// The boot time, in seconds since the epoch, from the "btime" line of /proc/stat.
absl::StatusOr<int64_t> ParseBootTime(absl::string_view proc_stat);

struct ProcessStats {
  double cpu_seconds = 0;  // user + system
  int64_t resident_memory_bytes = 0;
  int64_t virtual_memory_bytes = 0;
  int64_t threads = 0;
  // Since the epoch; 0 when unknown (no /proc/stat, as under systemd's ProcSubset=pid).
  double start_time_seconds = 0;
  int64_t open_fds = 0;
  int64_t max_fds = 0;  // the soft RLIMIT_NOFILE
};

// Reads this process's figures from /proc/self (and /proc/stat once, for the boot time).
// Costs a few file reads and a directory listing of /proc/self/fd (one entry per descriptor).
absl::StatusOr<ProcessStats> ReadProcessStats();

}  // namespace rdzv

#endif  // RDZV_SERVER_PROCESS_METRICS_H_
