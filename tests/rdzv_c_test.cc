// librdzv's C interface (client/rdzv.h), through librdzv.so as another language would use it,
// against a real rdzvd process on loopback: ranks, callbacks, failure reports, status, and the
// codes and messages of bad arguments.
#include <cmath>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/rdzv.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/long_wait.h"
#include "tests/testing/subprocess.h"

namespace rdzv {
namespace {

using ::testing::HasSubstr;
using testing::kLongWait;
using testing::Subprocess;
using testing::SubprocessOptions;

// What one client's callbacks saw; they run on the library's threads.
struct Events {
  absl::Mutex mu;
  int progress_calls ABSL_GUARDED_BY(mu) = 0;
  int32_t last_joined ABSL_GUARDED_BY(mu) = 0;
  int32_t last_expected ABSL_GUARDED_BY(mu) = 0;
  absl::Notification progressed;
  absl::Notification aborted;
  rdzv_abort_cause abort_cause ABSL_GUARDED_BY(mu) = RDZV_ABORT_UNSPECIFIED;
  int32_t abort_exit_code ABSL_GUARDED_BY(mu) = 0;
  std::string abort_reason ABSL_GUARDED_BY(mu);

  rdzv_callbacks Callbacks() {
    rdzv_callbacks cb{};
    cb.user_data = this;
    cb.on_progress = [](void* self, int32_t joined, int32_t expected) {
      auto* e = static_cast<Events*>(self);
      absl::MutexLock lock(&e->mu);
      ++e->progress_calls;
      e->last_joined = joined;
      e->last_expected = expected;
      if (!e->progressed.HasBeenNotified()) e->progressed.Notify();
    };
    cb.on_abort = [](void* self, rdzv_abort_cause cause, int32_t exit_code, const char* reason) {
      auto* e = static_cast<Events*>(self);
      absl::MutexLock lock(&e->mu);
      if (e->aborted.HasBeenNotified()) return;
      e->abort_cause = cause;
      e->abort_exit_code = exit_code;
      e->abort_reason = reason;
      e->aborted.Notify();
    };
    return cb;
  }
};

// A client that is destroyed with the test.
using ClientPtr = std::unique_ptr<rdzv_client, void (*)(rdzv_client*)>;

rdzv_join_spec Spec(const char* job, int64_t node_index, const char* host) {
  rdzv_join_spec spec;
  rdzv_join_spec_init(&spec);
  spec.job_id = job;
  spec.min_nodes = spec.max_nodes = 2;
  spec.node_index = node_index;
  spec.nproc = 2;
  spec.host = host;
  return spec;
}

struct JoinResult {
  rdzv_code code = RDZV_UNKNOWN;
  std::string error;  // rdzv_last_error() on the joining thread
  rdzv_assignment assignment{};
};

class RdzvCTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int attempt = 0; attempt < 5 && endpoint_.empty(); ++attempt) {
      const int port = testing::FreeLoopbackPort();
      SubprocessOptions options;
      // Waiting clients hear how their round fills every 50 ms rather than every 3 s.
      options.argv = {RDZVD_BIN,
                      "--auth",
                      "none",
                      "--listen",
                      absl::StrCat("127.0.0.1:", port),
                      "--progress-interval-ms",
                      "50"};
      options.unset_env_prefixes = {"RDZV_"};
      options.env = {{"RDZV_CONFIG", "/dev/null"}};
      rdzvd_ = std::make_unique<Subprocess>(std::move(options));
      if (testing::WaitForLoopbackPort(port, kLongWait) && rdzvd_->Running()) {
        endpoint_ = absl::StrCat("127.0.0.1:", port);
      } else {
        rdzvd_.reset();  // someone took the port first: try another
      }
    }
    ASSERT_FALSE(endpoint_.empty()) << "rdzvd did not start";
  }

  void TearDown() override {
    if (rdzvd_ != nullptr) rdzvd_->Kill();
  }

  ClientPtr NewClient(double join_timeout_s = 60) {
    rdzv_client* c = nullptr;
    const rdzv_code code =
        rdzv_client_create(endpoint_.c_str(), join_timeout_s, RDZV_AUTH_NONE, nullptr, nullptr, &c);
    EXPECT_EQ(code, RDZV_OK) << rdzv_last_error();
    return ClientPtr(c, rdzv_client_destroy);
  }

  // rdzv_join on a thread of its own, as a launcher's main thread would block in it.
  static std::future<JoinResult> JoinAsync(rdzv_client* client, rdzv_join_spec spec,
                                           rdzv_callbacks callbacks) {
    return std::async(std::launch::async, [client, spec, callbacks] {
      JoinResult r;
      r.code = rdzv_join(client, &spec, &callbacks, &r.assignment);
      r.error = rdzv_last_error();
      return r;
    });
  }

  static JoinResult Get(std::future<JoinResult>& f) {
    if (f.wait_for(absl::ToChronoSeconds(kLongWait)) != std::future_status::ready) {
      ADD_FAILURE() << "rdzv_join did not return within " << kLongWait;
      return {};
    }
    return f.get();
  }

  std::unique_ptr<Subprocess> rdzvd_;
  std::string endpoint_;
};

