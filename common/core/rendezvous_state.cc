#include "common/core/rendezvous_state.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/core/hang_verdict.h"
#include "common/core/hostlist.h"

namespace rdzv {

Event Decisions::EventOf(const Send& send) const {
  Event event = events[send.event];
  if (auto* assignment = std::get_if<AssignmentEvent>(&event)) {
    assignment->slot = send.slot;
    assignment->spare = send.spare;
  }
  return event;
}

enum class Phase { kFilling, kRunning, kEnded };

// An agent of an earlier run of a job that left it, as a restart's end names it.
struct RendezvousState::GoneNode {
  std::string host;
  int32_t node = 0;       // its node rank in the run it left
  int64_t position = -1;  // its claim (global position, else node index), or -1
  GoneHow how = GoneHow::kLeft;
};

namespace {

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

}  // namespace

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

namespace {

constexpr size_t kProgressHosts = 8;
constexpr size_t kProgressMissing = 16;
constexpr size_t kProgressExcluded = 8;
// Excluded nodes a job names in its status; the count covers the rest.
constexpr size_t kKeptExcluded = 64;
// No event kept yet (Decisions::Keep).
constexpr uint32_t kNoEvent = std::numeric_limits<uint32_t>::max();

// How a job ends for nodes left out of it.
AbortEvent NodeUnhealthyAbort(std::string reason) {
  AbortEvent abort;
  abort.cause = AbortCause::kNodeUnhealthy;
  abort.exit_code = kExitNodeUnhealthy;
  abort.reason = std::move(reason);
  return abort;
}

const char* PhaseName(Phase p) {
  switch (p) {
    case Phase::kFilling:
      return "filling";
    case Phase::kRunning:
      return "running";
    case Phase::kEnded:
      return "ended";
  }
  return "?";
}

bool IsLoopback(absl::string_view address) {
  return absl::StartsWith(address, "127.") || address == "::1" || address == "localhost";
}

// MASTER_ADDR: the rank-0 agent's best address, unless that is a loopback address while other
// agents reached the server over the network (`remote_peers`). Then the others could not reach
// it (a host name that /etc/hosts maps to 127.0.1.1 is the usual cause), so take a real one.
std::string ChooseMasterAddress(const std::vector<absl::string_view>& addresses,
                                absl::string_view master_peer, bool remote_peers) {
  const absl::string_view first = addresses.empty() ? "127.0.0.1" : addresses.front();
  if (!IsLoopback(first) || !remote_peers) return std::string(first);
  if (!master_peer.empty() && !IsLoopback(master_peer)) return std::string(master_peer);
  for (absl::string_view a : addresses) {
    if (!IsLoopback(a)) return std::string(a);
  }
  return std::string(first);
}

int64_t ClaimKey(const AgentSpec& a) { return a.order >= 0 ? a.order : a.node_index; }
int64_t ClaimKey(const AgentRecord& a) { return a.order >= 0 ? a.order : a.node_index; }

// Agent `i` of `table` as rank assignment reads it; its names valid until the table changes.
RankInput InputOf(const AgentTable& table, AgentTable::Index i) {
  const AgentRecord& r = table[i];
  return RankInput{table.agent_id(i), table.host(i), r.node_index, r.order, r.nproc};
}

// Sends a running round (`shared`, the parts every member shares) to member `m` on `stream`.
void SendAssignment(Decisions& out, StreamId stream, const AssignmentEvent& shared,
                    const AgentRecord& m) {
  out.SendTo(stream, out.Keep(shared), m.slot, m.spare);
}

// Why the assignment `spec` resumes cannot be one this server handed out, or "".
std::string ImpossibleResume(const JoinSpec& spec) {
  const AssignmentEvent& r = *spec.resume;
  const Slot& slot = r.slot;
  if (r.spare && slot != Slot{}) return "a spare's, with ranks";
  if (r.spare && spec.spare_nodes < 1) return "a spare's, in a job without --spare-nodes";
  const int64_t last_rank = int64_t{slot.rank_offset} + spec.agent.nproc - 1;
  const int64_t last_local = int64_t{slot.local_rank_offset} + spec.agent.nproc - 1;
  if (r.round < 1) return absl::StrFormat("round %d", r.round);
  if (r.agents < 1 || r.agents > spec.max_agents) {
    return absl::StrFormat("%d agents where --nnodes allows %d", r.agents, spec.max_agents);
  }
  if (r.group_world_size < 1 || r.group_world_size > r.agents) {
    return absl::StrFormat("%d nodes for %d agents", r.group_world_size, r.agents);
  }
  if (!r.spare && (slot.group_rank < 0 || slot.group_rank >= r.group_world_size)) {
    return absl::StrFormat("node %d of %d", slot.group_rank, r.group_world_size);
  }
  if (!r.spare && (slot.rank_offset < 0 || last_rank >= r.world_size)) {
    return absl::StrFormat("ranks %d-%d of world size %d", slot.rank_offset, last_rank,
                           r.world_size);
  }
  if (!r.spare && (slot.local_rank_offset < 0 || last_local >= slot.local_world_size ||
                   slot.local_world_size > r.world_size)) {
    return absl::StrFormat("local ranks %d-%d of %d on its node", slot.local_rank_offset,
                           last_local, slot.local_world_size);
  }
  if (r.master_port < 0 || r.master_port > 65535) {
    return absl::StrFormat("master port %d", r.master_port);
  }
  if (r.restart_count < 0) return absl::StrFormat("restart count %d", r.restart_count);
  if (r.longest_heartbeat_interval < 0 || r.longest_heartbeat_interval > kMaxJoinSpan) {
    return absl::StrFormat("a heartbeat interval of %d us", r.longest_heartbeat_interval);
  }
  return "";
}

// One line for a duration from the wire, whatever its value.
std::string Span(Micros span) { return absl::FormatDuration(absl::Microseconds(span)); }

absl::Status OutOfRange(absl::string_view what, int64_t value, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrFormat("%s is %d; expected %s", what, value, expected));
}

}  // namespace

absl::Status ValidateJoinSpec(const JoinSpec& spec) {
  if (spec.job_id.empty()) return absl::InvalidArgumentError("the job id is empty; pass --rdzv-id");
  if (spec.agent.agent_id.empty()) return absl::InvalidArgumentError("the agent id is empty");
  const AgentSpec& agent = spec.agent;
  if (agent.nproc < 1 || agent.nproc > kMaxWorkersPerAgent) {
    return OutOfRange("--nproc-per-node", agent.nproc,
                      absl::StrFormat("1 to %d", kMaxWorkersPerAgent));
  }
  if (spec.min_agents < 1 || spec.max_agents < spec.min_agents) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--nnodes %d:%d is not a valid range; expected 1 <= MIN <= MAX",
                        spec.min_agents, spec.max_agents));
  }
  // Ranks are 32-bit in torch and on the wire. No agent of the job runs more workers than
  // --nnodes times its own count allows, so the job's world fits once every agent's does.
  const int64_t world = int64_t{agent.nproc} * spec.max_agents;
  if (world > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d agents of %d workers each make %d ranks, over the limit of %d; lower --nnodes or "
        "--nproc-per-node",
        spec.max_agents, agent.nproc, world, std::numeric_limits<int32_t>::max()));
  }
  if (agent.order < -1 || agent.order >= spec.max_agents) {
    return absl::InvalidArgumentError(
        absl::StrFormat("global position %d is out of range for %d agents; expected 0..%d",
                        agent.order, spec.max_agents, spec.max_agents - 1));
  }
  // A node holds at least one agent, so there are never more nodes than agents.
  if (agent.node_index < -1 || agent.node_index >= spec.max_agents) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--node-rank %d is out of range for %d nodes; expected 0..%d",
                        agent.node_index, spec.max_agents, spec.max_agents - 1));
  }
  if (spec.last_call < 0 || spec.last_call > kMaxJoinSpan) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--last-call (last_call_ms) is %s; expected 0 to 365 days", Span(spec.last_call)));
  }
  if (spec.master_port < 0 || spec.master_port > 65535) {
    return OutOfRange("the master port", spec.master_port, "0 to 65535");
  }
  if (spec.master_port_override < 0 || spec.master_port_override > 65535) {
    return OutOfRange("--master-port", spec.master_port_override, "1 to 65535, or 0 for none");
  }
  if (spec.restart_count < 0) return OutOfRange("the restart count", spec.restart_count, ">= 0");
  if (spec.max_restarts && *spec.max_restarts < 0) {
    return OutOfRange("--max-restarts", *spec.max_restarts, ">= 0");
  }
  if (spec.longest_heartbeat_interval < 0 || spec.longest_heartbeat_interval > kMaxJoinSpan) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the longest heartbeat interval is %s; expected 0 to 365 days",
                        Span(spec.longest_heartbeat_interval)));
  }
  if (spec.spare_nodes < 0 || spec.spare_nodes >= spec.max_agents) {
    return OutOfRange("--spare-nodes", spec.spare_nodes,
                      absl::StrFormat("0 to %d (fewer than the job's %d nodes)",
                                      spec.max_agents - 1, spec.max_agents));
  }
  if (spec.spare_nodes > 0 && (agent.node_index < 0 || agent.order >= 0)) {
    return absl::InvalidArgumentError(
        "--spare-nodes needs one agent per node with its node rank: launch one task per node "
        "(srun --ntasks-per-node=1), or pass --node-rank to every agent");
  }
  if (spec.unhealthy) {
    const auto kind = static_cast<int32_t>(spec.unhealthy->kind);
    if (!AgentMayReport(spec.unhealthy->kind)) {
      return OutOfRange("the health check's kind", kind, "1 to 8 but 6");
    }
    if (spec.unhealthy->detail.size() > kMaxUnhealthyDetailBytes) {
      return OutOfRange("the health check's line (bytes)",
                        static_cast<int64_t>(spec.unhealthy->detail.size()),
                        absl::StrFormat("at most %d", kMaxUnhealthyDetailBytes));
    }
    for (const char c : spec.unhealthy->detail) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
        return absl::InvalidArgumentError(
            "the health check's line holds a control character; send printable text");
      }
    }
    if (spec.resume) {
      return absl::InvalidArgumentError("a join cannot both resume and report its node unhealthy");
    }
  }
  if (spec.resume) {
    if (const std::string why = ImpossibleResume(spec); !why.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "agent %s asks back into an assignment that no rendezvous hands out (%s); stop the "
          "agent and restart the job",
          agent.agent_id, why));
    }
  }
  return absl::OkStatus();
}

