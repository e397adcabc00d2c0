#include "client/agent/core/agent_lifecycle.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rdzv {
namespace {

namespace act = agent_action;

// Times fed to the lifecycle: it keeps no clock of its own.
constexpr int64_t kT0 = 1'700'000'000'000'000;
constexpr int64_t kSecond = 1'000'000;

LifecycleOptions Options() {
  LifecycleOptions o;
  o.job_id = "job1";
  o.host = "n1";
  o.nproc = 2;
  o.endpoint = "head:29400";
  o.join_timeout = absl::Minutes(10);
  o.term_timeout = absl::Seconds(3);
  return o;
}

// The assignment of node `group_rank` of two, in round `round` after `restarts` restarts.
AssignmentEvent Assignment(int32_t group_rank, int32_t restarts = 0, int32_t round = 1) {
  AssignmentEvent a;
  a.round = round;
  a.restart_count = restarts;
  a.slot.group_rank = group_rank;
  a.slot.rank_offset = 2 * group_rank;
  a.slot.local_world_size = 2;
  a.world_size = 4;
  a.group_world_size = 2;
  a.master_addr = "10.0.0.1";
  a.master_port = 29500;
  a.agents = 2;
  return a;
}

WorkerEnd Ended(int32_t rank, int exit_status, int signal = 0) {
  WorkerEnd e;
  e.rank = rank;
  e.local_rank = rank % 2;
  e.exit.pid = 100 + rank;
  e.exit.exit_status = exit_status;
  e.exit.signal = signal;
  if (exit_status != 0 || signal != 0) e.stderr_tail = "Traceback\nValueError: bad batch";
  return e;
}

template <typename A>
std::vector<A> All(const AgentActions& actions) {
  std::vector<A> out;
  for (const AgentAction& a : actions) {
    if (const A* x = std::get_if<A>(&a)) out.push_back(*x);
  }
  return out;
}

template <typename A>
std::optional<A> One(const AgentActions& actions) {
  std::vector<A> all = All<A>(actions);
  EXPECT_LE(all.size(), 1u);
  if (all.empty()) return std::nullopt;
  return all.front();
}

// Everything but log lines, by name, so that a mismatch shows the whole sequence.
std::string Kinds(const AgentActions& actions) {
  std::vector<std::string> kinds;
  for (const AgentAction& a : actions) {
    // In the order of AgentAction's alternatives.
    static constexpr const char* kNames[] = {"Join",          "CheckHealth",   "CancelHealthCheck",
                                             "StartWorkers",  "StopWorkers",   "KillWorkers",
                                             "AbortWorker",   "AwaitStack",    "AwaitEarlierHang",
                                             "ForwardSignal", "ReportFailure", "CancelJoin",
                                             "Leave",         "AwaitOthers",   "Log",
                                             "Exit"};
    static_assert(std::size(kNames) == std::variant_size_v<AgentAction>,
                  "name every kind of action");
    if (!std::holds_alternative<act::Log>(a)) kinds.push_back(kNames[a.index()]);
  }
  return absl::StrJoin(kinds, ",");
}

std::string Logs(const AgentActions& actions) {
  std::vector<std::string> lines;
  for (const act::Log& l : All<act::Log>(actions)) lines.push_back(l.text);
  return absl::StrJoin(lines, "\n");
}

// Drives a lifecycle from Start through a successful join of node `group_rank`.
class Running {
 public:
  explicit Running(LifecycleOptions options = Options(), AssignmentEvent a = Assignment(0))
      : life(std::move(options)) {
    const std::optional<act::Join> join = One<act::Join>(life.Start());
    EXPECT_TRUE(join.has_value());
    generation = join ? join->generation : 0;
    const AgentActions started = life.Joined(generation, a);
    EXPECT_EQ(Kinds(started), "StartWorkers");
  }
  AgentLifecycle life;
  int32_t generation = 0;
};

TEST(AgentLifecycleTest, SuccessfulJobStartsWorkersLeavesAndExitsZero) {
  AgentLifecycle life(Options());
  const AgentActions start = life.Start();
  ASSERT_EQ(Kinds(start), "Join");
  const act::Join join = *One<act::Join>(start);
  EXPECT_EQ(join.restart_count, 0);
  EXPECT_FALSE(join.resume.has_value());
  EXPECT_EQ(join.timeout, absl::Minutes(10));
  EXPECT_EQ(life.phase(), AgentLifecycle::Phase::kJoining);

  const AgentActions joined = life.Joined(join.generation, Assignment(1));
  ASSERT_EQ(Kinds(joined), "StartWorkers");
  const act::StartWorkers start_workers = *One<act::StartWorkers>(joined);
  EXPECT_EQ(start_workers.assignment.slot.rank_offset, 2);
  EXPECT_EQ(start_workers.assignment.world_size, 4);
  EXPECT_TRUE(absl::StrContains(Logs(joined), "node 1 of 2, ranks 2-3 of 4, master 10.0.0.1:29500"))
      << Logs(joined);

  EXPECT_EQ(Kinds(life.WorkerEnded(Ended(2, 0), kT0)), "");
  EXPECT_EQ(Kinds(life.WorkerEnded(Ended(3, 0), kT0)), "");
  const AgentActions done = life.AllWorkersDone();
  EXPECT_EQ(Kinds(done), "Leave");
  EXPECT_TRUE(absl::StrContains(Logs(done), "all 2 workers on n1 succeeded")) << Logs(done);
  const AgentActions left = life.Left(absl::OkStatus());
  ASSERT_EQ(Kinds(left), "Exit");
  EXPECT_EQ(One<act::Exit>(left)->code, 0);
  EXPECT_FALSE(One<act::Exit>(left)->linger);
  EXPECT_EQ(life.phase(), AgentLifecycle::Phase::kDone);
  EXPECT_FALSE(life.outcome().has_value());
}

TEST(AgentLifecycleTest, HostingAgentWaitsForTheOthersBeforeItExits) {
  LifecycleOptions o = Options();
  o.hosts_server = true;
  Running r(o);
  EXPECT_EQ(Kinds(r.life.AllWorkersDone()), "Leave");
  const AgentActions left = r.life.Left(absl::OkStatus());
  ASSERT_EQ(Kinds(left), "AwaitOthers");
  EXPECT_EQ(One<act::AwaitOthers>(left)->limit, absl::InfiniteDuration());
  const AgentActions gone = r.life.OthersGone();
  ASSERT_EQ(Kinds(gone), "Exit");
  EXPECT_EQ(One<act::Exit>(gone)->code, 0);
}

TEST(AgentLifecycleTest, ServersFirstReportedFailureIsTheRootCause) {
  Running r;
  const AgentActions failed = r.life.WorkerEnded(Ended(1, 3), kT0 + kSecond);
  ASSERT_EQ(Kinds(failed), "ReportFailure,StopWorkers");
  const act::ReportFailure report = *One<act::ReportFailure>(failed);
  EXPECT_EQ(report.failure.cause, AbortCause::kWorkerFailed);
  EXPECT_EQ(report.failure.rank, 1);
  EXPECT_EQ(report.failure.exit_code, 3);
  EXPECT_EQ(report.failure.host, "n1");
  EXPECT_EQ(report.failure.time_us, kT0 + kSecond);
  EXPECT_EQ(report.failure.stderr_tail, "Traceback\nValueError: bad batch");

  // The workers are down, but the answer that names the job's first failure is not in yet.
  EXPECT_EQ(Kinds(r.life.AllWorkersDone()), "");

  // Another node's rank failed first: that is the root cause every agent shows.
  FailureInfo other;
  other.host = "n2";
  other.group_rank = 1;
  other.rank = 3;
  other.exit_code = 7;
  other.stderr_tail = "RuntimeError: out of memory";
  const AgentActions answered = r.life.FailureAnswered(r.generation, AbortFor(other));
  ASSERT_EQ(Kinds(answered), "Leave");
  EXPECT_TRUE(absl::StrContains(Logs(answered), "job job1 failed: ")) << Logs(answered);
  EXPECT_TRUE(absl::StrContains(Logs(answered), "rank 3")) << Logs(answered);
  EXPECT_TRUE(absl::StrContains(Logs(answered), "    RuntimeError: out of memory"))
      << Logs(answered);
  const AgentActions left = r.life.Left(absl::UnavailableError("gone"));
  ASSERT_EQ(Kinds(left), "Exit");
  EXPECT_EQ(One<act::Exit>(left)->code, 7);
}

TEST(AgentLifecycleTest, UnansweredFailureReportEndsJobWithLocalCause) {
  Running r;
  ASSERT_EQ(Kinds(r.life.WorkerEnded(Ended(0, 0, SIGSEGV), kT0)), "ReportFailure,StopWorkers");
  EXPECT_EQ(Kinds(r.life.AllWorkersDone()), "");
  // The server did not answer: a departure would wait for it again, so the agent exits.
  const AgentActions answered =
      r.life.FailureAnswered(r.generation, absl::UnavailableError("connection refused"));
  EXPECT_EQ(Kinds(answered), "Exit");
  EXPECT_TRUE(absl::StrContains(Logs(answered), "could not report the failure")) << Logs(answered);
  EXPECT_EQ(One<act::Exit>(answered)->code, 128 + SIGSEGV);
}

TEST(AgentLifecycleTest, ARefusedFailureReportStillLeaves) {
  Running r;
  ASSERT_EQ(Kinds(r.life.WorkerEnded(Ended(0, 0, SIGSEGV), kT0)), "ReportFailure,StopWorkers");
  EXPECT_EQ(Kinds(r.life.AllWorkersDone()), "");
  // The server answered, with a refusal: it is there to hear the departure.
  const AgentActions answered =
      r.life.FailureAnswered(r.generation, absl::PermissionDeniedError("wrong job token"));
  EXPECT_EQ(Kinds(answered), "Leave");
  EXPECT_EQ(One<act::Exit>(r.life.Left(absl::OkStatus()))->code, 128 + SIGSEGV);
}

TEST(AgentLifecycleTest, AStoppedAgentWaitsBrieflyForTheServerToHearIt) {
  Running r;
  // A worker's failure waits for the server's answer as long as the call may take ...
  Running other;
  const AgentActions failed = other.life.WorkerEnded(Ended(0, 1), kT0);
  EXPECT_EQ(One<act::ReportFailure>(failed)->timeout, absl::InfiniteDuration());
  // ... a stop (scancel's SIGTERM) a short while: its workers are stopping meanwhile.
  const AgentActions stopped = r.life.Signal(SIGTERM, kT0);
  ASSERT_EQ(Kinds(stopped), "ReportFailure,StopWorkers");
  EXPECT_EQ(One<act::ReportFailure>(stopped)->timeout, absl::Seconds(2));
  EXPECT_EQ(Kinds(r.life.AllWorkersDone()), "");
  const AgentActions answered =
      r.life.FailureAnswered(r.generation, absl::DeadlineExceededError("no answer within 2s"));
  EXPECT_EQ(Kinds(answered), "Exit");
  EXPECT_EQ(One<act::Exit>(answered)->code, 128 + SIGTERM);
}

TEST(AgentLifecycleTest, RestartsUpToTheLimitCountingTheJobsRestarts) {
  LifecycleOptions o = Options();
  o.max_restarts = 2;
  Running r(o);
  ASSERT_EQ(Kinds(r.life.WorkerEnded(Ended(0, 1), kT0)), "ReportFailure,StopWorkers");
  EXPECT_EQ(Kinds(r.life.AllWorkersDone()), "");
  FailureInfo mine;
  mine.rank = 0;
  mine.exit_code = 1;
  const AgentActions restart = r.life.FailureAnswered(r.generation, AbortFor(mine));
  ASSERT_EQ(Kinds(restart), "Join");
  EXPECT_EQ(One<act::Join>(restart)->restart_count, 1);
  EXPECT_TRUE(absl::StrContains(Logs(restart), "restart 1 of 2")) << Logs(restart);
  EXPECT_FALSE(r.life.outcome().has_value());

  // The second round is the job's last allowed restart: its failure ends the job.
  const int32_t g2 = One<act::Join>(restart)->generation;
  EXPECT_NE(g2, r.generation);
  ASSERT_EQ(Kinds(r.life.Joined(g2, Assignment(0, /*restarts=*/2, /*round=*/3))), "StartWorkers");
  ASSERT_EQ(Kinds(r.life.WorkerEnded(Ended(1, 1), kT0)), "ReportFailure,StopWorkers");
  EXPECT_EQ(Kinds(r.life.AllWorkersDone()), "");
  const AgentActions last = r.life.FailureAnswered(g2, AbortFor(mine));
  EXPECT_EQ(Kinds(last), "Leave");
}

TEST(AgentLifecycleTest, LateJoinerTakesTheJobsRestartCount) {
  LifecycleOptions o = Options();
  o.max_restarts = 5;
  // This node joins a job that has already restarted three times.
  Running r(o, Assignment(1, /*restarts=*/3, /*round=*/4));
  ASSERT_EQ(Kinds(r.life.WorkerEnded(Ended(2, 1), kT0)), "ReportFailure,StopWorkers");
  EXPECT_EQ(Kinds(r.life.AllWorkersDone()), "");
  FailureInfo f;
  f.rank = 2;
  f.exit_code = 1;
  const AgentActions restart = r.life.FailureAnswered(r.generation, AbortFor(f));
  ASSERT_EQ(Kinds(restart), "Join");
  EXPECT_EQ(One<act::Join>(restart)->restart_count, 4);
  EXPECT_TRUE(absl::StrContains(Logs(restart), "restart 4 of 5")) << Logs(restart);
}

TEST(AgentLifecycleTest, SignalWhileJoiningCancelsAndExitsWithItsCode) {
  AgentLifecycle life(Options());
  const int32_t g = One<act::Join>(life.Start())->generation;
  const AgentActions sig = life.Signal(SIGTERM, kT0);
  EXPECT_EQ(Kinds(sig), "CancelJoin");
  const AgentActions joined = life.Joined(g, absl::CancelledError("cancelled"));
  ASSERT_EQ(Kinds(joined), "Exit");
  EXPECT_EQ(One<act::Exit>(joined)->code, 128 + SIGTERM);
}

TEST(AgentLifecycleTest, SignalWhileRunningStopsJobEverywhereNoRestart) {
  LifecycleOptions o = Options();
  o.max_restarts = 3;
  Running r(o);
  const AgentActions sig = r.life.Signal(SIGINT, kT0);
  ASSERT_EQ(Kinds(sig), "ReportFailure,StopWorkers");
  const act::ReportFailure report = *One<act::ReportFailure>(sig);
  EXPECT_EQ(report.failure.cause, AbortCause::kAgentSignalled);
  EXPECT_EQ(report.failure.signal, SIGINT);

  // A second signal while the workers stop: no more waiting.
  EXPECT_EQ(Kinds(r.life.Signal(SIGINT, kT0)), "KillWorkers");
  EXPECT_EQ(Kinds(r.life.AllWorkersDone()), "");
  FailureInfo f = report.failure;
  const AgentActions answered = r.life.FailureAnswered(r.generation, AbortFor(f));
  EXPECT_EQ(Kinds(answered), "Leave");
  EXPECT_EQ(One<act::Exit>(r.life.Left(absl::OkStatus()))->code, 128 + SIGINT);
}

TEST(AgentLifecycleTest, UserSignalsAreForwardedWithoutStoppingAnything) {
  Running r;
  const AgentActions a = r.life.Signal(SIGUSR1, kT0);
  ASSERT_EQ(Kinds(a), "ForwardSignal");
  EXPECT_EQ(One<act::ForwardSignal>(a)->signal, SIGUSR1);
  EXPECT_EQ(r.life.phase(), AgentLifecycle::Phase::kRunning);
}

TEST(AgentLifecycleTest, LostServerNoReconnectEndsJobNonZeroAndLingers) {
  Running r;
  const AgentActions lost =
      r.life.ServerLost(r.generation, absl::UnavailableError("socket closed"));
  ASSERT_EQ(Kinds(lost), "StopWorkers");
  ASSERT_TRUE(r.life.outcome().has_value());
  EXPECT_EQ(r.life.outcome()->cause, AbortCause::kServerLost);
  // No Leave to a server that is gone (a frozen one would hold the exit for a call deadline).
  const AgentActions done = r.life.AllWorkersDone();
  EXPECT_EQ(Kinds(done), "Exit");
  EXPECT_TRUE(absl::StrContains(Logs(done), "lost the rendezvous server at head:29400"))
      << Logs(done);
  EXPECT_EQ(r.life.phase(), AgentLifecycle::Phase::kDone);
  const act::Exit exit = *One<act::Exit>(done);
  EXPECT_NE(exit.code, 0);
  EXPECT_TRUE(exit.linger);
}

TEST(AgentLifecycleTest, LostServerWithReconnectRejoinsTheRunningRound) {
  LifecycleOptions o = Options();
  o.reconnect_timeout = absl::Seconds(30);
  Running r(o);
  const AgentActions lost = r.life.ServerLost(r.generation, absl::UnavailableError("restart"));
  ASSERT_EQ(Kinds(lost), "Join");
  const act::Join rejoin = *One<act::Join>(lost);
  ASSERT_TRUE(rejoin.resume.has_value());
  EXPECT_EQ(rejoin.resume->round, 1);
  EXPECT_EQ(rejoin.timeout, absl::Seconds(30));
  // The workers keep running while the agent reconnects.
  EXPECT_EQ(r.life.phase(), AgentLifecycle::Phase::kRunning);
  EXPECT_EQ(Kinds(r.life.Joined(rejoin.generation, Assignment(0))), "");
  EXPECT_EQ(r.life.phase(), AgentLifecycle::Phase::kRunning);

  // A second loss that cannot be mended ends the job.
  const int32_t g =
      One<act::Join>(r.life.ServerLost(rejoin.generation, absl::UnavailableError("x")))->generation;
  const AgentActions gave_up = r.life.Joined(g, absl::DeadlineExceededError("no server"));
  EXPECT_EQ(Kinds(gave_up), "StopWorkers");
  EXPECT_EQ(r.life.outcome()->cause, AbortCause::kServerLost);
  const AgentActions done = r.life.AllWorkersDone();
  EXPECT_EQ(Kinds(done), "Exit");
  EXPECT_TRUE(absl::StrContains(Logs(done), "could not rejoin within 30s")) << Logs(done);
}

TEST(AgentLifecycleTest, LostAgentRestartsAnElasticJobAndEndsAFixedOne) {
  AbortEvent lost = AbortForLostAgent("n2", 1, 2, 3);
  for (const bool elastic : {true, false}) {
    SCOPED_TRACE(elastic ? "elastic" : "fixed");
    LifecycleOptions o = Options();
    o.max_restarts = 1;
    o.elastic = elastic;
    Running r(o);
    ASSERT_EQ(Kinds(r.life.Aborted(r.generation, lost)), "StopWorkers");
    const AgentActions done = r.life.AllWorkersDone();
    if (elastic) {
      EXPECT_EQ(Kinds(done), "Join");
    } else {
      EXPECT_EQ(Kinds(done), "Leave");
      const act::Exit exit = *One<act::Exit>(r.life.Left(absl::OkStatus()));
      EXPECT_NE(exit.code, 0);
      EXPECT_TRUE(exit.linger);
    }
  }
}

TEST(AgentLifecycleTest, EventsOfAReplacedJoinAreIgnored) {
  LifecycleOptions o = Options();
  o.max_restarts = 1;
  Running r(o);
  ASSERT_EQ(Kinds(r.life.WorkerEnded(Ended(0, 1), kT0)), "ReportFailure,StopWorkers");
  EXPECT_EQ(Kinds(r.life.AllWorkersDone()), "");
  const int32_t old = r.generation;
  const int32_t g2 =
      One<act::Join>(r.life.FailureAnswered(old, AbortFor(FailureInfo{})))->generation;
  // The first round's stream reports its end late: nothing happens to the second round.
  EXPECT_EQ(Kinds(r.life.Aborted(old, AbortForLostAgent("n2", 1, 2, 3))), "");
  EXPECT_EQ(Kinds(r.life.ServerLost(old, absl::UnavailableError("closed"))), "");
  EXPECT_EQ(Kinds(r.life.Joined(old, Assignment(0))), "");
  EXPECT_EQ(Kinds(r.life.Joined(g2, Assignment(0, 1, 2))), "StartWorkers");
}

TEST(AgentLifecycleTest, JobThatEndedBeforeTheAssignmentArrivedStartsNothing) {
  AgentLifecycle life(Options());
  const int32_t g = One<act::Join>(life.Start())->generation;
  FailureInfo f;
  f.host = "n2";
  f.rank = 3;
  f.exit_code = 9;
  EXPECT_EQ(Kinds(life.Aborted(g, AbortFor(f))), "");
  const AgentActions joined = life.Joined(g, absl::AbortedError("job ended"));
  ASSERT_EQ(Kinds(joined), "Exit");
  EXPECT_EQ(One<act::Exit>(joined)->code, 9);
  EXPECT_TRUE(absl::StrContains(Logs(joined), "job job1 failed")) << Logs(joined);
}

TEST(AgentLifecycleTest, JoinErrorExitsNonZeroWithTheReason) {
  AgentLifecycle life(Options());
  const int32_t g = One<act::Join>(life.Start())->generation;
  const AgentActions joined =
      life.Joined(g, absl::DeadlineExceededError("only 1 of 2 nodes joined within 10m"));
  ASSERT_EQ(Kinds(joined), "Exit");
  EXPECT_EQ(One<act::Exit>(joined)->code, 1);
  EXPECT_TRUE(absl::StrContains(Logs(joined), "job job1: only 1 of 2 nodes joined"))
      << Logs(joined);
}

// Whoever sends an abort, it never ends the agent with 0: not with exit code 0, nor with one a
// process cannot exit with (256 would show as 0); a worker's own code is kept.
TEST(AgentLifecycleTest, AnAbortNeverEndsTheAgentWithZero) {
  for (const auto& [sent, expected] :
       std::vector<std::pair<int32_t, int>>{{0, 1}, {256, 1}, {-1, 1}, {3, 3}, {255, 255}}) {
    SCOPED_TRACE(sent);
    AbortEvent abort;
    abort.reason = "ended elsewhere";
    abort.exit_code = sent;
    Running r;
    ASSERT_EQ(Kinds(r.life.Aborted(r.generation, abort)), "StopWorkers");
    ASSERT_EQ(Kinds(r.life.AllWorkersDone()), "Leave");
    EXPECT_EQ(One<act::Exit>(r.life.Left(absl::OkStatus()))->code, expected);

    // The same abort before the assignment arrived.
    AgentLifecycle life(Options());
    const int32_t g = One<act::Join>(life.Start())->generation;
    EXPECT_EQ(Kinds(life.Aborted(g, abort)), "");
    EXPECT_EQ(One<act::Exit>(life.Joined(g, absl::AbortedError("ended")))->code, expected);
  }
}

TEST(AgentLifecycleTest, ProgressNamesWhoIsMissing) {
  AgentLifecycle life(Options());
  const int32_t g = One<act::Join>(life.Start())->generation;
  ProgressEvent p;
  p.joined = 1;
  p.expected = 3;
  p.joined_hosts = {"n1"};
  p.missing_node_indices = {1, 2};
  const AgentActions a = life.Progress(g, p);
  EXPECT_TRUE(absl::StrContains(Logs(a),
                                "waiting for 2 of 3 nodes (joined: n1; missing node "
                                "ranks 1,2)"))
      << Logs(a);
}

TEST(AgentLifecycleTest, WorkersThatCouldNotStartAreAFailureOfTheFirstRank) {
  Running r(Options(), Assignment(1));
  const AgentActions a =
      r.life.WorkersStartFailed(absl::NotFoundError("python9: command not found"), kT0);
  ASSERT_EQ(Kinds(a), "ReportFailure,StopWorkers");
  const act::ReportFailure report = *One<act::ReportFailure>(a);
  EXPECT_EQ(report.failure.rank, 2);
  EXPECT_EQ(report.failure.exit_code, 127);
  EXPECT_EQ(report.failure.error_message, "python9: command not found");

  // The root cause's line names the message already: it is not shown a second time.
  const AgentActions done = r.life.FailureAnswered(r.generation, AbortFor(report.failure));
  ASSERT_EQ(Kinds(done), "");
  const AgentActions stopped = r.life.AllWorkersDone();
  ASSERT_EQ(Kinds(stopped), "Leave");
  EXPECT_EQ(Logs(stopped),
            "job job1 failed: rank 2 (local rank 0, node 1) on n1 could not start: python9: "
            "command not found");
}

TEST(AgentLifecycleTest, WorkersErrorFileMessageIsShownBelowTheRootCause) {
  Running r;
  WorkerEnd end = Ended(1, 1);
  end.error_message = "ValueError: bad batch\n  File \"train.py\", line 3";
  ASSERT_EQ(Kinds(r.life.WorkerEnded(end, kT0)), "ReportFailure,StopWorkers");
  EXPECT_EQ(Kinds(r.life.AllWorkersDone()), "");
  const AgentActions done = r.life.FailureAnswered(r.generation, r.life.outcome().value());
  EXPECT_EQ(Logs(done),
            "job job1 failed: rank 1 (local rank 1, node 0) on n1 exited with code 1\n"
            "  rank 1's error:\n    ValueError: bad batch\n      File \"train.py\", line 3");
}

// The agent's configuration becomes the lifecycle's options in one place.
TEST(AgentLifecycleTest, OptionsComeFromTheAgentsConfiguration) {
  AgentConfig config;
  config.join.job_id = "slurm-42.0";
  config.join.agent.host = "n3";
  config.join.agent.nproc = 4;
  config.join.agent.order = 7;
  config.join.min_agents = 2;
  config.join.max_agents = 4;
  config.join.max_restarts = 3;
  config.join_timeout = absl::Seconds(90);
  config.reconnect_timeout = absl::Seconds(30);
  config.term_timeout = absl::Seconds(5);
  const LifecycleOptions o = LifecycleOptionsFor(config, true, "n1:29400");
  EXPECT_EQ(o.job_id, "slurm-42.0");
  EXPECT_EQ(o.host, "n3");
  EXPECT_EQ(o.nproc, 4);
  EXPECT_EQ(o.max_restarts, 3);
  EXPECT_TRUE(o.elastic);
  EXPECT_TRUE(o.per_task);
  EXPECT_TRUE(o.hosts_server);
  EXPECT_EQ(o.endpoint, "n1:29400");
  EXPECT_EQ(o.join_timeout, absl::Seconds(90));
  EXPECT_EQ(o.reconnect_timeout, absl::Seconds(30));
  EXPECT_EQ(o.term_timeout, absl::Seconds(5));

  config.join.agent.order = -1;
  config.join.min_agents = 4;
  config.join.max_restarts.reset();
  const LifecycleOptions fixed = LifecycleOptionsFor(config, false, "");
  EXPECT_FALSE(fixed.elastic);
  EXPECT_FALSE(fixed.per_task);
  EXPECT_FALSE(fixed.hosts_server);
  EXPECT_EQ(fixed.max_restarts, 0);
}

// ---- Health checks ----

LifecycleOptions Checked(LifecycleOptions o = Options()) {
  o.check_health = true;
  return o;
}

TEST(AgentLifecycleTest, AHealthyNodeIsCheckedBeforeItJoins) {
  AgentLifecycle life(Checked());
  const AgentActions start = life.Start();
  ASSERT_EQ(Kinds(start), "CheckHealth");
  EXPECT_EQ(life.phase(), AgentLifecycle::Phase::kChecking);
  const int32_t generation = One<act::CheckHealth>(start)->generation;
  const AgentActions checked = life.HealthChecked(generation, std::nullopt);
  ASSERT_EQ(Kinds(checked), "Join");
  EXPECT_FALSE(One<act::Join>(checked)->unhealthy.has_value());
  EXPECT_EQ(One<act::Join>(checked)->generation, generation);
  // A stale verdict (an earlier check's) changes nothing.
  EXPECT_TRUE(life.HealthChecked(generation - 1, Unhealthy{}).empty());
}

TEST(AgentLifecycleTest, AnUnhealthyNodeReportsItselfAndExitsWithItsCode) {
  AgentLifecycle life(Checked());
  const int32_t generation = One<act::CheckHealth>(life.Start())->generation;
  const AgentActions checked = life.HealthChecked(
      generation, Unhealthy{ExclusionKind::kHealthCheckFailed, "nvidia-smi: GPU 2 lost"});
  ASSERT_EQ(Kinds(checked), "Join");
  const act::Join report = *One<act::Join>(checked);
  ASSERT_TRUE(report.unhealthy.has_value());
  EXPECT_EQ(report.unhealthy->detail, "nvidia-smi: GPU 2 lost");
  EXPECT_LE(report.timeout, kUnhealthyReportTimeout);
  EXPECT_TRUE(absl::StrContains(Logs(checked), "n1: health check failed: nvidia-smi: GPU 2 lost"))
      << Logs(checked);
  // Progress while the report is on its way says nothing: this node waits for nobody.
  ProgressEvent p;
  p.joined = 1;
  p.expected = 2;
  EXPECT_TRUE(life.Progress(generation, p).empty());
  const AgentActions answered =
      life.Joined(generation, absl::FailedPreconditionError("n1 is left out of job job1 for good"));
  ASSERT_EQ(Kinds(answered), "Exit");
  EXPECT_EQ(One<act::Exit>(answered)->code, kExitNodeUnhealthy);
}

TEST(AgentLifecycleTest, AnUnhealthyNodeThatHostsTheServerKeepsItForTheOthers) {
  LifecycleOptions o = Checked();
  o.hosts_server = true;
  o.agents = 3;
  AgentLifecycle life(o);
  const int32_t generation = One<act::CheckHealth>(life.Start())->generation;
  life.HealthChecked(generation, Unhealthy{ExclusionKind::kRunDir, "/tmp is full"});
  const AgentActions answered = life.Joined(generation, absl::FailedPreconditionError("left out"));
  ASSERT_EQ(Kinds(answered), "AwaitOthers");
  // The others may not have come yet: it waits for both, within the join timeout.
  EXPECT_EQ(One<act::AwaitOthers>(answered)->others, 2);
  EXPECT_EQ(One<act::AwaitOthers>(answered)->limit, o.join_timeout);
  const AgentActions gone = life.OthersGone();
  ASSERT_EQ(Kinds(gone), "Exit");
  EXPECT_EQ(One<act::Exit>(gone)->code, kExitNodeUnhealthy);
}

TEST(AgentLifecycleTest, ASignalDuringTheHealthCheckStopsItAndExits) {
  AgentLifecycle life(Checked());
  const int32_t generation = One<act::CheckHealth>(life.Start())->generation;
  const AgentActions stopped = life.Signal(SIGTERM, kT0);
  EXPECT_EQ(Kinds(stopped), "CancelHealthCheck,Exit");
  EXPECT_EQ(One<act::Exit>(stopped)->code, 128 + SIGTERM);
  EXPECT_TRUE(life.HealthChecked(generation, std::nullopt).empty());
}

TEST(AgentLifecycleTest, ARestartChecksTheNodeAgainButAResumeDoesNot) {
  LifecycleOptions o = Checked();
  o.max_restarts = 1;
  o.reconnect_timeout = absl::Seconds(30);
  AgentLifecycle life(o);
  int32_t generation = One<act::CheckHealth>(life.Start())->generation;
  generation = One<act::Join>(life.HealthChecked(generation, std::nullopt))->generation;
  ASSERT_EQ(Kinds(life.Joined(generation, Assignment(0))), "StartWorkers");
  // The server is lost and the workers go on: the rejoin resumes, with no check.
  const AgentActions lost = life.ServerLost(generation, absl::UnavailableError("gone"));
  ASSERT_EQ(Kinds(lost), "Join");
  ASSERT_TRUE(One<act::Join>(lost)->resume.has_value());
  generation = One<act::Join>(lost)->generation;
  ASSERT_EQ(Kinds(life.Joined(generation, Assignment(0))), "");
  // A worker fails: the restart's join comes after a check.
  AgentActions failed = life.WorkerEnded(Ended(1, 3), kT0);
  const act::ReportFailure report = *One<act::ReportFailure>(failed);
  life.FailureAnswered(report.generation, AbortFor(report.failure));
  const AgentActions done = life.AllWorkersDone();
  EXPECT_EQ(Kinds(done), "CheckHealth");
}

TEST(AgentLifecycleTest, EveryLeftOutNodeIsLoggedOnce) {
  AgentLifecycle life(Checked());
  int32_t generation = One<act::CheckHealth>(life.Start())->generation;
  generation = One<act::Join>(life.HealthChecked(generation, std::nullopt))->generation;
  ProgressEvent p;
  p.joined = 1;
  p.expected = 2;
  p.excluded = {ExcludedNode{"n3", 2, Unhealthy{ExclusionKind::kHealthCheckFailed, "ECC"}}};
  const AgentActions first = life.Progress(generation, p);
  EXPECT_TRUE(absl::StrContains(Logs(first), "n3 (node 2): health check failed: ECC"))
      << Logs(first);
  EXPECT_FALSE(absl::StrContains(Logs(life.Progress(generation, p)), "ECC"));
  // News of one more, alone (no joined hosts to name), is that node's line and no other.
  p.excluded.push_back(ExcludedNode{"n4", 3, Unhealthy{ExclusionKind::kRunDir, ""}});
  const AgentActions news = life.Progress(generation, p);
  ASSERT_EQ(news.size(), 1u) << Logs(news);
  EXPECT_TRUE(absl::StrContains(Logs(news), "n4 (node 3)")) << Logs(news);
  // A progress names who joined and who is awaited.
  p.joined_hosts = {"n1"};
  EXPECT_TRUE(absl::StrContains(Logs(life.Progress(generation, p)), "waiting for 1 of 2 nodes"));
}

// ---- What a rank asks of the job ----

TEST(AgentLifecycleTest, ARankThatExits84EndsTheJobWithoutTheRestartsLeft) {
  LifecycleOptions o = Options();
  o.max_restarts = 3;
  Running r(o);
  const AgentActions failed = r.life.WorkerEnded(Ended(1, kWorkerExitNoRestart), kT0);
  ASSERT_EQ(Kinds(failed), "ReportFailure,StopWorkers");
  const FailureInfo f = One<act::ReportFailure>(failed)->failure;
  EXPECT_EQ(f.request, RankRequest::kNoRestart);
  EXPECT_EQ(Kinds(r.life.AllWorkersDone()), "");
  const AgentActions end = r.life.FailureAnswered(r.generation, AbortFor(f));
  EXPECT_EQ(Kinds(end), "Leave") << Logs(end);
  EXPECT_TRUE(absl::StrContains(Logs(end), "it asked that the job not restart")) << Logs(end);
  EXPECT_EQ(Kinds(r.life.Left(absl::OkStatus())), "Exit");
}

TEST(AgentLifecycleTest, AnotherNodesNoRestartFailureEndsThisOneToo) {
  LifecycleOptions o = Options();
  o.max_restarts = 3;
  Running r(o, Assignment(1));
  FailureInfo theirs;
  theirs.host = "n0";
  theirs.rank = 0;
  theirs.exit_code = 1;
  theirs.request = RankRequest::kNoRestart;
  theirs.request_reason = "the config names no dataset";
  EXPECT_EQ(Kinds(r.life.Aborted(r.generation, AbortFor(theirs))), "StopWorkers");
  const AgentActions end = r.life.AllWorkersDone();
  EXPECT_EQ(Kinds(end), "Leave") << Logs(end);
  EXPECT_TRUE(absl::StrContains(Logs(end), "the config names no dataset")) << Logs(end);
}

TEST(AgentLifecycleTest, ARankThatExits83TakesItsNodeOutAtTheRestart) {
  LifecycleOptions o = Options();
  o.max_restarts = 1;
  o.elastic = true;
  Running r(o, Assignment(1));
  const AgentActions failed = r.life.WorkerEnded(Ended(3, kWorkerExitExcludeNode), kT0);
  ASSERT_EQ(Kinds(failed), "ReportFailure,StopWorkers");
  const FailureInfo f = One<act::ReportFailure>(failed)->failure;
  EXPECT_EQ(f.request, RankRequest::kExcludeNode);
  EXPECT_EQ(Kinds(r.life.AllWorkersDone()), "");
  // The others restart; this node reports itself left out instead of rejoining.
  const AgentActions restart = r.life.FailureAnswered(r.generation, AbortFor(f));
  ASSERT_EQ(Kinds(restart), "Join") << Logs(restart);
  const act::Join join = *One<act::Join>(restart);
  EXPECT_EQ(join.restart_count, 1);
  ASSERT_TRUE(join.unhealthy.has_value());
  EXPECT_EQ(join.unhealthy->kind, ExclusionKind::kRankRequested);
  EXPECT_EQ(join.unhealthy->detail, "rank 3 exited with code 83");
  EXPECT_TRUE(absl::StrContains(Logs(restart),
                                "this node is left out of the job: n1: a rank "
                                "asked for it: rank 3 exited with code 83"))
      << Logs(restart);
  const AgentActions out =
      r.life.Joined(join.generation, absl::FailedPreconditionError("left out"));
  ASSERT_EQ(Kinds(out), "Exit");
  EXPECT_EQ(One<act::Exit>(out)->code, kExitNodeUnhealthy);
}

TEST(AgentLifecycleTest, ARanksWordsOnTheFifoGoWithItsFailure) {
  LifecycleOptions o = Options();
  o.max_restarts = 2;
  Running r(o);
  // Another agent's rank is not this agent's to speak for.
  EXPECT_TRUE(r.life.RankAsked(7, RankRequest::kExcludeNode, "not mine").empty());
  const AgentActions asked = r.life.RankAsked(1, RankRequest::kExcludeNode, "ECC errors on GPU 1");
  EXPECT_TRUE(absl::StrContains(Logs(asked), "rank 1 asks that n1 be left out of the job: ECC"))
      << Logs(asked);
  const AgentActions failed = r.life.WorkerEnded(Ended(1, 1), kT0);
  const FailureInfo f = One<act::ReportFailure>(failed)->failure;
  EXPECT_EQ(f.request, RankRequest::kExcludeNode);
  EXPECT_EQ(f.request_reason, "ECC errors on GPU 1");
  EXPECT_TRUE(absl::StrContains(DescribeFailure(f),
                                "it asked for its node to be left out: ECC errors on GPU 1"))
      << DescribeFailure(f);
  r.life.AllWorkersDone();
  const act::Join join = *One<act::Join>(r.life.FailureAnswered(r.generation, AbortFor(f)));
  ASSERT_TRUE(join.unhealthy.has_value());
  EXPECT_EQ(join.unhealthy->detail, "rank 1: ECC errors on GPU 1");
}

TEST(AgentLifecycleTest, ANodeARankAskedOutLeavesEvenWhenAnotherFailedFirst) {
  LifecycleOptions o = Options();
  o.max_restarts = 1;
  Running r(o, Assignment(1));
  r.life.RankAsked(2, RankRequest::kExcludeNode, "NVLink down");
  FailureInfo theirs;
  theirs.host = "n0";
  theirs.exit_code = 1;
  r.life.Aborted(r.generation, AbortFor(theirs));
  const act::Join join = *One<act::Join>(r.life.AllWorkersDone());
  ASSERT_TRUE(join.unhealthy.has_value());
  EXPECT_EQ(join.unhealthy->detail, "rank 2: NVLink down");
}

}  // namespace
}  // namespace rdzv

