// RendezvousState: every job a server knows, as a pure state machine.
//
// It holds no clock, socket or thread. The server shell feeds it events stamped with the time
// (a join on a new stream, a stream closing, an exit report, a departure, a periodic tick) and
// carries out the Decisions it returns: messages to send on streams and streams to close. A
// stream is named by a StreamId the shell chooses; the state never sees the stream itself.
//
// A job goes Filling -> Running -> Ended. A round fills until max_agents have joined, or until
// at least min_agents have and the last-call window has passed since the latest join. Then the
// ranks are assigned (rank_assignment.h) and every member gets its Assignment. After that, a
// failure report or a lost stream ends the job and every attached member gets the Abort. A
// member that joins again with a higher restart count opens the next round, which never waits
// for an agent of the last run that cannot come: one that left (its workers succeeded, or it
// gave up) or whose stream ended without a word after the end; it forms without them when it
// still can and otherwise ends at once with the last run's own end, naming one of them.
// A job this state does not know, or knows only as a round that never formed here, is rebuilt
// from the assignments its resuming agents bring back (the server restarted, or took the job
// over); an agent that lost its assignment with the old server and joins afresh gets its ranks
// once every agent is back.
//
// Not thread-safe: the shell serialises calls.
#ifndef RDZV_COMMON_CORE_RENDEZVOUS_STATE_H_
#define RDZV_COMMON_CORE_RENDEZVOUS_STATE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/core/agent_table.h"
#include "common/core/join_validation.h"
#include "common/core/rank_assignment.h"
#include "common/core/rendezvous_types.h"

namespace rdzv {

using StreamId = uint64_t;

// Who is calling, as the server shell sees it.
struct CallerInfo {
  // The address the agent connected from ("" when unknown or in-process).
  std::string peer_address;
};

using Event = std::variant<ProgressEvent, AssignmentEvent, AbortEvent>;

// What the state decided: events to send, in order, and streams to close. An event that goes to
// many streams (a job's abort, a progress report, a round's assignments) is kept once, in
// `events`, and each of its sends names it: a round of 100,000 agents decides 100,000 sends of
// 32 bytes, not 100,000 copies of an event.
struct Decisions {
  struct Send {
    StreamId stream = 0;
    uint32_t event = 0;  // index into `events`
    // For an assignment, this agent's own part of it; `events` holds the round's shared part.
    Slot slot;
    bool spare = false;
  };
  struct Close {
    StreamId stream;
    absl::Status status;  // OK for a clean end
  };
  std::vector<Event> events;
  std::vector<Send> sends;
  std::vector<Close> closes;
  // Jobs this state took up from a resuming agent (it did not know the job, or only a round of
  // it that never formed here): the server restarted, or took them over from a lost one.
  std::vector<std::string> taken_up;

  // Keeps `event` for sends to come, and returns its index.
  uint32_t Keep(Event event) {
    events.push_back(std::move(event));
    return static_cast<uint32_t>(events.size() - 1);
  }
  // Sends event `event` (an index into `events`) to `stream`; an assignment with the agent's
  // own `slot` and whether it is a spare.
  void SendTo(StreamId stream, uint32_t event, const Slot& slot = {}, bool spare = false) {
    sends.push_back({stream, event, slot, spare});
  }
  // Sends `event` to `stream` alone.
  void Tell(StreamId stream, Event event) { SendTo(stream, Keep(std::move(event))); }
  // The event `send` delivers as its stream receives it: an assignment with its own part.
  Event EventOf(const Send& send) const;
};

struct StateOptions {
  // How often a waiting agent hears how the round is filling.
  Micros progress_interval = 3'000'000;
  // How long an ended job is kept (so reconnecting agents learn how it ended) once no agent
  // is attached any more.
  Micros ended_job_ttl = 60'000'000;
  // How long a job that this server rebuilds from resuming agents (it restarted while the job
  // ran) waits for the rest of them; then the missing ones count as lost and the job ends.
  Micros resume_window = 30'000'000;
};

class RendezvousState {
 public:
  explicit RendezvousState(StateOptions options = {});
  ~RendezvousState();
  RendezvousState(const RendezvousState&) = delete;
  RendezvousState& operator=(const RendezvousState&) = delete;

  // An agent opened `stream` to join `spec.job_id`. A refusal (bad spec, wrong size, late,
  // duplicate node rank, a node rank where the others give none) comes back as a Close of
  // `stream` in `out`; the round goes on for the others. A member joining again after the job
  // ended gets the job's Abort, and then its stream is closed. With `spec.resume` the agent asks
  // back into the round it runs in: it gets that assignment again, the job's Abort if the job
  // ended, or a refusal if the job moved on to another round or its claim disagrees with the
  // job's (master endpoint, restart count, sizes).
  void Join(Micros now, StreamId stream, const JoinSpec& spec, const CallerInfo& caller,
            Decisions& out);
  void Join(Micros now, StreamId stream, const JoinSpec& spec, Decisions& out) {
    Join(now, stream, spec, CallerInfo{}, out);
  }

