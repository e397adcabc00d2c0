// The watchdog's pure parts: parsing what workers write to the FIFO, deciding which worker is
// hung, tracing a pid to its worker, which hang the job's abort names, and what the agent's
// lifecycle does about a hung worker.
#include "client/agent/core/hang_watchdog.h"

#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/agent/core/agent_lifecycle.h"
#include "client/agent/core/watchdog_request.h"
#include "common/core/hang_verdict.h"
#include "common/core/rendezvous_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rdzv {
namespace {

using ::testing::HasSubstr;
using Kind = WatchdogRequest::Kind;

struct ParseCase {
  std::string line;
  bool ok;
  Kind kind;
  int64_t pid;
  std::string scope;
  Micros expiration_us;
};

ParseCase Good(std::string line, Kind kind, int64_t pid, std::string scope = "",
               Micros expiration_us = 0) {
  return {std::move(line), true, kind, pid, std::move(scope), expiration_us};
}
ParseCase Bad(std::string line) { return {std::move(line), false, Kind::kHeartbeat, 0, "", 0}; }

TEST(ParseWatchdogLineTest, Table) {
  const std::vector<ParseCase> cases = {
      // What torch's FileTimerClient writes (json.dumps), acquire and release.
      Good(
          R"({"version": 1, "pid": 4242, "scope_id": "train.py#12", "expiration_time": 1700000000.5, "signal": 9})",
          Kind::kAcquire, 4242, "train.py#12", 1700000000500000),
      Good(
          R"({"version": 1, "pid": 4242, "scope_id": "train.py#12", "expiration_time": -1, "signal": 0})",
          Kind::kRelease, 4242, "train.py#12"),
      Good(R"({"version":1,"pid":7,"heartbeat":true})", Kind::kHeartbeat, 7),
      Good(R"(  {"pid": 7, "heartbeat": true, "version": 1}  )", Kind::kHeartbeat, 7),
      // Escapes in the scope, as json.dumps writes non-ASCII.
      Good(
          R"({"version": 1, "pid": 1, "scope_id": "a\"b\\c\u00e9\ud83d\ude00", "expiration_time": 5})",
          Kind::kAcquire, 1, "a\"b\\c\xc3\xa9\xf0\x9f\x98\x80", 5000000),
      // Malformed.
      Bad(""),
      Bad("not json"),
      Bad("[1, 2]"),
      Bad(R"({"version": 1, "pid": 7, "heartbeat": true)"),
      Bad(R"({"version": 1, "pid": 7, "heartbeat": true} trailing)"),
      Bad(R"({"version": 2, "pid": 7, "heartbeat": true})"),
      Bad(R"({"pid": 7, "heartbeat": true})"),
      Bad(R"({"version": 1, "heartbeat": true})"),
      Bad(R"({"version": 1, "pid": -3, "heartbeat": true})"),
      Bad(R"({"version": 1, "pid": 1.5, "heartbeat": true})"),
      Bad(R"({"version": 1, "pid": "7", "heartbeat": true})"),
      Bad(R"({"version": 1, "pid": 7, "heartbeat": false})"),
      Bad(R"({"version": 1, "pid": 7})"),
      Bad(R"({"version": 1, "pid": 7, "scope_id": "s"})"),
      Bad(R"({"version": 1, "pid": 7, "scope_id": 3, "expiration_time": 5})"),
      Bad(R"({"version": 1, "pid": 7, "scope_id": "s", "expiration_time": 1e300})"),
      Bad(R"({"version": 1, "pid": 7, "nested": {"a": 1}, "heartbeat": true})"),
      Bad(R"({"version": 1, "pid": 7, "scope_id": "unterminated, "expiration_time": 5})"),
      Bad(R"({"version": 1, "pid": 7, "scope_id": "bad \x escape", "expiration_time": 5})"),
      Bad(R"({"version": 1, "pid": 7, "scope_id": "\ud83d", "expiration_time": 5})"),
      Bad(std::string(R"({"version": 1, "pid": 7, "scope_id": ")") + std::string(5000, 'x') +
          R"(", "expiration_time": 5})"),
  };
  for (const ParseCase& c : cases) {
    SCOPED_TRACE(c.line.substr(0, 120));
    absl::StatusOr<WatchdogRequest> r = ParseWatchdogLine(c.line);
    ASSERT_EQ(r.ok(), c.ok) << r.status();
    if (!c.ok) continue;
    EXPECT_EQ(r->kind, c.kind);
    EXPECT_EQ(r->pid, c.pid);
    EXPECT_EQ(r->scope, c.scope);
    if (c.kind == Kind::kAcquire) {
      EXPECT_EQ(r->expiration_us, c.expiration_us);
    }
  }
}

