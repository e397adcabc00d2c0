#include "client/agent/core/agent_lifecycle.h"

#include <signal.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/core/hostlist.h"

namespace rdzv {
namespace {

using agent_action::Log;

// How long the hosting agent keeps its server up for the others after a failure: they need it
// only to learn how the job ended and to stop their workers.
constexpr absl::Duration kAwaitAfterFailure = absl::Seconds(5);
// How much longer than the term timeout (after which a hung worker gets SIGKILL) an agent waits
// for another node's hung worker's stack.
constexpr absl::Duration kStackMargin = absl::Seconds(2);
// How long an agent whose worker hung waits for another node's earlier hang: the other agent's
// next check (100 ms at most) and its report's way through the server, with room for a loaded
// machine. Well within the window in which the server lets an earlier hang take over.
constexpr absl::Duration kEarlierHangWait = absl::Seconds(1);
// How long an agent told to stop (SIGTERM from scancel, Ctrl-C) waits for the server to answer
// its report: the workers are stopped meanwhile, and Slurm kills what is left after KillWait.
// The others learn of the stop from its stream ending when the server does not answer.
constexpr absl::Duration kStopReportTimeout = absl::Seconds(2);
// Nodes left out of the job an agent logs, at most.
constexpr size_t kMaxExcludedLogged = 64;

Log Info(std::string text) { return {Log::kInfo, std::move(text)}; }
Log Warn(std::string text) { return {Log::kWarn, std::move(text)}; }
Log Error(std::string text) { return {Log::kError, std::move(text)}; }

// Only the workers' success ends in 0: an abort's code, whoever sent it, is taken when it is one a
// process can exit with and that is not 0 (a worker's own), else 1 (256 would show as 0).
int ExitCodeOf(const AbortEvent& abort) {
  return abort.exit_code >= 1 && abort.exit_code <= 255 ? abort.exit_code : 1;
}

void Append(AgentActions& to, AgentActions more) {
  for (AgentAction& a : more) to.push_back(std::move(a));
}

// Whether `hang` began before the failure `abort` names, as the server compares them
// (common/core/hang_verdict.h): only a worker's failure or another hang gives way to an earlier
// hang.
bool HungBefore(const WorkerHang& hang, const AbortEvent& abort) {
  const std::optional<FailureInfo>& f = abort.first_failure;
  if (!f || (f->cause != AbortCause::kWorkerFailed && f->cause != AbortCause::kWorkerHung)) {
    return false;
  }
  return hang.since_us < f->time_us;
}

}  // namespace

LifecycleOptions LifecycleOptionsFor(const AgentConfig& config, bool hosts_server,
                                     std::string endpoint) {
  const JoinSpec& join = config.join;
  LifecycleOptions o;
  o.job_id = join.job_id;
  o.host = join.agent.host;
  o.nproc = join.agent.nproc;
  o.max_restarts = join.max_restarts.value_or(0);
  o.elastic = join.min_agents < join.max_agents;
  o.spares = join.spare_nodes > 0;
  o.per_task = join.agent.order >= 0;
  o.hosts_server = hosts_server;
  o.agents = join.max_agents;
  o.endpoint = std::move(endpoint);
  o.join_timeout = config.join_timeout;
  o.reconnect_timeout = config.reconnect_timeout;
  o.term_timeout = config.term_timeout;
  o.check_health = true;  // the built-in checks always run
  return o;
}

AgentLifecycle::AgentLifecycle(LifecycleOptions options)
    : options_(std::move(options)), endpoint_(options_.endpoint) {}

AgentActions AgentLifecycle::Start() {
  if (phase_ != Phase::kIdle) return {};
  return JoinRound(std::nullopt);
}

AgentActions AgentLifecycle::JoinRound(std::optional<AssignmentEvent> resume) {
  ++generation_;
  resuming_ = resume.has_value();
  if (!resuming_ && options_.check_health) {
    phase_ = Phase::kChecking;
    return {agent_action::CheckHealth{generation_}};
  }
  if (!resuming_) phase_ = Phase::kJoining;
  agent_action::Join join;
  join.generation = generation_;
  join.restart_count = restart_count_;
  join.timeout = resuming_ ? options_.reconnect_timeout : options_.join_timeout;
  join.resume = std::move(resume);
  return {std::move(join)};
}

AgentActions AgentLifecycle::HealthChecked(int32_t generation,
                                           const std::optional<Unhealthy>& unhealthy) {
  if (generation != generation_ || phase_ != Phase::kChecking) return {};
  phase_ = Phase::kJoining;
  agent_action::Join join;
  join.generation = generation_;
  join.restart_count = restart_count_;
  join.timeout = options_.join_timeout;
  if (!unhealthy) return {std::move(join)};
  // The node takes no part: the server hears why, and leaves it out of the job for good.
  unhealthy_ = true;
  AbortEvent out;
  out.cause = AbortCause::kNodeUnhealthy;
  out.exit_code = kExitNodeUnhealthy;
  out.reason = absl::StrFormat("this node is left out of the job: %s",
                               DescribeExcluded({options_.host, -1, *unhealthy}));
  outcome_ = out;
  join.unhealthy = unhealthy;
  join.timeout = std::min(options_.join_timeout, kUnhealthyReportTimeout);
  return {Error(absl::StrFormat("job %s: %s", options_.job_id, out.reason)), std::move(join)};
}

AgentActions AgentLifecycle::Joined(int32_t generation,
                                    const absl::StatusOr<AssignmentEvent>& result) {
  if (generation != generation_) return {};
  if (resuming_) {
    resuming_ = false;
    // Stopping already: the job ended (an Abort on rejoining), a worker failed, or a signal.
    if (phase_ != Phase::kRunning) return {};
    if (result.ok()) {
      return {Info(absl::StrFormat("job %s: back in touch with the rendezvous server at %s",
                                   options_.job_id, endpoint_))};
    }
    return EndForLostServer(absl::StrFormat(
        "lost the rendezvous server at %s and could not rejoin within %s (%s)", endpoint_,
        absl::FormatDuration(options_.reconnect_timeout), result.status().message()));
  }
  if (phase_ != Phase::kJoining) {
    // Given up while joining (a signal).
    phase_ = Phase::kDone;
    return {agent_action::Exit{exit_code_, false}};
  }
  if (unhealthy_) {
    // The report's answer: the server left the node out (or could not be told). Nothing runs
    // here; an agent whose server the others use keeps it up for them.
    AgentActions actions;
    if (!result.ok() && !absl::IsFailedPrecondition(result.status())) {
      actions.push_back(Warn(absl::StrFormat("job %s: could not tell the rendezvous server: %s",
                                             options_.job_id, result.status().message())));
    }
    if (options_.hosts_server) {
      // The others may not even have come yet: the server stays until every agent of the job
      // has joined and gone (or the others' join timeout has passed).
      phase_ = Phase::kAwaitingOthers;
      actions.push_back(agent_action::AwaitOthers{options_.join_timeout, options_.agents - 1});
      return actions;
    }
    Append(actions, Finish());
    return actions;
  }
  if (!result.ok()) {
    phase_ = Phase::kDone;
    if (outcome_) {
      // The job had already ended when this agent joined (it came back to a job that failed).
      return {Error(RootCause(*outcome_)), agent_action::Exit{ExitCodeOf(*outcome_), false}};
    }
    return {Error(absl::StrFormat("job %s: %s", options_.job_id, result.status().message())),
            agent_action::Exit{1, false}};
  }
  assignment_ = *result;
  restart_count_ = assignment_.restart_count;
  const AssignmentEvent& a = assignment_;
  if (a.spare) {
    AgentActions actions = {Info(absl::StrFormat(
        "job %s round %d: %s is a spare; it starts no workers and takes the place of a node the "
        "job loses (%d nodes run it, ranks 0-%d)",
        options_.job_id, a.round, options_.host, a.group_world_size, a.world_size - 1))};
    phase_ = outcome_ ? Phase::kStopping : Phase::kRunning;
    if (outcome_) Append(actions, MaybeFinish());
    return actions;
  }
  AgentActions actions = {Info(absl::StrFormat(
      "job %s round %d: node %d of %d, ranks %d-%d of %d, master %s:%d", options_.job_id, a.round,
      a.slot.group_rank, a.group_world_size, a.slot.rank_offset,
      a.slot.rank_offset + options_.nproc - 1, a.world_size, a.master_addr, a.master_port))};
  if (outcome_) {
    // The job ended elsewhere while this agent's assignment was on its way: start nothing.
    phase_ = Phase::kStopping;
    Append(actions, MaybeFinish());
    return actions;
  }
  phase_ = Phase::kRunning;
  workers_live_ = true;
  actions.push_back(agent_action::StartWorkers{a});
  return actions;
}

AgentActions AgentLifecycle::Progress(int32_t generation, const ProgressEvent& p) {
  if (generation != generation_ || phase_ != Phase::kJoining || unhealthy_) return {};
  AgentActions actions;
  for (const ExcludedNode& node : p.excluded) {
    if (std::find(excluded_seen_.begin(), excluded_seen_.end(), node) != excluded_seen_.end() ||
        excluded_seen_.size() >= kMaxExcludedLogged) {
      continue;
    }
    excluded_seen_.push_back(node);
    actions.push_back(Warn(absl::StrFormat("job %s: %s is left out of the job: %s", options_.job_id,
                                           node.host, DescribeExcluded(node))));
  }
  if (p.joined >= p.expected) return actions;  // the assignment follows
  // News of nodes left out, sent as they come: the waiting line comes with the next progress.
  if (p.joined_hosts.empty() && !p.excluded.empty()) return actions;
  std::string missing;
  if (!p.missing_node_indices.empty()) {
    missing = absl::StrCat(
        "; missing node ranks ", absl::StrJoin(p.missing_node_indices, ","),
        p.missing_node_indices.size() < static_cast<size_t>(p.expected - p.joined) ? ",..." : "");
  }
  actions.push_back(Info(absl::StrFormat(
      "job %s: waiting for %d of %d %s (joined: %s%s%s)", options_.job_id, p.expected - p.joined,
      p.expected, options_.per_task ? "tasks" : "nodes", absl::StrJoin(p.joined_hosts, ","),
      p.joined > static_cast<int32_t>(p.joined_hosts.size()) ? ",..." : "", missing)));
  return actions;
}

AgentActions AgentLifecycle::Aborted(int32_t generation, const AbortEvent& abort,
                                     const std::optional<WorkerHang>& overdue) {
  if (generation != generation_ || phase_ == Phase::kDone) return {};
  if (phase_ == Phase::kRunning && overdue && HungBefore(*overdue, abort)) {
    // The server's answer to the report names whichever hang began first.
    return WorkerHung(*overdue);
  }
  const bool was_waiting = awaiting_stack_;
  AgentActions actions = NoteOutcome(abort);
  if (phase_ == Phase::kRunning) {
    Append(actions, StopWorkers());
  } else if (was_waiting && !awaiting_stack_) {
    // The hung worker's stack has come.
    Append(actions, MaybeFinish());
  }
  // While joining, the join ends with the abort too.
  return actions;
}

AgentActions AgentLifecycle::Released(int32_t generation) {
  if (generation != generation_ || phase_ != Phase::kRunning) return {};
  if (!assignment_.spare) {
    return ServerLost(generation, absl::UnavailableError("the server ended this agent's stream"));
  }
  phase_ = Phase::kDone;
  return {Info(absl::StrFormat("job %s: done without needing %s, a spare", options_.job_id,
                               options_.host)),
          agent_action::Exit{0, false}};
}

AgentActions AgentLifecycle::ServerLost(int32_t generation, const absl::Status& status) {
  if (generation != generation_ || phase_ != Phase::kRunning) return {};
  if (assignment_.spare && options_.reconnect_timeout <= absl::ZeroDuration()) {
    // Nothing runs here, and nothing brings the job back to this spare: it leaves the job,
    // which goes on without it.
    phase_ = Phase::kDone;
    return {Warn(absl::StrFormat(
                "job %s: lost the rendezvous server at %s (%s); %s was a spare and leaves the job",
                options_.job_id, endpoint_, status.message(), options_.host)),
            agent_action::Exit{0, false}};
  }
  if (assignment_.spare) {
    // It follows the job wherever the job's nodes take it (the server back, or the next of the
    // list), and stays a spare there.
    AgentActions actions = {Warn(absl::StrFormat(
        "job %s: lost the rendezvous server at %s (%s); %s, a spare, rejoins the job as one, for "
        "up to %s",
        options_.job_id, endpoint_, status.message(), options_.host,
        absl::FormatDuration(options_.reconnect_timeout)))};
    Append(actions, JoinRound(assignment_));
    return actions;
  }
  if (options_.reconnect_timeout <= absl::ZeroDuration()) {
    return EndForLostServer(
        absl::StrFormat("lost the rendezvous server at %s (%s)", endpoint_, status.message()));
  }
  AgentActions actions = {Warn(absl::StrFormat(
      "job %s: lost the rendezvous server at %s (%s); the workers go on while this agent "
      "reconnects, for up to %s",
      options_.job_id, endpoint_, status.message(),
      absl::FormatDuration(options_.reconnect_timeout)))};
  Append(actions, JoinRound(assignment_));
  return actions;
}

AgentActions AgentLifecycle::FailureAnswered(int32_t generation,
                                             const absl::StatusOr<AbortEvent>& first) {
  if (reports_pending_ > 0) --reports_pending_;
  AgentActions actions;
  if (!first.ok()) {
    actions.push_back(Warn(absl::StrCat("could not report the failure to the rendezvous server: ",
                                        first.status().message())));
    if (absl::IsDeadlineExceeded(first.status()) || absl::IsUnavailable(first.status())) {
      server_silent_ = true;
    }
  } else if (generation == generation_ && phase_ != Phase::kDone) {
    // The server's answer names the job's first failure, which may be another node's.
    Append(actions, NoteOutcome(*first));
  }
  Append(actions, MaybeFinish());
  return actions;
}

AgentActions AgentLifecycle::WorkersStartFailed(const absl::Status& status, Micros now) {
  if (phase_ != Phase::kRunning) return {};
  FailureInfo f = NewFailure(now);
  f.rank = assignment_.slot.rank_offset;
  f.local_rank = assignment_.slot.local_rank_offset;
  f.exit_code = 127;
  f.error_message = std::string(status.message());
  return Fail(f);
}

AgentActions AgentLifecycle::RankAsked(int32_t rank, RankRequest request,
                                       const std::string& reason) {
  const int32_t first = assignment_.slot.rank_offset;
  if (request == RankRequest::kNone || rank < first || rank >= first + options_.nproc ||
      (phase_ != Phase::kRunning && phase_ != Phase::kStopping)) {
    return {};
  }
  asked_[rank] = {request, reason};
  const std::string words = reason.empty() ? "" : absl::StrCat(": ", reason);
  if (request == RankRequest::kNoRestart) {
    return {Warn(absl::StrFormat("job %s: rank %d asks that the job not restart when it fails%s",
                                 options_.job_id, rank, words))};
  }
  NoteLeaveNode(absl::StrFormat("rank %d%s", rank, words));
  return {Warn(absl::StrFormat(
      "job %s: rank %d asks that %s be left out of the job%s; it leaves at the next restart",
      options_.job_id, rank, options_.host, words))};
}

void AgentLifecycle::NoteLeaveNode(std::string detail) {
  if (leave_node_) return;
  detail.resize(Utf8Cut(detail, kMaxUnhealthyDetailBytes));
  leave_node_ = Unhealthy{ExclusionKind::kRankRequested, std::move(detail)};
}

AgentActions AgentLifecycle::WorkerEnded(const WorkerEnd& end, Micros now) {
  // What the rank asked: on the FIFO, else by its exit code.
  RankRequest request = RankRequest::kNone;
  std::string reason;
  if (auto it = asked_.find(end.rank); it != asked_.end()) {
    std::tie(request, reason) = it->second;
  } else if (end.exit.signal == 0 && end.exit.exit_status == kWorkerExitExcludeNode) {
    request = RankRequest::kExcludeNode;
    NoteLeaveNode(absl::StrFormat("rank %d exited with code %d", end.rank, kWorkerExitExcludeNode));
  } else if (end.exit.signal == 0 && end.exit.exit_status == kWorkerExitNoRestart) {
    request = RankRequest::kNoRestart;
  }
  if (own_hang_ && end.rank == own_hang_->rank) {
    // The hung worker has printed its stack and ended: tell the job, whose abort then shows it.
    FailureInfo f = *std::exchange(own_hang_, std::nullopt);
    // Never empty: the other agents wait for this report until it carries a tail.
    f.stderr_tail = end.stderr_tail.empty() ? "(nothing on stderr)" : end.stderr_tail;
    if (outcome_ && outcome_->first_failure && outcome_->first_failure->cause == f.cause &&
        outcome_->first_failure->rank == f.rank && outcome_->first_failure->host == f.host) {
      outcome_ = AbortFor(f);
    }
    ++reports_pending_;
    return {agent_action::ReportFailure{generation_, f}};
  }
  if (end.exit.code() == 0 || phase_ != Phase::kRunning) return {};
  FailureInfo f = NewFailure(now);
  f.rank = end.rank;
  f.local_rank = end.local_rank;
  f.exit_code = end.exit.code();
  f.signal = end.exit.signal;
  f.stderr_tail = end.stderr_tail;
  f.error_message = end.error_message;
  f.request = request;
  f.request_reason = reason;
  return Fail(f);
}

AgentActions AgentLifecycle::AllWorkersDone() {
  workers_live_ = false;
  return MaybeFinish();
}

AgentActions AgentLifecycle::WorkerHung(const WorkerHang& hang) {
  if (phase_ != Phase::kRunning) return {};
  FailureInfo f = NewFailure(hang.since_us);
  f.cause = AbortCause::kWorkerHung;
  f.rank = hang.rank;
  f.local_rank = hang.local_rank;
  f.signal = SIGABRT;
  f.exit_code = 128 + SIGABRT;
  f.hang_detail = hang.detail;
  own_hang_ = f;
  awaiting_earlier_hang_ = true;
  AgentActions actions = {
      Warn(absl::StrFormat("rank %d hung: %s; sending it SIGABRT for its stack (SIGKILL after %s)",
                           hang.rank, hang.detail, absl::FormatDuration(options_.term_timeout))),
      agent_action::AbortWorker{hang.rank}, agent_action::AwaitEarlierHang{kEarlierHangWait}};
  Append(actions, Fail(f));
  return actions;
}

AgentActions AgentLifecycle::StackWaitOver() {
  if (!awaiting_stack_) return {};
  awaiting_stack_ = false;
  return MaybeFinish();
}

AgentActions AgentLifecycle::EarlierHangWaitOver() {
  if (!awaiting_earlier_hang_) return {};
  awaiting_earlier_hang_ = false;
  return MaybeFinish();
}

AgentActions AgentLifecycle::NoteOutcome(const AbortEvent& abort) {
  outcome_ = abort;
  const std::optional<FailureInfo>& f = abort.first_failure;
  const bool stack_to_come = abort.cause == AbortCause::kWorkerHung && f &&
                             f->stderr_tail.empty() && !(own_hang_ && own_hang_->rank == f->rank);
  if (!stack_to_come) {
    awaiting_stack_ = false;
    return {};
  }
  if (awaiting_stack_) return {};
  awaiting_stack_ = true;
  return {agent_action::AwaitStack{options_.term_timeout + kStackMargin}};
}

AgentActions AgentLifecycle::Signal(int sig, Micros now) {
  if (sig == SIGUSR1 || sig == SIGUSR2) return {agent_action::ForwardSignal{sig}};
  // SIGINT, SIGTERM, SIGHUP: stop the job, everywhere.
  switch (phase_) {
    case Phase::kChecking:
      exit_code_ = 128 + sig;
      phase_ = Phase::kDone;
      return {Warn(absl::StrCat(SignalName(sig), " during the health check; giving up")),
              agent_action::CancelHealthCheck{}, agent_action::Exit{exit_code_, false}};
    case Phase::kIdle:
    case Phase::kJoining:
      exit_code_ = 128 + sig;
      phase_ = Phase::kStopping;
      return {Warn(absl::StrCat(SignalName(sig), " while joining; giving up")),
              agent_action::CancelJoin{}};
    case Phase::kRunning: {
      FailureInfo f = NewFailure(now);
      f.cause = AbortCause::kAgentSignalled;
      f.signal = sig;
      f.exit_code = 128 + sig;
      return Fail(f, kStopReportTimeout);
    }
    case Phase::kStopping:
      return {Warn(absl::StrCat(SignalName(sig), " again: killing the workers now")),
              agent_action::KillWorkers{}};
    case Phase::kAwaitingOthers:
      // Told to stop while keeping the server up for the others: stop now.
      return Finish();
    case Phase::kLeaving:
    case Phase::kDone:
      return {};
  }
  return {};
}

AgentActions AgentLifecycle::Left(const absl::Status& status) {
  if (phase_ != Phase::kLeaving) return {};
  AgentActions actions;
  if (!status.ok()) {
    actions.push_back(Log{Log::kDebug, absl::StrCat("leave: ", status.message())});
  }
  if (!options_.hosts_server) {
    Append(actions, Finish());
    return actions;
  }
  // The other agents reach the job's end through this process's server: keep it up until they
  // have gone (after a failure, only as long as they need to stop their workers).
  phase_ = Phase::kAwaitingOthers;
  actions.push_back(agent_action::AwaitOthers{outcome_ ? options_.term_timeout + kAwaitAfterFailure
                                                       : absl::InfiniteDuration()});
  return actions;
}

AgentActions AgentLifecycle::OthersGone() {
  if (phase_ != Phase::kAwaitingOthers) return {};
  return Finish();
}

AgentActions AgentLifecycle::Fail(const FailureInfo& failure, absl::Duration report_timeout) {
  outcome_ = AbortFor(failure);
  ++reports_pending_;
  AgentActions actions = {agent_action::ReportFailure{generation_, failure, report_timeout}};
  Append(actions, StopWorkers());
  return actions;
}

AgentActions AgentLifecycle::StopWorkers() {
  phase_ = Phase::kStopping;
  if (!workers_live_) return MaybeFinish();
  return {agent_action::StopWorkers{outcome_ ? outcome_->reason : ""}};
}

AgentActions AgentLifecycle::EndForLostServer(std::string reason) {
  AbortEvent abort;
  abort.cause = AbortCause::kServerLost;
  abort.reason = std::move(reason);
  abort.exit_code = 1;
  outcome_ = std::move(abort);
  return StopWorkers();
}

AgentActions AgentLifecycle::MaybeFinish() {
  if (phase_ != Phase::kRunning && phase_ != Phase::kStopping) return {};
  // The workers first; and the server's answer to a failure report names the job's first
  // failure, which is what the root cause must show.
  if (workers_live_ || reports_pending_ > 0 || awaiting_stack_ || awaiting_earlier_hang_) {
    return {};
  }
  if (outcome_ && MayRestart(*outcome_)) return Restart();
  AgentActions actions;
  if (outcome_) {
    actions.push_back(Error(RootCause(*outcome_)));
  } else {
    actions.push_back(Info(absl::StrFormat("job %s: all %d workers on %s succeeded",
                                           options_.job_id, options_.nproc, options_.host)));
  }
  if (!excluded_seen_.empty()) {
    // The nodes this job left out, once more at its end: the line to keep them out of the next.
    std::vector<std::string> hosts;
    std::vector<std::string> why;
    for (const ExcludedNode& node : excluded_seen_) {
      hosts.push_back(node.host);
      why.push_back(DescribeExcluded(node));
    }
    std::sort(hosts.begin(), hosts.end());
    hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
    actions.push_back(
        Warn(absl::StrFormat("job %s left out %s; next time: sbatch --exclude=%s", options_.job_id,
                             absl::StrJoin(why, "; "), CompressHostlist(hosts))));
  }
  if ((outcome_ && outcome_->cause == AbortCause::kServerLost) || server_silent_) {
    // Nothing to leave, and a frozen server would hold the exit for a whole call deadline.
    Append(actions, Finish());
    return actions;
  }
  phase_ = Phase::kLeaving;
  actions.push_back(agent_action::Leave{});
  return actions;
}

bool AgentLifecycle::MayRestart(const AbortEvent& abort) const {
  if (assignment_.restart_count >= options_.max_restarts) return false;
  // The failed rank said the error is its own: a restart would fail the same way.
  if (abort.first_failure && abort.first_failure->cause == AbortCause::kWorkerFailed &&
      abort.first_failure->request == RankRequest::kNoRestart) {
    return false;
  }
  // A worker's failure, or (with --nnodes MIN:MAX) a lost node the others can go on without.
  // A stop request (a signal to an agent) ends the job.
  switch (abort.cause) {
    case AbortCause::kWorkerFailed:
    case AbortCause::kWorkerHung:
      return true;
    case AbortCause::kAgentLost:
      return options_.elastic || options_.spares;
    default:
      return false;
  }
}

AgentActions AgentLifecycle::Restart() {
  AgentActions actions = {Warn(absl::StrFormat(
      "job %s: restarting the workers (restart %d of %d) after: %s", options_.job_id,
      assignment_.restart_count + 1, options_.max_restarts, outcome_->reason))};
  outcome_.reset();
  own_hang_.reset();
  awaiting_stack_ = false;
  awaiting_earlier_hang_ = false;
  server_silent_ = false;
  asked_.clear();
  restart_count_ = assignment_.restart_count + 1;
  if (leave_node_) {
    // A rank asked for this node to go: it reports itself left out instead of rejoining, as a
    // node that failed its health check does.
    ++generation_;
    resuming_ = false;
    phase_ = Phase::kChecking;
    Append(actions, HealthChecked(generation_, leave_node_));
    return actions;
  }
  Append(actions, JoinRound(std::nullopt));
  return actions;
}

AgentActions AgentLifecycle::Finish() {
  phase_ = Phase::kDone;
  const bool lost_peer = outcome_ && (outcome_->cause == AbortCause::kAgentLost ||
                                      outcome_->cause == AbortCause::kServerLost);
  return {agent_action::Exit{outcome_ ? ExitCodeOf(*outcome_) : 0, lost_peer}};
}

FailureInfo AgentLifecycle::NewFailure(Micros now) const {
  FailureInfo f;
  f.host = options_.host;
  f.group_rank = assignment_.slot.group_rank;
  f.time_us = now;
  return f;
}

std::string AgentLifecycle::RootCause(const AbortEvent& abort) const {
  std::string text = absl::StrFormat("job %s failed: %s", options_.job_id, abort.reason);
  const auto block = [&text](absl::string_view title, absl::string_view body) {
    absl::StrAppend(&text, "\n  ", title);
    for (absl::string_view line : absl::StrSplit(body, '\n')) {
      absl::StrAppend(&text, "\n    ", line);
    }
  };
  if (const std::optional<FailureInfo>& f = abort.first_failure;
      f && f->cause == AbortCause::kWorkerHung) {
    if (!f->stderr_tail.empty()) {
      block(absl::StrCat("rank ", f->rank, "'s stderr (its stack):"), f->stderr_tail);
    } else {
      absl::StrAppend(&text, "\n  (rank ", f->rank, "'s stack did not arrive)");
    }
  } else if (f && f->cause == AbortCause::kWorkerFailed) {
    if (!f->error_message.empty() && !DescribeFailureShowsMessage(*f)) {
      block(absl::StrCat("rank ", f->rank, "'s error:"), f->error_message);
    } else if (!f->stderr_tail.empty()) {
      block(absl::StrCat("last lines of rank ", f->rank, "'s stderr:"), f->stderr_tail);
    }
  }
  return text;
}

}  // namespace rdzv