// ---- Hot spares ----

namespace rdzv {
namespace {

AssignmentEvent SpareAssignment() {
  AssignmentEvent a = Assignment(0);
  a.slot = Slot{};
  a.spare = true;
  return a;
}

TEST(AgentLifecycleTest, ASpareStartsNoWorkersAndTakesItsPlaceInTheRestart) {
  LifecycleOptions o = Options();
  o.max_restarts = 1;
  o.spares = true;
  AgentLifecycle life(o);
  const int32_t generation = One<act::Join>(life.Start())->generation;
  const AgentActions joined = life.Joined(generation, SpareAssignment());
  EXPECT_EQ(Kinds(joined), "");
  EXPECT_TRUE(absl::StrContains(Logs(joined), "n1 is a spare; it starts no workers"))
      << Logs(joined);
  EXPECT_EQ(life.phase(), AgentLifecycle::Phase::kRunning);
  // Another node is lost: the spare rejoins at once (it has no workers to stop).
  const AgentActions lost = life.Aborted(generation, AbortForLostAgent("n2", 1, 2, 3));
  ASSERT_EQ(Kinds(lost), "Join") << Logs(lost);
  const act::Join again = *One<act::Join>(lost);
  EXPECT_EQ(again.restart_count, 1);
  const AgentActions seated = life.Joined(again.generation, Assignment(1, 1, 2));
  ASSERT_EQ(Kinds(seated), "StartWorkers");
  EXPECT_EQ(One<act::StartWorkers>(seated)->assignment.slot.rank_offset, 2);
}

TEST(AgentLifecycleTest, TheEndNamesTheNodesTheJobLeftOutAndTheExcludeLine) {
  AgentLifecycle life(Options());
  const int32_t generation = One<act::Join>(life.Start())->generation;
  ProgressEvent p;
  p.joined = 1;
  p.expected = 2;
  p.excluded = {ExcludedNode{"n7", 1, Unhealthy{ExclusionKind::kNodeLost, ""}},
                ExcludedNode{"n5", 2, Unhealthy{ExclusionKind::kHealthCheckFailed, "no IB"}}};
  life.Progress(generation, p);
  life.Joined(generation, Assignment(0));
  life.WorkerEnded(Ended(0, 0), kT0);
  life.WorkerEnded(Ended(1, 0), kT0);
  const AgentActions done = life.AllWorkersDone();
  EXPECT_TRUE(absl::StrContains(Logs(done),
                                "job job1 left out n7 (node 1): lost while the job ran; n5 (node "
                                "2): health check failed: no IB; next time: sbatch "
                                "--exclude=n[5,7]"))
      << Logs(done);
}

TEST(AgentLifecycleTest, ASpareTheJobDidNotNeedExitsZeroWhenLetGo) {
  LifecycleOptions o = Options();
  o.spares = true;
  AgentLifecycle life(o);
  const int32_t generation = One<act::Join>(life.Start())->generation;
  life.Joined(generation, SpareAssignment());
  const AgentActions released = life.Released(generation);
  ASSERT_EQ(Kinds(released), "Exit");
  EXPECT_EQ(One<act::Exit>(released)->code, 0);
  EXPECT_TRUE(absl::StrContains(Logs(released), "done without needing n1, a spare"));
}

TEST(AgentLifecycleTest, ASpareThatLosesItsServerFollowsTheJobAndStaysASpare) {
  LifecycleOptions o = Options();
  o.spares = true;
  o.reconnect_timeout = absl::Seconds(30);
  AgentLifecycle life(o);
  const int32_t generation = One<act::Join>(life.Start())->generation;
  life.Joined(generation, SpareAssignment());
  const AgentActions lost = life.ServerLost(generation, absl::UnavailableError("gone"));
  ASSERT_EQ(Kinds(lost), "Join") << Logs(lost);
  const act::Join resume = *One<act::Join>(lost);
  ASSERT_TRUE(resume.resume.has_value());
  EXPECT_TRUE(resume.resume->spare);
  EXPECT_EQ(resume.timeout, absl::Seconds(30));
  EXPECT_TRUE(absl::StrContains(Logs(lost), "n1, a spare, rejoins the job as one")) << Logs(lost);
  life.ServerAt("backup:29400");
  const AgentActions back = life.Joined(resume.generation, SpareAssignment());
  EXPECT_TRUE(absl::StrContains(Logs(back), "back in touch with the rendezvous server at "
                                            "backup:29400"))
      << Logs(back);
  EXPECT_EQ(life.phase(), AgentLifecycle::Phase::kRunning);
  // Let go there when the job is done without it: exit 0, as anywhere.
  EXPECT_EQ(One<act::Exit>(life.Released(resume.generation))->code, 0);
}

TEST(AgentLifecycleTest, ASpareThatCannotReconnectLeavesTheJobQuietly) {
  LifecycleOptions o = Options();
  o.spares = true;
  AgentLifecycle life(o);
  const int32_t generation = One<act::Join>(life.Start())->generation;
  life.Joined(generation, SpareAssignment());
  const AgentActions lost = life.ServerLost(generation, absl::UnavailableError("gone"));
  ASSERT_EQ(Kinds(lost), "Exit");
  EXPECT_EQ(One<act::Exit>(lost)->code, 0);
  EXPECT_TRUE(absl::StrContains(Logs(lost), "n1 was a spare and leaves the job")) << Logs(lost);
}

TEST(AgentLifecycleTest, WithSparesALostNodeRestartsTheJobAndAStreamLetGoIsALostServer) {
  LifecycleOptions o = Options();
  o.max_restarts = 1;
  o.spares = true;
  {
    Running r(o);
    ASSERT_EQ(Kinds(r.life.Aborted(r.generation, AbortForLostAgent("n2", 1, 2, 3))), "StopWorkers");
    EXPECT_EQ(Kinds(r.life.AllWorkersDone()), "Join");
  }
  // A node with ranks is never let go: a clean end of its stream is its server lost.
  Running r(o);
  EXPECT_EQ(Kinds(r.life.Released(r.generation)), "StopWorkers");
}

}  // namespace
}  // namespace rdzv
