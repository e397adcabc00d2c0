// RendezvousState's rounds: how a job's round opens, forms, and ends; restarts and the agents of
// the last run they await; nodes left out for good; a round rebuilt from resuming agents; and
// time passing (Tick). Joins and departures are in rendezvous_state.cc.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/core/hang_verdict.h"
#include "common/core/hostlist.h"
#include "common/core/rendezvous_job.h"
#include "common/core/rendezvous_state.h"

namespace rdzv {

namespace {

// How a job ends for nodes left out of it.
AbortEvent NodeUnhealthyAbort(std::string reason) {
  AbortEvent abort;
  abort.cause = AbortCause::kNodeUnhealthy;
  abort.exit_code = kExitNodeUnhealthy;
  abort.reason = std::move(reason);
  return abort;
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
}  // namespace

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
  ForgetMembers(job);
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
    ForgetMembers(job);
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

}  // namespace rdzv