TEST_F(RdzvCTest, TwoClientsJoinWithConsistentRanksAndHearProgress) {
  Events ea, eb;  // outlive the clients, whose callbacks point at them
  ClientPtr a = NewClient();
  ClientPtr b = NewClient();
  std::future<JoinResult> ja = JoinAsync(a.get(), Spec("job", 0, "n0"), ea.Callbacks());
  // The first client hears that its round has 1 of 2 before the second one comes.
  ASSERT_TRUE(ea.progressed.WaitForNotificationWithTimeout(kLongWait));
  {
    absl::MutexLock lock(&ea.mu);
    EXPECT_EQ(ea.last_joined, 1);
    EXPECT_EQ(ea.last_expected, 2);
  }
  rdzv_job_status status;
  ASSERT_EQ(rdzv_status(b.get(), "job", &status), RDZV_OK) << rdzv_last_error();
  EXPECT_STREQ(status.state, "filling");
  EXPECT_EQ(status.joined, 1);
  EXPECT_EQ(status.min_nodes, 2);
  EXPECT_EQ(status.max_nodes, 2);

  std::future<JoinResult> jb = JoinAsync(b.get(), Spec("job", 1, "n1"), eb.Callbacks());
  JoinResult ra = Get(ja);
  JoinResult rb = Get(jb);
  ASSERT_EQ(ra.code, RDZV_OK) << ra.error;
  ASSERT_EQ(rb.code, RDZV_OK) << rb.error;
  EXPECT_EQ(ra.error, "");
  const rdzv_assignment& x = ra.assignment;
  const rdzv_assignment& y = rb.assignment;
  // Node index 0 comes first: ranks 0-1, then 2-3.
  EXPECT_EQ(x.rank_offset, 0);
  EXPECT_EQ(y.rank_offset, 2);
  EXPECT_EQ(x.group_rank, 0);
  EXPECT_EQ(y.group_rank, 1);
  for (const rdzv_assignment* s : {&x, &y}) {
    EXPECT_EQ(s->world_size, 4);
    EXPECT_EQ(s->group_world_size, 2);
    EXPECT_EQ(s->local_world_size, 2);
    EXPECT_EQ(s->local_rank_offset, 0);
    EXPECT_EQ(s->restart_count, 0);
    EXPECT_EQ(s->round, x.round);
  }
  EXPECT_STREQ(x.master_addr, y.master_addr);
  EXPECT_STRNE(x.master_addr, "");
  EXPECT_EQ(x.master_port, y.master_port);
  EXPECT_GT(x.master_port, 0);

  ASSERT_EQ(rdzv_status(a.get(), "job", &status), RDZV_OK) << rdzv_last_error();
  EXPECT_STREQ(status.state, "running");
  EXPECT_EQ(status.joined, 2);
  EXPECT_EQ(status.world_size, 4);

  EXPECT_EQ(rdzv_leave(a.get()), RDZV_OK) << rdzv_last_error();
  EXPECT_EQ(rdzv_leave(b.get()), RDZV_OK) << rdzv_last_error();
}

