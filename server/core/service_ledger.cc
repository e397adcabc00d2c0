#include "server/core/service_ledger.h"

namespace rdzv {

int64_t JoinBytes(int64_t agents, int64_t request_bytes) {
  return kAgentBaseBytes + (agents - 1) * kGroupMemberBytes + request_bytes;
}

std::optional<LimitBreach> ServiceLedger::CheckJoin(User user, bool new_job, int64_t jobs,
                                                    int64_t agents, int64_t bytes,
                                                    std::optional<int64_t> user_bytes,
                                                    int64_t all_bytes) const {
  // Jobs held while the peers are asked count as jobs: each is a question to every peer.
  if (auto parked = parked_.find(user); parked != parked_.end()) jobs += parked->second;
  if (new_job && jobs >= limits_.max_jobs_per_user) {
    return LimitBreach{LimitBreach::Limit::kJobs, jobs, limits_.max_jobs_per_user};
  }
  if (auto held = agents_.find(user);
      held != agents_.end() && held->second + agents > limits_.max_agents_per_user) {
    return LimitBreach{LimitBreach::Limit::kAgents, held->second, limits_.max_agents_per_user};
  }
  if (user_bytes && limits_.max_memory_per_user_bytes > 0 &&
      *user_bytes + bytes > limits_.max_memory_per_user_bytes) {
    return LimitBreach{LimitBreach::Limit::kUserMemory, *user_bytes,
                       limits_.max_memory_per_user_bytes};
  }
  if (limits_.max_memory_bytes > 0 && all_bytes + bytes > limits_.max_memory_bytes) {
    return LimitBreach{LimitBreach::Limit::kAllMemory, all_bytes, limits_.max_memory_bytes};
  }
  return std::nullopt;
}

void ServiceLedger::StreamClosed(User user, int64_t agents) {
  auto held = agents_.find(user);
  if (held != agents_.end() && (held->second -= agents) <= 0) agents_.erase(held);
}

void ServiceLedger::JobUnparked(User user) {
  auto parked = parked_.find(user);
  if (parked != parked_.end() && --parked->second <= 0) parked_.erase(parked);
}

int64_t ServiceLedger::ChargeExcluded(User user, int64_t excluded) {
  int64_t& charged = excluded_[user];
  const int64_t bytes = (excluded - charged) * kExcludedAgentBytes;
  charged = excluded;
  return bytes;
}

}  // namespace rdzv
