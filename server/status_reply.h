// The reply to GetStatus, kept within a fixed size: an operator's `rdzvctl status` answers under
// any load, with however many jobs and agents the server holds, and says what it left out.
//
// Pure; thread-safe.
#ifndef RDZV_SERVER_STATUS_REPLY_H_
#define RDZV_SERVER_STATUS_REPLY_H_

#include <cstddef>
#include <vector>

#include "rdzv/v1/rdzv.pb.h"

namespace rdzv {

// The most a status reply holds, in serialized bytes: half of gRPC's default 4 MiB limit on
// what a client receives.
inline constexpr size_t kMaxStatusReplyBytes = 2 << 20;

// Fills `reply` with `jobs`, in their order, within `max_bytes`: every job that fits without
// its agents first, then each job's agents within an equal share of what is left (and what
// other jobs left of theirs). What does not fit is counted in JobStatus.omitted_agents and
// StatusResponse.omitted_jobs.
void FitStatusReply(std::vector<v1::JobStatus> jobs, size_t max_bytes, v1::StatusResponse* reply);

}  // namespace rdzv

#endif  // RDZV_SERVER_STATUS_REPLY_H_
