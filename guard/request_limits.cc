#include "guard/request_limits.h"

#include <limits>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"

namespace rdzv {
namespace {

constexpr int64_t kMaxRank = std::numeric_limits<int32_t>::max() - 1;

absl::Status CheckSize(const std::string& value, const char* field, size_t max) {
  if (value.size() <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s is %d bytes, over rdzvd's limit of %d; shorten it", field, value.size(), max));
}

// A name from the wire (an id, a host name, an address): bounded, and free of anything a
// terminal would act on when it is printed or logged.
absl::Status CheckName(const std::string& value, const char* field, size_t max) {
  if (absl::Status s = CheckSize(value, field, max); !s.ok()) return s;
  for (const char c : value) {
    if (!absl::ascii_iscntrl(static_cast<unsigned char>(c))) continue;
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s \"%s\" contains the control character \\x%02x; use printable characters only", field,
        absl::CHexEscape(value), static_cast<unsigned char>(c)));
  }
  return absl::OkStatus();
}

absl::Status CheckRange(int64_t value, const char* field, int64_t min, int64_t max) {
  if (value >= min && value <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("%s is %d; expected %d to %d", field, value, min, max));
}

// The first error of `checks`, or OK.
absl::Status First(std::initializer_list<absl::Status> checks) {
  for (const absl::Status& s : checks) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// Text a worker wrote and every node prints: bounded elsewhere, but never able to move a
// terminal's cursor or colour what follows.
absl::Status CheckPrintable(const std::string& value, const char* field) {
  for (const char c : value) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7f) continue;
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s contains the control character \\x%02x; send one line of printable text", field, u));
  }
  return absl::OkStatus();
}

// Keeps the last `max` bytes of `text` (or a few fewer, not to split a UTF-8 character) after
// a marker saying how much was cut.
void KeepEnd(std::string* text, size_t max) {
  if (text->size() <= max) return;
  size_t cut = text->size() - max;
  while (cut < text->size() && (static_cast<unsigned char>((*text)[cut]) & 0xC0) == 0x80) ++cut;
  *text = absl::StrFormat("[... %d bytes cut]\n", cut) + text->substr(cut);
}

// Keeps the first `max` bytes of `text` and a marker saying how much was cut.
void KeepStart(std::string* text, size_t max) {
  if (text->size() <= max) return;
  const size_t keep = Utf8Cut(*text, max);
  const size_t cut = text->size() - keep;
  text->resize(keep);
  *text += absl::StrFormat(" [... %d bytes cut]", cut);
}

}  // namespace

absl::Status CheckJoinRequest(const v1::JoinRequest& r) {
  if (r.members_size() > 0) return CheckGroupJoinRequest(r);
  absl::Status s =
      First({CheckName(r.job_id(), "the job id", kMaxIdBytes),
             CheckName(r.agent_id(), "the agent id", kMaxIdBytes),
             CheckName(r.host(), "the host name", kMaxHostBytes),
             CheckName(r.master_addr_override(), "the master address", kMaxHostBytes),
             CheckName(r.resume().master_addr(), "the master address", kMaxHostBytes)});
  if (!s.ok()) return s;
  if (r.addresses_size() > static_cast<int>(kMaxAddresses)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a join lists %d addresses, over rdzvd's limit of %d; give fewer",
                        r.addresses_size(), kMaxAddresses));
  }
  for (const std::string& address : r.addresses()) {
    if (s = CheckName(address, "an address", kMaxHostBytes); !s.ok()) return s;
  }
  if (s = CheckSize(r.unhealthy().detail(), "the health check's line", kMaxUnhealthyDetailBytes);
      !s.ok()) {
    return s;
  }
  return CheckSize(r.node_list(), "the node list", kMaxNodeListBytes);
}