TEST(ParseWatchdogLineTest, RankRequestsCarryTheRanksWordsPrintable) {
  absl::StatusOr<WatchdogRequest> out =
      ParseWatchdogLine(R"({"version": 1, "pid": 9, "exclude_node": "ECC errors\non GPU 3"})");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->kind, Kind::kRankRequest);
  EXPECT_EQ(out->request, RankRequest::kExcludeNode);
  EXPECT_EQ(out->pid, 9);
  EXPECT_EQ(out->reason, "ECC errors on GPU 3");  // one line on every node's terminal
  absl::StatusOr<WatchdogRequest> mine =
      ParseWatchdogLine(R"({"version": 1, "pid": 9, "no_restart": ""})");
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->request, RankRequest::kNoRestart);
  EXPECT_EQ(mine->reason, "");
  absl::StatusOr<WatchdogRequest> long_words = ParseWatchdogLine(
      absl::StrCat(R"({"version": 1, "pid": 9, "no_restart": ")", std::string(3000, 'w'), R"("})"));
  ASSERT_TRUE(long_words.ok());
  EXPECT_EQ(long_words->reason.size(), kMaxRankRequestReasonBytes);
  // Cut before a character that would straddle the limit, never inside it: "x" then 2-byte
  // characters puts byte 512 in the middle of one.
  std::string accented = "x";
  for (int i = 0; i < 1000; ++i) accented += "\xc3\xa9";
  absl::StatusOr<WatchdogRequest> accents = ParseWatchdogLine(
      absl::StrCat(R"({"version": 1, "pid": 9, "exclude_node": ")", accented, R"("})"));
  ASSERT_TRUE(accents.ok()) << accents.status();
  EXPECT_EQ(accents->reason, accented.substr(0, kMaxRankRequestReasonBytes - 1));
  EXPECT_FALSE(ParseWatchdogLine(R"({"version": 1, "pid": 9, "no_restart": true})").ok());
  EXPECT_FALSE(ParseWatchdogLine(R"({"version": 1, "exclude_node": "x"})").ok());
}

WatchdogRequest Acquire(int64_t pid, std::string scope, Micros at) {
  return {Kind::kAcquire, pid, std::move(scope), at, 9, RankRequest::kNone, ""};
}
WatchdogRequest Release(int64_t pid, std::string scope) {
  return {Kind::kRelease, pid, std::move(scope), 0, 0, RankRequest::kNone, ""};
}
WatchdogRequest Beat(int64_t pid) {
  return {Kind::kHeartbeat, pid, "", 0, 0, RankRequest::kNone, ""};
}

constexpr Micros kS = 1'000'000;

TEST(HangWatchdogTest, ExpiredTimerIsAHangOnce) {
  HangWatchdog w({});
  w.Start(2, 0, 0);
  w.Apply(1, Acquire(11, "step", 10 * kS), 1 * kS);
  EXPECT_FALSE(w.Check(10 * kS).has_value());  // at the deadline, not past it
  std::optional<WorkerHang> hang = w.Check(10 * kS + 1);
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->worker, 1);
  EXPECT_EQ(hang->since_us, 10 * kS);
  EXPECT_THAT(hang->detail, HasSubstr("timer \"step\" expired"));
  EXPECT_THAT(hang->detail, HasSubstr("pid 11"));
  EXPECT_FALSE(w.Check(20 * kS).has_value());
}

TEST(HangWatchdogTest, ReleasedTimerAndEndedWorkerAreNotHangs) {
  HangWatchdog w({});
  w.Start(2, 0, 0);
  w.Apply(0, Acquire(10, "a", 5 * kS), 0);
  w.Apply(0, Release(10, "a"), 1 * kS);
  // The same scope from another pid of the worker is another timer.
  w.Apply(1, Acquire(11, "a", 5 * kS), 0);
  w.Apply(1, Release(12, "a"), 1 * kS);
  w.WorkerEnded(1);
  w.Apply(1, Acquire(11, "b", 5 * kS), 2 * kS);  // after its end: ignored
  EXPECT_FALSE(w.Check(60 * kS).has_value());
}