  // `stream` ended from the agent's side (cancelled, deadline, connection lost).
  void StreamClosed(Micros now, StreamId stream, Decisions& out);

  // Whether `stream` is the stream of an agent in a running round that has not left: one whose
  // loss ends the job.
  bool Runs(StreamId stream) const;
  // Whether `stream` is the stream of an agent that the job still counts on after it ended: a
  // member that has not left (it may restart), or one awaited by the restart's round. Its loss
  // tells a restart that the agent is not coming.
  bool Awaits(StreamId stream) const;

  // An agent's worker failed, or the agent was told to stop. Ends the job unless it already
  // ended; returns the job's first failure (which may be an earlier one from another agent).
  // NotFound for an unknown job or agent; InvalidArgument for a failure of another cause.
  absl::StatusOr<AbortEvent> ReportFailure(Micros now, const std::string& job_id,
                                           const std::string& agent_id, const FailureInfo& failure,
                                           Decisions& out);

  // An agent is done with the job (its workers ended, or it gave up). Closes its stream
  // cleanly; the job is forgotten once every member has left. A member that left already may
  // leave again (OK) while the job is kept, and so may an agent of the last run that a restart
  // awaits (the restart then does not wait for it); NotFound for a job or agent this state does
  // not know.
  absl::Status Leave(Micros now, const std::string& job_id, const std::string& agent_id,
                     Decisions& out);

  // The operator ends `job_id` (rdzvctl abort) with `abort`: every attached member hears it, as
  // after a failure. Returns how the job ended: `abort`, or the earlier end of a job that had
  // ended already. NotFound for a job this state does not know.
  absl::StatusOr<AbortEvent> Abort(Micros now, const std::string& job_id, AbortEvent abort,
                                   Decisions& out);

  // Time passes: last-call windows close, waiters hear progress, ended jobs are forgotten.
  void Tick(Micros now, Decisions& out);

  // A snapshot of one job, or of all jobs when `job_id` is empty.
  std::vector<JobStatusView> Status(const std::string& job_id) const;

  // The stream `job_id`'s agent `agent_id` holds: its join's, or, for an agent of the last run
  // that a restart awaits, the one it still holds from that run; 0 for none.
  StreamId StreamOf(const std::string& job_id, absl::string_view agent_id) const;

  size_t job_count() const;
  bool has_job(const std::string& job_id) const { return jobs_.contains(job_id); }
  // Agents left out of this state's jobs, all together: what those records hold (each at most
  // kMaxExcludedAgents per job), for the server to charge to their user.
  int64_t excluded_agents() const { return excluded_agents_; }

 private:
  struct Job;
  struct GoneNode;
  using Index = AgentTable::Index;
  // How an agent of an earlier run went: it left while the job ran (its workers had
  // succeeded), left after the job ended (it gave up), or was lost after the job ended (its
  // stream ended without a word: its process died).
  enum class GoneHow { kFinished, kLeft, kLost };

