// Request limits: what rdzvd accepts from a caller before any of it reaches a job. Every string
// and list in a request has a bound; a request over one is refused with INVALID_ARGUMENT naming
// the field and the bound. Names (ids, host names, addresses) with a control character are
// refused alike, and so is a failure report whose exit code, signal or ranks are out of range (a
// join's numbers are checked by ValidateJoinSpec, common/core/join_validation.h). A failure
// report's text (stderr tail, error message, hang detail) is not refused but cut to a fixed size
// here, once, so that the Abort every agent of the job receives stays small whatever a worker
// wrote.
//
// Pure functions over the request messages; thread-safe.
#ifndef RDZV_GUARD_REQUEST_LIMITS_H_
#define RDZV_GUARD_REQUEST_LIMITS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/core/rendezvous_types.h"
#include "rdzv/v1/rdzv.pb.h"

namespace rdzv {

// Bounds on what one request may carry. The defaults leave room for every real use: Slurm's
// node names are at most 64 bytes, DNS names 253. A join's node list is bounded by
// kMaxNodeListBytes (common/core/rendezvous_types.h), which agents respect too.
inline constexpr size_t kMaxIdBytes = 256;       // job id, agent id
inline constexpr size_t kMaxHostBytes = 255;     // host names and addresses
inline constexpr size_t kMaxAddresses = 32;      // a join's candidate addresses
inline constexpr size_t kMaxReasonBytes = 1024;  // an operator's abort reason
// A failure's stderr tail keeps its last kMaxTailBytes (the end shows the error), its error
// message and hang detail their first bytes.
inline constexpr size_t kMaxTailBytes = 16 * 1024;
inline constexpr size_t kMaxErrorMessageBytes = 16 * 1024;
inline constexpr size_t kMaxHangDetailBytes = 1024;
// The largest request rdzvd reads at all (the message is refused before it is stored): the
// largest failure report above with ample room.
inline constexpr int kMaxRequestBytes = 256 * 1024;
// Calls open at once on one connection: an agent has its Join stream and a call or two beside.
inline constexpr int kMaxStreamsPerConnection = 16;
// The agents one group join (JoinRequest.members) may carry: the tasks of one node.
inline constexpr size_t kMaxGroupMembers = 512;

// A group join (with members) is checked as CheckGroupJoinRequest says.
absl::Status CheckJoinRequest(const v1::JoinRequest& request);
// At most kMaxGroupMembers members, each a join of the group's job (or none) with no members of
// its own, each within CheckJoinRequest's bounds.
absl::Status CheckGroupJoinRequest(const v1::JoinRequest& request);
absl::Status CheckReportExitRequest(const v1::ReportExitRequest& request);
absl::Status CheckLeaveRequest(const v1::LeaveRequest& request);
absl::Status CheckStatusRequest(const v1::StatusRequest& request);
absl::Status CheckAbortJobRequest(const v1::AbortJobRequest& request);
absl::Status CheckHoldsJobRequest(const v1::HoldsJobRequest& request);

// The per-user caps on what one owner holds at once (ServiceOptions::max_jobs_per_user and
// max_agents_per_user), and the RESOURCE_EXHAUSTED refusal of a join past one: `held` against
// `limit`, `user` naming the caller. Without authentication (--auth none) every caller is the
// same user, so the text says that all callers share the one limit instead of naming a user.
enum class UserCap { kJobs, kAgents };
absl::Status UserCapError(UserCap cap, bool auth_none, absl::string_view user, int64_t held,
                          int64_t limit);

// The RESOURCE_EXHAUSTED refusal of a join past a memory limit: `held` bytes against `limit`,
// one user's (ServiceOptions::max_memory_per_user_bytes) or, with `all_users`, all users'
// together (max_memory_bytes).
absl::Status MemoryCapError(bool auth_none, absl::string_view user, int64_t held, int64_t limit,
                            bool all_users);

// Cuts `failure`'s text fields to the bounds above, marking each cut ("[… 1234 bytes cut]").
void TruncateFailureText(v1::WorkerFailure& failure);

}  // namespace rdzv

#endif  // RDZV_GUARD_REQUEST_LIMITS_H_
