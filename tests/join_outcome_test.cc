// A real rdzvd on loopback and real rdzv-agents whose joins it refuses or ends: an agent whose
// connection broke just as its round completed comes back to a job that has ended; an agent
// without --node-rank among agents that give one; an agent whose join the server ends without
// an assignment. Asserts what the user sees: each agent's exit code, how soon it exits, its one
// line, that the others go on, and that rdzvd's log holds no raw control character however
// hostile the text it was sent. Nothing started here outlives its test.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "rdzv/v1/rdzv.grpc.pb.h"
#include "tests/testing/long_wait.h"
#include "tests/testing/output.h"
#include "tests/testing/process_fixture.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tcp_proxy.h"

namespace rdzv {
namespace {

using testing::Contains;
using testing::kLongWait;
using testing::LineWith;
using testing::Subprocess;
using testing::SubprocessOptions;

// How soon an agent told that its job ended must have exited: a retried join after a reset
// connection and the agent's own exit, with a wide margin for a loaded machine, yet well below
// the minute an ended job keeps a stream open and the agents' --join-timeout.
constexpr absl::Duration kPrompt = absl::Seconds(20);

class JoinOutcomeTest : public testing::ProcessTest {
 protected:
  // An agent on host "n<host>" of a job of `nnodes`, meeting at `endpoint`; `flags` come before
  // its worker, a bash script that carries the test's marker.
  Subprocess& StartAgent(const std::string& endpoint, const std::string& job, int host, int nnodes,
                         std::vector<std::string> flags, const std::string& script = "exit 0") {
    std::vector<std::string> argv = {RDZV_AGENT_BIN,
                                     "--auth",
                                     "none",
                                     "--rdzv-endpoint",
                                     endpoint,
                                     "--rdzv-id",
                                     job,
                                     "--nnodes",
                                     absl::StrCat(nnodes),
                                     "--host-name",
                                     absl::StrCat("n", host),
                                     "--join-timeout",
                                     "300"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {"--", "bash", "-c", absl::StrCat(script, " # ", marker_)});
    return Start(std::move(argv));
  }

  std::unique_ptr<v1::Rendezvous::Stub> Stub() {
    return v1::Rendezvous::NewStub(
        grpc::CreateChannel(endpoint_, grpc::InsecureChannelCredentials()));
  }

  // `job` as rdzvd shows it, or an empty one while it has none.
  v1::JobStatus JobStatus(const std::string& job) {
    v1::StatusRequest request;
    request.set_job_id(job);
    v1::StatusResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    if (!Stub()->GetStatus(&ctx, request, &response).ok() || response.jobs_size() == 0) return {};
    return response.jobs(0);
  }