  Job* FindJob(const std::string& job_id);
  void CompleteRound(Job& job, Micros now, Decisions& out);
  void EndJob(Job& job, Micros now, AbortEvent abort, Decisions& out);
  // Opens the job's next round for `spec`; `fresh`: the job id starts over (a requeue), not
  // restarts, and forgets the nodes its last run left out.
  void OpenRound(Job& job, const JoinSpec& spec, bool fresh, Decisions& out);
  // With spares: gives each node of the round (`specs`, one agent per node) its seat, which it
  // keeps over restarts, and renumbers the seated agents' node indices to their seats. Returns,
  // per agent, whether it is a spare.
  std::vector<bool> SeatNodes(Job& job, std::vector<RankInput>& specs);
  // Records the node of `agent` as left out of `job` (as `node`); false when it was already, or
  // when the job keeps no more such records.
  bool NoteExcluded(Job& job, const AgentSpec& agent, const ExcludedNode& node);
  // How a job ends that its left-out nodes leave short of the agents it needs; names `latest`
  // (else the last one recorded) and every recorded node for sbatch --exclude.
  AbortEvent TooFewLeft(const Job& job, const ExcludedNode* latest) const;
  // How a round ends that can never have --nnodes MIN: TooFewLeft, or, when agents of an earlier
  // run left the job, the last run's own end (its failure, exit code and all) naming `latest`
  // (else the last one recorded), the agent that had already finished.
  AbortEvent CannotForm(const Job& job, const GoneNode* latest) const;
  // Records an agent of the last run that left the job: a restart cannot have it.
  void NoteGone(Job& job, GoneNode node);
  // The restart of `job` awaited its agent `awaited` (an index into Job::awaited), which is gone
  // (`how`): the round forms without it, or ends when it cannot.
  void AwaitedGone(Job& job, Micros now, Index awaited, GoneHow how, Decisions& out);
  // Ends the streams of the last run that agents awaited for `job`'s restart still hold.
  void DropAwaited(Job& job, const absl::Status& status, Decisions& out);
  // ---- Join's steps (rendezvous_state.cc). Each refusal is a Close of `stream` in `out`.
  // A join of a job that ended: tells a member or a peer of the run how it ended, or opens the
  // next round (a restart, or the job id starting afresh). True when the join goes on into it.
  bool JoinEnded(Job& job, Micros now, StreamId stream, const JoinSpec& spec, Decisions& out);
  // Member `i` joins again (a retried join): `stream` replaces its old one.
  void Rejoin(Job& job, Index i, StreamId stream, const JoinSpec& spec, Decisions& out);
  // A fresh join of a job rebuilt from resuming agents: it waits for its ranks (FillRebuilt).
  void JoinRebuilt(Job& job, Micros now, StreamId stream, const JoinSpec& spec, Decisions& out);
  // Why the newcomer `spec` may not wait in `job`'s filling round (it ranks differently from its
  // members, contradicts their master endpoint, claims a taken position, or is one too many).
  absl::Status MayJoinRound(const Job& job, const JoinSpec& spec) const;
  // Adds the newcomer `spec` to `job`'s filling round, which forms once it is full.
  void AddWaiting(Job& job, Micros now, StreamId stream, const JoinSpec& spec,
                  const CallerInfo& caller, Decisions& out);
  // A join that resumes the assignment it holds (`spec.resume`).
  void Resume(Micros now, StreamId stream, const JoinSpec& spec, const CallerInfo& caller,
              Decisions& out);
  // The job `spec` resumes: the one known here, made (or remade) from `spec`'s assignment when
  // no round of it formed here.
  Job& JobToResume(Micros now, const JoinSpec& spec, Decisions& out);
  // The member of `job`'s running round that the resuming `spec` is, or kNone when it is
  // refused.
  Index ResumedMember(Job& job, StreamId stream, const JoinSpec& spec, Decisions& out);
  // Makes `job` the running round that the resuming `spec` holds, waiting (resume_window) for
  // the rest of its agents; members it has already wait for their ranks.
  void Rebuild(Job& job, Micros now, const JoinSpec& spec);
  // Of a rebuilt job's agents that run ranks (not spares), how many are back with their ranks;
  // `unranked` gets how many joined afresh and wait for theirs.
  int32_t RankedBack(const Job& job, int32_t* unranked) const;
  // Once every agent of a rebuilt job is back, gives those that joined afresh their ranks (the
  // round's rank assignment over all of them), or ends the job when the resumed ranks disagree.
  void FillRebuilt(Job& job, Micros now, Decisions& out);
  // Makes `stream` member `i`'s (detaching any earlier one).
  void Attach(Job& job, Index i, StreamId stream);
  void Detach(Job& job, Index i);
  // Forgets the round's members, with what they claimed and offered; a later round starts empty.
  void ForgetMembers(Job& job);
  // Forgets member `i` of a round that fills (its claim, its part of the master endpoint).
  void EraseWaiting(Job& job, Index i);
  void EraseIfDone(const std::string& job_id);
  void EraseJob(const std::string& job_id);
  // Leaves the node of `agent` out of `job` for good (its agent reported it unhealthy, or
  // another agent of it was left out), ends `stream` saying so, and then ends the round that
  // can no longer reach --nnodes MIN, completes one that has all the agents it can still have,
  // or tells its waiting agents.
  void Exclude(Job& job, Micros now, StreamId stream, const AgentSpec& agent, const Unhealthy& why,
               Decisions& out);
  // Tells `job`'s waiting agents of the nodes left out of it (a few, as a progress message).
  void TellExcluded(Job& job, Micros now, Decisions& out);
  ProgressEvent MakeProgress(const Job& job) const;

  StateOptions options_;
  absl::flat_hash_map<std::string, std::unique_ptr<Job>> jobs_;
  int64_t excluded_agents_ = 0;  // the sum of the jobs' excluded_agents
  // Whose each stream is: member `index` of `job`'s round, or, with `awaited`, the agent of its
  // last run that a restart awaits. A job that goes takes its streams with it (EraseJob).
  struct StreamOwner {
    Job* job;
    Index index;
    bool awaited;
  };
  absl::flat_hash_map<StreamId, StreamOwner> streams_;
};

}  // namespace rdzv

#endif  // RDZV_COMMON_CORE_RENDEZVOUS_STATE_H_
