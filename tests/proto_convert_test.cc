// The conversions between the core's types and rdzv.v1 (common/proto_convert.h), through the
// bytes that travel: why a job ended arrives as it was decided, for every cause, and numbers
// from the wire too large for the core's units arrive saturated rather than overflowed.
#include "common/proto_convert.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <variant>

#include "common/core/rendezvous_state.h"

namespace rdzv {
namespace {

constexpr Micros kSecond = 1'000'000;

// `message` as a peer receives it: serialized, and parsed back.
template <typename Message>
Message OverTheWire(const Message& message) {
  std::string bytes;
  EXPECT_TRUE(message.SerializeToString(&bytes));
  Message received;
  EXPECT_TRUE(received.ParseFromString(bytes));
  return received;
}

TEST(ProtoConvertTest, EveryAbortCauseSurvivesTheRoundTrip) {
  for (int32_t value = 0; value <= kMaxAbortCause; ++value) {
    const auto cause = static_cast<AbortCause>(value);
    AbortEvent abort;
    abort.cause = cause;
    abort.reason = AbortCauseName(cause);
    abort.exit_code = 3;
    // Both ways an abort travels: alone (ReportExit's answer) and as a Join stream's event.
    const AbortEvent direct = FromProto(OverTheWire(ToProto(abort)));
    EXPECT_EQ(direct, abort) << AbortCauseName(cause);
    const v1::JoinEvent event = OverTheWire(ToProto(Event(abort)));
    ASSERT_TRUE(event.has_abort()) << AbortCauseName(cause);
    EXPECT_EQ(FromProto(event.abort()).cause, cause) << AbortCauseName(cause);
  }
}

TEST(ProtoConvertTest, EveryCauseOfAFailureReportSurvivesTheRoundTrip) {
  for (const AbortCause cause :
       {AbortCause::kWorkerFailed, AbortCause::kWorkerHung, AbortCause::kAgentSignalled}) {
    FailureInfo failure;
    failure.cause = cause;
    failure.host = "n1";
    failure.rank = 3;
    failure.exit_code = 134;
    failure.hang_detail = "timer expired";
    EXPECT_EQ(FromProto(OverTheWire(ToProto(failure))), failure) << AbortCauseName(cause);
    // Inside the abort it causes, too.
    const AbortEvent abort = AbortFor(failure);
    const AbortEvent received = FromProto(OverTheWire(ToProto(abort)));
    EXPECT_EQ(received, abort) << AbortCauseName(cause);
  }
}

// A newer peer's cause this build does not know is no cause at all, not a wrong one.
TEST(ProtoConvertTest, UnknownCausesFromTheWireAreUnspecified) {
  for (const int value : {kMaxAbortCause + 1, 1000, -1, std::numeric_limits<int32_t>::min()}) {
    v1::Abort abort;
    abort.set_cause(static_cast<v1::AbortCause>(value));
    EXPECT_EQ(FromProto(OverTheWire(abort)).cause, AbortCause::kUnspecified) << value;
  }
}

TEST(ProtoConvertTest, MillisecondsBeyondMicrosecondsSaturate) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  v1::JoinRequest join;
  join.set_last_call_ms(kMax);
  join.set_longest_heartbeat_interval_ms(kMin);
  JoinSpec spec = FromProto(OverTheWire(join));
  EXPECT_EQ(spec.last_call, kMax);
  EXPECT_EQ(spec.longest_heartbeat_interval, kMin);
  join.set_last_call_ms(kMax / 1000);
  join.set_longest_heartbeat_interval_ms(-1500);
  spec = FromProto(OverTheWire(join));
  EXPECT_EQ(spec.last_call, kMax / 1000 * 1000);
  EXPECT_EQ(spec.longest_heartbeat_interval, -1'500'000);

  v1::Assignment assignment;
  assignment.set_longest_heartbeat_interval_ms(kMax);
  EXPECT_EQ(FromProto(OverTheWire(assignment)).longest_heartbeat_interval, kMax);
}

TEST(ProtoConvertTest, AssignmentCarriesTheWorkersOfEveryNode) {
  AssignmentEvent a;
  a.world_size = 6;
  a.group_world_size = 3;
  a.workers_per_node = "2,1,3";
  EXPECT_EQ(FromProto(OverTheWire(ToProto(a))).workers_per_node, "2,1,3");
  // From a server that does not say.
  EXPECT_EQ(FromProto(OverTheWire(v1::Assignment())).workers_per_node, "");
}

// A restarted rdzvd rebuilds a running job from the agents that come back; when one does not
// come back within the resume window, the others are aborted with kResumeTimedOut, and that is
// the cause they read off the wire.
TEST(ProtoConvertTest, ResumeTimedOutWhenRestartedServerStopsWaiting) {
  JoinSpec specs[2];
  for (int i = 0; i < 2; ++i) {
    specs[i].job_id = "j";
    specs[i].agent.agent_id = i == 0 ? "a0" : "a1";
    specs[i].agent.host = specs[i].agent.agent_id;
    specs[i].agent.node_index = i;
    specs[i].min_agents = specs[i].max_agents = 2;
    specs[i].addresses = {"10.0.0.1"};
    specs[i].master_port = 29500;
  }
  RendezvousState before;
  Decisions assigned;
  before.Join(0, 1, specs[0], assigned);
  before.Join(0, 2, specs[1], assigned);
  ASSERT_EQ(assigned.sends.size(), 2u);

  StateOptions options;
  options.resume_window = 10 * kSecond;
  RendezvousState restarted(options);
  JoinSpec back = specs[0];
  back.resume = std::get<AssignmentEvent>(assigned.EventOf(assigned.sends.at(0)));
  Decisions resumed;
  restarted.Join(kSecond, 7, back, resumed);
  ASSERT_EQ(resumed.sends.size(), 1u);
  ASSERT_TRUE(std::holds_alternative<AssignmentEvent>(resumed.EventOf(resumed.sends[0])));

  Decisions ended;
  restarted.Tick(11 * kSecond, ended);
  ASSERT_EQ(ended.sends.size(), 1u);
  EXPECT_EQ(ended.sends[0].stream, 7u);
  const v1::JoinEvent seen = OverTheWire(ToProto(ended.EventOf(ended.sends[0])));
  ASSERT_TRUE(seen.has_abort());
  EXPECT_EQ(seen.abort().cause(), v1::ABORT_CAUSE_RESUME_TIMED_OUT);
  const AbortEvent abort = FromProto(seen.abort());
  EXPECT_EQ(abort.cause, AbortCause::kResumeTimedOut);
  EXPECT_NE(abort.exit_code, 0);
  EXPECT_EQ(abort.reason,
            "1 of 2 agents did not come back within 10s after the rendezvous server restarted "
            "or the job moved to this one");
}

}  // namespace
}  // namespace rdzv