absl::Status CheckGroupJoinRequest(const v1::JoinRequest& r) {
  if (absl::Status s = CheckName(r.job_id(), "the job id", kMaxIdBytes); !s.ok()) return s;
  if (r.members_size() > static_cast<int>(kMaxGroupMembers)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a group join holds %d agents, over rdzvd's limit of %d; relay fewer tasks per node",
        r.members_size(), kMaxGroupMembers));
  }
  for (const v1::JoinRequest& member : r.members()) {
    if (member.members_size() > 0) {
      return absl::InvalidArgumentError("a member of a group join has members of its own");
    }
    if (!member.job_id().empty() && member.job_id() != r.job_id()) {
      return absl::InvalidArgumentError(
          "a member of a group join names another job than the group's");
    }
    if (absl::Status s = CheckJoinRequest(member); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckReportExitRequest(const v1::ReportExitRequest& r) {
  // The failure's text is cut, not refused (TruncateFailureText). Its numbers name a worker
  // and how it ended: an exit status (an agent exits with it: 256 would read as success), a
  // Linux signal, and ranks.
  const v1::WorkerFailure& f = r.failure();
  return First({CheckName(r.job_id(), "the job id", kMaxIdBytes),
                CheckName(r.agent_id(), "the agent id", kMaxIdBytes),
                CheckName(f.host(), "the host name", kMaxHostBytes),
                CheckRange(f.exit_code(), "the failure's exit code", 0, 255),
                CheckRange(f.signal(), "the failure's signal", 0, 64),
                CheckRange(f.rank(), "the failed worker's rank", 0, kMaxRank),
                CheckRange(f.local_rank(), "the failed worker's local rank", 0, kMaxRank),
                CheckRange(f.group_rank(), "the failure's node", 0, kMaxRank),
                CheckPrintable(f.request_reason(), "the rank's request (request_reason)")});
}

absl::Status CheckLeaveRequest(const v1::LeaveRequest& r) {
  return First({CheckName(r.job_id(), "the job id", kMaxIdBytes),
                CheckName(r.agent_id(), "the agent id", kMaxIdBytes)});
}

absl::Status CheckStatusRequest(const v1::StatusRequest& r) {
  return CheckName(r.job_id(), "the job id", kMaxIdBytes);
}

absl::Status CheckAbortJobRequest(const v1::AbortJobRequest& r) {
  return First({CheckName(r.job_id(), "the job id", kMaxIdBytes),
                CheckSize(r.reason(), "the reason", kMaxReasonBytes)});
}

absl::Status CheckHoldsJobRequest(const v1::HoldsJobRequest& r) {
  return First({CheckName(r.job_id(), "the job id", kMaxIdBytes),
                CheckSize(r.owner(), "the owner", kMaxIdBytes),
                CheckSize(r.nonce(), "the nonce", kMaxIdBytes)});
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

absl::Status MemoryCapError(bool auth_none, absl::string_view user, int64_t held, int64_t limit,
                            bool all_users) {
  const auto mib = [](int64_t bytes) { return (bytes + (1 << 20) - 1) >> 20; };
  if (all_users) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the agents attached to this rendezvous server hold %d MiB, and all users together may "
        "hold %d MiB (--max-memory-mb); wait for some jobs to end, or ask its administrator",
        mib(held), mib(limit)));
  }
  if (auth_none) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "rdzvd runs with --auth none, so all callers share one memory limit of %d MiB "
        "(--max-memory-per-user-mb), and it is reached; wait for some jobs to end, raise "
        "--max-memory-per-user-mb or turn on authentication",
        mib(limit)));
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "%s's agents hold %d MiB on this rendezvous server already, and a user may hold %d MiB "
      "(--max-memory-per-user-mb); wait for some jobs to end, or ask its administrator",
      user, mib(held), mib(limit)));
}

void TruncateFailureText(v1::WorkerFailure& f) {
  KeepEnd(f.mutable_stderr_tail(), kMaxTailBytes);
  KeepStart(f.mutable_error_message(), kMaxErrorMessageBytes);
  KeepStart(f.mutable_hang_detail(), kMaxHangDetailBytes);
  KeepStart(f.mutable_request_reason(), kMaxRankRequestReasonBytes);
}

}  // namespace rdzv
