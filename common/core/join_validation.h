// Join validation: whether a join may enter a job, as pure checks that return the refusal an
// agent sees, one line that says what to change. The rendezvous state (rendezvous_state.h)
// decides when each applies; here is what each compares and what it says.
//
// ValidateJoinSpec checks a join on its own: every id and number of the spec against its range.
// rdzvd applies it as soon as a join arrives, and rdzv-agent to its configuration before it
// starts. The others check a join against the job it enters: the terms the job's first agent
// set (--nnodes, --spare-nodes, --max-restarts, the master endpoint), the shape of an agent
// already in it, and, for a resuming agent, the round the job runs.
//
// Pure and thread-compatible: functions of their arguments.
#ifndef RDZV_COMMON_CORE_JOIN_VALIDATION_H_
#define RDZV_COMMON_CORE_JOIN_VALIDATION_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/core/agent_table.h"
#include "common/core/rank_assignment.h"
#include "common/core/rendezvous_types.h"

namespace rdzv {

// The most workers one agent may run; rdzv-agent caps --nproc-per-node at the same
// (kMaxNprocPerNode).
inline constexpr int32_t kMaxWorkersPerAgent = 4096;
// The longest span a join may carry (its last-call window, its longest heartbeat interval).
inline constexpr Micros kMaxJoinSpan = Micros{365} * 24 * 3600 * 1'000'000;

// Why `spec` can join no job at all, or OK: the checks that need no job, every id and number of
// the spec against its range.
absl::Status ValidateJoinSpec(const JoinSpec& spec);

// What a job's first agent fixed for the others: its sizes and restarts.
struct JobTerms {
  int32_t min_agents = 1;
  int32_t max_agents = 1;
  int32_t spare_nodes = 0;
  std::optional<int32_t> max_restarts;  // the first member's that stated one
};

// Why `spec` disagrees with the --spare-nodes or --nnodes of `job_id` (`terms`), or OK.
absl::Status SameSizes(const std::string& job_id, const JobTerms& terms, const JoinSpec& spec);
// Why `spec` disagrees with the --max-restarts of `job_id` (`terms`), or OK; a join or a job
// that states none agrees with any.
absl::Status SameMaxRestarts(const std::string& job_id, const JobTerms& terms,
                             const JoinSpec& spec);

// A member's shape is fixed once it has joined: a join under the same agent id (`agent_id`,
// held as `held`) that asks for another (`asked`) is refused, naming both values.
absl::Status SameShape(const std::string& job_id, absl::string_view agent_id,
                       const AgentRecord& held, const AgentSpec& asked);

// Why the newcomer `asked` cannot rank with `other`, any agent already in `job_id`, or OK: they
// must agree on giving a node rank and on having a global position; with spares
// (`spare_nodes` > 0) they also run the same number of workers.
absl::Status SameRanking(const std::string& job_id, int32_t spare_nodes, const RankInput& other,
                         const AgentSpec& asked);

// The refusal of `spec`, whose fixed master endpoint differs from the one the job's agent on
// `other_host` set (`addr`, `port`): every worker of a job must reach the same master.
absl::Status MasterDiffers(const JoinSpec& spec, absl::string_view other_host,
                           absl::string_view addr, int32_t port);

// The refusal of the agent `agent`, whose position `claim` in `job_id` the agent on
// `holder_host` holds.
absl::Status ClaimTaken(const std::string& job_id, const AgentSpec& agent, int64_t claim,
                        absl::string_view holder_host);
// The refusal of the agent on `host`, one more than the `agents` that `job_id` can have.
absl::Status OneTooMany(const std::string& job_id, int32_t agents, absl::string_view host);
// The refusal of the agent on `host`, which came after `job_id` started round `round` with
// `agents` agents.
absl::Status TooLate(const std::string& job_id, int32_t round, int32_t agents,
                     absl::string_view host);

// The refusal of a resuming agent on `host` whose workers run with `claimed` where the job has
// `actual`.
absl::Status ForeignWorkers(const std::string& host, int32_t round, const std::string& job_id,
                            const std::string& claimed, const std::string& actual);
// A resuming agent's claim (`held`, its agent on `host`) against the round `job_id` runs
// (`runs`, as the first agent back brought it, with the job's restart count): workers of
// another master or size are not this job's, and must not change it for the others.
absl::Status SameRun(const std::string& job_id, const AssignmentEvent& runs,
                     const AssignmentEvent& held, const std::string& host);
// A resuming agent known to the job (as `member`) against the ranks it claims (`held`): its
// workers run other ranks than the job gave it, or claim ranks as a spare or none as a node.
absl::Status SameRanks(const std::string& job_id, const AgentRecord& member,
                       const AssignmentEvent& held, const std::string& host);

}  // namespace rdzv

#endif  // RDZV_COMMON_CORE_JOIN_VALIDATION_H_