// A worker that names ever new timers: the agent keeps kMaxTimersPerWorker of them, says so once,
// goes on watching those it kept and takes new ones again once some are released.
TEST(HangWatchdogTest, TimersPerWorkerAreBoundedAndTheExcessIsReportedOnce) {
  HangWatchdog w({});
  w.Start(2, 0, 0);
  const int64_t max = HangWatchdog::kMaxTimersPerWorker;
  for (int64_t i = 0; i < max; ++i) {
    EXPECT_FALSE(w.Apply(0, Acquire(10, absl::StrCat("t", i), 100 * kS), 0).has_value());
  }
  std::optional<std::string> full = w.Apply(0, Acquire(10, "one too many", 5 * kS), 0);
  ASSERT_TRUE(full.has_value());
  EXPECT_THAT(*full, HasSubstr("worker 0 holds 1024 watchdog timers"));
  EXPECT_THAT(*full, HasSubstr("one too many"));
  for (int64_t i = 0; i < 100'000; ++i) {
    EXPECT_FALSE(w.Apply(0, Acquire(10, absl::StrCat("more", i), 5 * kS), 0).has_value());
  }
  // Renewing a kept timer still works, and the refused ones are not watched.
  EXPECT_FALSE(w.Apply(0, Acquire(10, "t0", 50 * kS), 0).has_value());
  EXPECT_FALSE(w.Check(20 * kS).has_value());
  std::optional<WorkerHang> hang = w.Check(50 * kS + 1);
  ASSERT_TRUE(hang.has_value());
  EXPECT_THAT(hang->detail, HasSubstr("timer \"t0\""));
  // Another worker has its own bound.
  EXPECT_FALSE(w.Apply(1, Acquire(11, "own", 100 * kS), 0).has_value());
  // Released room is taken again.
  w.Apply(0, Release(10, "t1"), 0);
  EXPECT_FALSE(w.Apply(0, Acquire(10, "new", 100 * kS), 0).has_value());
}

TEST(HangWatchdogTest, EarliestDeadlineWins) {
  HangWatchdog w({});
  w.Start(3, 0, 0);
  w.Apply(0, Acquire(10, "late", 8 * kS), 0);
  w.Apply(2, Acquire(12, "early", 6 * kS), 0);
  std::optional<WorkerHang> hang = w.Check(9 * kS);
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->worker, 2);
  EXPECT_EQ(w.Check(9 * kS)->worker, 0);
}

TEST(HangWatchdogTest, FixedHeartbeatTimeout) {
  HangWatchdog w({.heartbeat_timeout = absl::Seconds(10)});
  w.Start(2, 0, 0);
  EXPECT_FALSE(w.Check(100 * kS).has_value());  // no heartbeat yet: not watched
  w.Apply(0, Beat(10), 100 * kS);
  w.Apply(0, Beat(10), 105 * kS);
  EXPECT_FALSE(w.Check(115 * kS).has_value());
  std::optional<WorkerHang> hang = w.Check(115 * kS + 1);
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->worker, 0);
  EXPECT_EQ(hang->since_us, 115 * kS);
  EXPECT_THAT(hang->detail, HasSubstr("no heartbeat for 10.0s (timeout 10s)"));
  EXPECT_EQ(w.longest_interval(), 5 * kS);
}

TEST(HangWatchdogTest, AutoTimeoutAfterWarmUp) {
  HangWatchdog w(
      {.auto_timeout = true, .auto_factor = 3, .auto_warmup = 3, .auto_floor = absl::Seconds(1)});
  w.Start(1, 0, 0);
  w.Apply(0, Beat(10), 0);
  w.Apply(0, Beat(10), 2 * kS);
  w.Apply(0, Beat(10), 3 * kS);
  EXPECT_EQ(w.heartbeat_timeout(), absl::ZeroDuration());  // two intervals: warming up
  EXPECT_FALSE(w.Check(100 * kS).has_value());
  w.Apply(0, Beat(10), 100 * kS);  // the third interval, 97 s, is now the longest
  EXPECT_EQ(w.heartbeat_timeout(), absl::Seconds(291));
  w.Apply(0, Beat(10), 101 * kS);
  EXPECT_FALSE(w.Check(101 * kS + 291 * kS).has_value());
  const std::optional<WorkerHang> hang = w.Check(101 * kS + 291 * kS + 1);
  ASSERT_TRUE(hang.has_value());
  EXPECT_THAT(hang->detail, HasSubstr("(timeout 4m51s, learned)"));
}

TEST(HangWatchdogTest, AutoTimeoutFromTheJobNeedsNoWarmUp) {
  HangWatchdog w({.auto_timeout = true, .auto_factor = 2, .auto_floor = absl::Seconds(1)});
  w.Start(1, 0, 4 * kS);
  EXPECT_EQ(w.heartbeat_timeout(), absl::Seconds(8));
  w.Apply(0, Beat(10), 0);
  EXPECT_TRUE(w.Check(8 * kS + 1).has_value());
}

