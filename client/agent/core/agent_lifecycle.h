// AgentLifecycle: the agent's decisions as a pure state machine. It holds no clock, socket,
// process or thread: the agent feeds it what happened (the join's result, a worker's end, a
// signal, an abort from the rendezvous, the server lost) and carries out the actions it returns
// (join, start or stop the workers, report a failure, leave, exit). A hung worker (found by the
// watchdog) is a failure too: it is stopped with SIGABRT so that it prints its stack, reported
// at once, and reported again with that stack once it has ended. As every agent checks its
// workers at its own moments, the job's first hang may be found after a later one: an abort
// that finds a worker of this agent's overdue since before the job's failure stops it as hung,
// and an agent whose own worker hung waits a moment for another node's earlier hang, so that
// the server's comparison names the hang that began first. Every policy lives here:
// when the job has failed, what the root cause is, whether to restart, when to exit and with
// which code.
//
// An agent goes Joining -> Running -> Stopping -> Leaving (-> AwaitingOthers, when it hosts the
// server the others use) -> Done, and from Stopping back to Joining for a restart. Each join it
// asks for carries a generation; events of an older generation (a replaced join's stream) are
// ignored.
//
// Not thread-safe: the agent calls it from its event loop.
#ifndef RDZV_CLIENT_AGENT_CORE_AGENT_LIFECYCLE_H_
#define RDZV_CLIENT_AGENT_CORE_AGENT_LIFECYCLE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/agent/core/agent_options.h"
#include "client/agent/core/hang_watchdog.h"
#include "client/agent/core/worker_end.h"
#include "common/core/rendezvous_types.h"

namespace rdzv {

struct LifecycleOptions {
  std::string job_id;
  std::string host;
  int32_t nproc = 1;
  int32_t max_restarts = 0;
  // --nnodes MIN:MAX with MIN < MAX: a lost node is a restart, not the end.
  bool elastic = false;
  // The job keeps hot spares (--spare-nodes): a lost node is a restart, with a spare in its place.
  bool spares = false;
  // Agents are tasks, not nodes (per-task mode), in messages.
  bool per_task = false;
  // This agent hosts the server the others use: it waits for them before it exits.
  bool hosts_server = false;
  // The agents of the job (--nnodes MAX).
  int32_t agents = 1;
  std::string endpoint;  // the server, for messages
  absl::Duration join_timeout = absl::Minutes(10);
  absl::Duration reconnect_timeout = absl::ZeroDuration();
  absl::Duration term_timeout = absl::Seconds(3);
  // Check the node's health (CheckHealth) before each join that is not a resume.
  bool check_health = false;
};

// How long an agent whose node failed its health check waits for the server to take its report.
inline constexpr absl::Duration kUnhealthyReportTimeout = absl::Seconds(10);

// The options of an agent configured by `config` (whose join names the job), with its server at
// `endpoint`, hosted by this agent when `hosts_server`.
LifecycleOptions LifecycleOptionsFor(const AgentConfig& config, bool hosts_server,
                                     std::string endpoint);

// What the agent must do.
namespace agent_action {

// Join the job's current round (or, with `resume`, rejoin the round the workers run in). With
// `unhealthy`, report the node unhealthy instead: the join's end (any) is the server's answer.
struct Join {
  int32_t generation = 0;
  int32_t restart_count = 0;
  std::optional<AssignmentEvent> resume;
  absl::Duration timeout;
  std::optional<Unhealthy> unhealthy;
};
// Run the node's health checks (the built-in ones and --health-check); call HealthChecked.
struct CheckHealth {
  int32_t generation = 0;
};
// Stop a health check that runs (its process group is killed); HealthChecked is not called.
struct CancelHealthCheck {};
struct StartWorkers {
  AssignmentEvent assignment;
};
// SIGTERM to the workers, SIGKILL after the term timeout.
struct StopWorkers {
  std::string why;
};
struct KillWorkers {};
// SIGABRT to the worker at global `rank` (so that it prints its stack), SIGKILL after the term
// timeout; StopWorkers leaves it to that.
struct AbortWorker {
  int32_t rank = 0;
};
// Another node's worker hung and its stack is on its way: wait for the abort that carries it,
// or `limit`, then call StackWaitOver.
struct AwaitStack {
  absl::Duration limit;
};
// This agent's worker hung and names the job's abort so far, but another node's worker may have
// hung earlier and be found a moment later (every agent checks its workers every 100 ms, at its
// own moments): wait `limit` for an abort that names it, then call EarlierHangWaitOver.
struct AwaitEarlierHang {
  absl::Duration limit;
};
struct ForwardSignal {
  int signal = 0;
};
struct ReportFailure {
  int32_t generation = 0;
  FailureInfo failure;
  // When the server has not answered by then, call FailureAnswered with DeadlineExceeded (and
  // drop the late answer). Infinite: the call's own deadline.
  absl::Duration timeout = absl::InfiniteDuration();
};
struct CancelJoin {};
struct Leave {};
// Wait until no other agent is attached to this agent's server, or `limit` has passed.
struct AwaitOthers {
  absl::Duration limit;
  // The other agents of the job that may not have come yet: not before as many more agents
  // than are attached now have joined the server.
  int32_t others = 0;
};
struct Log {
  enum Level { kDebug, kInfo, kWarn, kError };
  Level level = kInfo;
  std::string text;
};
struct Exit {
  int code = 0;
  // The job ended because an agent or the server was lost: stay a moment, so that what the
  // other agents print still reaches the user (srun drops output once its last task exits).
  bool linger = false;
};

}  // namespace agent_action

using AgentAction =
    std::variant<agent_action::Join, agent_action::CheckHealth, agent_action::CancelHealthCheck,
                 agent_action::StartWorkers, agent_action::StopWorkers, agent_action::KillWorkers,
                 agent_action::AbortWorker, agent_action::AwaitStack,
                 agent_action::AwaitEarlierHang, agent_action::ForwardSignal,
                 agent_action::ReportFailure, agent_action::CancelJoin, agent_action::Leave,
                 agent_action::AwaitOthers, agent_action::Log, agent_action::Exit>;
using AgentActions = std::vector<AgentAction>;

class AgentLifecycle {
 public:
  enum class Phase {
    kIdle,
    kChecking,
    kJoining,
    kRunning,
    kStopping,
    kLeaving,
    kAwaitingOthers,
    kDone
  };

