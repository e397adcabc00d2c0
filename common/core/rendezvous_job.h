// RendezvousState::Job: what the rendezvous state keeps of one job, shared by the files that
// define RendezvousState's members (rendezvous_state.cc: joins and departures;
// rendezvous_rounds.cc: rounds, restarts, left-out nodes and the end; rendezvous_status.cc: what
// the job looks like to its agents and to rdzvctl). Not for other callers: the state's own.
#ifndef RDZV_COMMON_CORE_RENDEZVOUS_JOB_H_
#define RDZV_COMMON_CORE_RENDEZVOUS_JOB_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "common/core/agent_table.h"
#include "common/core/join_validation.h"
#include "common/core/rank_assignment.h"
#include "common/core/rendezvous_state.h"
#include "common/core/rendezvous_types.h"

namespace rdzv {

enum class Phase { kFilling, kRunning, kEnded };

// An agent of an earlier run of a job that left it, as a restart's end names it.
struct RendezvousState::GoneNode {
  std::string host;
  int32_t node = 0;       // its node rank in the run it left
  int64_t position = -1;  // its claim (global position, else node index), or -1
  GoneHow how = GoneHow::kLeft;
};

// What a waiting member's join says that only the forming of its round reads: where its host can
// be reached and the port it offers (the master's are the rank-0 agent's), where it connected
// from, and its longest heartbeat interval (the job's is the longest). A job keeps one per member
// while its round fills, its strings in one pool, and drops them once the round forms.
struct Joining {
  uint64_t at = 0;         // its addresses, then where it connected from, in the job's pool
  uint32_t addresses = 0;  // how many
  int32_t master_port = 0;
  Micros longest_heartbeat_interval = 0;
};

struct RendezvousState::Job {
  std::string id;
  Phase phase = Phase::kFilling;
  int32_t round = 0;
  int32_t restart_count = 0;
  std::optional<int32_t> max_restarts;  // the first member's that stated one
  int32_t min_agents = 1;
  int32_t max_agents = 1;
  int32_t spare_nodes = 0;
  Micros last_call = 0;
  Micros last_join = 0;
  Micros last_progress = 0;
  // Nodes left out since the waiting agents last heard of them: they hear at once, then with the
  // next progress (at most once per progress interval), and before the round completes.
  bool excluded_news = false;
  std::optional<Micros> excluded_told;
  Micros ended_at = 0;
  Micros last_detach = 0;  // an ended job's TTL runs from the later of this and ended_at
  // Set while a job rebuilt from resuming agents waits for the rest of them.
  Micros resume_deadline = 0;
  int32_t attached = 0;
  int32_t world_size = 0;
  // The round's agents: a record each (agent_table.h), which is all a job keeps of an agent once
  // its round has formed.
  AgentTable members;
  // While the round fills, what only its forming reads of each member's join, by member index,
  // and the pool of their strings with how many of its bytes erased members left behind.
  std::vector<Joining> joining;
  std::string joining_pool;
  size_t joining_dead = 0;
  // Members with `left` set, so that "has everyone left?" is a comparison and not a scan: it is
  // asked after every departure, and a job of N agents sees N of them.
  size_t left = 0;
  // Who holds each position (global order, else node index; the first rank in a rebuilt job), by
  // member index: refuses a second claim at once instead of failing the whole round when it
  // completes.
  absl::flat_hash_map<int64_t, AgentTable::Index> claims;
  AssignmentEvent assignment;  // the parts every member shares
  std::optional<AbortEvent> abort;
  // The longest heartbeat interval its agents have reported, over all rounds.
  Micros longest_heartbeat_interval = 0;
  // The first node list an agent gave (JoinSpec::node_list), kept over rounds for Status.
  std::string node_list;
  // The fixed master endpoint this round's members give, and how many give each part: a join
  // that differs is refused, so at most one of each exists, and checking a join against them
  // takes no scan of the members.
  std::string addr_override;
  int32_t addr_givers = 0;
  // Nodes left out for good (a failed health check), kept over rounds: a few for status and
  // progress, and how many agents they took out of --nnodes. Bounded by max_agents.
  std::vector<ExcludedNode> excluded;
  int32_t excluded_agents = 0;
  absl::flat_hash_set<int64_t> excluded_positions;  // agents' ClaimKey, when they have one
  absl::flat_hash_set<int64_t> excluded_node_indices;
  absl::flat_hash_set<std::string> excluded_hosts;  // of nodes without an index
  // Agents of the job's earlier runs that left it (their workers succeeded, or they gave up):
  // they are not coming back for a restart, whose round can then not have them. A few for
  // messages, how many, and their positions (for the missing ones a progress names). Kept over
  // restarts, forgotten when the job id starts afresh.
  std::vector<GoneNode> gone;
  int32_t gone_agents = 0;
  absl::flat_hash_set<int64_t> gone_positions;
  // The agents of the last run not yet back in the round that fills, as the last run's records,
  // each with the stream of the last run it still holds (0: none): one that leaves instead, or
  // whose stream ends without a word, is gone too.
  AgentTable awaited;
  // How the last run ended, for the end of a restart that cannot be whole.
  std::optional<AbortEvent> last_run_end;
  // The round that fills or runs formed here (or was rebuilt here from its resuming agents).
  bool ran = false;
  // The round was ended while it filled because it could never have --nnodes MIN: a peer that
  // comes for it later hears that end at once.
  bool cannot_form = false;

  // The seat (node rank) each node held in the last round that ranked it, by node index: with
  // spares, a node keeps its seat over restarts and a spare takes a lost node's.
  absl::flat_hash_map<int64_t, int32_t> seats;
  // The running round's spares, and how many of them have left (released or lost).
  int32_t spares = 0;
  int32_t spares_left = 0;