TEST(OwningWorkerTest, Table) {
  // 100 -> 200 -> 300 (worker 1's guard) ; 400 -> 1 ; 500 -> 500 (a loop).
  const auto parent = [](int64_t pid) -> int64_t {
    switch (pid) {
      case 100:
        return 200;
      case 200:
        return 300;
      case 400:
        return 1;
      case 500:
        return 500;
      default:
        return 0;
    }
  };
  const std::vector<pid_t> workers = {900, 300};
  EXPECT_EQ(OwningWorker(300, workers, parent), 1);
  EXPECT_EQ(OwningWorker(100, workers, parent), 1);
  EXPECT_EQ(OwningWorker(900, workers, parent), 0);
  EXPECT_EQ(OwningWorker(400, workers, parent), std::nullopt);
  EXPECT_EQ(OwningWorker(500, workers, parent), std::nullopt);
  EXPECT_EQ(OwningWorker(12345, workers, parent), std::nullopt);
  EXPECT_EQ(OwningWorker(1, {1}, parent), std::nullopt);  // init is nobody's worker
}

FailureInfo Hang(int32_t rank, Micros since, std::string tail = "") {
  FailureInfo f;
  f.cause = AbortCause::kWorkerHung;
  f.host = absl::StrCat("n", rank / 2);
  f.group_rank = rank / 2;
  f.rank = rank;
  f.local_rank = rank % 2;
  f.exit_code = 134;
  f.signal = SIGABRT;
  f.time_us = since;
  f.hang_detail = "timer \"step\" expired 0.1s ago (pid 7)";
  f.stderr_tail = std::move(tail);
  return f;
}

FailureInfo Crash(int32_t rank, Micros at) {
  FailureInfo f;
  f.host = "n9";
  f.rank = rank;
  f.exit_code = 1;
  f.time_us = at;
  return f;
}

TEST(RefineAbortWithHangTest, Table) {
  struct Case {
    std::string name;
    AbortEvent current;
    Micros since_end;
    FailureInfo report;
    std::optional<int32_t> named_rank;  // nullopt: keep current
  };
  const std::vector<Case> cases = {
      {"earlier hang takes over", AbortFor(Hang(2, 20 * kS)), kS, Hang(1, 10 * kS), 1},
      {"later hang does not", AbortFor(Hang(1, 10 * kS)), kS, Hang(2, 20 * kS), std::nullopt},
      {"hang before a crash takes over", AbortFor(Crash(3, 12 * kS)), kS, Hang(1, 10 * kS), 1},
      {"hang after a crash does not", AbortFor(Crash(3, 9 * kS)), kS, Hang(1, 10 * kS),
       std::nullopt},
      {"too late to take over", AbortFor(Hang(2, 20 * kS)), kHangVerdictWindow + 1,
       Hang(1, 10 * kS), std::nullopt},
      {"a crash never takes over", AbortFor(Hang(2, 20 * kS)), kS, Crash(1, 1), std::nullopt},
      {"the same hang's stack completes it", AbortFor(Hang(1, 10 * kS)), 60 * kS,
       Hang(1, 10 * kS, "File \"x.py\", line 3"), 1},
      {"the same hang again without stack", AbortFor(Hang(1, 10 * kS)), kS, Hang(1, 10 * kS),
       std::nullopt},
      {"a lost agent stays", AbortForLostAgent("n1", 1, 2, 3), kS, Hang(1, 10 * kS), std::nullopt},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::optional<AbortEvent> r = RefineAbortWithHang(c.current, c.since_end, c.report);
    ASSERT_EQ(r.has_value(), c.named_rank.has_value());
    if (!r) continue;
    EXPECT_EQ(r->cause, AbortCause::kWorkerHung);
    EXPECT_EQ(r->first_failure->rank, *c.named_rank);
    EXPECT_EQ(r->exit_code, 134);
    EXPECT_THAT(r->reason, HasSubstr(absl::StrCat("rank ", *c.named_rank, " hung: timer")));
    EXPECT_EQ(r->first_failure->stderr_tail, c.report.stderr_tail);
  }
}

// The rendezvous keeps the job's longest heartbeat interval across rounds, and tells the hang
// reports of one job apart: the earliest hang names the abort, whoever reported first.
JoinSpec StateSpec(const std::string& host, int64_t node, Micros longest) {
  JoinSpec s;
  s.job_id = "j";
  s.agent.agent_id = host + "/agent";
  s.agent.host = host;
  s.agent.node_index = node;
  s.agent.nproc = 2;
  s.min_agents = 2;
  s.max_agents = 2;
  s.addresses = {"10.0.0.1"};
  s.master_port = 30000;
  s.longest_heartbeat_interval = longest;
  return s;
}

