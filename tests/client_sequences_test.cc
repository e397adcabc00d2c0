// librdzv's Client (client/client.h) called in orders a launcher may call it in, rightly or not,
// against rdzvd's service in this process over loopback: a departure while a join blocks on
// another thread, departures twice, reports and departures before any join, a cancel after the
// departure. No sequence crashes, and every call ends with a value or a status that says what
// happened. Also an operator's calls (Status, AbortJob, Health), made by a client that never
// joins.
#include <grpcpp/grpcpp.h>

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "rdzv/v1/rdzv.grpc.pb.h"
#include "server/server.h"
#include "tests/testing/long_wait.h"

namespace rdzv {
namespace {

using testing::kLongWait;

class ClientSequencesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.tick_interval = absl::Milliseconds(20);
    options.service.auth.mode = AuthMode::kNone;
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  std::unique_ptr<Client> NewClient() {
    ClientOptions options;
    options.endpoint = absl::StrCat("127.0.0.1:", server_->port());
    options.join_timeout = kLongWait;
    options.auth.mode = ClientAuth::Mode::kNone;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  static JoinSpec Spec(const std::string& job, const std::string& agent, int nnodes) {
    JoinSpec spec;
    spec.job_id = job;
    spec.agent.agent_id = agent;
    spec.agent.host = agent;
    spec.min_agents = spec.max_agents = nnodes;
    spec.addresses = {"127.0.0.1"};
    spec.master_port = 29500;
    return spec;
  }

  // Client::Join on a thread of its own, as a launcher's main thread blocks in it.
  static std::future<absl::StatusOr<AssignmentEvent>> JoinAsync(Client& client, JoinSpec spec) {
    return std::async(std::launch::async,
                      [&client, spec] { return client.Join(spec, Handlers{}); });
  }

  static absl::StatusOr<AssignmentEvent> Get(std::future<absl::StatusOr<AssignmentEvent>>& f) {
    if (f.wait_for(absl::ToChronoSeconds(kLongWait)) != std::future_status::ready) {
      ADD_FAILURE() << "Join did not return within " << kLongWait;
      return absl::DeadlineExceededError("test gave up");
    }
    return f.get();
  }

  // Waits until `job` has `joined` agents.
  void WaitForJoined(Client& client, const std::string& job, int joined) {
    const absl::Time deadline = absl::Now() + kLongWait;
    while (absl::Now() < deadline) {
      absl::StatusOr<std::vector<JobStatusView>> jobs = client.Status(job);
      if (jobs.ok() && jobs->size() == 1 && jobs->front().joined == joined) return;
      absl::SleepFor(absl::Milliseconds(10));
    }
    FAIL() << "job " << job << " never had " << joined << " agents";
  }

  std::unique_ptr<Server> server_;
};

TEST_F(ClientSequencesTest, LeaveFromAnotherThreadEndsABlockedJoin) {
  std::unique_ptr<Client> client = NewClient();
  auto joining = JoinAsync(*client, Spec("j", "a0", 2));
  WaitForJoined(*client, "j", 1);
  const absl::Status left = client->Leave();
  EXPECT_TRUE(left.ok()) << left;
  const absl::StatusOr<AssignmentEvent> joined = Get(joining);
  ASSERT_FALSE(joined.ok());
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kCancelled) << joined.status();
  EXPECT_EQ(joined.status().message(), "Leave ended the join before its round completed");
  // The server forgot the waiter: a job of two still needs two.
  absl::StatusOr<std::vector<JobStatusView>> jobs = client->Status("j");
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_TRUE(jobs->empty());
}

// The server ends the join stream cleanly without an assignment (a departure in this agent's
// name from elsewhere): the join does not take that for a place in the job, nor retry.
TEST_F(ClientSequencesTest, JoinEndedByTheServerWithoutAnAssignmentIsAborted) {
  std::unique_ptr<Client> client = NewClient();
  auto joining = JoinAsync(*client, Spec("j", "a0", 2));
  WaitForJoined(*client, "j", 1);
  auto stub = v1::Rendezvous::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", server_->port()), grpc::InsecureChannelCredentials()));
  v1::LeaveRequest leave;
  leave.set_job_id("j");
  leave.set_agent_id("a0");
  v1::LeaveResponse left;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->Leave(&ctx, leave, &left).ok());
  const absl::StatusOr<AssignmentEvent> joined = Get(joining);
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kAborted) << joined.status();
  EXPECT_EQ(joined.status().message(),
            "the rendezvous server ended the join without an assignment");
}

// A departure is said once; saying it again is no error, before or after the round completes.
TEST_F(ClientSequencesTest, LeavingTwiceIsFine) {
  std::unique_ptr<Client> a = NewClient();
  std::unique_ptr<Client> b = NewClient();
  auto ja = JoinAsync(*a, Spec("j", "a0", 2));
  auto jb = JoinAsync(*b, Spec("j", "a1", 2));
  ASSERT_TRUE(Get(ja).ok());
  ASSERT_TRUE(Get(jb).ok());
  for (Client* c : {a.get(), b.get()}) {
    for (int i = 0; i < 2; ++i) {
      const absl::Status left = c->Leave();
      EXPECT_TRUE(left.ok()) << i << ": " << left;
    }
  }
  // After a join that waited and was left, too.
  std::unique_ptr<Client> w = NewClient();
  auto waiting = JoinAsync(*w, Spec("k", "w0", 2));
  WaitForJoined(*w, "k", 1);
  EXPECT_TRUE(w->Leave().ok());
  EXPECT_FALSE(Get(waiting).ok());
  const absl::Status again = w->Leave();
  EXPECT_TRUE(again.ok()) << again;
}

