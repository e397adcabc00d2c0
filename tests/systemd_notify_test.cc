// NotifySystemd: the datagram a Type=notify service sends, received on a real unix socket.
#include "server/systemd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace rdzv {
namespace {

// A datagram socket bound at `path` ('@' for an abstract name), as systemd's.
class Receiver {
 public:
  explicit Receiver(const std::string& path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, path.data(), path.size());
    if (path[0] == '@') address.sun_path[0] = '\0';
    bound_ = bind(fd_, reinterpret_cast<sockaddr*>(&address),
                  static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size())) == 0;
  }
  ~Receiver() { close(fd_); }
  bool bound() const { return bound_; }
  std::string Receive() {
    char buffer[256];
    const ssize_t n = recv(fd_, buffer, sizeof(buffer), MSG_DONTWAIT);
    return n > 0 ? std::string(buffer, n) : "";
  }

 private:
  int fd_ = -1;
  bool bound_ = false;
};

TEST(SystemdNotifyTest, SendsTheStateToAPathAndToAnAbstractSocket) {
  char dir_template[] = "/tmp/rdzv-notify-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string path = absl::StrCat(dir_template, "/notify");
  {
    Receiver receiver(path);
    ASSERT_TRUE(receiver.bound());
    ASSERT_TRUE(NotifySystemd(path, "READY=1").ok());
    EXPECT_EQ(receiver.Receive(), "READY=1");
  }
  unlink(path.c_str());
  rmdir(dir_template);

  const std::string abstract = absl::StrCat("@rdzv-notify-test-", getpid());
  Receiver receiver(abstract);
  ASSERT_TRUE(receiver.bound());
  ASSERT_TRUE(NotifySystemd(abstract, "STOPPING=1").ok());
  EXPECT_EQ(receiver.Receive(), "STOPPING=1");
}

TEST(SystemdNotifyTest, NoSocketIsNothingToDoAndABadOneIsAnError) {
  EXPECT_TRUE(NotifySystemd("", "READY=1").ok());
  EXPECT_EQ(NotifySystemd("relative/path", "READY=1").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NotifySystemd(std::string(200, '/'), "READY=1").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NotifySystemd("/nonexistent/rdzv/notify", "READY=1").code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace rdzv
