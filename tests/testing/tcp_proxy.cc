#include "tests/testing/tcp_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "gtest/gtest.h"

namespace rdzv::testing {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

// Writes all of `data` to the blocking socket `fd`; false when the peer is gone.
bool WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

SilentListener::SilentListener() {
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr = Loopback(0);
  socklen_t len = sizeof(addr);
  if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd_, 16) != 0 || getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ADD_FAILURE() << "cannot listen on 127.0.0.1: " << strerror(errno);
    return;
  }
  port_ = ntohs(addr.sin_port);
}

SilentListener::~SilentListener() {
  if (fd_ >= 0) close(fd_);
}

TcpProxy::TcpProxy(int target_port) : target_port_(target_port) {
  listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr = Loopback(0);
  socklen_t len = sizeof(addr);
  if (listener_ < 0 || bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener_, 64) != 0 ||
      getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      pipe2(wake_, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "the proxy cannot listen: " << strerror(errno);
    return;
  }
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { Run(); });
}

TcpProxy::~TcpProxy() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (wake_[1] >= 0) (void)!write(wake_[1], "x", 1);
  if (thread_.joinable()) thread_.join();
  for (Connection& c : connections_) Close(c, false);
  for (int fd : {listener_, wake_[0], wake_[1]}) {
    if (fd >= 0) close(fd);
  }
}

void TcpProxy::DropReplies() { Do(Command::kDropReplies); }

void TcpProxy::ResetAll() { Do(Command::kResetAll); }

void TcpProxy::Cut() { Do(Command::kCut); }

void TcpProxy::Do(Command command) {
  absl::MutexLock lock(&mu_);
  command_ = command;
  (void)!write(wake_[1], "x", 1);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return command_ == Command::kNone; };
  mu_.Await(absl::Condition(&done));
}

void TcpProxy::Close(Connection& c, bool reset) {
  for (int* fd : {&c.client, &c.target}) {
    if (*fd < 0) continue;
    if (reset) {
      const linger abort{1, 0};  // close with RST, as a failing path does
      setsockopt(*fd, SOL_SOCKET, SO_LINGER, &abort, sizeof(abort));
    }
    close(*fd);
    *fd = -1;
  }
}

void TcpProxy::Run() {
  char buffer[16 * 1024];
  for (;;) {
    std::vector<pollfd> fds = {{wake_[0], POLLIN, 0}, {listener_, POLLIN, 0}};
    for (const Connection& c : connections_) {
      fds.push_back({c.client, POLLIN, 0});
      fds.push_back({c.target, POLLIN, 0});
    }
    if (poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
    if (fds[0].revents != 0) {
      (void)!read(wake_[0], buffer, sizeof(buffer));
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      if (command_ == Command::kDropReplies) {
        for (Connection& c : connections_) c.drop_replies = true;
      } else if (command_ == Command::kResetAll || command_ == Command::kCut) {
        for (Connection& c : connections_) Close(c, true);
        connections_.clear();
        if (command_ == Command::kCut) cut_ = true;
      }
      command_ = Command::kNone;
      continue;  // the connections may have changed under `fds`
    }
    const size_t polled = connections_.size();
    if (fds[1].revents & POLLIN) {
      Connection c;
      c.client = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      c.target = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      const sockaddr_in target = Loopback(target_port_);
      if (cut_) {
        Close(c, true);
      } else if (c.client >= 0 && c.target >= 0 &&
                 connect(c.target, reinterpret_cast<const sockaddr*>(&target), sizeof(target)) ==
                     0) {
        connections_.push_back(c);
      } else {
        Close(c, false);
      }
    }
    for (size_t i = 0; i < polled; ++i) {
      Connection& c = connections_[i];
      bool gone = false;
      for (const bool from_client : {true, false}) {
        const pollfd& p = fds[2 + 2 * i + (from_client ? 0 : 1)];
        if (gone || p.revents == 0) continue;
        const ssize_t n = read(p.fd, buffer, sizeof(buffer));
        if (n <= 0) {
          gone = true;
        } else if (from_client) {
          gone = !WriteAll(c.target, buffer, static_cast<size_t>(n));
        } else if (!c.drop_replies) {
          gone = !WriteAll(c.client, buffer, static_cast<size_t>(n));
        }
      }
      if (gone) Close(c, false);
    }
    std::erase_if(connections_, [](const Connection& c) { return c.client < 0; });
  }
}

}  // namespace rdzv::testing