namespace {

// A member's shape is fixed once it has joined: its place among the claims and its ranks were
// (or will be) worked out from it. A join under the same agent id that changes it would take
// the member's place with a different shape, so it is refused, naming both values.
absl::Status SameShape(const std::string& job_id, absl::string_view agent_id,
                       const AgentRecord& held, const AgentSpec& asked) {
  const auto refuse = [&](absl::string_view flag, int64_t was, int64_t now) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "agent %s already joined job %s with %s %d and now asks for %d; rejoin with %s %d, or "
        "give a launcher of another shape its own agent id",
        agent_id, job_id, flag, was, now, flag, was));
  };
  if (asked.nproc != held.nproc) return refuse("--nproc-per-node", held.nproc, asked.nproc);
  if (asked.node_index != held.node_index) {
    return refuse("--node-rank", held.node_index, asked.node_index);
  }
  if (asked.order != held.order) return refuse("global position", held.order, asked.order);
  return absl::OkStatus();
}

// Ranks are assigned by node rank when the agents give one, else by host name; by global
// position when they have one (one agent per task). A job's agents must agree on both, so a
// newcomer that does not is refused, naming the agent it disagrees with; `other` is any member.
absl::Status SameRanking(const std::string& job_id, const RankInput& other,
                         const AgentSpec& asked) {
  if ((asked.node_index >= 0) != (other.node_index >= 0)) {
    const auto gives = [](int64_t node_index) {
      return node_index >= 0 ? absl::StrFormat("gives --node-rank %d", node_index)
                             : std::string("gives no --node-rank");
    };
    return absl::FailedPreconditionError(absl::StrFormat(
        "the agent on %s %s, but the agent on %s, already in job %s, %s; pass --node-rank to "
        "every agent of the job or to none",
        asked.host, gives(asked.node_index), other.host, job_id, gives(other.node_index)));
  }
  if ((asked.order >= 0) != (other.order >= 0)) {
    const auto has = [](int64_t order) {
      return order >= 0 ? "has a global position (one agent per task)"
                        : "has no global position (one agent per node)";
    };
    return absl::FailedPreconditionError(absl::StrFormat(
        "the agent on %s %s, but the agent on %s, already in job %s, %s; run every agent of the "
        "job in the same --mode",
        asked.host, has(asked.order), other.host, job_id, has(other.order)));
  }
  return absl::OkStatus();
}

// The refusal of a resuming agent whose workers run with `claimed` where the job has `actual`.
absl::Status ForeignWorkers(const std::string& host, int32_t round, const std::string& job_id,
                            const std::string& claimed, const std::string& actual) {
  return absl::FailedPreconditionError(absl::StrFormat(
      "the agent on %s rejoins round %d of job %s with %s, but %s; its workers are not this "
      "job's: stop it, or restart the job",
      host, round, job_id, claimed, actual));
}

// A resuming agent's claim against the round the job runs (`runs`, as the first agent back
// brought it, with the job's restart count): workers of another master or size are not this
// job's, and must not change it for the others.
absl::Status SameRun(const std::string& job_id, const AssignmentEvent& runs,
                     const AssignmentEvent& held, const std::string& host) {
  const auto refuse = [&](const std::string& claimed, const std::string& held_by_job) {
    return ForeignWorkers(host, held.round, job_id, claimed,
                          absl::StrCat("the job runs with ", held_by_job));
  };
  const auto master = [](const AssignmentEvent& a) {
    return absl::StrFormat("master %s:%d", a.master_addr, a.master_port);
  };
  if (held.master_addr != runs.master_addr || held.master_port != runs.master_port) {
    return refuse(master(held), master(runs));
  }
  if (held.restart_count != runs.restart_count) {
    return refuse(absl::StrFormat("restart count %d", held.restart_count),
                  absl::StrFormat("restart count %d", runs.restart_count));
  }
  if (held.group_world_size != runs.group_world_size || held.agents != runs.agents) {
    return refuse(absl::StrFormat("%d nodes of %d agents", held.group_world_size, held.agents),
                  absl::StrFormat("%d nodes of %d agents", runs.group_world_size, runs.agents));
  }
  return absl::OkStatus();
}

std::string SizeText(int32_t min, int32_t max) {
  return min == max ? absl::StrFormat("%d", max) : absl::StrFormat("%d:%d", min, max);
}

}  // namespace

RendezvousState::RendezvousState(StateOptions options) : options_(options) {}
RendezvousState::~RendezvousState() = default;

size_t RendezvousState::job_count() const { return jobs_.size(); }