// A server list whose first server does not answer: the join goes to the next one.
TEST_F(RdzvCTest, AServerListJoinsAtTheFirstServerThatAnswers) {
  const std::string list = absl::StrCat("127.0.0.1:", testing::FreeLoopbackPort(), ",", endpoint_);
  Events ea, eb;
  std::vector<ClientPtr> clients;
  for (int i = 0; i < 2; ++i) {
    rdzv_client* c = nullptr;
    ASSERT_EQ(rdzv_client_create(list.c_str(), 60, RDZV_AUTH_NONE, nullptr, nullptr, &c), RDZV_OK)
        << rdzv_last_error();
    clients.emplace_back(c, rdzv_client_destroy);
  }
  std::future<JoinResult> ja = JoinAsync(clients[0].get(), Spec("listed", 0, "n0"), ea.Callbacks());
  std::future<JoinResult> jb = JoinAsync(clients[1].get(), Spec("listed", 1, "n1"), eb.Callbacks());
  JoinResult ra = Get(ja);
  JoinResult rb = Get(jb);
  ASSERT_EQ(ra.code, RDZV_OK) << ra.error;
  ASSERT_EQ(rb.code, RDZV_OK) << rb.error;
  EXPECT_EQ(ra.assignment.rank_offset, 0);
  EXPECT_EQ(rb.assignment.rank_offset, 2);
  // The calls after the join go to the server it found.
  rdzv_job_status status;
  ASSERT_EQ(rdzv_status(clients[0].get(), "listed", &status), RDZV_OK) << rdzv_last_error();
  EXPECT_STREQ(status.state, "running");
  EXPECT_EQ(rdzv_leave(clients[0].get()), RDZV_OK) << rdzv_last_error();
  EXPECT_EQ(rdzv_leave(clients[1].get()), RDZV_OK) << rdzv_last_error();
  // An empty entry is refused in one line.
  rdzv_client* never = nullptr;
  EXPECT_EQ(
      rdzv_client_create((endpoint_ + ",").c_str(), 1, RDZV_AUTH_NONE, nullptr, nullptr, &never),
      RDZV_INVALID_ARGUMENT);
  EXPECT_THAT(rdzv_last_error(), HasSubstr("empty entry"));
  // So is a list of more servers than a primary and its backups.
  std::string long_list = endpoint_;
  for (int i = 0; i < 100; ++i) absl::StrAppend(&long_list, ",", endpoint_);
  EXPECT_EQ(rdzv_client_create(long_list.c_str(), 1, RDZV_AUTH_NONE, nullptr, nullptr, &never),
            RDZV_INVALID_ARGUMENT);
  EXPECT_THAT(rdzv_last_error(), HasSubstr("give at most 8"));
}