// Before any join there is no job to report on or to leave: the calls say so instead of sending
// a request without a job.
TEST_F(ClientSequencesTest, ReportAndLeaveBeforeAnyJoinSayThereIsNoJob) {
  std::unique_ptr<Client> client = NewClient();
  FailureInfo failure;
  failure.host = "h";
  absl::StatusOr<AbortEvent> reported = client->ReportFailure(failure);
  EXPECT_EQ(reported.status().code(), absl::StatusCode::kFailedPrecondition) << reported.status();
  EXPECT_EQ(reported.status().message(), "this client has not joined a job; call Join first");
  const absl::Status left = client->Leave();
  EXPECT_EQ(left.code(), absl::StatusCode::kFailedPrecondition) << left;
  EXPECT_EQ(left.message(), "this client has not joined a job; call Join first");
}

TEST_F(ClientSequencesTest, CancelAfterLeaveAndJoinAfterCancelEndCleanly) {
  std::unique_ptr<Client> client = NewClient();
  ASSERT_TRUE(client->Join(Spec("solo", "s0", 1), Handlers{}).ok());
  EXPECT_TRUE(client->Leave().ok());
  client->Cancel();
  client->Cancel();
  const absl::StatusOr<AssignmentEvent> after = client->Join(Spec("solo2", "s0", 1), Handlers{});
  EXPECT_EQ(after.status().code(), absl::StatusCode::kCancelled) << after.status();
  EXPECT_TRUE(client->Leave().ok());
}

// An operator's client, which joins nothing, sees a waiting job, ends it for its agents, and
// then sees how it ended.
TEST_F(ClientSequencesTest, AnOperatorSeesAndAbortsAJob) {
  std::unique_ptr<Client> agent = NewClient();
  auto joining = JoinAsync(*agent, Spec("op", "a0", 2));
  std::unique_ptr<Client> ctl = NewClient();
  WaitForJoined(*ctl, "op", 1);
  absl::StatusOr<std::vector<JobStatusView>> jobs = ctl->Status("");
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ(jobs->front().job_id, "op");
  EXPECT_EQ(jobs->front().state, "filling");
  ASSERT_EQ(jobs->front().agents.size(), 1u);
  EXPECT_EQ(jobs->front().agents.front().host, "a0");
  EXPECT_FALSE(jobs->front().abort.has_value());

  absl::StatusOr<AbortEvent> abort = ctl->AbortJob("op", "node maintenance");
  ASSERT_TRUE(abort.ok()) << abort.status();
  EXPECT_EQ(abort->reason, "aborted with rdzvctl: node maintenance");
  EXPECT_EQ(abort->cause, AbortCause::kAgentSignalled);
  const absl::StatusOr<AssignmentEvent> joined = Get(joining);
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kAborted) << joined.status();
  EXPECT_EQ(joined.status().message(), abort->reason);

  jobs = ctl->Status("op");
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ(jobs->front().state, "ended");
  ASSERT_TRUE(jobs->front().abort.has_value());
  EXPECT_EQ(*jobs->front().abort, *abort);

  absl::StatusOr<AbortEvent> unknown = ctl->AbortJob("nosuchjob", "x");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound) << unknown.status();
  EXPECT_EQ(unknown.status().message(), "rdzvd has no job nosuchjob; see rdzvctl status");
  jobs = ctl->Status("nosuchjob");
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_TRUE(jobs->empty());

  absl::StatusOr<ServingStatus> health = ctl->Health();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, ServingStatus::kServing);
}

// Where nothing listens, each operator's call says in one line that rdzvd did not answer.
TEST_F(ClientSequencesTest, OperatorCallsToNoServerSayItDidNotAnswer) {
  ClientOptions options;
  options.endpoint = "127.0.0.1:1";
  options.rpc_timeout = absl::Seconds(5);
  options.auth.mode = ClientAuth::Mode::kNone;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<absl::Status> failed = {(*client)->Status("").status(),
                                            (*client)->AbortJob("j", "x").status(),
                                            (*client)->Health().status()};
  for (const absl::Status& status : failed) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_TRUE(absl::StartsWith(status.message(), "rdzvd at 127.0.0.1:1 did not answer ("))
        << status;
    EXPECT_TRUE(absl::EndsWith(status.message(),
                               "); check that it runs and that --rdzv-endpoint/RDZV_ENDPOINT "
                               "names it"))
        << status;
    EXPECT_FALSE(absl::StrContains(status.message(), "\n")) << status;
  }
}

}  // namespace
}  // namespace rdzv