  // What the job's first agent fixed for the others (join_validation.h).
  JobTerms Terms() const { return {min_agents, max_agents, spare_nodes, max_restarts}; }

  // The job's sizes as `spec` gives them, for its round.
  void TakeSizes(const JoinSpec& spec) {
    min_agents = spec.min_agents;
    max_agents = spec.max_agents;
    spare_nodes = spec.spare_nodes;
    last_call = spec.last_call;
  }

  // The most agents this round can still have.
  int32_t Expected() const { return std::max(0, max_agents - excluded_agents - gone_agents); }
  // The fewest agents a round may start with: --nnodes MIN, and with spares no more than the
  // nodes that run the job.
  int32_t Needed() const {
    return spare_nodes > 0 ? std::min(min_agents, max_agents - spare_nodes) : min_agents;
  }
  // Whether an agent on `host`, node `node_index`, runs on a node left out of the job.
  bool Excludes(int64_t node_index, absl::string_view host) const {
    return node_index >= 0 ? excluded_node_indices.contains(node_index)
                           : excluded_hosts.contains(host);
  }
  bool Excludes(const AgentSpec& agent) const { return Excludes(agent.node_index, agent.host); }
  int32_t port_override = 0;
  int32_t port_givers = 0;

  // A member that gives (part of) a fixed master endpoint joins the round being filled...
  void GiveOverride(const JoinSpec& spec) {
    if (!spec.master_addr_override.empty()) {
      ++addr_givers;
      addr_override = spec.master_addr_override;
    }
    if (spec.master_port_override > 0) {
      ++port_givers;
      port_override = spec.master_port_override;
    }
  }
  // ... or leaves it.
  void TakeBackOverride(const AgentRecord& m) {
    if (m.gave_master_addr && --addr_givers == 0) addr_override.clear();
    if (m.gave_master_port && --port_givers == 0) port_override = 0;
  }
  void ClearOverrides() {
    addr_override.clear();
    addr_givers = 0;
    port_override = 0;
    port_givers = 0;
  }

  // Keeps what only the forming of the round reads of member `i`'s join.
  void KeepJoining(AgentTable::Index i, const JoinSpec& spec, absl::string_view peer) {
    if (joining.size() <= i) joining.resize(i + 1);
    Joining& j = joining[i];
    j.at = joining_pool.size();
    j.addresses = static_cast<uint32_t>(spec.addresses.size());
    j.master_port = spec.master_port;
    j.longest_heartbeat_interval = spec.longest_heartbeat_interval;
    for (const std::string& a : spec.addresses) AppendLengthPrefixed(joining_pool, a);
    AppendLengthPrefixed(joining_pool, peer);
  }
  // Member `i`'s addresses; with `peer`, also where it connected from.
  std::vector<absl::string_view> AddressesOf(AgentTable::Index i,
                                             absl::string_view* peer = nullptr) const {
    std::vector<absl::string_view> out;
    size_t at = joining[i].at;
    for (uint32_t n = 0; n < joining[i].addresses; ++n) {
      out.push_back(ReadLengthPrefixed(joining_pool, at));
    }
    const absl::string_view from = ReadLengthPrefixed(joining_pool, at);
    if (peer != nullptr) *peer = from;
    return out;
  }
  // Member `i`, waiting, is gone: its strings are garbage in the pool, which is rewritten once
  // garbage is most of it (agents that come and go while a round fills do not grow it for good).
  void DropJoining(AgentTable::Index i) {
    size_t at = joining[i].at;
    for (uint32_t n = 0; n <= joining[i].addresses; ++n) ReadLengthPrefixed(joining_pool, at);
    joining_dead += at - joining[i].at;
    if (joining_dead < 4096 || joining_dead < joining_pool.size() / 2) return;
    std::string pool;
    for (AgentTable::Index m : members) {
      if (m == i) continue;
      absl::string_view peer;
      const std::vector<absl::string_view> addresses = AddressesOf(m, &peer);
      joining[m].at = pool.size();
      for (absl::string_view a : addresses) AppendLengthPrefixed(pool, a);
      AppendLengthPrefixed(pool, peer);
    }
    joining_pool = std::move(pool);
    joining_dead = 0;
  }
  void ClearJoining() {
    std::vector<Joining>().swap(joining);
    std::string().swap(joining_pool);
    joining_dead = 0;
  }
};

inline constexpr size_t kProgressHosts = 8;
inline constexpr size_t kProgressMissing = 16;
inline constexpr size_t kProgressExcluded = 8;
// Excluded nodes a job names in its status; the count covers the rest.
inline constexpr size_t kKeptExcluded = 64;
// No event kept yet (Decisions::Keep).
inline constexpr uint32_t kNoEvent = std::numeric_limits<uint32_t>::max();

inline int64_t ClaimKey(const AgentSpec& a) { return a.order >= 0 ? a.order : a.node_index; }
inline int64_t ClaimKey(const AgentRecord& a) { return a.order >= 0 ? a.order : a.node_index; }

// Agent `i` of `table` as rank assignment reads it; its names valid until the table changes.
inline RankInput InputOf(const AgentTable& table, AgentTable::Index i) {
  const AgentRecord& r = table[i];
  return RankInput{table.agent_id(i), table.host(i), r.node_index, r.order, r.nproc};
}

// Sends a running round (`shared`, the parts every member shares) to member `m` on `stream`.
inline void SendAssignment(Decisions& out, StreamId stream, const AssignmentEvent& shared,
                           const AgentRecord& m) {
  out.SendTo(stream, out.Keep(shared), m.slot, m.spare);
}

}  // namespace rdzv

#endif  // RDZV_COMMON_CORE_RENDEZVOUS_JOB_H_