std::vector<Micros> AssignedIntervals(const Decisions& d) {
  std::vector<Micros> out;
  for (const Decisions::Send& s : d.sends) {
    const Event event = d.EventOf(s);
    if (const auto* a = std::get_if<AssignmentEvent>(&event)) {
      out.push_back(a->longest_heartbeat_interval);
    }
  }
  return out;
}

TEST(RendezvousStateHangTest, LongestHeartbeatIntervalOutlivesRounds) {
  RendezvousState state;
  Decisions d;
  state.Join(0, 1, StateSpec("n0", 0, 2 * kS), d);
  state.Join(0, 2, StateSpec("n1", 1, 5 * kS), d);
  EXPECT_EQ(AssignedIntervals(d), std::vector<Micros>({5 * kS, 5 * kS}));

  ASSERT_TRUE(state.ReportFailure(kS, "j", "n0/agent", Hang(0, kS), d).ok());
  // The restart: the agent that saw 5 s comes back with nothing (a new process).
  Decisions next;
  JoinSpec a = StateSpec("n0", 0, 3 * kS), b = StateSpec("n1", 1, 0);
  a.restart_count = b.restart_count = 1;
  state.Join(2 * kS, 3, a, next);
  state.Join(2 * kS, 4, b, next);
  EXPECT_EQ(AssignedIntervals(next), std::vector<Micros>({5 * kS, 5 * kS}));
}

TEST(RendezvousStateHangTest, EarliestHangNamesTheAbortAndItsStackFollows) {
  RendezvousState state;
  Decisions d;
  state.Join(0, 1, StateSpec("n0", 0, 0), d);
  state.Join(0, 2, StateSpec("n1", 1, 0), d);
  // A victim on n0 reports first; the culprit on n1, whose deadline passed earlier, second.
  Decisions first, second, stack;
  absl::StatusOr<AbortEvent> a =
      state.ReportFailure(10 * kS, "j", "n0/agent", Hang(0, 9 * kS), first);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->first_failure->rank, 0);
  absl::StatusOr<AbortEvent> b =
      state.ReportFailure(10 * kS + 1, "j", "n1/agent", Hang(2, 8 * kS), second);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->first_failure->rank, 2);
  EXPECT_EQ(second.sends.size(), 2u) << "every agent hears the culprit";
  absl::StatusOr<AbortEvent> c =
      state.ReportFailure(12 * kS, "j", "n1/agent", Hang(2, 8 * kS, "line 7 in stuck"), stack);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->first_failure->stderr_tail, "line 7 in stuck");
  EXPECT_EQ(stack.sends.size(), 2u);
  // The victim's own stack does not take the abort back.
  Decisions late;
  absl::StatusOr<AbortEvent> v =
      state.ReportFailure(12 * kS, "j", "n0/agent", Hang(0, 9 * kS, "line 40 in all_reduce"), late);
  EXPECT_EQ(v->first_failure->rank, 2);
  EXPECT_TRUE(late.sends.empty());
}

// The lifecycle, from a running round.
class LifecycleHangTest : public ::testing::Test {
 protected:
  LifecycleHangTest() : lc_(Options()) {
    lc_.Start();
    AssignmentEvent a;
    a.round = 1;
    a.slot.rank_offset = 2;
    a.slot.local_rank_offset = 0;
    a.slot.group_rank = 1;
    a.world_size = 4;
    lc_.Joined(1, a);
  }
  static LifecycleOptions Options() {
    LifecycleOptions o;
    o.job_id = "j";
    o.host = "n1";
    o.nproc = 2;
    o.term_timeout = absl::Seconds(3);
    return o;
  }
  template <typename T>
  static int Count(const AgentActions& actions) {
    int n = 0;
    for (const AgentAction& a : actions) n += std::holds_alternative<T>(a) ? 1 : 0;
    return n;
  }
  template <typename T>
  static const T* Find(const AgentActions& actions) {
    for (const AgentAction& a : actions) {
      if (const T* t = std::get_if<T>(&a)) return t;
    }
    return nullptr;
  }
  static std::string Errors(const AgentActions& actions) {
    std::string out;
    for (const AgentAction& a : actions) {
      if (const auto* log = std::get_if<agent_action::Log>(&a);
          log && log->level == agent_action::Log::kError) {
        out += log->text;
      }
    }
    return out;
  }
  WorkerEnd End(int32_t rank, int code, std::string tail = "") {
    WorkerEnd e;
    e.rank = rank;
    e.local_rank = rank - 2;
    e.exit.exit_status = code;
    e.stderr_tail = std::move(tail);
    return e;
  }
  AgentLifecycle lc_;
};

