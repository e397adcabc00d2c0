#include "server/request_limits.h"

#include <string>

#include "absl/strings/str_format.h"

namespace rdzv {
namespace {

absl::Status CheckSize(const std::string& value, const char* field, size_t max) {
  if (value.size() <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s is %d bytes, over rdzvd's limit of %d; shorten it", field, value.size(), max));
}

// The first error of `checks`, or OK.
absl::Status First(std::initializer_list<absl::Status> checks) {
  for (const absl::Status& s : checks) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// Keeps the last `max` bytes of `text` after a marker saying how much was cut.
void KeepEnd(std::string* text, size_t max) {
  if (text->size() <= max) return;
  const size_t cut = text->size() - max;
  *text = absl::StrFormat("[... %d bytes cut]\n", cut) + text->substr(cut);
}

// Keeps the first `max` bytes of `text` and a marker saying how much was cut.
void KeepStart(std::string* text, size_t max) {
  if (text->size() <= max) return;
  const size_t cut = text->size() - max;
  text->resize(max);
  *text += absl::StrFormat(" [... %d bytes cut]", cut);
}

}  // namespace

absl::Status CheckJoinRequest(const v1::JoinRequest& r) {
  absl::Status s =
      First({CheckSize(r.job_id(), "the job id", kMaxIdBytes),
             CheckSize(r.agent_id(), "the agent id", kMaxIdBytes),
             CheckSize(r.host(), "the host name", kMaxHostBytes),
             CheckSize(r.master_addr_override(), "the master address", kMaxHostBytes),
             CheckSize(r.resume().master_addr(), "the master address", kMaxHostBytes)});
  if (!s.ok()) return s;
  if (r.addresses_size() > static_cast<int>(kMaxAddresses)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a join lists %d addresses, over rdzvd's limit of %d; give fewer",
                        r.addresses_size(), kMaxAddresses));
  }
  for (const std::string& address : r.addresses()) {
    if (s = CheckSize(address, "an address", kMaxHostBytes); !s.ok()) return s;
  }
  return CheckSize(r.node_list(), "the node list", kMaxNodeListBytes);
}

absl::Status CheckReportExitRequest(const v1::ReportExitRequest& r) {
  // The failure's text is cut, not refused (TruncateFailureText).
  return First({CheckSize(r.job_id(), "the job id", kMaxIdBytes),
                CheckSize(r.agent_id(), "the agent id", kMaxIdBytes),
                CheckSize(r.failure().host(), "the host name", kMaxHostBytes)});
}

absl::Status CheckLeaveRequest(const v1::LeaveRequest& r) {
  return First({CheckSize(r.job_id(), "the job id", kMaxIdBytes),
                CheckSize(r.agent_id(), "the agent id", kMaxIdBytes)});
}

absl::Status CheckStatusRequest(const v1::StatusRequest& r) {
  return CheckSize(r.job_id(), "the job id", kMaxIdBytes);
}

absl::Status CheckAbortJobRequest(const v1::AbortJobRequest& r) {
  return First({CheckSize(r.job_id(), "the job id", kMaxIdBytes),
                CheckSize(r.reason(), "the reason", kMaxReasonBytes)});
}

absl::Status UserCapError(UserCap cap, bool auth_none, absl::string_view user, int64_t held,
                          int64_t limit) {
  const bool jobs = cap == UserCap::kJobs;
  const char* flag = jobs ? "--max-jobs-per-user" : "--max-agents-per-user";
  const char* wait = jobs ? "wait for some to end" : "wait for some jobs to end";
  if (auth_none) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "rdzvd runs with --auth none, so all callers share one limit of %d %s (%s), and it is "
        "reached; %s, raise %s or turn on authentication",
        limit, jobs ? "jobs" : "attached agents", flag, wait, flag));
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "%s has %d %s this rendezvous server already, its %s; %s, or ask its administrator", user,
      held, jobs ? "jobs on" : "agents attached to", flag, wait));
}

void TruncateFailureText(v1::WorkerFailure& f) {
  KeepEnd(f.mutable_stderr_tail(), kMaxTailBytes);
  KeepStart(f.mutable_error_message(), kMaxErrorMessageBytes);
  KeepStart(f.mutable_hang_detail(), kMaxHangDetailBytes);
}

}  // namespace rdzv
