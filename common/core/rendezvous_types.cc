#include "common/core/rendezvous_types.h"

#include <string.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace rdzv {

const char* AbortCauseName(AbortCause cause) {
  switch (cause) {
    case AbortCause::kUnspecified:
      return "unspecified";
    case AbortCause::kWorkerFailed:
      return "worker_failed";
    case AbortCause::kAgentSignalled:
      return "agent_signalled";
    case AbortCause::kAgentLost:
      return "agent_lost";
    case AbortCause::kServerLost:
      return "server_lost";
    case AbortCause::kResumeTimedOut:
      return "resume_timed_out";
    case AbortCause::kWorkerHung:
      return "worker_hung";
    case AbortCause::kNodeUnhealthy:
      return "node_unhealthy";
  }
  return "unspecified";
}

size_t Utf8Cut(const std::string& text, size_t max) {
  if (text.size() <= max) return text.size();
  size_t cut = max;
  // Back over continuation bytes (10xxxxxx) to the start of the character that straddles `max`.
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return cut;
}

const char* ExclusionKindName(ExclusionKind kind) {
  switch (kind) {
    case ExclusionKind::kUnspecified:
      return "unspecified";
    case ExclusionKind::kHealthCheckFailed:
      return "health_check";
    case ExclusionKind::kHealthCheckTimedOut:
      return "health_check_timeout";
    case ExclusionKind::kGpusMissing:
      return "gpus";
    case ExclusionKind::kRunDir:
      return "run_dir";
    case ExclusionKind::kAddress:
      return "address";
    case ExclusionKind::kNodeLeftOut:
      return "node_left_out";
    case ExclusionKind::kRankRequested:
      return "rank_requested";
    case ExclusionKind::kWorkersStuck:
      return "workers_stuck";
    case ExclusionKind::kNodeLost:
      return "lost";
  }
  return "unspecified";
}

namespace {

const char* ExclusionWords(ExclusionKind kind) {
  switch (kind) {
    case ExclusionKind::kHealthCheckFailed:
      return "health check failed";
    case ExclusionKind::kHealthCheckTimedOut:
      return "health check timed out";
    case ExclusionKind::kGpusMissing:
      return "GPUs missing";
    case ExclusionKind::kRunDir:
      return "run directory unusable";
    case ExclusionKind::kAddress:
      return "no reachable address";
    case ExclusionKind::kNodeLeftOut:
      return "another agent of this node was left out";
    case ExclusionKind::kRankRequested:
      return "a rank asked for it";
    case ExclusionKind::kWorkersStuck:
      return "the last run's workers did not end";
    case ExclusionKind::kNodeLost:
      return "lost while the job ran";
    case ExclusionKind::kUnspecified:
      break;
  }
  return "unhealthy";
}

}  // namespace

std::string DescribeExcluded(const ExcludedNode& node) {
  std::string who = node.node_index >= 0
                        ? absl::StrFormat("%s (node %d)", node.host, node.node_index)
                        : node.host;
  if (node.why.detail.empty()) return absl::StrCat(who, ": ", ExclusionWords(node.why.kind));
  return absl::StrCat(who, ": ", ExclusionWords(node.why.kind), ": ", node.why.detail);
}

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  if (abbrev == nullptr) return absl::StrFormat("signal %d", sig);
  return absl::StrCat("SIG", abbrev);
}

bool DescribeFailureShowsMessage(const FailureInfo& f) {
  if (f.error_message.empty()) return false;
  switch (f.cause) {
    case AbortCause::kWorkerFailed:
      return f.signal == 0 && f.exit_code == 127;
    case AbortCause::kWorkerHung:
    case AbortCause::kAgentSignalled:
      return false;
    default:
      return true;
  }
}

std::string DescribeFailure(const FailureInfo& f) {
  const bool message = DescribeFailureShowsMessage(f);
  switch (f.cause) {
    case AbortCause::kWorkerFailed:
      break;
    case AbortCause::kWorkerHung:
      return absl::StrFormat(
          "rank %d hung: %s; stopped with SIGABRT (local rank %d, node %d on %s)", f.rank,
          f.hang_detail, f.local_rank, f.group_rank, f.host);
    case AbortCause::kAgentSignalled:
      return absl::StrFormat("the agent on %s (node %d) received %s", f.host, f.group_rank,
                             SignalName(f.signal));
    default:
      return absl::StrFormat("the agent on %s (node %d) failed (exit code %d)%s", f.host,
                             f.group_rank, f.exit_code,
                             message ? absl::StrCat(": ", f.error_message) : "");
  }
  std::string who = absl::StrFormat("rank %d (local rank %d, node %d) on %s", f.rank, f.local_rank,
                                    f.group_rank, f.host);
  if (f.signal != 0) {
    return absl::StrFormat("%s was killed by %s (exit code %d)", who, SignalName(f.signal),
                           f.exit_code);
  }
  if (message) return absl::StrFormat("%s could not start: %s", who, f.error_message);
  std::string line = absl::StrFormat("%s exited with code %d", who, f.exit_code);
  const std::string words = f.request_reason.empty() ? "" : absl::StrCat(": ", f.request_reason);
  switch (f.request) {
    case RankRequest::kExcludeNode:
      absl::StrAppend(&line, "; it asked for its node to be left out", words);
      break;
    case RankRequest::kNoRestart:
      absl::StrAppend(&line, "; it asked that the job not restart", words);
      break;
    case RankRequest::kNone:
      break;
  }
  return line;
}

AbortEvent AbortFor(const FailureInfo& failure) {
  AbortEvent abort;
  abort.cause = failure.cause;
  abort.first_failure = failure;
  abort.exit_code = failure.exit_code != 0 ? failure.exit_code : 1;
  abort.reason = DescribeFailure(failure);
  return abort;
}

AbortEvent AbortForLostAgent(const std::string& host, int32_t group_rank, int32_t first_rank,
                             int32_t last_rank) {
  AbortEvent abort;
  abort.cause = AbortCause::kAgentLost;
  abort.reason = absl::StrFormat("lost contact with the agent on %s (node %d, ranks %d-%d)", host,
                                 group_rank, first_rank, last_rank);
  abort.exit_code = 1;
  return abort;
}

}  // namespace rdzv