RendezvousState::Job* RendezvousState::FindJob(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

void RendezvousState::Detach(Job& job, Index i) {
  AgentRecord& member = job.members[i];
  if (member.stream == 0) return;
  streams_.erase(member.stream);
  member.stream = 0;
  --job.attached;
}

void RendezvousState::EraseWaiting(Job& job, Index i) {
  const AgentRecord& member = job.members[i];
  job.claims.erase(ClaimKey(member));
  job.TakeBackOverride(member);
  job.DropJoining(i);
  job.members.Erase(i);
}

void RendezvousState::OpenRound(Job& job, const JoinSpec& spec, bool fresh, Decisions& out) {
  DropAwaited(job, absl::AbortedError("a new round started"), out);
  job.awaited.Clear();
  if (!fresh) {
    // A restart: of the last run's agents, those that left or were lost are not coming back;
    // the others are awaited on the stream they still hold, as the records they are.
    job.awaited = std::move(job.members);
    job.members = AgentTable();
    for (Index i : job.awaited) {
      AgentRecord& member = job.awaited[i];
      if (member.stream != 0) --job.attached;
      const bool excluded = job.Excludes(member.node_index, job.awaited.host(i));
      if (excluded || member.left || member.lost) {
        // Counted as left out already, or not coming.
        if (!excluded) {
          NoteGone(
              job,
              GoneNode{std::string(job.awaited.host(i)),
                       member.spare ? member.node_index : member.slot.group_rank, ClaimKey(member),
                       member.left ? (member.finished ? GoneHow::kFinished : GoneHow::kLeft)
                                   : GoneHow::kLost});
        }
        if (member.stream != 0) streams_.erase(member.stream);
        job.awaited.Erase(i);
        continue;
      }
      // Its stream stays its own, now as an awaited agent's.
      if (member.stream != 0) streams_[member.stream] = {&job, i, /*awaited=*/true};
    }
    job.last_run_end = job.abort;
  }
  for (Index i : job.members) Detach(job, i);
  job.members.Clear();
  job.ClearJoining();
  job.ClearOverrides();
  job.left = 0;
  job.claims.clear();
  job.spares = 0;
  job.spares_left = 0;
  if (fresh) {
    // The same job id starting over (a requeued job, maybe on other nodes): what its last run
    // left out or seated is not this run's.
    excluded_agents_ -= job.excluded_agents;
    job.excluded.clear();
    job.excluded_agents = 0;
    job.excluded_positions.clear();
    job.excluded_node_indices.clear();
    job.excluded_hosts.clear();
    job.excluded_news = false;
    job.excluded_told.reset();
    job.seats.clear();
    job.gone.clear();
    job.gone_agents = 0;
    job.gone_positions.clear();
    job.last_run_end.reset();
  }
  job.cannot_form = false;
  job.ran = false;
  job.phase = Phase::kFilling;
  job.round += 1;
  job.restart_count = spec.restart_count;
  job.max_restarts = spec.max_restarts;
  job.TakeSizes(spec);
  job.world_size = 0;
  job.abort.reset();
}

void RendezvousState::Attach(Job& job, Index i, StreamId stream) {
  Detach(job, i);
  job.members[i].stream = stream;
  streams_[stream] = {&job, i, /*awaited=*/false};
  ++job.attached;
}

void RendezvousState::Rebuild(Job& job, Micros now, const JoinSpec& spec) {
  const AssignmentEvent& held = *spec.resume;
  job.phase = Phase::kRunning;
  job.ran = true;
  job.round = held.round;
  job.restart_count = held.restart_count;
  job.TakeSizes(spec);
  job.world_size = held.world_size;
  job.assignment = held;
  job.assignment.slot = Slot{};
  job.assignment.spare = false;
  job.resume_deadline = now + options_.resume_window;
  if (job.node_list.empty()) job.node_list = spec.node_list;
  // Agents that joined afresh wait for their ranks (FillRebuilt); resumed ones claim theirs.
  job.claims.clear();
  job.ClearOverrides();
  job.ClearJoining();
  for (Index i : job.members) job.members[i].unranked = true;
}

int32_t RendezvousState::RankedBack(const Job& job, int32_t* unranked) const {
  int32_t ranked = 0;
  int32_t waiting = 0;
  for (Index i : job.members) {
    const AgentRecord& m = job.members[i];
    if (m.spare) continue;
    if (m.unranked) {
      ++waiting;
    } else {
      ++ranked;
    }
  }
  if (unranked != nullptr) *unranked = waiting;
  return ranked;
}

void RendezvousState::FillRebuilt(Job& job, Micros now, Decisions& out) {
  int32_t unranked = 0;
  const int32_t ranked = RankedBack(job, &unranked);
  if (ranked + unranked < job.assignment.agents) return;
  job.resume_deadline = 0;  // everyone is back
  if (unranked == 0) return;
  // The round's ranks worked out again over all of its agents, as when it formed: rank
  // assignment depends on nothing else, so the resumed agents' ranks come out the same and the
  // others get the ones the lost server gave them.
  std::vector<Index> all;
  std::vector<RankInput> specs;
  for (Index i : job.members) {
    if (job.members[i].spare) continue;
    all.push_back(i);
    specs.push_back(InputOf(job.members, i));
  }
  absl::StatusOr<RankTable> table = AssignRanks(specs);
  bool same = table.ok() && table->world_size == job.world_size &&
              table->group_world_size == job.assignment.group_world_size;
  for (size_t k = 0; same && k < all.size(); ++k) {
    const AgentRecord& m = job.members[all[k]];
    if (!m.unranked && m.slot != table->slots[k]) same = false;
  }
  if (!same) {
    AbortEvent abort;
    abort.cause = AbortCause::kResumeTimedOut;
    abort.exit_code = 1;
    abort.reason = absl::StrFormat(
        "the agents of job %s that came back to this rendezvous server rank differently than the "
        "round they ran (round %d, world size %d); restart the job",
        job.id, job.round, job.world_size);
    EndJob(job, now, std::move(abort), out);
    return;
  }
  uint32_t round = kNoEvent;
  for (size_t k = 0; k < all.size(); ++k) {
    AgentRecord& m = job.members[all[k]];
    if (!m.unranked) continue;
    m.unranked = false;
    m.slot = table->slots[k];
    if (m.node_index >= 0) job.seats[m.node_index] = m.slot.group_rank;
    if (m.stream == 0) continue;
    if (round == kNoEvent) round = out.Keep(job.assignment);
    out.SendTo(m.stream, round, m.slot, m.spare);
  }
}

void RendezvousState::Resume(Micros now, StreamId stream, const JoinSpec& spec,
                             const CallerInfo& caller, Decisions& out) {
  const AssignmentEvent& held = *spec.resume;
  Job* job = FindJob(spec.job_id);
  if (job != nullptr && job->phase == Phase::kFilling && !job->ran &&
      held.restart_count == job->restart_count && job->spare_nodes == 0 && !held.spare &&
      job->min_agents == spec.min_agents && job->max_agents == spec.max_agents) {
    // The round filling here never formed here: agents of the same run whose assignment was
    // lost with the server that formed it joined afresh before any of the others came back. It
    // is that run's round, rebuilt from the resuming agents; the fresh ones get their ranks
    // once every agent is back.
    Rebuild(*job, now, spec);
    out.taken_up.push_back(job->id);
  }
  if (job == nullptr) {
    // This server does not know the job: it restarted while the job ran, or took it over from
    // a lost one. The round is rebuilt from the assignments its agents bring back; the ones not
    // back in time count as lost.
    auto created = std::make_unique<Job>();
    job = created.get();
    job->id = spec.job_id;
    jobs_.emplace(spec.job_id, std::move(created));
    Rebuild(*job, now, spec);
    out.taken_up.push_back(job->id);
  }

  switch (job->phase) {
    case Phase::kEnded:
      // It ended while this agent was away (losing an agent ends a job, this one included).
      out.Tell(stream, *job->abort);
      out.closes.push_back({stream, absl::OkStatus()});
      return;
    case Phase::kFilling:
      out.closes.push_back(
          {stream, absl::AbortedError(absl::StrFormat(
                       "job %s started round %d without this agent, which ran round %d", job->id,
                       job->round, held.round))});
      return;
    case Phase::kRunning:
      break;
  }
  if (job->round != held.round || job->world_size != held.world_size) {
    out.closes.push_back(
        {stream, absl::AbortedError(absl::StrFormat(
                     "job %s runs round %d (world size %d), not this agent's round %d (world "
                     "size %d)",
                     job->id, job->round, job->world_size, held.round, held.world_size))});
    return;
  }
  AssignmentEvent runs = job->assignment;
  runs.restart_count = job->restart_count;
  if (absl::Status s = SameRun(job->id, runs, held, spec.agent.host); !s.ok()) {
    out.closes.push_back({stream, std::move(s)});
    return;
  }
  (void)caller;  // where a resuming agent connected from matters only to a round that forms
  Index it = job->members.Find(spec.agent.agent_id);
  const bool newcomer = it == AgentTable::kNone || job->members[it].unranked;
  if (newcomer) {
    if (job->resume_deadline == 0) {
      out.closes.push_back(
          {stream, absl::AbortedError(absl::StrFormat("round %d of job %s has no agent %s",
                                                      job->round, job->id, spec.agent.agent_id))});
      return;
    }
    bool claimed = false;
    if (!held.spare) {
      auto claim = job->claims.find(held.slot.rank_offset);
      if (claim != job->claims.end() && claim->second != it) {
        out.closes.push_back(
            {stream, absl::FailedPreconditionError(absl::StrFormat(
                         "rank %d of job %s is already held by the agent on %s",
                         held.slot.rank_offset, job->id, job->members.host(claim->second)))});
        return;
      }
      claimed = claim != job->claims.end();
    }
    if (it == AgentTable::kNone) {
      it = job->members.Add(spec.agent);
    } else {
      job->members.Update(it, spec.agent);
    }
    if (!held.spare && !claimed) job->claims.emplace(held.slot.rank_offset, it);
    AgentRecord& m = job->members[it];
    m.unranked = false;
    m.spare = held.spare;
    m.slot = held.spare ? Slot{} : held.slot;
    if (held.spare) {
      ++job->spares;
    } else if (spec.agent.node_index >= 0) {
      job->seats[spec.agent.node_index] = held.slot.group_rank;
    }
  } else if (absl::Status s =
                 SameShape(job->id, job->members.agent_id(it), job->members[it], spec.agent);
             !s.ok()) {
    out.closes.push_back({stream, std::move(s)});
    return;
  } else if (const AgentRecord& m = job->members[it];
             m.spare != held.spare || (!held.spare && m.slot != held.slot)) {
    // Its workers run other ranks than the job gave it (an assignment of an earlier run of the
    // same job id), or it claims ranks as a spare or none as a node: they are not this run's.
    const auto ranks = [](bool spare, const Slot& slot) {
      return spare ? std::string("no ranks (a spare)")
                   : absl::StrFormat("rank %d", slot.rank_offset);
    };
    out.closes.push_back(
        {stream, ForeignWorkers(spec.agent.host, held.round, job->id, ranks(held.spare, held.slot),
                                absl::StrCat("the job gave it ", ranks(m.spare, m.slot)))});
    return;
  } else if (m.stream != 0 && m.stream != stream) {
    out.closes.push_back({m.stream, absl::AbortedError("replaced by a newer join")});
  }
  Attach(*job, it, stream);
  SendAssignment(out, stream, job->assignment, job->members[it]);
  if (job->resume_deadline != 0) FillRebuilt(*job, now, out);
}

void RendezvousState::Join(Micros now, StreamId stream, const JoinSpec& spec,
                           const CallerInfo& caller, Decisions& out) {
  if (absl::Status s = ValidateJoinSpec(spec); !s.ok()) {
    out.closes.push_back({stream, s});
    return;
  }
  if (spec.resume) {
    Resume(now, stream, spec, caller, out);
    return;
  }
  Job* job = FindJob(spec.job_id);
  if (job == nullptr) {
    auto created = std::make_unique<Job>();
    job = created.get();
    job->id = spec.job_id;
    jobs_.emplace(spec.job_id, std::move(created));
    OpenRound(*job, spec, /*fresh=*/true, out);
    job->last_progress = now;
  }

  const Index member_at = job->members.Find(spec.agent.agent_id);
  const bool is_member = member_at != AgentTable::kNone;

  if (job->phase == Phase::kEnded) {
    const bool next_round = spec.restart_count > job->restart_count;
    if (spec.unhealthy && !next_round) {
      // Too late to change this run; it is still left out of the job's next ones.
      Exclude(*job, now, stream, spec.agent, *spec.unhealthy, out);
      return;
    }
    if (!is_member && !next_round && job->abort &&
        (job->abort->cause == AbortCause::kNodeUnhealthy || job->cannot_form) &&
        spec.restart_count == job->restart_count) {
      // A peer of the run that a node's failed health check ended, or of a restart that could
      // not be whole: it hears why, at once, instead of opening a round that waits for that
      // node.
      out.Tell(stream, *job->abort);
      out.closes.push_back({stream, absl::OkStatus()});
      return;
    }
    if (is_member && !next_round) {
      // A reconnect after the end (its first stream broke before the assignment reached it):
      // tell it how the job ended, and end the join, as for a resume, so that the agent exits
      // with the root cause now instead of waiting on a stream that will carry nothing more.
      out.Tell(stream, *job->abort);
      out.closes.push_back({stream, absl::OkStatus()});
      return;
    }
    if (!next_round && job->attached > 0) {
      out.closes.push_back(
          {stream, absl::UnavailableError(absl::StrFormat(
                       "job %s is still ending its previous run; try again", job->id))});
      return;
    }
    // A restart (next_round), or the same job id starting afresh (a requeued job). The old
    // run's streams end, but for a restart those of the agents awaited for it: their end tells
    // the round whether they are coming.
    for (Index i : job->members) {
      const StreamId old = job->members[i].stream;
      if (old != 0 && (!next_round || i == member_at)) {
        out.closes.push_back({old, absl::AbortedError("a new round started")});
        Detach(*job, i);
      }
    }
    OpenRound(*job, spec, /*fresh=*/!next_round, out);
    job->last_progress = now;
    if (job->Expected() < job->Needed()) {
      // Nodes left out while the last run ran (lost, or asked out), or nodes that finished and
      // left, leave too few for this one.
      EndJob(*job, now, CannotForm(*job, nullptr), out);
      job->cannot_form = true;
      out.Tell(stream, *job->abort);
      out.closes.push_back({stream, absl::OkStatus()});
      job->last_detach = now;
      return;
    }
  } else if (job->spare_nodes != spec.spare_nodes) {
    out.closes.push_back({stream, absl::FailedPreconditionError(absl::StrFormat(
                                      "this agent has --spare-nodes %d but job %s was started "
                                      "with --spare-nodes %d; give every agent the same",
                                      spec.spare_nodes, job->id, job->spare_nodes))});
    return;
  } else if (job->min_agents != spec.min_agents || job->max_agents != spec.max_agents) {
    out.closes.push_back(
        {stream, absl::FailedPreconditionError(absl::StrFormat(
                     "this agent expects --nnodes %s but job %s was started with --nnodes %s; "
                     "give every agent the same --nnodes",
                     SizeText(spec.min_agents, spec.max_agents), job->id,
                     SizeText(job->min_agents, job->max_agents)))});
    return;
  }
  if (spec.max_restarts && job->max_restarts && *spec.max_restarts != *job->max_restarts) {
    out.closes.push_back(
        {stream, absl::FailedPreconditionError(
                     absl::StrFormat("this agent has --max-restarts %d but job %s was started with "
                                     "--max-restarts %d; give every agent the same --max-restarts",
                                     *spec.max_restarts, job->id, *job->max_restarts))});
    return;
  }

  if (spec.unhealthy) {
    Exclude(*job, now, stream, spec.agent, *spec.unhealthy, out);
    return;
  }
  if (job->Excludes(spec.agent)) {
    Exclude(*job, now, stream, spec.agent, Unhealthy{ExclusionKind::kNodeLeftOut, ""}, out);
    return;
  }

  if (const Index i = job->members.Find(spec.agent.agent_id); i != AgentTable::kNone) {
    // The same agent again (a retried join): the new stream replaces the old one.
    AgentRecord& member = job->members[i];
    if (absl::Status s = SameShape(job->id, job->members.agent_id(i), member, spec.agent);
        !s.ok()) {
      out.closes.push_back({stream, std::move(s)});
      return;
    }
    if (member.stream != 0 && member.stream != stream) {
      out.closes.push_back({member.stream, absl::AbortedError("replaced by a newer join")});
    }
    Attach(*job, i, stream);
    if (job->phase == Phase::kRunning && !member.unranked) {
      // A spare hears again that it is one.
      SendAssignment(out, stream, job->assignment, member);
    }
    return;
  }

  if (job->phase == Phase::kRunning && job->resume_deadline != 0 && job->spare_nodes == 0 &&
      spec.restart_count == job->restart_count) {
    // The job is being rebuilt from its resuming agents: this one lost its assignment with the
    // server that formed the round, and gets its ranks once every agent is back.
    int32_t unranked = 0;
    const int32_t ranked = RankedBack(*job, &unranked);
    if (ranked + unranked >= job->assignment.agents) {
      out.closes.push_back(
          {stream, absl::FailedPreconditionError(absl::StrFormat(
                       "job %s already has all %d agents; this agent on %s is one too many: "
                       "check --nnodes",
                       job->id, job->assignment.agents, spec.agent.host))});
      return;
    }
    const Index waiting = job->members.Add(spec.agent);
    job->members[waiting].unranked = true;
    Attach(*job, waiting, stream);
    FillRebuilt(*job, now, out);
    return;
  }

  if (job->phase == Phase::kRunning) {
    out.closes.push_back(
        {stream,
         absl::FailedPreconditionError(absl::StrFormat(
             "job %s already started (round %d, %d agents); this agent on %s came too "
             "late: check --nnodes, and that the job id is not reused",
             job->id, job->round, static_cast<int>(job->members.size()), spec.agent.host))});
    return;
  }

  if (!job->members.empty()) {
    const RankInput other = InputOf(job->members, *job->members.begin());
    if (absl::Status s = SameRanking(job->id, other, spec.agent); !s.ok()) {
      out.closes.push_back({stream, std::move(s)});
      return;
    }
    if (job->spare_nodes > 0 && other.nproc != spec.agent.nproc) {
      // A spare takes a lost node's ranks one for one, so the nodes after it keep theirs.
      out.closes.push_back(
          {stream, absl::FailedPreconditionError(absl::StrFormat(
                       "the agent on %s runs %d workers but the agent on %s, already in job %s, "
                       "runs %d; with --spare-nodes every node runs the same --nproc-per-node",
                       spec.agent.host, spec.agent.nproc, other.host, job->id, other.nproc))});
      return;
    }
  }

  // A fixed master endpoint must be the same wherever it is given: otherwise one agent could
  // point every worker of the job somewhere else.
  const bool addr_differs = !spec.master_addr_override.empty() && job->addr_givers > 0 &&
                            spec.master_addr_override != job->addr_override;
  const bool port_differs = spec.master_port_override > 0 && job->port_givers > 0 &&
                            spec.master_port_override != job->port_override;
  if (addr_differs || port_differs) {
    // Refusals only: name one member that set what this agent contradicts.
    Index o = AgentTable::kNone;
    for (Index i : job->members) {
      const AgentRecord& other = job->members[i];
      if ((addr_differs && other.gave_master_addr) || (port_differs && other.gave_master_port)) {
        o = i;
        break;
      }
    }
    const bool named = o != AgentTable::kNone;
    out.closes.push_back(
        {stream, absl::FailedPreconditionError(absl::StrFormat(
                     "the agent on %s sets the master to %s:%d but the agent on %s set %s:%d; "
                     "give every agent the same --master-addr and --master-port, or none",
                     spec.agent.host, spec.master_addr_override, spec.master_port_override,
                     named ? job->members.host(o) : "?",
                     !named || job->members[o].gave_master_addr ? job->addr_override : "",
                     !named || job->members[o].gave_master_port ? job->port_override : 0))});
    return;
  }

  const int64_t claim = ClaimKey(spec.agent);
  if (claim >= 0) {
    if (auto it = job->claims.find(claim); it != job->claims.end()) {
      out.closes.push_back(
          {stream, absl::FailedPreconditionError(absl::StrFormat(
                       "%s %d of job %s is already taken by the agent on %s; give each %s its own",
                       spec.agent.order >= 0 ? "global position" : "node rank", claim, job->id,
                       job->members.host(it->second),
                       spec.agent.order >= 0 ? "agent" : "node --node-rank"))});
      return;
    }
  }
  if (static_cast<int32_t>(job->members.size()) >= job->Expected()) {
    out.closes.push_back(
        {stream, absl::FailedPreconditionError(absl::StrFormat(
                     "job %s already has all %d agents; this agent on %s is one too many: "
                     "check --nnodes",
                     job->id, job->Expected(), spec.agent.host))});
    return;
  }

  if (const Index back = job->awaited.Find(spec.agent.agent_id); back != AgentTable::kNone) {
    // Back: the stream of its last run is done with.
    const StreamId old = job->awaited[back].stream;
    if (old != 0 && old != stream) {
      out.closes.push_back({old, absl::AbortedError("replaced by a newer join")});
      streams_.erase(old);
    }
    job->awaited.Erase(back);
  }
  const Index i = job->members.Add(spec.agent);
  if (claim >= 0) job->claims.emplace(claim, i);
  if (!job->max_restarts) job->max_restarts = spec.max_restarts;
  if (job->node_list.empty()) job->node_list = spec.node_list;
  AgentRecord& member = job->members[i];
  member.gave_master_addr = !spec.master_addr_override.empty();
  member.gave_master_port = spec.master_port_override > 0;
  job->GiveOverride(spec);
  job->KeepJoining(i, spec, caller.peer_address);
  Attach(*job, i, stream);
  job->last_join = now;
  if (!job->excluded.empty()) {
    // Nodes left out before this agent came: it hears of them too (a few, as progress does).
    ProgressEvent p;
    p.joined = static_cast<int32_t>(job->members.size());
    p.expected = job->Expected();
    p.excluded.assign(job->excluded.begin(),
                      job->excluded.begin() + std::min(job->excluded.size(), kProgressExcluded));
    out.Tell(stream, std::move(p));
  }
  if (static_cast<int32_t>(job->members.size()) == job->Expected()) {
    CompleteRound(*job, now, out);
    EraseIfDone(spec.job_id);  // a round that could not be ranked leaves nobody
  }
}

AbortEvent RendezvousState::TooFewLeft(const Job& job, const ExcludedNode* latest) const {
  if (latest == nullptr && !job.excluded.empty()) latest = &job.excluded.back();
  std::vector<std::string> hosts;
  for (const ExcludedNode& e : job.excluded) {
    if (std::find(hosts.begin(), hosts.end(), e.host) == hosts.end()) hosts.push_back(e.host);
  }
  if (latest != nullptr && std::find(hosts.begin(), hosts.end(), latest->host) == hosts.end()) {
    hosts.push_back(latest->host);
  }
  return NodeUnhealthyAbort(absl::StrFormat(
      "%s; job %s needs %d agents and can now have at most %d: leave the node%s out (sbatch "
      "--exclude=%s), or lower --nnodes",
      latest != nullptr ? DescribeExcluded(*latest)
                        : absl::StrFormat("%d agents were left out", job.excluded_agents),
      job.id, job.Needed(), job.Expected(), hosts.size() == 1 ? "" : "s",
      absl::StrJoin(hosts, ",")));
}

AbortEvent RendezvousState::CannotForm(const Job& job, const GoneNode* latest) const {
  if (job.gone_agents == 0 || !job.last_run_end || job.gone.empty()) {
    return TooFewLeft(job, nullptr);
  }
  if (latest == nullptr) latest = &job.gone.back();
  // The run's own end (the failure, with its exit code and stderr) and why it is the last.
  AbortEvent abort = *job.last_run_end;
  const std::string more =
      job.gone_agents > 1 ? absl::StrFormat(" (and %d more agents)", job.gone_agents - 1) : "";
  abort.reason = absl::StrFormat(
      "%s; job %s cannot restart whole: %s (node %d) had already %s%s, and the job needs %d "
      "agents but can now have at most %d",
      abort.reason, job.id, latest->host, latest->node,
      latest->how == GoneHow::kFinished ? "finished (its workers succeeded and its agent left)"
      : latest->how == GoneHow::kLost   ? "been lost (its agent died after the job's failure)"
                                              : "left the job (its agent exited)",
      more, job.Needed(), job.Expected());
  return abort;
}

void RendezvousState::NoteGone(Job& job, GoneNode node) {
  ++job.gone_agents;
  if (node.position >= 0) job.gone_positions.insert(node.position);
  if (job.gone.size() < kKeptExcluded) job.gone.push_back(std::move(node));
}

bool RendezvousState::NoteExcluded(Job& job, const AgentSpec& agent, const ExcludedNode& node) {
  // Each agent position counts once, however often its agent says so; past max_agents nothing
  // more can change (the job already cannot run), so nothing more is kept.
  const int64_t position = ClaimKey(agent);
  const bool counted = position >= 0 ? job.excluded_positions.contains(position)
                                     : job.excluded_hosts.contains(agent.host);
  if (counted || job.excluded_agents >= job.max_agents ||
      job.excluded_agents >= kMaxExcludedAgents) {
    return false;
  }
  ++job.excluded_agents;
  ++excluded_agents_;
  if (position >= 0) job.excluded_positions.insert(position);
  if (agent.node_index >= 0) {
    job.excluded_node_indices.insert(agent.node_index);
  } else {
    job.excluded_hosts.insert(agent.host);
  }
  if (job.excluded.size() < kKeptExcluded && node.why.kind != ExclusionKind::kNodeLeftOut) {
    job.excluded.push_back(node);
  }
  return true;
}

void RendezvousState::Exclude(Job& job, Micros now, StreamId stream, const AgentSpec& agent,
                              const Unhealthy& why, Decisions& out) {
  const int64_t position = ClaimKey(agent);
  const bool counted = position >= 0 ? job.excluded_positions.contains(position)
                                     : job.excluded_hosts.contains(agent.host);
  if (!counted && job.excluded_agents == kMaxExcludedAgents && job.phase == Phase::kFilling) {
    // So many nodes failing points at the check or the cluster, not at the nodes: the round
    // ends rather than keep records without end. A running job keeps running; the node is
    // refused without a record.
    EndJob(
        job, now,
        NodeUnhealthyAbort(absl::StrFormat(
            "%d agents of job %s were left out, the most one job may have; check the health "
            "check (--health-check) on a node that failed it%s",
            kMaxExcludedAgents, job.id,
            job.excluded.empty() ? ""
                                 : absl::StrCat(", such as ", DescribeExcluded(job.excluded[0])))),
        out);
  }
  ExcludedNode node{agent.host, agent.node_index, why};
  if (why.kind == ExclusionKind::kNodeLeftOut) {
    // Name the first reason its node was left out for.
    for (const ExcludedNode& e : job.excluded) {
      if (agent.node_index >= 0 ? e.node_index == agent.node_index : e.host == agent.host) {
        node.why.detail = DescribeExcluded(e);
        break;
      }
    }
  }
  const bool newly = NoteExcluded(job, agent, node);
  job.last_detach = now;
  out.closes.push_back({stream, absl::FailedPreconditionError(
                                    absl::StrFormat("%s is left out of job %s for good: %s",
                                                    agent.host, job.id, DescribeExcluded(node)))});
  if (!newly || job.phase != Phase::kFilling) return;

  if (job.Expected() < job.Needed()) {
    EndJob(job, now, TooFewLeft(job, &node), out);
    return;
  }
  job.excluded_news = true;
  if (!job.members.empty() && static_cast<int32_t>(job.members.size()) >= job.Expected()) {
    CompleteRound(job, now, out);  // tells them first
    EraseIfDone(job.id);
    return;
  }
  // The waiting agents hear of the first one now, not at the next progress tick; of a burst,
  // once an interval: each message goes to every one of them.
  if (!job.excluded_told || now - *job.excluded_told >= options_.progress_interval) {
    TellExcluded(job, now, out);
  }
}

void RendezvousState::TellExcluded(Job& job, Micros now, Decisions& out) {
  job.excluded_news = false;
  job.excluded_told = now;
  ProgressEvent p;
  p.joined = static_cast<int32_t>(job.members.size());
  p.expected = job.Expected();
  p.excluded.assign(job.excluded.begin(),
                    job.excluded.begin() + std::min(job.excluded.size(), kProgressExcluded));
  const uint32_t event = out.Keep(std::move(p));
  for (Index i : job.members) {
    if (job.members[i].stream != 0) out.SendTo(job.members[i].stream, event);
  }
}

void RendezvousState::CompleteRound(Job& job, Micros now, Decisions& out) {
  // The round forms without the agents of the last run that have not come (an elastic round
  // after its last call): a later join of theirs is one too late.
  DropAwaited(job, absl::AbortedError("the round formed without this agent"), out);
  job.awaited.Clear();
  // Agents hear of every node left out before their ranks, which the round gives without it.
  if (job.excluded_news) TellExcluded(job, now, out);
  std::vector<Index> members;
  std::vector<RankInput> specs;
  members.reserve(job.members.size());
  specs.reserve(job.members.size());
  for (Index i : job.members) {
    members.push_back(i);
    specs.push_back(InputOf(job.members, i));
  }
  std::vector<Index> spares;
  if (job.spare_nodes > 0) {
    // Ranks go to the seated nodes, by seat; the rest wait as spares.
    std::vector<bool> spare = SeatNodes(job, specs);
    std::vector<Index> seated;
    std::vector<RankInput> seated_specs;
    for (size_t k = 0; k < members.size(); ++k) {
      if (spare[k]) {
        spares.push_back(members[k]);
      } else {
        seated.push_back(members[k]);
        seated_specs.push_back(specs[k]);
      }
    }
    members = std::move(seated);
    specs = std::move(seated_specs);
  }
  absl::StatusOr<RankTable> table = AssignRanks(specs);
  std::vector<RankInput>().swap(specs);
  if (!table.ok()) {
    for (Index i : job.members) {
      if (job.members[i].stream != 0) out.closes.push_back({job.members[i].stream, table.status()});
    }
    // Nobody can use this round: forget it so that corrected agents can start over.
    for (Index i : job.members) Detach(job, i);
    job.members.Clear();
    job.ClearJoining();
    job.ClearOverrides();
    job.left = 0;
    job.claims.clear();
    return;
  }

  const Index master = members[table->master_agent];
  AssignmentEvent shared;
  shared.round = job.round;
  shared.world_size = table->world_size;
  shared.group_world_size = table->group_world_size;
  shared.restart_count = job.restart_count;
  shared.agents = static_cast<int32_t>(members.size());
  shared.workers_per_node = FormatTasksPerNode(table->workers_per_node);
  bool remote_peers = false;
  bool addr_given = false;
  bool port_given = false;
  for (Index i : members) {
    job.longest_heartbeat_interval =
        std::max(job.longest_heartbeat_interval, job.joining[i].longest_heartbeat_interval);
    absl::string_view peer;
    job.AddressesOf(i, &peer);
    remote_peers = remote_peers || (!peer.empty() && !IsLoopback(peer));
    addr_given = addr_given || job.members[i].gave_master_addr;
    port_given = port_given || job.members[i].gave_master_port;
  }
  shared.longest_heartbeat_interval = job.longest_heartbeat_interval;
  absl::string_view master_peer;
  const std::vector<absl::string_view> master_addresses = job.AddressesOf(master, &master_peer);
  shared.master_addr = ChooseMasterAddress(master_addresses, master_peer, remote_peers);
  shared.master_port = job.joining[master].master_port;
  // Every agent that gives a part of the endpoint gives the same (Join refuses the others).
  if (addr_given) shared.master_addr = job.addr_override;
  if (port_given) shared.master_port = job.port_override;
  job.assignment = shared;
  job.world_size = table->world_size;
  job.phase = Phase::kRunning;
  job.ran = true;

  const uint32_t round = out.Keep(std::move(shared));
  for (size_t k = 0; k < members.size(); ++k) {
    AgentRecord& m = job.members[members[k]];
    m.slot = table->slots[k];
    m.spare = false;
    if (m.stream != 0) out.SendTo(m.stream, round, m.slot);
  }
  job.spares = static_cast<int32_t>(spares.size());
  job.spares_left = 0;
  for (Index i : spares) {
    AgentRecord& m = job.members[i];
    m.slot = Slot{};
    m.spare = true;
    if (m.stream != 0) out.SendTo(m.stream, round, m.slot, /*spare=*/true);
  }
  // What only the forming read is done with; the records take no more agents.
  job.ClearJoining();
  job.members.ShrinkToFit();
}

std::vector<bool> RendezvousState::SeatNodes(Job& job, std::vector<RankInput>& specs) {
  const auto seats = static_cast<size_t>(std::max(0, job.max_agents - job.spare_nodes));
  std::vector<size_t> by_node(specs.size());
  for (size_t i = 0; i < by_node.size(); ++i) by_node[i] = i;
  std::sort(by_node.begin(), by_node.end(),
            [&](size_t l, size_t r) { return specs[l].node_index < specs[r].node_index; });
  // A node that held a seat in the last round keeps it; the free seats go to the others in node
  // order: in the first round the lowest node ranks, after a loss the lowest spare.
  std::vector<int64_t> holder(seats, -1);
  std::vector<int64_t> seat_of(specs.size(), -1);
  for (size_t i : by_node) {
    auto held = job.seats.find(specs[i].node_index);
    if (held == job.seats.end() || held->second < 0 || static_cast<size_t>(held->second) >= seats ||
        holder[held->second] >= 0) {
      continue;
    }
    holder[held->second] = specs[i].node_index;
    seat_of[i] = held->second;
  }
  size_t free = 0;
  for (size_t i : by_node) {
    if (seat_of[i] >= 0) continue;
    while (free < seats && holder[free] >= 0) ++free;
    if (free == seats) break;
    holder[free] = specs[i].node_index;
    seat_of[i] = static_cast<int64_t>(free);
  }
  // Fewer nodes than seats (no spare left): the empty seats close up, so that node ranks stay
  // 0..G-1; the nodes after a gap move down.
  std::vector<int64_t> dense(seats, -1);
  int64_t next = 0;
  for (size_t seat = 0; seat < seats; ++seat) {
    if (holder[seat] >= 0) dense[seat] = next++;
  }
  job.seats.clear();
  std::vector<bool> spare(specs.size(), true);
  for (size_t i = 0; i < specs.size(); ++i) {
    if (seat_of[i] < 0) continue;
    spare[i] = false;
    const int64_t seat = dense[seat_of[i]];
    job.seats[specs[i].node_index] = static_cast<int32_t>(seat);
    specs[i].node_index = seat;
  }
  return spare;
}

void RendezvousState::EndJob(Job& job, Micros now, AbortEvent abort, Decisions& out) {
  const bool filling = job.phase == Phase::kFilling;
  // Agents still awaited for the round hear how it ended when they come for it.
  DropAwaited(job, absl::OkStatus(), out);
  job.phase = Phase::kEnded;
  job.ended_at = now;
  job.abort = std::move(abort);
  uint32_t event = kNoEvent;
  for (Index i : job.members) {
    const AgentRecord& member = job.members[i];
    if (member.stream == 0 || member.left) continue;
    if (event == kNoEvent) event = out.Keep(*job.abort);
    out.SendTo(member.stream, event);
    // A waiter's join ends with the abort: no assignment will follow it.
    if (filling) {
      out.closes.push_back({member.stream, absl::OkStatus()});
      Detach(job, i);
    }
  }
  if (filling) job.last_detach = now;
}

bool RendezvousState::Runs(StreamId stream) const {
  auto owner = streams_.find(stream);
  if (owner == streams_.end() || owner->second.awaited) return false;
  const Job& job = *owner->second.job;
  if (job.phase != Phase::kRunning) return false;
  const AgentRecord& member = job.members[owner->second.index];
  return member.stream == stream && !member.left && !member.unranked;
}

void RendezvousState::StreamClosed(Micros now, StreamId stream, Decisions& out) {
  auto owner_it = streams_.find(stream);
  if (owner_it == streams_.end()) return;
  const StreamOwner owner = owner_it->second;
  Job& job = *owner.job;
  const std::string job_id = job.id;  // the job may go (EraseIfDone)
  if (owner.awaited) {
    // An agent awaited for the restart lost the stream of its last run without a word: its
    // process died; it is not coming.
    streams_.erase(stream);
    job.awaited[owner.index].stream = 0;
    AwaitedGone(job, now, owner.index, GoneHow::kLost, out);
    EraseIfDone(job_id);
    return;
  }
  const Index i = owner.index;
  Detach(job, i);
  job.last_detach = now;
  AgentRecord& member = job.members[i];

  switch (job.phase) {
    case Phase::kFilling:
      // A waiter gave up (deadline, Ctrl-C): it is no longer part of the round.
      EraseWaiting(job, i);
      break;
    case Phase::kRunning: {
      if (member.left) break;
      if (member.unranked) {
        // It waited for its ranks in a rebuilt job, and gave up: as a waiter of a round.
        job.members.Erase(i);
        break;
      }
      // A node lost while the job runs does not come back to it, even if its agent does.
      const AgentSpec agent = job.members.Spec(i);
      NoteExcluded(
          job, agent,
          ExcludedNode{agent.host, agent.node_index, Unhealthy{ExclusionKind::kNodeLost, ""}});
      if (member.spare) {
        // The job runs on without it, one spare short.
        member.left = true;
        ++job.left;
        ++job.spares_left;
        break;
      }
      EndJob(job, now,
             AbortForLostAgent(agent.host, member.slot.group_rank, member.slot.rank_offset,
                               member.slot.rank_offset + agent.nproc - 1),
             out);
      break;
    }
    case Phase::kEnded:
      // Its agent died after the end, before any restart: a restart will not have it.
      if (!member.left) member.lost = true;
      break;
  }
  EraseIfDone(job_id);
}

bool RendezvousState::Awaits(StreamId stream) const {
  auto owner = streams_.find(stream);
  if (owner == streams_.end()) return false;
  const Job& job = *owner->second.job;
  if (owner->second.awaited) return job.awaited[owner->second.index].stream == stream;
  if (job.phase != Phase::kEnded) return false;
  const AgentRecord& member = job.members[owner->second.index];
  return member.stream == stream && !member.left;
}

void RendezvousState::AwaitedGone(Job& job, Micros now, Index i, GoneHow how, Decisions& out) {
  const AgentRecord& awaited = job.awaited[i];
  GoneNode node{std::string(job.awaited.host(i)),
                awaited.spare ? awaited.node_index : awaited.slot.group_rank, ClaimKey(awaited),
                how};
  if (awaited.stream != 0) streams_.erase(awaited.stream);
  job.awaited.Erase(i);
  NoteGone(job, node);
  job.last_detach = now;
  if (job.phase != Phase::kFilling) return;
  if (job.Expected() < job.Needed()) {
    EndJob(job, now, CannotForm(job, &node), out);
    job.cannot_form = true;
  } else if (!job.members.empty() && static_cast<int32_t>(job.members.size()) >= job.Expected()) {
    CompleteRound(job, now, out);  // it waited only for that agent
  }
}

void RendezvousState::DropAwaited(Job& job, const absl::Status& status, Decisions& out) {
  for (Index i : job.awaited) {
    AgentRecord& awaited = job.awaited[i];
    if (awaited.stream == 0) continue;
    out.closes.push_back({awaited.stream, status});
    streams_.erase(awaited.stream);
    awaited.stream = 0;
  }
}

absl::StatusOr<AbortEvent> RendezvousState::ReportFailure(Micros now, const std::string& job_id,
                                                          const std::string& agent_id,
                                                          const FailureInfo& failure,
                                                          Decisions& out) {
  if (failure.cause != AbortCause::kWorkerFailed && failure.cause != AbortCause::kWorkerHung &&
      failure.cause != AbortCause::kAgentSignalled) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a failure report names a worker's failure or hang or an agent's stop request, not %s",
        AbortCauseName(failure.cause)));
  }
  Job* job = FindJob(job_id);
  if (job == nullptr || !job->members.contains(agent_id)) {
    return absl::NotFoundError(
        absl::StrFormat("job %s has no agent %s (did the server restart?)", job_id, agent_id));
  }
  if (job->phase != Phase::kEnded) {
    EndJob(*job, now, AbortFor(failure), out);
  } else if (job->abort) {
    // A hang that began first names the culprit, however late its report came.
    if (std::optional<AbortEvent> better =
            RefineAbortWithHang(*job->abort, now - job->ended_at, failure)) {
      EndJob(*job, job->ended_at, *std::move(better), out);
    }
  }
  return *job->abort;
}