TEST_F(LifecycleHangTest, OwnHangAbortsReportsAndReportsAgainWithTheStack) {
  WorkerHang hang{1, 3, 1, 50 * kS, "timer \"step\" expired 0.1s ago (pid 7)"};
  AgentActions a = lc_.WorkerHung(hang);
  const auto* abort = Find<agent_action::AbortWorker>(a);
  ASSERT_NE(abort, nullptr);
  EXPECT_EQ(abort->rank, 3);
  const auto* report = Find<agent_action::ReportFailure>(a);
  ASSERT_NE(report, nullptr);
  EXPECT_EQ(report->failure.cause, AbortCause::kWorkerHung);
  EXPECT_EQ(report->failure.rank, 3);
  EXPECT_EQ(report->failure.time_us, 50 * kS);
  EXPECT_EQ(Count<agent_action::StopWorkers>(a), 1);
  const auto* wait = Find<agent_action::AwaitEarlierHang>(a);
  ASSERT_NE(wait, nullptr);
  EXPECT_EQ(wait->limit, absl::Seconds(1));
  // A second hang of the same round changes nothing.
  EXPECT_TRUE(lc_.WorkerHung(hang).empty());

  const AbortEvent first = AbortFor(report->failure);
  EXPECT_TRUE(lc_.FailureAnswered(1, first).empty());
  // The other worker stops on SIGTERM; the hung one ends after printing its stack.
  EXPECT_TRUE(lc_.WorkerEnded(End(2, 128 + SIGTERM), 0).empty());
  AgentActions again = lc_.WorkerEnded(End(3, 128 + SIGABRT, "File \"t.py\", line 9"), 0);
  const auto* second = Find<agent_action::ReportFailure>(again);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->failure.stderr_tail, "File \"t.py\", line 9");
  EXPECT_EQ(second->failure.time_us, 50 * kS);
  EXPECT_TRUE(lc_.AllWorkersDone().empty());  // the second report is not answered yet
  // Nor is the moment over in which another node's earlier hang could still come.
  EXPECT_TRUE(lc_.FailureAnswered(1, AbortFor(second->failure)).empty());
  AgentActions done = lc_.EarlierHangWaitOver();
  EXPECT_THAT(Errors(done), HasSubstr("rank 3 hung: timer \"step\""));
  EXPECT_THAT(Errors(done), HasSubstr("File \"t.py\", line 9"));
  EXPECT_EQ(Count<agent_action::Leave>(done), 1);
  EXPECT_EQ(lc_.outcome()->exit_code, 134);
}

TEST_F(LifecycleHangTest, AnotherNodesHangWaitsForItsStack) {
  const FailureInfo culprit = Hang(0, 40 * kS);
  AgentActions a = lc_.Aborted(1, AbortFor(culprit));
  EXPECT_EQ(Count<agent_action::StopWorkers>(a), 1);
  const auto* wait = Find<agent_action::AwaitStack>(a);
  ASSERT_NE(wait, nullptr);
  EXPECT_EQ(wait->limit, absl::Seconds(5));
  EXPECT_TRUE(lc_.AllWorkersDone().empty());  // waiting for the stack
  AgentActions done = lc_.Aborted(1, AbortFor(Hang(0, 40 * kS, "File \"t.py\", line 4")));
  EXPECT_THAT(Errors(done), HasSubstr("rank 0 hung:"));
  EXPECT_THAT(Errors(done), HasSubstr("line 4"));
  EXPECT_EQ(Count<agent_action::Leave>(done), 1);
}

TEST_F(LifecycleHangTest, StackThatNeverComesIsWaitedForOnlyUntilTheLimit) {
  lc_.Aborted(1, AbortFor(Hang(0, 40 * kS)));
  EXPECT_TRUE(lc_.AllWorkersDone().empty());
  AgentActions done = lc_.StackWaitOver();
  EXPECT_THAT(Errors(done), HasSubstr("rank 0's stack did not arrive"));
  EXPECT_EQ(Count<agent_action::Leave>(done), 1);
  EXPECT_TRUE(lc_.StackWaitOver().empty());
}