  explicit AgentLifecycle(LifecycleOptions options);

  // The agent starts: join.
  AgentActions Start();

  // The health check of `generation` is over: nothing found, or why the node is unhealthy.
  AgentActions HealthChecked(int32_t generation, const std::optional<Unhealthy>& unhealthy);
  // The server the agent talks to now, when a join moved to another of its list.
  void ServerAt(std::string endpoint) { endpoint_ = std::move(endpoint); }
  // The join of `generation` ended: an assignment, or why not (Cancelled after CancelJoin).
  AgentActions Joined(int32_t generation, const absl::StatusOr<AssignmentEvent>& result);
  // The round of `generation` is still filling.
  AgentActions Progress(int32_t generation, const ProgressEvent& progress);
  // The job of `generation` ended elsewhere. `overdue` is the watchdog's last look at this
  // agent's workers, taken as the abort came in: an overdue worker whose hang began before the
  // job's first failure is the likelier culprit, found late only because the agents check at
  // different moments. It is stopped as hung (SIGABRT for its stack) and reported, so that the
  // server's comparison of hangs can name it; otherwise the workers are stopped.
  AgentActions Aborted(int32_t generation, const AbortEvent& abort,
                       const std::optional<WorkerHang>& overdue = std::nullopt);
  // The stream of `generation` to the server ended without Leave.
  AgentActions ServerLost(int32_t generation, const absl::Status& status);
  // The server ended the stream of `generation` cleanly without Leave: the job completed without
  // this agent, a spare.
  AgentActions Released(int32_t generation);
  // The server answered the failure report of `generation` with the job's first failure.
  AgentActions FailureAnswered(int32_t generation, const absl::StatusOr<AbortEvent>& first);

