// rdzvd's service in this process over loopback, against what a careless or hostile client can
// put on the wire with raw rdzv.v1 calls (not what librdzv sends): numbers at the ends of their
// types, control characters in names, a departure from a job of another owner, more calls on one
// connection than rdzvd serves at once, and more bytes than its memory quota. Asserts what the
// client sees (one status naming the field, or an end within its deadline) and that rdzvd goes
// on serving everyone else. The ASan+UBSan build runs these too: no overflow on the way in.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "gtest/gtest.h"
#include "guard/request_limits.h"
#include "rdzv/v1/rdzv.grpc.pb.h"
#include "server/server.h"
#include "tests/testing/wire.h"

namespace rdzv {
namespace {

using testing::End;
using testing::Joined;
using testing::JoinOf;
using testing::ReadUntil;

constexpr auto kWait = testing::kWireDeadline;
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int32_t kInt32Min = std::numeric_limits<int32_t>::min();

// A stream reading its events on a thread of its own until it ends, as an agent does.
class Reading {
 public:
  explicit Reading(Joined joined)
      : joined_(std::move(joined)), thread_([this] {
          v1::JoinEvent event;
          while (joined_.reader->Read(&event)) {
          }
          status_ = joined_.reader->Finish();
        }) {}
  ~Reading() { (void)Cancel(); }

  // Cancels the stream (unless it ended already) and returns how it ended.
  grpc::Status Cancel() {
    if (thread_.joinable()) {
      joined_.context->TryCancel();
      thread_.join();
    }
    return status_;
  }

 private:
  Joined joined_;
  grpc::Status status_;
  std::thread thread_;
};

class ServerWireTest : public ::testing::Test {
 protected:
  void Start(AuthMode auth = AuthMode::kNone, size_t memory_limit = size_t{4} << 30) {
    ServerOptions options = testing::LoopbackServerOptions();
    options.service.auth.mode = auth;
    options.memory_limit_bytes = memory_limit;
    server_ = testing::StartLoopbackServer(options);
    ASSERT_NE(server_, nullptr);
    wire_.emplace(server_->port());
  }

  std::shared_ptr<grpc::Channel> Channel() { return wire_->Channel(); }
  std::unique_ptr<v1::Rendezvous::Stub> Stub() { return wire_->Stub(); }
  Joined Join(const v1::JoinRequest& request, const std::string& token = "",
              v1::Rendezvous::Stub* on = nullptr) {
    return wire_->Join(request, token, on);
  }

