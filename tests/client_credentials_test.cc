// Where librdzv makes the MUNGE credentials of its non-blocking calls: not on the caller's thread
// (the agent's event loop), which must not wait for munged. A client joins a one-agent job on a
// real rdzvd through a private munged; then munged is frozen (SIGSTOP): it accepts connections
// and answers none. ReportFailureAsync and LeaveAsync must return at once; their `done` runs once
// munged is back (SIGCONT) and the call has been made.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "common/auth.h"
#include "tests/testing/rdzvd_fixture.h"
#include "tests/testing/subprocess.h"

namespace rdzv {
namespace {

using testing::Subprocess;
using testing::SubprocessOptions;

constexpr absl::Duration kWait = absl::Seconds(60);

class ClientCredentialsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // As rdzv-agent does: libmunge writes to munged's socket, which must not kill the test.
    signal(SIGPIPE, SIG_IGN);
    socket_ = dir_.File("munge.socket");
    const std::string key = dir_.File("munge.key");
    {
      std::ifstream random("/dev/urandom", std::ios::binary);
      std::string bytes(1024, '\0');
      random.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      std::ofstream(key, std::ios::binary) << bytes;
    }
    ASSERT_EQ(chmod(key.c_str(), 0600), 0);
    munged_.emplace(SubprocessOptions{
        .argv = {"munged", "--foreground", "--force", "--socket=" + socket_, "--key-file=" + key,
                 "--pid-file=" + dir_.File("munged.pid"), "--log-file=" + dir_.File("munged.log"),
                 "--seed-file=" + dir_.File("munged.seed")}});
    for (int i = 0; i < 100 && !MungeWorks(socket_); ++i) usleep(50'000);
    ASSERT_TRUE(MungeWorks(socket_)) << munged_->Stderr();
    rdzvd_.emplace(std::vector<std::string>{"--auth", "munge", "--munge-socket", socket_},
                   SubprocessOptions{.unset_env_prefixes = {"RDZV_", "SLURM_"}}, kWait);
    ASSERT_TRUE(rdzvd_->started());
    endpoint_ = rdzvd_->endpoint();
  }

  void TearDown() override {
    if (munged_) munged_->Signal(SIGCONT);  // whatever the test left it in
  }

  // Thaws munged after `after`, from another thread: should a call block on munged after all,
  // the test fails instead of hanging.
  std::thread ThawLater(absl::Duration after) {
    return std::thread([this, after] {
      absl::SleepFor(after);
      munged_->Signal(SIGCONT);
    });
  }

  // A client that has joined job `job` alone, through munged.
  std::unique_ptr<Client> JoinedClient(const std::string& job) {
    ClientOptions options;
    options.endpoint = endpoint_;
    options.auth.mode = ClientAuth::Mode::kMunge;
    options.auth.munge_socket = socket_;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return nullptr;
    JoinSpec spec;
    spec.job_id = job;
    spec.agent.agent_id = job + "-agent";
    spec.agent.host = "node0";
    spec.agent.nproc = 1;
    spec.min_agents = spec.max_agents = 1;
    spec.addresses = {"127.0.0.1"};
    spec.master_port = 29500;
    absl::StatusOr<AssignmentEvent> a = (*client)->Join(spec, {});
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? *std::move(client) : nullptr;
  }

  testing::ScopedTempDir dir_;
  std::string socket_;
  std::string endpoint_;
  std::optional<Subprocess> munged_;
  std::optional<testing::RdzvdProcess> rdzvd_;
};

TEST_F(ClientCredentialsTest, LeaveAsyncReturnsWhileMungedHasNotAnswered) {
  std::unique_ptr<Client> client = JoinedClient("leave");
  ASSERT_NE(client, nullptr);
  munged_->Signal(SIGSTOP);
  absl::Notification done;
  absl::Status status = absl::UnknownError("not called");
  std::thread thaw = ThawLater(absl::Seconds(2));
  const absl::Time start = absl::Now();
  client->LeaveAsync([&](absl::Status s) {
    status = std::move(s);
    done.Notify();
  });
  // Returned at once, and the departure waits for its credential elsewhere.
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_FALSE(done.HasBeenNotified());
  thaw.join();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(kWait));
  EXPECT_TRUE(status.ok()) << status;
}

TEST_F(ClientCredentialsTest, ReportFailureAsyncReturnsBeforeMungedAnswers) {
  std::unique_ptr<Client> client = JoinedClient("report");
  ASSERT_NE(client, nullptr);
  munged_->Signal(SIGSTOP);
  absl::Notification done;
  absl::StatusOr<AbortEvent> result = absl::UnknownError("not called");
  FailureInfo failure;
  failure.cause = AbortCause::kWorkerFailed;
  failure.exit_code = 3;
  failure.host = "node0";
  std::thread thaw = ThawLater(absl::Seconds(2));
  const absl::Time start = absl::Now();
  client->ReportFailureAsync(failure, [&](absl::StatusOr<AbortEvent> r) {
    result = std::move(r);
    done.Notify();
  });
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_FALSE(done.HasBeenNotified());
  thaw.join();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(kWait));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 3);
}

// A client destroyed while a departure still waits for munged runs its `done` once, after munged
// answers: the destructor finishes what was posted.
TEST_F(ClientCredentialsTest, DestroyingTheClientFinishesWhatWasPosted) {
  std::unique_ptr<Client> client = JoinedClient("destroy");
  ASSERT_NE(client, nullptr);
  munged_->Signal(SIGSTOP);
  int calls = 0;
  client->LeaveAsync([&](absl::Status) { ++calls; });
  std::thread thaw = ThawLater(absl::Milliseconds(300));
  client.reset();
  thaw.join();
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace rdzv
