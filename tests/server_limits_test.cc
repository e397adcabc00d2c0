// rdzvd's limits, against its service in this process over loopback, with raw rdzv.v1 calls
// (what a careless or hostile client can send, not what librdzv sends): oversized fields and
// requests are refused with a status naming the field, one user's jobs and agents are capped,
// and a failure's huge stderr reaches the other agents cut to a fixed size.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "guard/request_limits.h"
#include "rdzv/v1/rdzv.grpc.pb.h"
#include "server/server.h"
#include "tests/testing/wire.h"

namespace rdzv {
namespace {

using testing::Joined;
using testing::JoinOf;
using testing::ReadUntil;

// As a client with a large message limit of its own, so that rdzvd's limits are what refuse.
grpc::ChannelArguments LargeMessages() {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  return args;
}

class ServerLimitsTest : public ::testing::Test {
 protected:
  void Start(ServiceOptions service = {}) {
    ServerOptions options = testing::LoopbackServerOptions();
    options.service = service;
    options.service.auth.mode = AuthMode::kNone;
    server_ = testing::StartLoopbackServer(options);
    ASSERT_NE(server_, nullptr);
    wire_.emplace(server_->port(), LargeMessages());
  }

  std::unique_ptr<v1::Rendezvous::Stub> Stub() { return wire_->Stub(); }
  Joined Join(const v1::JoinRequest& request) { return wire_->Join(request); }

  // The status a refused join ends with (after any events).
  static grpc::Status Refusal(Joined& j) { return testing::End(j); }

  std::unique_ptr<Server> server_;
  std::optional<testing::WireClient> wire_;
};

TEST_F(ServerLimitsTest, OversizedFieldsAreRefusedNamingTheField) {
  Start();
  v1::JoinRequest long_id = JoinOf(std::string(1000, 'j'), "a0", 1);
  Joined a = Join(long_id);
  grpc::Status s = Refusal(a);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "the job id is 1000 bytes"))
      << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "limit of 256")) << s.error_message();

  v1::JoinRequest many = JoinOf("j", "a0", 1);
  for (int i = 0; i < 100; ++i) many.add_addresses(absl::StrCat("10.0.0.", i));
  Joined b = Join(many);
  s = Refusal(b);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "101 addresses")) << s.error_message();

  v1::AbortJobRequest abort;
  abort.set_job_id("j");
  abort.set_reason(std::string(5000, 'r'));
  v1::AbortJobResponse response;
  grpc::ClientContext ctx;
  s = Stub()->AbortJob(&ctx, abort, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "the reason")) << s.error_message();
}

TEST_F(ServerLimitsTest, OversizedRequestIsRefusedAndServerGoesOn) {
  Start();
  v1::JoinRequest huge = JoinOf("j", "a0", 1);
  huge.set_host(std::string(8 << 20, 'h'));
  Joined a = Join(huge);
  const grpc::Status s = Refusal(a);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();

  // A normal job on the same server is unaffected.
  Joined ok = Join(JoinOf("j", "a1", 1));
  v1::JoinEvent event;
  EXPECT_TRUE(ReadUntil(ok, v1::JoinEvent::kAssignment, &event));
  ok.context->TryCancel();
}

