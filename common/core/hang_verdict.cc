#include "common/core/hang_verdict.h"

namespace rdzv {

std::optional<AbortEvent> RefineAbortWithHang(const AbortEvent& current, Micros since_end,
                                              const FailureInfo& report) {
  if (report.cause != AbortCause::kWorkerHung || !current.first_failure) return std::nullopt;
  const FailureInfo& first = *current.first_failure;
  const bool same_hang = first.cause == AbortCause::kWorkerHung && first.host == report.host &&
                         first.group_rank == report.group_rank && first.rank == report.rank &&
                         first.time_us == report.time_us;
  if (same_hang) {
    if (first.stderr_tail.empty() && !report.stderr_tail.empty()) return AbortFor(report);
    return std::nullopt;
  }
  if (first.cause != AbortCause::kWorkerFailed && first.cause != AbortCause::kWorkerHung) {
    return std::nullopt;
  }
  if (since_end > kHangVerdictWindow || report.time_us >= first.time_us) return std::nullopt;
  return AbortFor(report);
}

}  // namespace rdzv