  // Waits until `job` is in `state` with `joined` agents.
  bool WaitForJob(const std::string& job, const std::string& state, int joined) {
    const absl::Time deadline = absl::Now() + kLongWait;
    while (absl::Now() < deadline) {
      const v1::JobStatus status = JobStatus(job);
      if (status.state() == state && status.joined() == joined) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }
};

// n0's connection breaks just as the round completes: the assignment never reaches it, and
// rdzvd, which lost n0's stream, ends the job. n0 joins again under the same agent id and hears
// how the job ended; its join then ends, so it exits at once with the root cause instead of
// waiting on a stream that will carry nothing more.
TEST_F(JoinOutcomeTest, AgentBackInAJobThatEndedExitsAtOnceWithTheRootCause) {
  // No probes or pings from rdzvd: the test alone decides when n0's connection breaks.
  StartRdzvd({"--keepalive-ms", "0", "--ping-ms", "0"});
  testing::TcpProxy path(port_);
  Subprocess& n0 = StartAgent(absl::StrCat("127.0.0.1:", path.port()), "j", 0, 2,
                              {"--node-rank", "0"}, "sleep 60");
  ASSERT_TRUE(WaitForJob("j", "filling", 1)) << n0.Stderr();
  path.DropReplies();
  Subprocess& n1 = StartAgent(endpoint_, "j", 1, 2, {"--node-rank", "1"}, "sleep 60");
  ASSERT_TRUE(WaitForJob("j", "running", 2)) << n1.Stderr();
  EXPECT_FALSE(absl::StrContains(n0.Stderr(), "round 1:")) << "the assignment reached n0";

  const absl::Time broken = absl::Now();
  path.ResetAll();
  EXPECT_EQ(n0.Wait(kPrompt), 1) << n0.Stderr();
  EXPECT_LT(absl::Now() - broken, kPrompt);
  EXPECT_TRUE(Contains(LineWith(n0.Stderr(), "job j failed"),
                       "job j failed: lost contact with the agent on n0 (node 0, ranks 0-0)"));
  EXPECT_FALSE(absl::StrContains(n0.Stderr(), "round 1:")) << "n0 started its workers";
  // n1 heard the same end and stopped its worker.
  EXPECT_EQ(n1.Wait(kLongWait), 1) << n1.Stderr();
  EXPECT_TRUE(Contains(n1.Stderr(), "lost contact with the agent on n0"));
}

// An agent without --node-rank among agents that give one is refused at once with the line
// that says what differs and what to do; the agent already waiting goes on, and completes its
// round with a correct one.
TEST_F(JoinOutcomeTest, AgentWithoutNodeRankIsRefusedRoundGoesOn) {
  StartRdzvd();
  Subprocess& n0 = StartAgent(endpoint_, "j", 0, 2, {"--node-rank", "0"}, "echo ran-$RANK");
  ASSERT_TRUE(WaitForJob("j", "filling", 1)) << n0.Stderr();

  Subprocess& loose = StartAgent(endpoint_, "j", 7, 2, {});
  EXPECT_EQ(loose.Wait(kLongWait), 1) << loose.Stderr();
  EXPECT_TRUE(Contains(LineWith(loose.Stderr(), "job j:"),
                       "the agent on n7 gives no --node-rank, but the agent on n0, already in "
                       "job j, gives --node-rank 0; pass --node-rank to every agent of the job "
                       "or to none"));
  EXPECT_FALSE(absl::StrContains(loose.Stdout(), "ran-")) << loose.Stdout();
  EXPECT_TRUE(n0.Running()) << n0.Stderr();
  EXPECT_EQ(JobStatus("j").joined(), 1);

  Subprocess& n1 = StartAgent(endpoint_, "j", 1, 2, {"--node-rank", "1"}, "echo ran-$RANK");
  EXPECT_EQ(n0.Wait(kLongWait), 0) << n0.Stderr();
  EXPECT_EQ(n1.Wait(kLongWait), 0) << n1.Stderr();
  EXPECT_TRUE(Contains(n0.Stdout(), "ran-0"));
  EXPECT_TRUE(Contains(n1.Stdout(), "ran-1"));
}

// rdzvd ends a waiting agent's join cleanly without an assignment (here: a departure in the
// agent's name). The agent does not mistake that for a place in the job or retry forever: it
// says so in one line and exits non-zero.
TEST_F(JoinOutcomeTest, JoinEndedWithoutAnAssignmentIsReportedAndTheAgentExits) {
  StartRdzvd();
  Subprocess& n0 = StartAgent(endpoint_, "j", 0, 2, {"--node-rank", "0"}, "echo ran");
  ASSERT_TRUE(WaitForJob("j", "filling", 1)) << n0.Stderr();
  v1::LeaveRequest leave;
  leave.set_job_id("j");
  leave.set_agent_id(JobStatus("j").agents(0).agent_id());
  v1::LeaveResponse left;
  grpc::ClientContext ctx;
  ASSERT_TRUE(Stub()->Leave(&ctx, leave, &left).ok());
  EXPECT_EQ(n0.Wait(kPrompt), 1) << n0.Stderr();
  EXPECT_TRUE(Contains(LineWith(n0.Stderr(), "job j:"),
                       "job j: the rendezvous server ended the join without an assignment"));
  EXPECT_FALSE(absl::StrContains(n0.Stdout(), "ran")) << n0.Stdout();
}

// Every log line of rdzvd that carries text from the wire has its control characters escaped:
// refused names, failure reports, an operator's reason. The log is what an administrator reads
// in a terminal or a journal, and a line is one line.
TEST_F(JoinOutcomeTest, RdzvdLogsWireTextWithItsControlCharactersEscaped) {
  StartRdzvd();
  const std::string hostile = "x\x1b[2J\rrdzvd I 00:00:00.000 fake\n\a";
  auto stub = Stub();
  // A join refused for a control character in its host name.
  {
    v1::JoinRequest join;
    join.set_job_id("j");
    join.set_agent_id("a");
    join.set_host(hostile);
    join.set_nproc(1);
    join.set_min_agents(1);
    join.set_max_agents(1);
    grpc::ClientContext ctx;
    auto reader = stub->Join(&ctx, join);
    v1::JoinEvent event;
    while (reader->Read(&event)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  // A job of two raw agents and a hang report whose detail is hostile; a job of one, aborted by
  // an operator with a hostile reason.
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::JoinEvent>>> readers;
  for (const auto& [job, agent, nnodes] : std::vector<std::tuple<std::string, std::string, int>>{
           {"j", "a0", 2}, {"j", "a1", 2}, {"k", "b0", 1}}) {
    v1::JoinRequest join;
    join.set_job_id(job);
    join.set_agent_id(agent);
    join.set_host(agent);
    join.set_node_index(-1);
    join.set_order(-1);
    join.set_nproc(1);
    join.set_min_agents(nnodes);
    join.set_max_agents(nnodes);
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    readers.push_back(stub->Join(contexts.back().get(), join));
  }
  for (auto& reader : readers) {
    v1::JoinEvent event;
    ASSERT_TRUE(reader->Read(&event));
    ASSERT_TRUE(event.has_assignment());
  }
  v1::ReportExitRequest report;
  report.set_job_id("j");
  report.set_agent_id("a0");
  v1::WorkerFailure* f = report.mutable_failure();
  f->set_host("a0");
  f->set_exit_code(134);
  f->set_cause(v1::ABORT_CAUSE_WORKER_HUNG);
  f->set_hang_detail(hostile);
  f->set_stderr_tail(hostile);
  v1::ReportExitResponse reported;
  grpc::ClientContext report_ctx;
  ASSERT_TRUE(stub->ReportExit(&report_ctx, report, &reported).ok());
  v1::AbortJobRequest abort;
  abort.set_job_id("k");
  abort.set_reason(hostile);
  v1::AbortJobResponse aborted;
  grpc::ClientContext abort_ctx;
  ASSERT_TRUE(stub->AbortJob(&abort_ctx, abort, &aborted).ok());
  for (auto& context : contexts) context->TryCancel();
  for (auto& reader : readers) {
    v1::JoinEvent event;
    while (reader->Read(&event)) {
    }
    reader->Finish();
  }
  rdzvd_->Signal(SIGTERM);
  ASSERT_EQ(rdzvd_->Wait(kLongWait), 0) << rdzvd_->Stderr();

  const std::string log = rdzvd_->Stderr();
  EXPECT_TRUE(Contains(log, R"(the host name "x\x1b[2J\rrdzvd I 00:00:00.000 fake\n\x07")"));
  EXPECT_TRUE(Contains(log, R"(rank 0 hung: x\x1b[2J\rrdzvd I 00:00:00.000 fake\n\x07;)"));
  EXPECT_TRUE(
      Contains(log, R"(job k: aborted with rdzvctl: x\x1b[2J\rrdzvd I 00:00:00.000 fake\n\x07)"));
  for (absl::string_view line : absl::StrSplit(log, '\n', absl::SkipEmpty())) {
    EXPECT_TRUE(absl::StartsWith(line, "rdzvd ")) << "a line rdzvd did not start: " << line;
    for (const char c : line) {
      EXPECT_FALSE(absl::ascii_iscntrl(static_cast<unsigned char>(c)))
          << "raw control character " << static_cast<int>(c) << " in: " << absl::CHexEscape(line);
    }
  }
}

}  // namespace
}  // namespace rdzv