absl::Status RendezvousState::Leave(Micros now, const std::string& job_id,
                                    const std::string& agent_id, Decisions& out) {
  Job* job = FindJob(job_id);
  if (job != nullptr && !job->members.contains(agent_id)) {
    if (const Index awaited = job->awaited.Find(agent_id); awaited != AgentTable::kNone) {
      // An agent of the last run leaves instead of coming back for the restart.
      if (job->awaited[awaited].stream != 0) {
        out.closes.push_back({job->awaited[awaited].stream, absl::OkStatus()});
      }
      AwaitedGone(*job, now, awaited, GoneHow::kLeft, out);
      EraseIfDone(job_id);
      return absl::OkStatus();
    }
  }
  if (job == nullptr || !job->members.contains(agent_id)) {
    return absl::NotFoundError(absl::StrFormat(
        "job %s has no agent %s to leave (did the server restart?)", job_id, agent_id));
  }
  const Index i = job->members.Find(agent_id);
  AgentRecord& member = job->members[i];
  if (member.stream != 0) out.closes.push_back({member.stream, absl::OkStatus()});
  Detach(*job, i);
  job->last_detach = now;
  if (job->phase == Phase::kFilling) {
    EraseWaiting(*job, i);
  } else if (member.unranked) {
    job->members.Erase(i);  // it never had ranks in this round
  } else if (!member.left) {
    member.left = true;
    member.finished = job->phase == Phase::kRunning && !member.spare;
    ++job->left;
    if (member.spare) ++job->spares_left;
    if (job->phase == Phase::kRunning && job->spares > job->spares_left &&
        job->left - job->spares_left == job->members.size() - static_cast<size_t>(job->spares)) {
      // Every node that ran the job is done with it: so are its spares, which were not needed.
      for (Index s : job->members) {
        AgentRecord& m = job->members[s];
        if (!m.spare || m.left) continue;
        if (m.stream != 0) out.closes.push_back({m.stream, absl::OkStatus()});
        Detach(*job, s);
        m.left = true;
        ++job->left;
        ++job->spares_left;
      }
    }
  }
  EraseIfDone(job_id);
  return absl::OkStatus();
}

