// ServiceLedger: what each user holds on rdzvd, and whether a join still fits: its jobs, its
// agents on open Join streams, and the memory they hold, against the per-user limits and the
// limit for all users together (ServiceOptions). A join past any is refused, to that user only
// (or, past the limit for all, to whoever joins), before it reaches a job.
//
// A user is named by an opaque key, the same for all its calls (rdzvd uses its jobs' state). The
// ledger counts what the service's lock orders: streams opened and closed, jobs held while the
// peers are asked about them, and the records of agents left out of a user's jobs, which it
// charges at kExcludedAgentBytes each. The bytes of requests and queued events change as streams
// write, outside that lock: the caller keeps those counts and passes what they hold to CheckJoin.
//
// Pure: no clock, no I/O. Not thread-safe: the service serialises calls.
#ifndef RDZV_SERVER_CORE_SERVICE_LEDGER_H_
#define RDZV_SERVER_CORE_SERVICE_LEDGER_H_

#include <cstdint>
#include <optional>

#include "absl/container/flat_hash_map.h"

namespace rdzv {

// What one attached agent costs the server beyond its request and its queued events: measured
// at 10,000 agents (docs/performance.md), nearly all of it gRPC's.
inline constexpr int64_t kAgentBaseBytes = 36 * 1024;
// What each member of a group join (JoinRequest.members) costs beyond the first, which counts as
// kAgentBaseBytes: the job state's record (agent_table.h), its member bookkeeping here, and its
// share of the events at their peak, the round's assignments. Measured at about 450 bytes, with
// 100,000 agents in groups of 64 and 80,000 in groups of 8 (docs/performance.md).
inline constexpr int64_t kGroupMemberBytes = 512;
// What the record of one agent left out of its job (a failed health check) costs, charged to its
// user while the job keeps it: its entries in the job's sets, its host name at the longest.
inline constexpr int64_t kExcludedAgentBytes = 512;

// The bytes a join of `agents` agents (1, or a group's members) holds while its stream is open,
// its request being `request_bytes` long.
int64_t JoinBytes(int64_t agents, int64_t request_bytes);

// What one user, and all users together, may hold at once; zero for a memory limit: none.
struct LedgerLimits {
  int64_t max_jobs_per_user = 1000;
  int64_t max_agents_per_user = 100'000;
  int64_t max_memory_per_user_bytes = 0;
  int64_t max_memory_bytes = 0;
};

// A join past a limit: which, what is held (jobs, agents or bytes) and the limit.
struct LimitBreach {
  enum class Limit { kJobs, kAgents, kUserMemory, kAllMemory };
  Limit limit;
  int64_t held = 0;
  int64_t most = 0;
};

class ServiceLedger {
 public:
  using User = const void*;

  explicit ServiceLedger(LedgerLimits limits) : limits_(limits) {}

  // A join of `agents` agents holding `bytes` by `user`, who has `jobs` jobs (not counting those
  // held for the peers' answer); `new_job`: a job the user neither has nor waits on. `user_bytes`:
  // what the user's streams hold now (nullopt: it never opened one); `all_bytes`: all users'.
  // The first limit it would pass, or nullopt when it fits.
  std::optional<LimitBreach> CheckJoin(User user, bool new_job, int64_t jobs, int64_t agents,
                                       int64_t bytes, std::optional<int64_t> user_bytes,
                                       int64_t all_bytes) const;

  // A stream of `agents` agents opened, or closed, for `user`.
  void StreamOpened(User user, int64_t agents) { agents_[user] += agents; }
  void StreamClosed(User user, int64_t agents);

  // A job of `user` is held while the peers are asked about it, or no longer is.
  void JobParked(User user) { ++parked_[user]; }
  void JobUnparked(User user);
  // Forgets every parked job (the service stops).
  void ClearParked() { parked_.clear(); }

  // `user`'s jobs keep `excluded` records of left-out agents now: the bytes to add to what the
  // user (and all users) hold, negative when records were forgotten.
  int64_t ChargeExcluded(User user, int64_t excluded);

 private:
  const LedgerLimits limits_;
  absl::flat_hash_map<User, int64_t> agents_;    // on open streams
  absl::flat_hash_map<User, int64_t> parked_;    // jobs held for the peers' answer
  absl::flat_hash_map<User, int64_t> excluded_;  // left-out agents charged so far
};

}  // namespace rdzv

#endif  // RDZV_SERVER_CORE_SERVICE_LEDGER_H_
