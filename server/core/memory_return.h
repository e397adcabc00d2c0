// MemoryReturn: when rdzvd hands memory it has freed back to the kernel (malloc_trim). glibc's
// malloc keeps freed memory for reuse; after an attack, or a large job, ends, rdzvd would stay at
// its peak. Trimming walks the whole heap and holds malloc's locks meanwhile, so it is done only
// when memory was given up and nothing is growing: when the bytes the service counts for attached
// agents have fallen well below their peak since the last trim, or when the process holds much
// more than it did after the last trim while the count stands still. At most once per interval.
//
// Pure: the caller passes the time and both sizes. Not thread-safe.
#ifndef RDZV_SERVER_CORE_MEMORY_RETURN_H_
#define RDZV_SERVER_CORE_MEMORY_RETURN_H_

#include <cstdint>

#include "absl/time/time.h"

namespace rdzv {

class MemoryReturn {
 public:
  // Memory counts as given up past `slack` bytes; trims are `interval` apart at least.
  explicit MemoryReturn(int64_t slack = int64_t{32} << 20,
                        absl::Duration interval = absl::Seconds(10));

  // Called now and then with what the service counts (`held`) and the process's resident size
  // (`rss`). True when the caller should trim now (and then call Trimmed with the new size).
  bool Check(absl::Time now, int64_t held, int64_t rss);

  // The trim Check asked for is done; the process is `rss` bytes now.
  void Trimmed(absl::Time now, int64_t held, int64_t rss);

 private:
  const int64_t slack_;
  const absl::Duration interval_;
  absl::Time last_trim_ = absl::InfinitePast();
  int64_t peak_held_ = 0;
  int64_t last_held_ = -1;
  // rss - held after the last trim (or at the first check): the process's own memory.
  int64_t base_gap_ = -1;
};

}  // namespace rdzv

#endif  // RDZV_SERVER_CORE_MEMORY_RETURN_H_