absl::StatusOr<AbortEvent> RendezvousState::Abort(Micros now, const std::string& job_id,
                                                  AbortEvent abort, Decisions& out) {
  Job* job = FindJob(job_id);
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrFormat("rdzvd has no job %s; see rdzvctl status", job_id));
  }
  if (job->phase != Phase::kEnded) EndJob(*job, now, std::move(abort), out);
  return *job->abort;
}

void RendezvousState::EraseIfDone(const std::string& job_id) {
  Job* job = FindJob(job_id);
  if (job == nullptr) return;
  const bool everyone_left = job->left == job->members.size();
  // A job that left nodes out and did not run, or whose restart could not be whole, stays
  // (Tick ends it), so that their agents, late peers and its status can see why.
  if ((job->excluded_agents > 0 || job->cannot_form) && job->phase != Phase::kRunning) return;
  if (job->phase == Phase::kFilling ? job->members.empty() : everyone_left) EraseJob(job_id);
}

void RendezvousState::EraseJob(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  // No stream may name a job that is gone.
  const Job& job = *it->second;
  for (Index i : job.awaited) {
    if (job.awaited[i].stream != 0) streams_.erase(job.awaited[i].stream);
  }
  for (Index i : job.members) {
    if (job.members[i].stream != 0) streams_.erase(job.members[i].stream);
  }
  excluded_agents_ -= job.excluded_agents;
  jobs_.erase(it);
}