TEST_F(RdzvCTest, FailureReportReachesOtherClientsAbortCallback) {
  Events ea, eb;  // outlive the clients, whose callbacks point at them
  ClientPtr a = NewClient();
  ClientPtr b = NewClient();
  std::future<JoinResult> ja = JoinAsync(a.get(), Spec("failing", 0, "n0"), ea.Callbacks());
  std::future<JoinResult> jb = JoinAsync(b.get(), Spec("failing", 1, "n1"), eb.Callbacks());
  JoinResult ra = Get(ja);
  JoinResult rb = Get(jb);
  ASSERT_EQ(ra.code, RDZV_OK) << ra.error;
  ASSERT_EQ(rb.code, RDZV_OK) << rb.error;

  rdzv_failure failure{};
  failure.cause = RDZV_ABORT_WORKER_FAILED;
  failure.rank = ra.assignment.rank_offset + 1;
  failure.local_rank = 1;
  failure.exit_code = 3;
  failure.message = "loss is NaN";
  rdzv_abort_info first{};
  ASSERT_EQ(rdzv_report_failure(a.get(), &failure, &first), RDZV_OK) << rdzv_last_error();
  EXPECT_EQ(first.cause, RDZV_ABORT_WORKER_FAILED);
  EXPECT_EQ(first.exit_code, 3);
  EXPECT_THAT(first.reason, HasSubstr("rank 1"));

  ASSERT_TRUE(eb.aborted.WaitForNotificationWithTimeout(kLongWait));
  absl::MutexLock lock(&eb.mu);
  EXPECT_EQ(eb.abort_cause, RDZV_ABORT_WORKER_FAILED);
  EXPECT_EQ(eb.abort_exit_code, 3);
  EXPECT_THAT(eb.abort_reason, HasSubstr("rank 1"));
  EXPECT_THAT(eb.abort_reason, HasSubstr("n0"));
}

TEST_F(RdzvCTest, TheMasterEndpointGivenByRankZerosLauncherIsEveryonesMaster) {
  Events ea, eb;
  ClientPtr a = NewClient();
  ClientPtr b = NewClient();
  rdzv_join_spec first = Spec("given", 0, "n0");
  first.master_addr = "127.0.0.2";
  first.master_port = 23456;
  std::future<JoinResult> ja = JoinAsync(a.get(), first, ea.Callbacks());
  std::future<JoinResult> jb = JoinAsync(b.get(), Spec("given", 1, "n1"), eb.Callbacks());
  JoinResult ra = Get(ja);
  JoinResult rb = Get(jb);
  ASSERT_EQ(ra.code, RDZV_OK) << ra.error;
  ASSERT_EQ(rb.code, RDZV_OK) << rb.error;
  for (const JoinResult* r : {&ra, &rb}) {
    EXPECT_STREQ(r->assignment.master_addr, "127.0.0.2");
    EXPECT_EQ(r->assignment.master_port, 23456);
  }
}

TEST_F(RdzvCTest, CancelEndsAJoinBlockedOnAnotherThread) {
  Events ea;
  ClientPtr a = NewClient();
  std::future<JoinResult> ja = JoinAsync(a.get(), Spec("alone", 0, "n0"), ea.Callbacks());
  ASSERT_TRUE(ea.progressed.WaitForNotificationWithTimeout(kLongWait));
  EXPECT_EQ(rdzv_cancel(a.get()), RDZV_OK);
  JoinResult r = Get(ja);
  EXPECT_EQ(r.code, RDZV_CANCELLED) << r.error;
  EXPECT_THAT(r.error, HasSubstr("rdzv_join"));
}

// A launcher that gives up on another thread: rdzv_leave ends the blocked rdzv_join with a
// status that says so, and a second rdzv_leave is no error.
TEST_F(RdzvCTest, LeaveFromAnotherThreadEndsABlockedJoin) {
  Events ea;
  ClientPtr a = NewClient();
  std::future<JoinResult> ja = JoinAsync(a.get(), Spec("left", 0, "n0"), ea.Callbacks());
  ASSERT_TRUE(ea.progressed.WaitForNotificationWithTimeout(kLongWait));
  EXPECT_EQ(rdzv_leave(a.get()), RDZV_OK) << rdzv_last_error();
  JoinResult r = Get(ja);
  EXPECT_EQ(r.code, RDZV_CANCELLED) << r.error;
  EXPECT_EQ(r.error, "rdzv_join: Leave ended the join before its round completed");
  EXPECT_EQ(rdzv_leave(a.get()), RDZV_OK) << rdzv_last_error();
  rdzv_job_status status;
  EXPECT_EQ(rdzv_status(a.get(), "left", &status), RDZV_NOT_FOUND) << "the waiter was kept";
}