  // The jobs the server shows to the holder of `token`.
  v1::StatusResponse Status(const std::string& token = "") {
    v1::StatusRequest request;
    v1::StatusResponse response;
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata(kTokenMetadata, token);
    const grpc::Status s = Stub()->GetStatus(&ctx, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response;
  }

  grpc::Status Leave(const std::string& job, const std::string& agent,
                     const std::string& token = "") {
    v1::LeaveRequest request;
    request.set_job_id(job);
    request.set_agent_id(agent);
    v1::LeaveResponse response;
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata(kTokenMetadata, token);
    return Stub()->Leave(&ctx, request, &response);
  }

  // A job of two agents whose round completes, for the checks of what a running job hears.
  void ServeOneRound(const std::string& job) {
    Joined a = Join(JoinOf(job, "ok-a", 2));
    Joined b = Join(JoinOf(job, "ok-b", 2));
    for (Joined* j : {&a, &b}) {
      v1::JoinEvent event;
      ASSERT_TRUE(ReadUntil(*j, v1::JoinEvent::kAssignment, &event));
      EXPECT_EQ(event.assignment().world_size(), 2);
      j->context->TryCancel();
      End(*j);
    }
  }

  // Whether a new job of two agents completes its round; both streams are ended either way.
  bool RoundCompletes(const std::string& job) {
    Joined a = Join(JoinOf(job, "ok-a", 2));
    Joined b = Join(JoinOf(job, "ok-b", 2));
    v1::JoinEvent event;
    const bool a_assigned = ReadUntil(a, v1::JoinEvent::kAssignment, &event);
    if (!a_assigned) b.context->TryCancel();  // b alone would wait for a
    const bool b_assigned = a_assigned && ReadUntil(b, v1::JoinEvent::kAssignment, &event);
    for (Joined* j : {&a, &b}) {
      j->context->TryCancel();
      End(*j);
    }
    return a_assigned && b_assigned;
  }

  std::unique_ptr<Server> server_;
  std::optional<testing::WireClient> wire_;
};

struct WireCase {
  std::string name;
  std::function<void(v1::JoinRequest&)> change;
  std::string message_has;
};

TEST_F(ServerWireTest, JoinNumbersAtTypeLimitsRefusedNamingField) {
  Start();
  const WireCase cases[] = {
      {"last_call_ms max", [](v1::JoinRequest& r) { r.set_last_call_ms(kInt64Max); },
       "--last-call (last_call_ms) is"},
      {"last_call_ms min", [](v1::JoinRequest& r) { r.set_last_call_ms(kInt64Min); },
       "--last-call (last_call_ms) is -"},
      {"last_call_ms -1", [](v1::JoinRequest& r) { r.set_last_call_ms(-1); },
       "--last-call (last_call_ms) is -1ms; expected 0 to 365 days"},
      {"last_call_ms a year and 1 ms",
       [](v1::JoinRequest& r) { r.set_last_call_ms(int64_t{365} * 24 * 3600 * 1000 + 1); },
       "--last-call (last_call_ms) is 8760h0.001s; expected 0 to 365 days"},
      {"nproc 0", [](v1::JoinRequest& r) { r.set_nproc(0); },
       "--nproc-per-node is 0; expected 1 to 4096"},
      {"nproc 4097", [](v1::JoinRequest& r) { r.set_nproc(4097); },
       "--nproc-per-node is 4097; expected 1 to 4096"},
      {"nproc max", [](v1::JoinRequest& r) { r.set_nproc(kInt32Max); },
       "--nproc-per-node is 2147483647"},
      {"nproc min", [](v1::JoinRequest& r) { r.set_nproc(kInt32Min); },
       "--nproc-per-node is -2147483648"},
      {"world past 32 bits",
       [](v1::JoinRequest& r) {
         r.set_nproc(4096);
         r.set_max_agents(kInt32Max);
       },
       "2147483647 agents of 4096 workers each make 8796093018112 ranks"},
      {"node_index max", [](v1::JoinRequest& r) { r.set_node_index(kInt64Max); },
       "--node-rank 9223372036854775807 is out of range for 2 nodes; expected 0..1"},
      {"node_index min", [](v1::JoinRequest& r) { r.set_node_index(kInt64Min); },
       "--node-rank -9223372036854775808 is out of range"},
      {"order max", [](v1::JoinRequest& r) { r.set_order(kInt64Max); },
       "global position 9223372036854775807 is out of range for 2 agents"},
      {"master_port min", [](v1::JoinRequest& r) { r.set_master_port(kInt32Min); },
       "the master port is -2147483648; expected 0 to 65535"},
      {"master_port_override max",
       [](v1::JoinRequest& r) { r.set_master_port_override(kInt32Max); },
       "--master-port is 2147483647"},
      {"restart_count min", [](v1::JoinRequest& r) { r.set_restart_count(kInt32Min); },
       "the restart count is -2147483648; expected >= 0"},
      {"max_restarts -1", [](v1::JoinRequest& r) { r.set_max_restarts(-1); },
       "--max-restarts is -1; expected >= 0"},
      {"heartbeat max", [](v1::JoinRequest& r) { r.set_longest_heartbeat_interval_ms(kInt64Max); },
       "the longest heartbeat interval is"},
      {"heartbeat min", [](v1::JoinRequest& r) { r.set_longest_heartbeat_interval_ms(kInt64Min); },
       "the longest heartbeat interval is -"},
      {"resumed ranks past the world",
       [](v1::JoinRequest& r) {
         v1::Assignment* a = r.mutable_resume();
         a->set_round(1);
         a->set_world_size(2);
         a->set_group_world_size(2);
         a->set_agents(2);
         a->set_local_world_size(1);
         a->set_rank_offset(kInt32Max);
       },
       "(ranks 2147483647-2147483647 of world size 2)"},
      {"resumed heartbeat min",
       [](v1::JoinRequest& r) {
         v1::Assignment* a = r.mutable_resume();
         a->set_round(1);
         a->set_world_size(2);
         a->set_group_world_size(2);
         a->set_agents(2);
         a->set_local_world_size(1);
         a->set_longest_heartbeat_interval_ms(kInt64Min);
       },
       "(a heartbeat interval of -9223372036854775808 us)"},
  };
  for (const WireCase& c : cases) {
    v1::JoinRequest request = JoinOf("j", "a0", 2);
    request.set_protocol_version(2);
    c.change(request);
    Joined j = Join(request);
    const grpc::Status s = End(j);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.name << ": " << s.error_message();
    EXPECT_TRUE(absl::StrContains(s.error_message(), c.message_has))
        << c.name << ": " << s.error_message();
  }
  // None of them made a job, and rdzvd serves a correct one as before.
  EXPECT_EQ(Status().jobs_size(), 0);
  ServeOneRound("j");
}

TEST_F(ServerWireTest, FailureReportNumbersAreRangeCheckedAndTheJobRunsOn) {
  Start();
  Joined a = Join(JoinOf("j", "a0", 2));
  Joined b = Join(JoinOf("j", "a1", 2));
  v1::JoinEvent event;
  ASSERT_TRUE(ReadUntil(a, v1::JoinEvent::kAssignment, &event));
  ASSERT_TRUE(ReadUntil(b, v1::JoinEvent::kAssignment, &event));

  struct Case {
    std::function<void(v1::WorkerFailure&)> change;
    std::string message;
  };
  const Case cases[] = {
      // An agent exits with the job's exit code: 256 would read as success.
      {[](v1::WorkerFailure& f) { f.set_exit_code(256); },
       "the failure's exit code is 256; expected 0 to 255"},
      {[](v1::WorkerFailure& f) { f.set_exit_code(kInt32Min); },
       "the failure's exit code is -2147483648; expected 0 to 255"},
      {[](v1::WorkerFailure& f) { f.set_signal(65); },
       "the failure's signal is 65; expected 0 to 64"},
      {[](v1::WorkerFailure& f) { f.set_signal(-1); },
       "the failure's signal is -1; expected 0 to 64"},
      {[](v1::WorkerFailure& f) { f.set_rank(-1); },
       "the failed worker's rank is -1; expected 0 to 2147483646"},
      {[](v1::WorkerFailure& f) { f.set_local_rank(kInt32Min); },
       "the failed worker's local rank is -2147483648; expected 0 to 2147483646"},
      {[](v1::WorkerFailure& f) { f.set_group_rank(-1); },
       "the failure's node is -1; expected 0 to 2147483646"},
      // A rank's own words are shown on every node's terminal: one printable line.
      {[](v1::WorkerFailure& f) {
         f.set_request(v1::RANK_REQUEST_EXCLUDE_NODE);
         f.set_request_reason("ECC\x1b[2J errors");
       },
       R"(the rank's request (request_reason) contains the control character \x1b; send one line of printable text)"},
      {[](v1::WorkerFailure& f) { f.set_request_reason("bad\nrdzvd I fake line"); },
       R"(the rank's request (request_reason) contains the control character \x0a; send one line of printable text)"},
  };
  for (const Case& c : cases) {
    v1::ReportExitRequest report;
    report.set_job_id("j");
    report.set_agent_id("a0");
    v1::WorkerFailure* f = report.mutable_failure();
    f->set_host("a0");
    f->set_exit_code(3);
    f->set_cause(v1::ABORT_CAUSE_WORKER_FAILED);
    c.change(*f);
    v1::ReportExitResponse response;
    grpc::ClientContext ctx;
    const grpc::Status s = a.stub->ReportExit(&ctx, report, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_EQ(s.error_message(), c.message);
  }
  ASSERT_EQ(Status().jobs_size(), 1);
  EXPECT_EQ(Status().jobs(0).state(), "running");

  // The end of the range is a failure like any other, and every agent hears it.
  v1::ReportExitRequest report;
  report.set_job_id("j");
  report.set_agent_id("a0");
  report.mutable_failure()->set_host("a0");
  report.mutable_failure()->set_exit_code(255);
  report.mutable_failure()->set_signal(64);
  report.mutable_failure()->set_cause(v1::ABORT_CAUSE_WORKER_FAILED);
  // Long words are cut, not refused, and never inside a character: 2-byte "é" from byte 1 on
  // puts byte 512 in the middle of one.
  report.mutable_failure()->set_request(v1::RANK_REQUEST_NO_RESTART);
  std::string words = "x";
  for (int i = 0; i < 1500; ++i) words += "\xc3\xa9";
  report.mutable_failure()->set_request_reason(words);
  v1::ReportExitResponse response;
  grpc::ClientContext ctx;
  ASSERT_TRUE(a.stub->ReportExit(&ctx, report, &response).ok());
  ASSERT_TRUE(ReadUntil(b, v1::JoinEvent::kAbort, &event));
  EXPECT_EQ(event.abort().exit_code(), 255);
  const std::string& heard = event.abort().first_failure().request_reason();
  EXPECT_EQ(heard.substr(0, 511), words.substr(0, 511));
  EXPECT_TRUE(absl::StrContains(heard, "[... 2490 bytes cut]")) << heard.substr(500);
  for (Joined* j : {&a, &b}) {
    j->context->TryCancel();
    End(*j);
  }
}

TEST_F(ServerWireTest, ControlCharactersInNamesAreRefusedAndShownEscaped) {
  Start();
  struct Case {
    std::function<void(v1::JoinRequest&)> change;
    std::string message;
  };
  const Case cases[] = {
      {[](v1::JoinRequest& r) { r.set_job_id("j\x1b[2J"); },
       R"(the job id "j\x1b[2J" contains the control character \x1b; use printable characters only)"},
      {[](v1::JoinRequest& r) { r.set_agent_id("a0\nrdzvd I fake"); },
       R"(the agent id "a0\nrdzvd I fake" contains the control character \x0a; use printable characters only)"},
      {[](v1::JoinRequest& r) { r.set_host(std::string("h\0st", 4)); },
       R"(the host name "h\x00st" contains the control character \x00; use printable characters only)"},
      {[](v1::JoinRequest& r) { r.set_addresses(0, "10.0.0.1\r"); },
       R"(an address "10.0.0.1\r" contains the control character \x0d; use printable characters only)"},
      {[](v1::JoinRequest& r) { r.set_master_addr_override("m\x7f"); },
       R"(the master address "m\x7f" contains the control character \x7f; use printable characters only)"},
  };
  for (const Case& c : cases) {
    v1::JoinRequest request = JoinOf("j", "a0", 1);
    c.change(request);
    Joined j = Join(request);
    const grpc::Status s = End(j);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_EQ(s.error_message(), c.message);
  }
  // The other calls refuse such an id alike.
  const grpc::Status left = Leave("j\a", "a0");
  EXPECT_EQ(left.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << left.error_message();
  v1::StatusRequest status;
  status.set_job_id("j\t");
  v1::StatusResponse listed;
  grpc::ClientContext status_ctx;
  EXPECT_EQ(Stub()->GetStatus(&status_ctx, status, &listed).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::AbortJobRequest abort;
  abort.set_job_id("j\x1b");
  v1::AbortJobResponse aborted;
  grpc::ClientContext abort_ctx;
  EXPECT_EQ(Stub()->AbortJob(&abort_ctx, abort, &aborted).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::ReportExitRequest report;
  report.set_job_id("j");
  report.set_agent_id("a0");
  report.mutable_failure()->set_host("n\x1b]0;owned\a");
  v1::ReportExitResponse reported;
  grpc::ClientContext report_ctx;
  EXPECT_EQ(Stub()->ReportExit(&report_ctx, report, &reported).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Status().jobs_size(), 0);
  ServeOneRound("j");
}

// Jobs are kept per owner (here: per job token). A departure names a job and an agent; one of
// another owner's job, or of an agent the job does not have, is NOT_FOUND and changes nothing.
TEST_F(ServerWireTest, LeaveOfAJobTheCallerDoesNotOwnIsNotFound) {
  Start(AuthMode::kToken);
  const std::string mine = "owner-token-0123456789abcdef";
  const std::string theirs = "other-token-0123456789abcdef";
  Joined a = Join(JoinOf("j", "a0", 2), mine);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (Status(mine).jobs_size() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(Status(mine).jobs_size(), 1);

  grpc::Status s = Leave("j", "a0", theirs);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_EQ(s.error_message(), "job j has no agent a0 to leave (did the server restart?)");
  s = Leave("j", "nobody", mine);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  ASSERT_EQ(Status(mine).jobs_size(), 1);
  EXPECT_EQ(Status(mine).jobs(0).joined(), 1);

  // The owner's own departure ends its join cleanly.
  s = Leave("j", "a0", mine);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(End(a).ok());
}

// rdzvd serves kMaxStreamsPerConnection calls at once on one connection (an agent needs its Join
// stream and a call or two). A call past them waits in the client for a free one: it ends at its
// own deadline if none frees up, and goes through once one does. Other connections are served
// meanwhile, and the streams already open are untouched.
TEST_F(ServerWireTest, CallsPastConnectionStreamLimitWaitForDeadline) {
  Start();
  auto stub = v1::Rendezvous::NewStub(Channel());
  std::vector<std::unique_ptr<Reading>> held;
  for (int i = 0; i < kMaxStreamsPerConnection; ++i) {
    held.push_back(
        std::make_unique<Reading>(Join(JoinOf("big", absl::StrCat("a", i), 100), "", stub.get())));
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while ((Status().jobs_size() == 0 || Status().jobs(0).joined() < kMaxStreamsPerConnection) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(Status().jobs(0).joined(), kMaxStreamsPerConnection);

  const auto call_with_deadline = [&](absl::Duration timeout) {
    v1::StatusRequest request;
    v1::StatusResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return stub->GetStatus(&ctx, request, &response);
  };
  const absl::Time start = absl::Now();
  const grpc::Status waited = call_with_deadline(absl::Seconds(1));
  EXPECT_EQ(waited.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << waited.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << "the waiting call outlived its deadline";

  // Everyone else is served meanwhile, and the full connection's streams are all still there.
  ServeOneRound("other");
  EXPECT_EQ(Status().jobs(0).joined(), kMaxStreamsPerConnection);

  // One stream ends: the next call on the connection goes through.
  held.pop_back();
  const grpc::Status served = call_with_deadline(absl::Seconds(20));
  EXPECT_TRUE(served.ok()) << served.error_message();
}

// rdzvd's gRPC memory (--memory-limit-mb, gRPC's resource quota) is tiny here: joins on many
// connections and a burst of the largest failure reports exceed it. Calls past it are refused
// with RESOURCE_EXHAUSTED (gRPC resets the stream) or UNAVAILABLE (it closes a connection) and
// never hang; to make room gRPC may also reset streams that were open already, so every call is
// expected to end one way or the other. Once the burst is over rdzvd serves a new job as before.
TEST_F(ServerWireTest, CallsPastMemoryQuotaRefusedThenServesOn) {
  Start(AuthMode::kNone, size_t{256} << 10);
  std::vector<std::unique_ptr<Reading>> joins;
  for (int i = 0; i < 40; ++i) {
    joins.push_back(std::make_unique<Reading>(Join(JoinOf("big", absl::StrCat("a", i), 1000))));
  }
  std::vector<grpc::Status> reports(20);
  {
    std::vector<std::thread> threads;
    for (grpc::Status& result : reports) {
      threads.emplace_back([&] {
        v1::ReportExitRequest report;
        report.set_job_id("big");
        report.set_agent_id("nobody");
        report.mutable_failure()->set_host("h");
        report.mutable_failure()->set_stderr_tail(std::string(200 * 1024, 'x'));
        v1::ReportExitResponse response;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + kWait);
        result = Stub()->ReportExit(&ctx, report, &response);
      });
    }
    for (std::thread& t : threads) t.join();
  }
  int refused = 0;
  for (const grpc::Status& s : reports) {
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) continue;  // served: no such agent
    EXPECT_TRUE(s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
                s.error_code() == grpc::StatusCode::UNAVAILABLE)
        << s.error_code() << ": " << s.error_message();
    ++refused;
  }
  for (std::unique_ptr<Reading>& join : joins) {
    const grpc::Status s = join->Cancel();
    if (s.error_code() == grpc::StatusCode::CANCELLED) continue;  // held until now
    EXPECT_TRUE(s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
                s.error_code() == grpc::StatusCode::UNAVAILABLE)
        << s.error_code() << ": " << s.error_message();
    ++refused;
  }
  EXPECT_GT(refused, 0) << "the burst stayed within the quota: the test shows nothing";

  // gRPC gives the burst's memory back to the quota as it reclaims it, not at once: a new job,
  // trying again as agents do, completes its round soon after.
  const absl::Time deadline = absl::Now() + absl::FromChrono(kWait);
  bool served = false;
  for (int attempt = 0; !served && absl::Now() < deadline; ++attempt) {
    if (attempt > 0) absl::SleepFor(absl::Milliseconds(100));
    served = RoundCompletes(absl::StrCat("after-", attempt));
  }
  EXPECT_TRUE(served) << "no new job completed its round within " << absl::FromChrono(kWait);
}

}  // namespace
}  // namespace rdzv
