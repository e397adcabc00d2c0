// RendezvousState: joins, departures, failure reports and lost streams. A round's forming,
// restarts, left-out nodes and the end are in rendezvous_rounds.cc; the views of a job in
// rendezvous_status.cc; what makes a join valid in join_validation.cc.
#include "common/core/rendezvous_state.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/core/hang_verdict.h"
#include "common/core/join_validation.h"
#include "common/core/rendezvous_job.h"

namespace rdzv {

Event Decisions::EventOf(const Send& send) const {
  Event event = events[send.event];
  if (auto* assignment = std::get_if<AssignmentEvent>(&event)) {
    assignment->slot = send.slot;
    assignment->spare = send.spare;
  }
  return event;
}

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

void RendezvousState::ForgetMembers(Job& job) {
  for (Index i : job.members) Detach(job, i);
  job.members.Clear();
  job.ClearJoining();
  job.ClearOverrides();
  job.left = 0;
  job.claims.clear();
}

void RendezvousState::EraseWaiting(Job& job, Index i) {
  const AgentRecord& member = job.members[i];
  job.claims.erase(ClaimKey(member));
  job.TakeBackOverride(member);
  job.DropJoining(i);
  job.members.Erase(i);
}

void RendezvousState::Attach(Job& job, Index i, StreamId stream) {
  Detach(job, i);
  job.members[i].stream = stream;
  streams_[stream] = {&job, i, /*awaited=*/false};
  ++job.attached;
}

RendezvousState::Job& RendezvousState::JobToResume(Micros now, const JoinSpec& spec,
                                                   Decisions& out) {
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
  return *job;
}

RendezvousState::Index RendezvousState::ResumedMember(Job& job, StreamId stream,
                                                      const JoinSpec& spec, Decisions& out) {
  const AssignmentEvent& held = *spec.resume;
  Index it = job.members.Find(spec.agent.agent_id);
  const bool newcomer = it == AgentTable::kNone || job.members[it].unranked;
  if (!newcomer) {
    absl::Status s = SameShape(job.id, job.members.agent_id(it), job.members[it], spec.agent);
    if (s.ok()) s = SameRanks(job.id, job.members[it], held, spec.agent.host);
    if (!s.ok()) {
      out.closes.push_back({stream, std::move(s)});
      return AgentTable::kNone;
    }
    const AgentRecord& m = job.members[it];
    if (m.stream != 0 && m.stream != stream) {
      out.closes.push_back({m.stream, absl::AbortedError("replaced by a newer join")});
    }
    return it;
  }
  if (job.resume_deadline == 0) {
    out.closes.push_back(
        {stream, absl::AbortedError(absl::StrFormat("round %d of job %s has no agent %s", job.round,
                                                    job.id, spec.agent.agent_id))});
    return AgentTable::kNone;
  }
  bool claimed = false;
  if (!held.spare) {
    auto claim = job.claims.find(held.slot.rank_offset);
    if (claim != job.claims.end() && claim->second != it) {
      out.closes.push_back(
          {stream, absl::FailedPreconditionError(absl::StrFormat(
                       "rank %d of job %s is already held by the agent on %s",
                       held.slot.rank_offset, job.id, job.members.host(claim->second)))});
      return AgentTable::kNone;
    }
    claimed = claim != job.claims.end();
  }
  if (it == AgentTable::kNone) {
    it = job.members.Add(spec.agent);
  } else {
    job.members.Update(it, spec.agent);
  }
  if (!held.spare && !claimed) job.claims.emplace(held.slot.rank_offset, it);
  AgentRecord& m = job.members[it];
  m.unranked = false;
  m.spare = held.spare;
  m.slot = held.spare ? Slot{} : held.slot;
  if (held.spare) {
    ++job.spares;
  } else if (spec.agent.node_index >= 0) {
    job.seats[spec.agent.node_index] = held.slot.group_rank;
  }
  return it;
}

void RendezvousState::Resume(Micros now, StreamId stream, const JoinSpec& spec,
                             const CallerInfo& caller, Decisions& out) {
  const AssignmentEvent& held = *spec.resume;
  Job& job = JobToResume(now, spec, out);
  switch (job.phase) {
    case Phase::kEnded:
      // It ended while this agent was away (losing an agent ends a job, this one included).
      out.Tell(stream, *job.abort);
      out.closes.push_back({stream, absl::OkStatus()});
      return;
    case Phase::kFilling:
      out.closes.push_back(
          {stream, absl::AbortedError(absl::StrFormat(
                       "job %s started round %d without this agent, which ran round %d", job.id,
                       job.round, held.round))});
      return;
    case Phase::kRunning:
      break;
  }
  if (job.round != held.round || job.world_size != held.world_size) {
    out.closes.push_back(
        {stream, absl::AbortedError(absl::StrFormat(
                     "job %s runs round %d (world size %d), not this agent's round %d (world "
                     "size %d)",
                     job.id, job.round, job.world_size, held.round, held.world_size))});
    return;
  }
  AssignmentEvent runs = job.assignment;
  runs.restart_count = job.restart_count;
  if (absl::Status s = SameRun(job.id, runs, held, spec.agent.host); !s.ok()) {
    out.closes.push_back({stream, std::move(s)});
    return;
  }
  (void)caller;  // where a resuming agent connected from matters only to a round that forms
  const Index it = ResumedMember(job, stream, spec, out);
  if (it == AgentTable::kNone) return;
  Attach(job, it, stream);
  SendAssignment(out, stream, job.assignment, job.members[it]);
  if (job.resume_deadline != 0) FillRebuilt(job, now, out);
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
  if (job->phase == Phase::kEnded) {
    if (!JoinEnded(*job, now, stream, spec, out)) return;
  } else if (absl::Status s = SameSizes(job->id, job->Terms(), spec); !s.ok()) {
    out.closes.push_back({stream, std::move(s)});
    return;
  }
  if (absl::Status s = SameMaxRestarts(job->id, job->Terms(), spec); !s.ok()) {
    out.closes.push_back({stream, std::move(s)});
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
    Rejoin(*job, i, stream, spec, out);
    return;
  }
  if (job->phase == Phase::kRunning && job->resume_deadline != 0 && job->spare_nodes == 0 &&
      spec.restart_count == job->restart_count) {
    JoinRebuilt(*job, now, stream, spec, out);
    return;
  }
  if (job->phase == Phase::kRunning) {
    out.closes.push_back(
        {stream,
         TooLate(job->id, job->round, static_cast<int32_t>(job->members.size()), spec.agent.host)});
    return;
  }
  if (absl::Status s = MayJoinRound(*job, spec); !s.ok()) {
    out.closes.push_back({stream, std::move(s)});
    return;
  }
  AddWaiting(*job, now, stream, spec, caller, out);
}

bool RendezvousState::JoinEnded(Job& job, Micros now, StreamId stream, const JoinSpec& spec,
                                Decisions& out) {
  const Index member_at = job.members.Find(spec.agent.agent_id);
  const bool is_member = member_at != AgentTable::kNone;
  const bool next_round = spec.restart_count > job.restart_count;
  if (spec.unhealthy && !next_round) {
    // Too late to change this run; it is still left out of the job's next ones.
    Exclude(job, now, stream, spec.agent, *spec.unhealthy, out);
    return false;
  }
  if (!is_member && !next_round && job.abort &&
      (job.abort->cause == AbortCause::kNodeUnhealthy || job.cannot_form) &&
      spec.restart_count == job.restart_count) {
    // A peer of the run that a node's failed health check ended, or of a restart that could
    // not be whole: it hears why, at once, instead of opening a round that waits for that
    // node.
    out.Tell(stream, *job.abort);
    out.closes.push_back({stream, absl::OkStatus()});
    return false;
  }
  if (is_member && !next_round) {
    // A reconnect after the end (its first stream broke before the assignment reached it):
    // tell it how the job ended, and end the join, as for a resume, so that the agent exits
    // with the root cause now instead of waiting on a stream that will carry nothing more.
    out.Tell(stream, *job.abort);
    out.closes.push_back({stream, absl::OkStatus()});
    return false;
  }
  if (!next_round && job.attached > 0) {
    out.closes.push_back(
        {stream, absl::UnavailableError(absl::StrFormat(
                     "job %s is still ending its previous run; try again", job.id))});
    return false;
  }
  // A restart (next_round), or the same job id starting afresh (a requeued job). The old
  // run's streams end, but for a restart those of the agents awaited for it: their end tells
  // the round whether they are coming.
  for (Index i : job.members) {
    const StreamId old = job.members[i].stream;
    if (old != 0 && (!next_round || i == member_at)) {
      out.closes.push_back({old, absl::AbortedError("a new round started")});
      Detach(job, i);
    }
  }
  OpenRound(job, spec, /*fresh=*/!next_round, out);
  job.last_progress = now;
  if (job.Expected() < job.Needed()) {
    // Nodes left out while the last run ran (lost, or asked out), or nodes that finished and
    // left, leave too few for this one.
    EndJob(job, now, CannotForm(job, nullptr), out);
    job.cannot_form = true;
    out.Tell(stream, *job.abort);
    out.closes.push_back({stream, absl::OkStatus()});
    job.last_detach = now;
    return false;
  }
  return true;
}

void RendezvousState::Rejoin(Job& job, Index i, StreamId stream, const JoinSpec& spec,
                             Decisions& out) {
  // The same agent again (a retried join): the new stream replaces the old one.
  AgentRecord& member = job.members[i];
  if (absl::Status s = SameShape(job.id, job.members.agent_id(i), member, spec.agent); !s.ok()) {
    out.closes.push_back({stream, std::move(s)});
    return;
  }
  if (member.stream != 0 && member.stream != stream) {
    out.closes.push_back({member.stream, absl::AbortedError("replaced by a newer join")});
  }
  Attach(job, i, stream);
  if (job.phase == Phase::kRunning && !member.unranked) {
    // A spare hears again that it is one.
    SendAssignment(out, stream, job.assignment, member);
  }
}

void RendezvousState::JoinRebuilt(Job& job, Micros now, StreamId stream, const JoinSpec& spec,
                                  Decisions& out) {
  // The job is being rebuilt from its resuming agents: this one lost its assignment with the
  // server that formed the round, and gets its ranks once every agent is back.
  int32_t unranked = 0;
  const int32_t ranked = RankedBack(job, &unranked);
  if (ranked + unranked >= job.assignment.agents) {
    out.closes.push_back({stream, OneTooMany(job.id, job.assignment.agents, spec.agent.host)});
    return;
  }
  const Index waiting = job.members.Add(spec.agent);
  job.members[waiting].unranked = true;
  Attach(job, waiting, stream);
  FillRebuilt(job, now, out);
}

absl::Status RendezvousState::MayJoinRound(const Job& job, const JoinSpec& spec) const {
  if (!job.members.empty()) {
    const RankInput other = InputOf(job.members, *job.members.begin());
    if (absl::Status s = SameRanking(job.id, job.spare_nodes, other, spec.agent); !s.ok()) {
      return s;
    }
  }
  // A fixed master endpoint must be the same wherever it is given: otherwise one agent could
  // point every worker of the job somewhere else.
  const bool addr_differs = !spec.master_addr_override.empty() && job.addr_givers > 0 &&
                            spec.master_addr_override != job.addr_override;
  const bool port_differs = spec.master_port_override > 0 && job.port_givers > 0 &&
                            spec.master_port_override != job.port_override;
  if (addr_differs || port_differs) {
    // Refusals only: name one member that set what this agent contradicts.
    Index o = AgentTable::kNone;
    for (Index i : job.members) {
      const AgentRecord& other = job.members[i];
      if ((addr_differs && other.gave_master_addr) || (port_differs && other.gave_master_port)) {
        o = i;
        break;
      }
    }
    const bool named = o != AgentTable::kNone;
    return MasterDiffers(spec, named ? job.members.host(o) : "?",
                         !named || job.members[o].gave_master_addr ? job.addr_override : "",
                         !named || job.members[o].gave_master_port ? job.port_override : 0);
  }
  const int64_t claim = ClaimKey(spec.agent);
  if (claim >= 0) {
    if (auto it = job.claims.find(claim); it != job.claims.end()) {
      return ClaimTaken(job.id, spec.agent, claim, job.members.host(it->second));
    }
  }
  if (static_cast<int32_t>(job.members.size()) >= job.Expected()) {
    return OneTooMany(job.id, job.Expected(), spec.agent.host);
  }
  return absl::OkStatus();
}

void RendezvousState::AddWaiting(Job& job, Micros now, StreamId stream, const JoinSpec& spec,
                                 const CallerInfo& caller, Decisions& out) {
  if (const Index back = job.awaited.Find(spec.agent.agent_id); back != AgentTable::kNone) {
    // Back: the stream of its last run is done with.
    const StreamId old = job.awaited[back].stream;
    if (old != 0 && old != stream) {
      out.closes.push_back({old, absl::AbortedError("replaced by a newer join")});
      streams_.erase(old);
    }
    job.awaited.Erase(back);
  }
  const Index i = job.members.Add(spec.agent);
  const int64_t claim = ClaimKey(spec.agent);
  if (claim >= 0) job.claims.emplace(claim, i);
  if (!job.max_restarts) job.max_restarts = spec.max_restarts;
  if (job.node_list.empty()) job.node_list = spec.node_list;
  AgentRecord& member = job.members[i];
  member.gave_master_addr = !spec.master_addr_override.empty();
  member.gave_master_port = spec.master_port_override > 0;
  job.GiveOverride(spec);
  job.KeepJoining(i, spec, caller.peer_address);
  Attach(job, i, stream);
  job.last_join = now;
  if (!job.excluded.empty()) {
    // Nodes left out before this agent came: it hears of them too (a few, as progress does).
    ProgressEvent p;
    p.joined = static_cast<int32_t>(job.members.size());
    p.expected = job.Expected();
    p.excluded.assign(job.excluded.begin(),
                      job.excluded.begin() + std::min(job.excluded.size(), kProgressExcluded));
    out.Tell(stream, std::move(p));
  }
  if (static_cast<int32_t>(job.members.size()) == job.Expected()) {
    CompleteRound(job, now, out);
    EraseIfDone(spec.job_id);  // a round that could not be ranked leaves nobody
  }
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

}  // namespace rdzv
