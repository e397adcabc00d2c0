#include "server/core/job_claims.h"

#include "absl/container/flat_hash_map.h"

namespace rdzv {

bool JobClaims::Answer(const std::string& key, bool serves, bool asking, uint64_t asker,
                       Micros now) {
  if (serves) return true;
  // Not asking, or asked by itself (its own address among its peers: one list on every server).
  if (!asking || asker == instance_) return false;
  // Both are asking: the lower instance number takes the job.
  if (instance_ < asker) return true;
  if (yielded_.size() >= max_conceded_) Sweep(now);
  if (yielded_.size() >= max_conceded_) return true;
  yielded_[key] = now + kConcedeFor;
  return false;
}

JobClaims::Verdict JobClaims::Decide(const std::string& key, bool held_elsewhere, Micros now) {
  bool yielded = false;
  if (auto it = yielded_.find(key); it != yielded_.end()) {
    yielded = now < it->second;
    if (!yielded) yielded_.erase(it);
  }
  if (held_elsewhere) return Verdict::kServedElsewhere;
  return yielded ? Verdict::kYielded : Verdict::kTakeUp;
}

void JobClaims::Sweep(Micros now) {
  absl::erase_if(yielded_, [now](const auto& y) { return y.second <= now; });
}

}  // namespace rdzv
