// Where librdzv makes the MUNGE credentials of its non-blocking calls: not on the caller's thread
// (the agent's event loop), which must not wait for munged. A munged that accepts the connection
// and does not answer holds the credential back; the call has returned by then, and its `done`
// reports munged's failure once the connection is dropped.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "tests/testing/subprocess.h"

namespace rdzv {
namespace {

// A UNIX socket that listens and never answers: a munged that hangs.
class SilentSocket {
 public:
  explicit SilentSocket(const std::string& path) : fd_(socket(AF_UNIX, SOCK_STREAM, 0)) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    path.copy(addr.sun_path, sizeof(addr.sun_path) - 1);
    EXPECT_EQ(bind(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd_, 16), 0);
  }
  ~SilentSocket() { close(fd_); }

  // Waits up to `timeout` for a connection and drops it; false when none came.
  bool DropOne(absl::Duration timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) != 1) return false;
    const int conn = accept(fd_, nullptr, nullptr);
    if (conn < 0) return false;
    close(conn);
    return true;
  }

 private:
  const int fd_;
};

class ClientCredentialsTest : public ::testing::Test {
 protected:
  // As rdzv-agent does: libmunge writes to munged's socket, which this test's munged drops.
  void SetUp() override { signal(SIGPIPE, SIG_IGN); }

  std::unique_ptr<Client> MungeClient(const std::string& socket) {
    ClientOptions options;
    options.endpoint = "127.0.0.1:1";  // never reached: no credential, no call
    options.auth.mode = ClientAuth::Mode::kMunge;
    options.auth.munge_socket = socket;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  testing::ScopedTempDir dir_;
};

TEST_F(ClientCredentialsTest, LeaveAsyncReturnsWhileMungedHasNotAnswered) {
  const std::string path = dir_.File("munge.socket");
  SilentSocket munged(path);
  std::unique_ptr<Client> client = MungeClient(path);
  ASSERT_NE(client, nullptr);
  absl::Notification done;
  absl::Status status;
  client->LeaveAsync([&](absl::Status s) {
    status = std::move(s);
    done.Notify();
  });
  EXPECT_FALSE(done.HasBeenNotified());
  // The credential is being asked for, elsewhere.
  ASSERT_TRUE(munged.DropOne(absl::Seconds(60)));
  while (!done.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
    munged.DropOne(absl::Milliseconds(100));  // libmunge tries again; each try is dropped
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "is munged running")) << status;
}

TEST_F(ClientCredentialsTest, ReportFailureAsyncReturnsWhileMungedHasNotAnswered) {
  const std::string path = dir_.File("munge.socket");
  SilentSocket munged(path);
  std::unique_ptr<Client> client = MungeClient(path);
  ASSERT_NE(client, nullptr);
  absl::Notification done;
  absl::Status status;
  FailureInfo failure;
  failure.exit_code = 3;
  client->ReportFailureAsync(failure, [&](absl::StatusOr<AbortEvent> r) {
    status = r.status();
    done.Notify();
  });
  EXPECT_FALSE(done.HasBeenNotified());
  ASSERT_TRUE(munged.DropOne(absl::Seconds(60)));
  while (!done.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
    munged.DropOne(absl::Milliseconds(100));
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
}

// A client destroyed right after the call still runs `done`, once.
TEST_F(ClientCredentialsTest, DestroyingTheClientFinishesWhatWasPosted) {
  const std::string path = dir_.File("absent.socket");
  int calls = 0;
  {
    std::unique_ptr<Client> client = MungeClient(path);
    ASSERT_NE(client, nullptr);
    client->LeaveAsync([&](absl::Status s) {
      EXPECT_FALSE(s.ok());
      ++calls;
    });
  }
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace rdzv