  // StartWorkers failed part-way (the workers already started keep running); `now` is the
  // wall time in microseconds since the epoch, for the failure's record.
  AgentActions WorkersStartFailed(const absl::Status& status, Micros now);
  // A worker ended.
  AgentActions WorkerEnded(const WorkerEnd& end, Micros now);
  // Every worker that StartWorkers started has ended and its output is forwarded.
  AgentActions AllWorkersDone();
  // The watchdog found a worker hung (its timer expired, or its heartbeats stopped).
  AgentActions WorkerHung(const WorkerHang& hang);
  // Worker `rank` asked something of the job on the watchdog FIFO, in its own words: it holds
  // for that rank's failure (kNoRestart), or for this node from now on (kExcludeNode: the node
  // leaves the job at its next restart).
  AgentActions RankAsked(int32_t rank, RankRequest request, const std::string& reason);
  // The wait of AwaitStack is over.
  AgentActions StackWaitOver();
  // The wait of AwaitEarlierHang is over.
  AgentActions EarlierHangWaitOver();

  // The agent received `signal`.
  AgentActions Signal(int signal, Micros now);

  // The Leave asked for has been answered (or failed).
  AgentActions Left(const absl::Status& status);
  // The wait of AwaitOthers is over.
  AgentActions OthersGone();

  Phase phase() const { return phase_; }
  // The job's current outcome: why it is ending, once it is.
  const std::optional<AbortEvent>& outcome() const { return outcome_; }

 private:
  AgentActions Fail(const FailureInfo& failure,
                    absl::Duration report_timeout = absl::InfiniteDuration());
  // Takes `abort` as the job's outcome; asks to wait when it names a hang whose stack is yet to
  // come from another node.
  AgentActions NoteOutcome(const AbortEvent& abort);
  AgentActions StopWorkers();
  AgentActions EndForLostServer(std::string reason);
  AgentActions MaybeFinish();
  AgentActions Restart();
  AgentActions Finish();
  AgentActions JoinRound(std::optional<AssignmentEvent> resume);
  bool MayRestart(const AbortEvent& abort) const;
  // Keeps the first reason a rank gave for this node to leave the job.
  void NoteLeaveNode(std::string detail);
  FailureInfo NewFailure(Micros now) const;
  std::string RootCause(const AbortEvent& abort) const;

  const LifecycleOptions options_;
  std::string endpoint_;  // the server in use: options_.endpoint, or where a join moved to
  Phase phase_ = Phase::kIdle;
  int32_t generation_ = 0;
  bool resuming_ = false;       // the current join rejoins the running round
  int32_t restart_count_ = 0;   // the round being joined or run
  AssignmentEvent assignment_;  // of the round that runs (or ran)
  std::optional<AbortEvent> outcome_;
  bool workers_live_ = false;    // StartWorkers issued, AllWorkersDone not yet seen
  int32_t reports_pending_ = 0;  // ReportFailures not answered yet
  // This agent's hung worker, reported once; reported again with its stack when it ends.
  std::optional<FailureInfo> own_hang_;
  bool awaiting_stack_ = false;         // AwaitStack asked for, not over
  bool awaiting_earlier_hang_ = false;  // AwaitEarlierHang asked for, not over
  int exit_code_ = 0;                   // for a join given up on a signal
  // This node failed its health check: the join under way reports it, and the agent then ends.
  bool unhealthy_ = false;
  // Nodes left out of the job that this agent has already logged (a few).
  std::vector<ExcludedNode> excluded_seen_;
  // What this round's ranks asked on the watchdog FIFO, by rank (one per rank of this agent).
  absl::flat_hash_map<int32_t, std::pair<RankRequest, std::string>> asked_;
  // A rank asked for this node to be left out: at the next restart it reports itself so
  // instead of rejoining.
  std::optional<Unhealthy> leave_node_;
  // A failure report found the server silent (no answer, or unreachable): no Leave follows,
  // which would wait for it again.
  bool server_silent_ = false;
};

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_CORE_AGENT_LIFECYCLE_H_