TEST_F(RdzvCTest, LeaveTwiceThenCancelAreNoErrors) {
  ClientPtr a = NewClient();
  rdzv_join_spec spec = Spec("solo", 0, "n0");
  spec.min_nodes = spec.max_nodes = 1;
  rdzv_assignment assignment;
  ASSERT_EQ(rdzv_join(a.get(), &spec, nullptr, &assignment), RDZV_OK) << rdzv_last_error();
  EXPECT_EQ(rdzv_leave(a.get()), RDZV_OK) << rdzv_last_error();
  EXPECT_EQ(rdzv_leave(a.get()), RDZV_OK) << rdzv_last_error();
  EXPECT_EQ(rdzv_cancel(a.get()), RDZV_OK) << rdzv_last_error();
  EXPECT_EQ(rdzv_join(a.get(), &spec, nullptr, &assignment), RDZV_CANCELLED);
}

TEST_F(RdzvCTest, ReportAndLeaveBeforeAnyJoinAreRefusedWithTheReason) {
  ClientPtr a = NewClient();
  rdzv_failure failure{};
  failure.cause = RDZV_ABORT_WORKER_FAILED;
  failure.exit_code = 1;
  EXPECT_EQ(rdzv_report_failure(a.get(), &failure, nullptr), RDZV_FAILED_PRECONDITION);
  EXPECT_THAT(rdzv_last_error(), HasSubstr("has not joined a job"));
  EXPECT_EQ(rdzv_leave(a.get()), RDZV_FAILED_PRECONDITION);
  EXPECT_STREQ(rdzv_last_error(), "rdzv_leave: this client has not joined a job; call Join first");
}

// Destroying a client while another thread blocks in rdzv_join on it: the join returns
// RDZV_CANCELLED, and the client is freed only after (the ASan build checks that nothing is
// used after it is freed).
TEST_F(RdzvCTest, DestroyWhileAJoinBlocksOnAnotherThreadEndsTheJoinFirst) {
  Events ea;
  ClientPtr a = NewClient();
  std::future<JoinResult> ja = JoinAsync(a.get(), Spec("destroyed", 0, "n0"), ea.Callbacks());
  ASSERT_TRUE(ea.progressed.WaitForNotificationWithTimeout(kLongWait));
  a.reset();  // rdzv_client_destroy
  JoinResult r = Get(ja);
  EXPECT_EQ(r.code, RDZV_CANCELLED) << r.error;
  EXPECT_THAT(r.error, HasSubstr("rdzv_join"));
}

TEST_F(RdzvCTest, StatusOfAnUnknownJobIsNotFound) {
  ClientPtr a = NewClient();
  rdzv_job_status status;
  EXPECT_EQ(rdzv_status(a.get(), "nosuchjob", &status), RDZV_NOT_FOUND);
  EXPECT_THAT(rdzv_last_error(), HasSubstr("nosuchjob"));
}

TEST(RdzvCNoServerTest, AnUnreachableServerIsUnavailableAfterTheJoinTimeout) {
  rdzv_client* c = nullptr;
  const std::string endpoint = absl::StrCat("127.0.0.1:", testing::FreeLoopbackPort());
  ASSERT_EQ(rdzv_client_create(endpoint.c_str(), 1, RDZV_AUTH_NONE, nullptr, nullptr, &c), RDZV_OK);
  ClientPtr client(c, rdzv_client_destroy);
  rdzv_join_spec spec = Spec("j", 0, "n0");
  rdzv_assignment out;
  EXPECT_EQ(rdzv_join(c, &spec, nullptr, &out), RDZV_UNAVAILABLE);
  EXPECT_THAT(rdzv_last_error(), HasSubstr(endpoint));
}

// One bad argument per row: the code, and a message that names the argument.
struct BadCall {
  std::string name;
  std::function<rdzv_code(rdzv_client*)> call;
  rdzv_code code;
  std::string names;
};