ProgressEvent RendezvousState::MakeProgress(const Job& job) const {
  ProgressEvent p;
  p.joined = static_cast<int32_t>(job.members.size());
  p.expected = job.Expected();
  const size_t excluded = std::min(job.excluded.size(), kProgressExcluded);
  p.excluded.assign(job.excluded.begin(), job.excluded.begin() + excluded);
  std::vector<absl::string_view> hosts;
  hosts.reserve(job.members.size());
  for (Index i : job.members) hosts.push_back(job.members.host(i));
  std::sort(hosts.begin(), hosts.end());
  hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
  if (hosts.size() > kProgressHosts) hosts.resize(kProgressHosts);
  p.joined_hosts.reserve(hosts.size());
  for (absl::string_view host : hosts) p.joined_hosts.emplace_back(host);
  if (!job.claims.empty()) {
    for (int64_t i = 0; i < job.max_agents && p.missing_node_indices.size() < kProgressMissing;
         ++i) {
      if (!job.claims.contains(i) && !job.excluded_positions.contains(i) &&
          !job.gone_positions.contains(i)) {
        p.missing_node_indices.push_back(i);
      }
    }
  }
  return p;
}

void RendezvousState::Tick(Micros now, Decisions& out) {
  std::vector<std::string> expired;
  for (auto& [id, job_ptr] : jobs_) {
    Job& job = *job_ptr;
    if (job.phase == Phase::kFilling) {
      const auto joined = static_cast<int32_t>(job.members.size());
      if (joined == 0) {
        // Only its left-out nodes keep it (EraseIfDone): kept as an ended job would be.
        if (job.attached == 0 && now - job.last_detach >= options_.ended_job_ttl) {
          expired.push_back(id);
        }
      } else if (joined >= job.Needed() && now - job.last_join >= job.last_call) {
        CompleteRound(job, now, out);
        if (job.members.empty()) expired.push_back(id);  // the round could not be ranked
      } else if (now - job.last_progress >= options_.progress_interval) {
        job.last_progress = now;
        job.excluded_news = false;  // the progress names them too
        const uint32_t progress = out.Keep(MakeProgress(job));
        for (Index i : job.members) {
          if (job.members[i].stream != 0) out.SendTo(job.members[i].stream, progress);
        }
      }
    } else if (job.phase == Phase::kRunning && job.resume_deadline != 0 &&
               now >= job.resume_deadline) {
      job.resume_deadline = 0;
      AbortEvent abort;
      abort.cause = AbortCause::kResumeTimedOut;
      int32_t unranked = 0;
      const int32_t back = RankedBack(job, &unranked) + unranked;
      abort.reason = absl::StrFormat(
          "%d of %d agents did not come back within %ds after the rendezvous server restarted "
          "or the job moved to this one",
          job.assignment.agents - back, job.assignment.agents, options_.resume_window / 1'000'000);
      abort.exit_code = 1;
      EndJob(job, now, std::move(abort), out);
    } else if (job.phase == Phase::kEnded && job.attached == 0 &&
               now - std::max(job.ended_at, job.last_detach) >= options_.ended_job_ttl) {
      expired.push_back(id);
    } else if (job.phase == Phase::kEnded && job.attached > 0 &&
               now - job.ended_at >= options_.ended_job_ttl) {
      // Every agent heard the abort long ago; one that still holds its stream open (hung, or
      // not a real agent) does not keep the job alive: its stream is ended with the abort.
      for (Index i : job.members) {
        if (job.members[i].stream == 0) continue;
        out.closes.push_back({job.members[i].stream, absl::AbortedError(job.abort->reason)});
        Detach(job, i);
      }
      expired.push_back(id);
    }
  }
  for (const std::string& id : expired) EraseJob(id);
}