TEST_F(LifecycleHangTest, HangIsRestartedUnderMaxRestarts) {
  LifecycleOptions o = Options();
  o.max_restarts = 1;
  AgentLifecycle lc(o);
  lc.Start();
  AssignmentEvent asg;
  asg.slot.rank_offset = 0;
  lc.Joined(1, asg);
  AgentActions a = lc.WorkerHung({0, 0, 0, 5 * kS, "no heartbeat for 10.0s (timeout 10s)"});
  const auto* report = Find<agent_action::ReportFailure>(a);
  ASSERT_NE(report, nullptr);
  lc.FailureAnswered(1, AbortFor(report->failure));
  AgentActions again = lc.WorkerEnded(End(0, 128 + SIGABRT, "stack"), 0);
  const auto* second = Find<agent_action::ReportFailure>(again);
  ASSERT_NE(second, nullptr);
  lc.FailureAnswered(1, AbortFor(second->failure));
  EXPECT_TRUE(lc.AllWorkersDone().empty());
  AgentActions next = lc.EarlierHangWaitOver();
  const auto* join = Find<agent_action::Join>(next);
  ASSERT_NE(join, nullptr);
  EXPECT_EQ(join->restart_count, 1);
}

TEST_F(LifecycleHangTest, HungWorkerThatWroteNothingStillCompletesTheReport) {
  AgentActions a = lc_.WorkerHung({1, 3, 1, 50 * kS, "x"});
  AgentActions again = lc_.WorkerEnded(End(3, 0, ""), 0);
  const auto* second = Find<agent_action::ReportFailure>(again);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->failure.stderr_tail, "(nothing on stderr)");
}

// Agents check their workers every 100 ms, each at its own moment. Here the victim on n0 (rank 0,
// blocked in a collective behind the culprit) is found and reported first; the job's abort
// reaches this agent before its own check would have found the culprit, its rank 3, whose
// deadline had passed a second earlier. The last look the agent takes as the abort arrives
// finds rank 3 overdue: it is stopped with SIGABRT for its stack and reported, the server's
// comparison of hangs names it, and the root cause shows its stack.
TEST_F(LifecycleHangTest, CulpritFoundAtAbortIsStoppedAsHungAndNamed) {
  const AbortEvent victim_first = AbortFor(Hang(0, 41 * kS));
  const WorkerHang overdue{1, 3, 1, 40 * kS, "timer \"step\" expired 1.0s ago (pid 7)"};
  AgentActions a = lc_.Aborted(1, victim_first, overdue);
  const auto* abort = Find<agent_action::AbortWorker>(a);
  ASSERT_NE(abort, nullptr) << "the culprit gets SIGABRT, not SIGTERM";
  EXPECT_EQ(abort->rank, 3);
  const auto* report = Find<agent_action::ReportFailure>(a);
  ASSERT_NE(report, nullptr);
  EXPECT_EQ(report->failure.cause, AbortCause::kWorkerHung);
  EXPECT_EQ(report->failure.rank, 3);
  EXPECT_EQ(report->failure.time_us, 40 * kS);
  EXPECT_EQ(Count<agent_action::StopWorkers>(a), 1);
  EXPECT_EQ(Count<agent_action::AwaitStack>(a), 0)
      << "the victim's stack is not the one to wait for";

  // The server compares the two hangs as it would (common/core/hang_verdict.h) and answers, and
  // tells every agent, that the culprit's began first.
  const std::optional<AbortEvent> named = RefineAbortWithHang(victim_first, kS, report->failure);
  ASSERT_TRUE(named.has_value());
  EXPECT_TRUE(lc_.FailureAnswered(1, *named).empty());
  EXPECT_EQ(Count<agent_action::AwaitStack>(lc_.Aborted(1, *named)), 0);

  EXPECT_TRUE(lc_.WorkerEnded(End(2, 128 + SIGTERM), 0).empty());
  AgentActions again = lc_.WorkerEnded(End(3, 128 + SIGABRT, "File \"t.py\", line 9 in stuck"), 0);
  const auto* second = Find<agent_action::ReportFailure>(again);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->failure.stderr_tail, "File \"t.py\", line 9 in stuck");
  EXPECT_TRUE(lc_.AllWorkersDone().empty());
  EXPECT_TRUE(lc_.FailureAnswered(1, AbortFor(second->failure)).empty());
  AgentActions done = lc_.EarlierHangWaitOver();
  EXPECT_THAT(Errors(done), HasSubstr("failed: rank 3 hung: timer \"step\""));
  EXPECT_THAT(Errors(done), HasSubstr("line 9 in stuck"));
  EXPECT_EQ(lc_.outcome()->exit_code, 134);
}

