// A TCP proxy on loopback whose connections a test can break, to stand for a network path
// between an agent and rdzvd that fails: replies that stop arriving, connections reset.
//
//   rdzv::testing::TcpProxy proxy(rdzvd_port);
//   ... the agent connects to 127.0.0.1:proxy.port() ...
//   proxy.DropReplies();  // what rdzvd sends now never arrives
//   proxy.ResetAll();     // both ends see a reset; new connections are forwarded as before
//   proxy.Cut();          // every connection reset, now and from now on
//
// One thread forwards every connection; the destructor closes them all and stops it.
// Thread-safe.
#ifndef RDZV_TESTS_TESTING_TCP_PROXY_H_
#define RDZV_TESTS_TESTING_TCP_PROXY_H_

#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace rdzv::testing {

// A port of 127.0.0.1 that is taken and listens, and never accepts: a connection to it is made
// by the kernel and then hears nothing (a frozen server), and a server cannot listen there.
class SilentListener {
 public:
  SilentListener();
  ~SilentListener();
  SilentListener(const SilentListener&) = delete;
  SilentListener& operator=(const SilentListener&) = delete;

  // 0 when it could not listen (a gtest failure says why).
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

class TcpProxy {
 public:
  // Listens on a free port of 127.0.0.1 and forwards each connection to 127.0.0.1:`target_port`.
  explicit TcpProxy(int target_port);
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const { return port_; }

  // From now on, bytes from the target on the connections open now are dropped: the client
  // hears nothing more, while what it sends still arrives.
  void DropReplies();

  // Resets every open connection on both sides (RST); connections made afterwards are forwarded
  // normally. Returns once the resets are sent.
  void ResetAll();

  // Resets every open connection, and from now on every new one at once: the path to the target
  // is cut for good. Returns once the resets are sent.
  void Cut();

 private:
  struct Connection {
    int client = -1;
    int target = -1;
    bool drop_replies = false;
  };
  enum class Command { kNone, kDropReplies, kResetAll, kCut };

  void Run();
  // Runs `command` on the proxy's thread and waits until it has.
  void Do(Command command);
  void Close(Connection& c, bool reset);

  const int target_port_;
  int listener_ = -1;
  int port_ = 0;
  int wake_[2] = {-1, -1};               // a pipe: the thread's poll wakes up for a command
  std::vector<Connection> connections_;  // the proxy thread's own
  bool cut_ = false;                     // the proxy thread's own: Cut() was called
  absl::Mutex mu_;
  Command command_ ABSL_GUARDED_BY(mu_) = Command::kNone;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace rdzv::testing

#endif  // RDZV_TESTS_TESTING_TCP_PROXY_H_