std::vector<JobStatusView> RendezvousState::Status(const std::string& job_id) const {
  std::vector<JobStatusView> views;
  for (const auto& [id, job_ptr] : jobs_) {
    if (!job_id.empty() && id != job_id) continue;
    const Job& job = *job_ptr;
    JobStatusView v;
    v.job_id = id;
    v.round = job.round;
    v.state = PhaseName(job.phase);
    v.joined = static_cast<int32_t>(job.members.size());
    v.min_agents = job.min_agents;
    v.max_agents = job.max_agents;
    v.world_size = job.world_size;
    v.node_list = job.node_list;
    v.excluded = job.excluded;
    v.agents.reserve(job.members.size());
    for (Index i : job.members) {
      const AgentRecord& m = job.members[i];
      AgentStatusView a;
      a.agent_id = std::string(job.members.agent_id(i));
      a.host = std::string(job.members.host(i));
      a.node_index = m.node_index;
      a.nproc = m.nproc;
      a.rank_offset =
          job.phase == Phase::kFilling || m.spare || m.unranked ? -1 : m.slot.rank_offset;
      a.state = m.left       ? "left"
                : m.spare    ? "spare"
                : m.unranked ? "waiting"
                             : (m.stream != 0 ? "attached" : "detached");
      v.agents.push_back(std::move(a));
    }
    std::sort(v.agents.begin(), v.agents.end(),
              [](const AgentStatusView& l, const AgentStatusView& r) {
                return std::tie(l.rank_offset, l.host, l.agent_id) <
                       std::tie(r.rank_offset, r.host, r.agent_id);
              });
    views.push_back(std::move(v));
  }
  std::sort(views.begin(), views.end(),
            [](const JobStatusView& l, const JobStatusView& r) { return l.job_id < r.job_id; });
  return views;
}

StreamId RendezvousState::StreamOf(const std::string& job_id, absl::string_view agent_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return 0;
  const Job& job = *it->second;
  if (const Index i = job.members.Find(agent_id); i != AgentTable::kNone) {
    return job.members[i].stream;
  }
  if (const Index i = job.awaited.Find(agent_id); i != AgentTable::kNone) {
    return job.awaited[i].stream;
  }
  return 0;
}

}  // namespace rdzv