// The other side of the same race: this agent's rank 3 is found first and prints its stack at
// once, but rank 0 on n0 hung a second earlier and its agent finds it a moment later. This agent
// does not end the job naming its own rank before that moment is over.
TEST_F(LifecycleHangTest, OwnHangWaitsAMomentForAnEarlierHangElsewhere) {
  AgentActions a = lc_.WorkerHung({1, 3, 1, 41 * kS, "timer \"step\" expired 0.1s ago (pid 7)"});
  const auto* report = Find<agent_action::ReportFailure>(a);
  ASSERT_NE(report, nullptr);
  EXPECT_EQ(Count<agent_action::AwaitEarlierHang>(a), 1);
  EXPECT_TRUE(lc_.FailureAnswered(1, AbortFor(report->failure)).empty());
  EXPECT_TRUE(lc_.WorkerEnded(End(2, 128 + SIGTERM), 0).empty());
  AgentActions again = lc_.WorkerEnded(End(3, 128 + SIGABRT, "line 40 in all_reduce"), 0);
  const auto* second = Find<agent_action::ReportFailure>(again);
  ASSERT_NE(second, nullptr);
  EXPECT_TRUE(lc_.FailureAnswered(1, AbortFor(second->failure)).empty());
  EXPECT_TRUE(lc_.AllWorkersDone().empty()) << "the moment for an earlier hang is not over";

  // The culprit's report reaches the server, which tells every agent; its stack follows.
  const AbortEvent culprit = AbortFor(Hang(0, 40 * kS));
  AgentActions named = lc_.Aborted(1, culprit);
  EXPECT_EQ(Count<agent_action::AwaitStack>(named), 1);
  EXPECT_TRUE(lc_.Aborted(1, AbortFor(Hang(0, 40 * kS, "line 4 in stuck"))).empty());
  AgentActions done = lc_.EarlierHangWaitOver();
  EXPECT_THAT(Errors(done), HasSubstr("failed: rank 0 hung:"));
  EXPECT_THAT(Errors(done), HasSubstr("line 4 in stuck"));
  EXPECT_EQ(Count<agent_action::Leave>(done), 1);
  EXPECT_TRUE(lc_.EarlierHangWaitOver().empty());
}

// Which overdue worker of this agent's the abort gives way to: only one that hung before the
// job's first failure, and only a worker's failure or hang gives way, as on the server.
TEST_F(LifecycleHangTest, AbortGivesWayOnlyToAHangThatBeganBeforeItsFailure) {
  FailureInfo signalled = Crash(0, 50 * kS);
  signalled.cause = AbortCause::kAgentSignalled;
  struct Case {
    std::string name;
    AbortEvent abort;
    std::optional<WorkerHang> overdue;
    bool hung;  // the overdue worker is stopped as hung
  };
  const WorkerHang at40{1, 3, 1, 40 * kS, "no heartbeat for 6.0s (timeout 5s)"};
  const std::vector<Case> cases = {
      {"a later hang elsewhere", AbortFor(Hang(0, 41 * kS)), at40, true},
      {"a later crash elsewhere", AbortFor(Crash(0, 41 * kS)), at40, true},
      {"an earlier hang elsewhere", AbortFor(Hang(0, 39 * kS)), at40, false},
      {"an earlier crash elsewhere", AbortFor(Crash(0, 39 * kS)), at40, false},
      {"a hang at the same moment", AbortFor(Hang(0, 40 * kS)), at40, false},
      {"an agent told to stop", AbortFor(signalled), at40, false},
      {"a lost agent", AbortForLostAgent("n0", 0, 0, 1), at40, false},
      {"nothing overdue here", AbortFor(Hang(0, 41 * kS)), std::nullopt, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    AgentLifecycle lc(Options());
    lc.Start();
    AssignmentEvent asg;
    asg.slot.rank_offset = 2;
    asg.slot.group_rank = 1;
    lc.Joined(1, asg);
    AgentActions a = lc.Aborted(1, c.abort, c.overdue);
    EXPECT_EQ(Count<agent_action::AbortWorker>(a), c.hung ? 1 : 0);
    EXPECT_EQ(Count<agent_action::ReportFailure>(a), c.hung ? 1 : 0);
    EXPECT_EQ(Count<agent_action::StopWorkers>(a), 1);
    EXPECT_EQ(lc.phase(), AgentLifecycle::Phase::kStopping);
  }
}

TEST_F(LifecycleHangTest, HangWhileStoppingIsIgnored) {
  lc_.WorkerEnded(End(2, 1), 0);
  EXPECT_TRUE(lc_.WorkerHung({1, 3, 1, 1, "x"}).empty());
}

}  // namespace
}  // namespace rdzv