TEST_F(ServerLimitsTest, OneUsersJobsAndAgentsAreCapped) {
  ServiceOptions service;
  service.max_jobs_per_user = 2;
  service.max_agents_per_user = 3;
  Start(service);
  // Two jobs of two agents each: the second job's second agent is the fourth stream.
  std::vector<Joined> held;
  held.push_back(Join(JoinOf("job-1", "a0", 2)));
  held.push_back(Join(JoinOf("job-2", "b0", 2)));
  Joined third_job = Join(JoinOf("job-3", "c0", 2));
  grpc::Status s = Refusal(third_job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  // Without authentication there is no user to name: every caller shares the one limit.
  EXPECT_EQ(s.error_message(),
            "rdzvd runs with --auth none, so all callers share one limit of 2 jobs "
            "(--max-jobs-per-user), and it is reached; wait for some to end, raise "
            "--max-jobs-per-user or turn on authentication");

  held.push_back(Join(JoinOf("job-1", "a1", 2)));
  v1::JoinEvent event;
  EXPECT_TRUE(ReadUntil(held[2], v1::JoinEvent::kAssignment, &event));
  Joined fourth = Join(JoinOf("job-2", "b1", 2));
  s = Refusal(fourth);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_EQ(s.error_message(),
            "rdzvd runs with --auth none, so all callers share one limit of 3 attached agents "
            "(--max-agents-per-user), and it is reached; wait for some jobs to end, raise "
            "--max-agents-per-user or turn on authentication");

  // Once streams close, the user may attach again.
  held[1].context->TryCancel();
  Refusal(held[1]);
  held.erase(held.begin() + 1);
  for (int attempt = 0; attempt < 100; ++attempt) {
    Joined again = Join(JoinOf("job-2", "b2", 2));
    v1::JoinEvent e;
    if (again.reader->Read(&e)) {  // a progress or the job's abort: it was let in
      again.context->TryCancel();
      Refusal(again);
      break;
    }
    s = again.reader->Finish();
    ASSERT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (Joined& j : held) j.context->TryCancel();
  for (Joined& j : held) Refusal(j);
}

// Nodes reported unhealthy are kept for good, though their agents' streams close at once: each
// record is charged to its user, so that a flood of reports fills that user's share and no
// more, and the charge is returned when the job is forgotten.
TEST_F(ServerLimitsTest, LeftOutNodesAreChargedToTheirUser) {
  ServiceOptions service;
  service.max_memory_per_user_bytes = 512 << 10;
  service.state.ended_job_ttl = 5'000'000;  // past the flood and the next join, however loaded
  Start(service);
  const auto unhealthy = [](const std::string& job, int64_t node) {
    v1::JoinRequest r = JoinOf(job, absl::StrCat("n", node), 1'000'000, node);
    r.set_min_agents(1);
    r.set_protocol_version(4);
    r.mutable_unhealthy()->set_kind(v1::EXCLUSION_KIND_HEALTH_CHECK_FAILED);
    r.mutable_unhealthy()->set_detail("GPU 0 has fallen off");
    return r;
  };
  const int64_t most = service.max_memory_per_user_bytes / kExcludedAgentBytes;
  grpc::Status refused;
  int64_t recorded = 0;
  for (; recorded <= most; ++recorded) {
    Joined j = Join(unhealthy("flood", recorded));
    const grpc::Status s = Refusal(j);
    if (s.error_code() != grpc::StatusCode::FAILED_PRECONDITION) {
      refused = s;
      break;
    }
  }
  // A join's stream holds its share (kAgentBaseBytes) until rdzvd has closed it, so on a slow
  // machine the first refusal can come while the flood's last stream still closes: once it is
  // gone, more records fit. Go on until a refusal with nothing else held, some time after the
  // last stream.
  for (int quiet = 0; quiet < 2 && recorded <= most;) {
    Joined j = Join(unhealthy("flood", recorded));
    const grpc::Status s = Refusal(j);
    if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      ++recorded;
      quiet = 0;
      continue;
    }
    refused = s;
    ++quiet;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  // Refused before the records could pass the share, and for that reason.
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "memory limit"))
      << refused.error_message();
  EXPECT_GT(recorded, most / 2);
  EXPECT_LT(recorded, most);
  // A healthy join of the same user is refused too: the records are its own. (It is no smaller
  // than a report, which no longer fits.)
  v1::JoinRequest healthy_join = JoinOf("other", "a0", 1);
  healthy_join.set_node_list(std::string(128, 'n'));
  Joined healthy = Join(healthy_join);
  EXPECT_EQ(Refusal(healthy).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  // Once the job is forgotten (its ended-job TTL), so is the charge.
  const auto deadline = std::chrono::steady_clock::now() + testing::kWireDeadline;
  bool assigned = false;
  while (!assigned && std::chrono::steady_clock::now() < deadline) {
    Joined again = Join(JoinOf("other", "a0", 1));
    v1::JoinEvent event;
    assigned = ReadUntil(again, v1::JoinEvent::kAssignment, &event);
    again.context->TryCancel();
    Refusal(again);
    if (!assigned) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(assigned);
}

// A second join under an agent id the job has, with another --nproc-per-node, is refused over
// the wire with the one line naming both values; the agent that holds the id keeps its place.
TEST_F(ServerLimitsTest, RejoinUnderTheSameAgentIdWithAnotherNprocIsRefused) {
  Start();
  Joined first = Join(JoinOf("j", "a0", 2));
  // The first join is in before the second is sent: two streams opened one after the other may
  // reach the server in either order.
  for (int i = 0; i < 1000 && server_->open_streams() < 1; ++i) usleep(10'000);
  ASSERT_EQ(server_->open_streams(), 1u);
  v1::JoinRequest reshaped = JoinOf("j", "a0", 2);
  reshaped.set_nproc(4);
  Joined second = Join(reshaped);
  const grpc::Status s = Refusal(second);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_EQ(s.error_message(),
            "agent a0 already joined job j with --nproc-per-node 1 and now asks for 4; rejoin "
            "with --nproc-per-node 1, or give a launcher of another shape its own agent id");

  Joined other = Join(JoinOf("j", "b0", 2));
  for (Joined* j : {&first, &other}) {
    v1::JoinEvent event;
    ASSERT_TRUE(ReadUntil(*j, v1::JoinEvent::kAssignment, &event));
    EXPECT_EQ(event.assignment().world_size(), 2);
    j->context->TryCancel();
    Refusal(*j);
  }
}

TEST_F(ServerLimitsTest, HugeStderrReachesTheOtherAgentsCut) {
  Start();
  Joined a = Join(JoinOf("big", "a0", 2));
  Joined b = Join(JoinOf("big", "a1", 2));
  v1::JoinEvent event;
  ASSERT_TRUE(ReadUntil(a, v1::JoinEvent::kAssignment, &event));
  ASSERT_TRUE(ReadUntil(b, v1::JoinEvent::kAssignment, &event));

  v1::ReportExitRequest report;
  report.set_job_id("big");
  report.set_agent_id("a0");
  v1::WorkerFailure* f = report.mutable_failure();
  f->set_host("a0");
  f->set_exit_code(3);
  f->set_cause(v1::ABORT_CAUSE_WORKER_FAILED);
  f->set_stderr_tail(std::string(150 * 1024, 'x') + "the real error at the end");
  f->set_error_message(std::string(60 * 1024, 'm'));
  v1::ReportExitResponse response;
  grpc::ClientContext ctx;
  const grpc::Status s = a.stub->ReportExit(&ctx, report, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();

  ASSERT_TRUE(ReadUntil(b, v1::JoinEvent::kAbort, &event));
  const v1::WorkerFailure& got = event.abort().first_failure();
  EXPECT_LE(got.stderr_tail().size(), kMaxTailBytes + 64);
  EXPECT_TRUE(absl::EndsWith(got.stderr_tail(), "the real error at the end"));
  EXPECT_TRUE(absl::StartsWith(got.stderr_tail(), "[... ")) << got.stderr_tail().substr(0, 40);
  EXPECT_LE(got.error_message().size(), kMaxErrorMessageBytes + 64);
  EXPECT_EQ(event.abort().exit_code(), 3);
  a.context->TryCancel();
  b.context->TryCancel();
  Refusal(a);
  Refusal(b);
}

TEST_F(ServerLimitsTest, NodeListIsBoundedAndTheJobShowsTheFirstOne) {
  Start();
  v1::JoinRequest over = JoinOf("j", "a0", 2);
  over.set_node_list(std::string(kMaxNodeListBytes + 1, 'n'));
  Joined refused = Join(over);
  const grpc::Status s = Refusal(refused);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "the node list is 16385 bytes"))
      << s.error_message();

  v1::JoinRequest first = JoinOf("j", "a0", 2);
  first.set_node_list("n[1-2]");
  Joined waiting = Join(first);
  v1::StatusRequest request;
  request.set_job_id("j");
  v1::StatusResponse status;
  const auto deadline = std::chrono::steady_clock::now() + testing::kWireDeadline;
  while (status.jobs_size() == 0 && std::chrono::steady_clock::now() < deadline) {
    grpc::ClientContext ctx;
    ASSERT_TRUE(Stub()->GetStatus(&ctx, request, &status).ok());
    if (status.jobs_size() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(status.jobs_size(), 1);
  EXPECT_EQ(status.jobs(0).node_list(), "n[1-2]");
  waiting.context->TryCancel();
  Refusal(waiting);
}

// With authentication the refusal names the user whose cap it is; without it, every caller is
// one user, and the refusal says so and how to change it.
TEST(UserCapErrorTest, NamesTheUserOrSaysAllCallersShareOneLimit) {
  struct Case {
    UserCap cap;
    bool auth_none;
    std::string message;
  };
  const Case cases[] = {
      {UserCap::kJobs, false,
       "uid 1000 has 5 jobs on this rendezvous server already, its --max-jobs-per-user; wait for "
       "some to end, or ask its administrator"},
      {UserCap::kAgents, false,
       "uid 1000 has 5 agents attached to this rendezvous server already, its "
       "--max-agents-per-user; wait for some jobs to end, or ask its administrator"},
      {UserCap::kJobs, true,
       "rdzvd runs with --auth none, so all callers share one limit of 4 jobs "
       "(--max-jobs-per-user), and it is reached; wait for some to end, raise "
       "--max-jobs-per-user or turn on authentication"},
      {UserCap::kAgents, true,
       "rdzvd runs with --auth none, so all callers share one limit of 4 attached agents "
       "(--max-agents-per-user), and it is reached; wait for some jobs to end, raise "
       "--max-agents-per-user or turn on authentication"},
  };
  for (const Case& c : cases) {
    const absl::Status s = UserCapError(c.cap, c.auth_none, "uid 1000", 5, 4);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_EQ(s.message(), c.message);
    EXPECT_FALSE(absl::StrContains(s.message(), "\n")) << s;
  }
}

}  // namespace
}  // namespace rdzv