TEST(RdzvCNoServerTest, BadArgumentsAreRefusedWithTheArgumentNamed) {
  rdzv_client* client = nullptr;
  ASSERT_EQ(rdzv_client_create("127.0.0.1:1", 1, RDZV_AUTH_NONE, nullptr, nullptr, &client),
            RDZV_OK);
  ClientPtr owned(client, rdzv_client_destroy);
  const auto join_with = [](std::function<void(rdzv_join_spec&)> change) {
    return [change](rdzv_client* c) {
      rdzv_join_spec spec = Spec("j", 0, "n0");
      change(spec);
      rdzv_assignment out;
      return rdzv_join(c, &spec, nullptr, &out);
    };
  };
  rdzv_assignment out;
  rdzv_job_status status;
  rdzv_client* never = nullptr;
  const std::vector<BadCall> cases = {
      {"create without out",
       [](rdzv_client*) {
         return rdzv_client_create("h:1", 1, RDZV_AUTH_NONE, nullptr, nullptr, nullptr);
       },
       RDZV_INVALID_ARGUMENT, "out is NULL"},
      {"create with an empty endpoint",
       [&](rdzv_client*) {
         return rdzv_client_create("", 1, RDZV_AUTH_NONE, nullptr, nullptr, &never);
       },
       RDZV_INVALID_ARGUMENT, "endpoint"},
      {"create with a malformed endpoint",
       [&](rdzv_client*) {
         return rdzv_client_create("h:notaport", 1, RDZV_AUTH_NONE, nullptr, nullptr, &never);
       },
       RDZV_INVALID_ARGUMENT, "notaport"},
      {"create with a NaN timeout",
       [&](rdzv_client*) {
         return rdzv_client_create("h:1", std::nan(""), RDZV_AUTH_NONE, nullptr, nullptr, &never);
       },
       RDZV_INVALID_ARGUMENT, "join_timeout_s"},
      {"create with an unknown auth mode",
       [&](rdzv_client*) { return rdzv_client_create("h:1", 1, 9, nullptr, nullptr, &never); },
       RDZV_INVALID_ARGUMENT, "auth is 9"},
      {"token auth without a token file",
       [&](rdzv_client*) {
         return rdzv_client_create("h:1", 1, RDZV_AUTH_TOKEN, nullptr, nullptr, &never);
       },
       RDZV_INVALID_ARGUMENT, "token_file"},
      {"a token file that does not exist",
       [&](rdzv_client*) {
         return rdzv_client_create("h:1", 1, RDZV_AUTH_TOKEN, "/nonexistent/token", nullptr,
                                   &never);
       },
       RDZV_FAILED_PRECONDITION, "/nonexistent/token"},
      {"a TLS CA file that does not exist",
       [&](rdzv_client*) {
         return rdzv_client_create_tls("h:1", 1, RDZV_AUTH_NONE, nullptr, nullptr,
                                       "/nonexistent/ca.pem", nullptr, &never);
       },
       RDZV_FAILED_PRECONDITION, "/nonexistent/ca.pem"},
      {"a TLS server name without a CA",
       [&](rdzv_client*) {
         return rdzv_client_create_tls("h:1", 1, RDZV_AUTH_NONE, nullptr, nullptr, nullptr, "h",
                                       &never);
       },
       RDZV_INVALID_ARGUMENT, "tls_ca_file"},
      {"join without a client",
       [&](rdzv_client*) {
         rdzv_join_spec spec = Spec("j", 0, "n0");
         return rdzv_join(nullptr, &spec, nullptr, &out);
       },
       RDZV_INVALID_ARGUMENT, "client is NULL"},
      {"join without a spec", [&](rdzv_client* c) { return rdzv_join(c, nullptr, nullptr, &out); },
       RDZV_INVALID_ARGUMENT, "spec is NULL"},
      {"join without out",
       [](rdzv_client* c) {
         rdzv_join_spec spec = Spec("j", 0, "n0");
         return rdzv_join(c, &spec, nullptr, nullptr);
       },
       RDZV_INVALID_ARGUMENT, "out is NULL"},
      {"a NULL job id", join_with([](rdzv_join_spec& s) { s.job_id = nullptr; }),
       RDZV_INVALID_ARGUMENT, "spec->job_id"},
      {"min_nodes 0", join_with([](rdzv_join_spec& s) { s.min_nodes = 0; }), RDZV_INVALID_ARGUMENT,
       "spec->min_nodes is 0"},
      {"max_nodes below min_nodes", join_with([](rdzv_join_spec& s) { s.max_nodes = 1; }),
       RDZV_INVALID_ARGUMENT, "spec->max_nodes is 1"},
      {"a node index past the end", join_with([](rdzv_join_spec& s) { s.node_index = 2; }),
       RDZV_INVALID_ARGUMENT, "spec->node_index is 2"},
      {"a negative nproc", join_with([](rdzv_join_spec& s) { s.nproc = -1; }),
       RDZV_INVALID_ARGUMENT, "spec->nproc is -1"},
      {"a master port past 65535", join_with([](rdzv_join_spec& s) { s.master_port = 70000; }),
       RDZV_INVALID_ARGUMENT, "spec->master_port is 70000"},
      {"report without a failure",
       [](rdzv_client* c) { return rdzv_report_failure(c, nullptr, nullptr); },
       RDZV_INVALID_ARGUMENT, "failure is NULL"},
      {"report with a cause a launcher cannot report",
       [](rdzv_client* c) {
         rdzv_failure f{};
         f.cause = RDZV_ABORT_AGENT_LOST;
         return rdzv_report_failure(c, &f, nullptr);
       },
       RDZV_INVALID_ARGUMENT, "failure->cause is 3"},
      {"report before joining",
       [](rdzv_client* c) {
         rdzv_failure f{};
         f.cause = RDZV_ABORT_WORKER_FAILED;
         return rdzv_report_failure(c, &f, nullptr);
       },
       RDZV_FAILED_PRECONDITION, "rdzv_join first"},
      {"leave without a client", [](rdzv_client*) { return rdzv_leave(nullptr); },
       RDZV_INVALID_ARGUMENT, "rdzv_leave: client is NULL"},
      {"cancel without a client", [](rdzv_client*) { return rdzv_cancel(nullptr); },
       RDZV_INVALID_ARGUMENT, "rdzv_cancel: client is NULL"},
      {"status without a job id", [&](rdzv_client* c) { return rdzv_status(c, nullptr, &status); },
       RDZV_INVALID_ARGUMENT, "job_id is NULL"},
      {"status of an empty job id", [&](rdzv_client* c) { return rdzv_status(c, "", &status); },
       RDZV_INVALID_ARGUMENT, "job_id is empty"},
      {"status without out", [](rdzv_client* c) { return rdzv_status(c, "j", nullptr); },
       RDZV_INVALID_ARGUMENT, "out is NULL"},
  };
  for (const BadCall& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(c.call(client), c.code) << rdzv_code_name(c.code);
    EXPECT_THAT(rdzv_last_error(), HasSubstr(c.names));
  }
  EXPECT_EQ(never, nullptr);
}

TEST(RdzvCNoServerTest, TheLastErrorBelongsToTheThreadThatFailed) {
  EXPECT_EQ(rdzv_leave(nullptr), RDZV_INVALID_ARGUMENT);
  std::string seen_elsewhere = "unset";
  std::thread([&] { seen_elsewhere = rdzv_last_error(); }).join();
  EXPECT_EQ(seen_elsewhere, "");
  EXPECT_THAT(rdzv_last_error(), HasSubstr("rdzv_leave"));
}

}  // namespace
}  // namespace rdzv
