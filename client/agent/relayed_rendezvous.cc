// An agent's rendezvous through its node's relay, or directly when there is none.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/agent/agent_rendezvous.h"
#include "client/agent/core/relay_members.h"
#include "client/agent/relay_socket.h"
#include "common/net.h"

namespace rdzv {
namespace {

class RelayedRendezvous final : public AgentRendezvous {
 public:
  RelayedRendezvous(RelayRoute route, absl::Duration wait_for_relay,
                    std::unique_ptr<AgentRendezvous> local, std::unique_ptr<AgentRendezvous> direct,
                    Post post)
      : route_(std::move(route)),
        wait_for_relay_(wait_for_relay),
        local_(std::move(local)),
        direct_(std::move(direct)),
        post_(std::move(post)),
        watcher_([this] { Watch(); }) {}

  ~RelayedRendezvous() override {
    stopping_ = true;
    if (waiter_.joinable()) waiter_.join();
    watcher_.join();
  }

  void Join(const JoinSpec& spec, absl::Duration timeout, Handlers events,
            std::function<void(absl::StatusOr<AssignmentEvent>)> done) override {
    timeout_ = timeout;
    if (!first_) {
      StartJoin(!relay_gone_ && route_.listening(), spec, absl::Now() + timeout, std::move(events),
                std::move(done));
      return;
    }
    first_ = false;
    // The node's first task may not listen yet: wait for it, off the agent's loop.
    waiter_ = std::thread(
        [this, spec, timeout, events = std::move(events), done = std::move(done)]() mutable {
          const absl::Time deadline = absl::Now() + timeout;
          const absl::Time until = absl::Now() + wait_for_relay_;
          bool up = route_.listening();
          while (!up && !stopping_ && absl::Now() < until) {
            absl::SleepFor(std::min(route_.watch_every, absl::Milliseconds(100)));
            up = route_.listening();
          }
          if (stopping_) return;
          post_([this, up, spec, deadline, events = std::move(events),
                 done = std::move(done)]() mutable {
            if (!up) {
              spdlog::info("no relay listens at {} after {}: joining the server directly",
                           route_.name, absl::FormatDuration(wait_for_relay_));
            }
            StartJoin(up, spec, deadline, std::move(events), std::move(done));
          });
        });
  }

  void ReportFailure(const FailureInfo& failure,
                     std::function<void(absl::StatusOr<AbortEvent>)> done) override {
    Current().ReportFailure(failure, std::move(done));
  }

  void Leave(std::function<void(absl::Status)> done) override { Current().Leave(std::move(done)); }

  void Cancel() override {
    stopping_ = true;
    local_->Cancel();
    direct_->Cancel();
  }

  // The server in use: the one the relay reached, when the last join went through it and it
  // said (it may be another of the list than the first), else the direct route's.
  std::string endpoint() const override {
    if (current_ == local_.get()) {
      if (std::string reached = local_->relayed_server(); !reached.empty()) return reached;
    }
    return direct_->endpoint();
  }

 private:
  AgentRendezvous& Current() { return current_ != nullptr ? *current_ : *direct_; }

  // Joins through the relay, or directly. A join through the relay is watched: should the relay
  // stop listening before it completes (its task died), it is cancelled and made directly.
  void StartJoin(bool via_relay, const JoinSpec& spec, absl::Time deadline, Handlers events,
                 std::function<void(absl::StatusOr<AssignmentEvent>)> done) {
    const absl::Duration left = std::max(deadline - absl::Now(), absl::Seconds(1));
    if (!via_relay) {
      current_ = direct_.get();
      // A join that went directly after some time with the relay: its timeout is the one the
      // user set, not what was left of it.
      direct_->Join(spec, left, std::move(events),
                    [done = std::move(done),
                     timeout = timeout_](absl::StatusOr<AssignmentEvent> result) mutable {
                      if (absl::IsDeadlineExceeded(result.status()) &&
                          absl::StartsWith(result.status().message(), kDidNotComplete)) {
                        result = absl::DeadlineExceededError(
                            absl::StrCat(kDidNotComplete, absl::FormatDuration(timeout)));
                      }
                      done(std::move(result));
                    });
      return;
    }
    current_ = local_.get();
    watching_ = true;
    Handlers through_relay = events;
    if (events.on_lost) {
      // Runs on the agent's loop, before the agent rejoins.
      through_relay.on_lost = [this, on_lost = events.on_lost](const absl::Status& status) {
        if (!absl::StartsWith(status.message(), kRelaySaid) && !relay_gone_) {
          relay_gone_ = true;
          spdlog::warn("lost the relay at {} ({}): rejoining the server directly", route_.name,
                       std::string(status.message()));
        }
        on_lost(status);
      };
    }
    local_->Join(spec, left, through_relay,
                 [this, spec, deadline, events,
                  done = std::move(done)](absl::StatusOr<AssignmentEvent> result) mutable {
                   watching_ = false;
                   if (!result.ok() && relay_gone_) {
                     spdlog::warn("the relay at {} is gone: joining the server directly",
                                  route_.name);
                     StartJoin(false, spec, deadline, std::move(events), std::move(done));
                     return;
                   }
                   done(std::move(result));
                 });
  }

  // While a join through the relay is in progress, checks that the relay still listens.
  void Watch() {
    while (!stopping_) {
      absl::SleepFor(route_.watch_every);
      if (watching_ && !relay_gone_ && !route_.listening()) {
        relay_gone_ = true;
        local_->Cancel();  // the join in progress returns, and goes directly
      }
    }
  }

  const RelayRoute route_;
  const absl::Duration wait_for_relay_;
  const std::unique_ptr<AgentRendezvous> local_;
  const std::unique_ptr<AgentRendezvous> direct_;
  const Post post_;
  AgentRendezvous* current_ = nullptr;  // the one the latest Join went through
  absl::Duration timeout_;              // the latest Join's
  bool first_ = true;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> watching_{false};
  std::atomic<bool> relay_gone_{false};  // for good: every later join goes directly
  std::thread waiter_;
  std::thread watcher_;  // last: it starts running in the constructor
};

}  // namespace

RelayRoute NodeRelayRoute(const std::string& socket_path, const ClientOptions& direct) {
  RelayRoute route;
  route.name = socket_path;
  ClientOptions& local = route.options;
  local.endpoint = absl::StrCat("unix:", socket_path);
  local.join_timeout = direct.join_timeout;
  local.rpc_timeout = direct.rpc_timeout;
  local.backoff = direct.backoff;
  // The relay's own socket, in a directory only this user may enter, vouches for both ends.
  local.auth.mode = ClientAuth::Mode::kNone;
  // A relay whose task froze is noticed within 3 s: its pings cost nothing on a local socket.
  local.keepalive_time = absl::Seconds(1);
  local.keepalive_timeout = absl::Seconds(2);
  route.listening = [socket_path] { return RelayListening(socket_path); };
  return route;
}

RelayRoute GroupRelayRoute(const std::string& node, const std::vector<std::string>& endpoints,
                           const ClientOptions& direct) {
  RelayRoute route;
  route.name = absl::StrCat(node, " (", endpoints.empty() ? "" : endpoints.front(), ")");
  ClientOptions& relay = route.options;
  if (!endpoints.empty()) {
    relay.endpoint = endpoints.front();
    relay.alternate_endpoints.assign(endpoints.begin() + 1, endpoints.end());
  }
  relay.join_timeout = direct.join_timeout;
  relay.rpc_timeout = direct.rpc_timeout;
  relay.backoff = direct.backoff;
  // The relay is an agent of this job: it proves itself as this user's, or with the job's token.
  relay.auth = direct.auth;
  relay.auth.server_uid = getuid();
  // A relay whose node goes away is noticed within 2 s; a relay has a few dozen callers at most.
  relay.keepalive_time = absl::Seconds(1);
  relay.keepalive_timeout = absl::Seconds(1);
  route.listening = [endpoints] { return AnyListening(endpoints, absl::Milliseconds(500)); };
  // Checks cost the relay a connection each: once a second is enough to go directly in time.
  route.watch_every = absl::Seconds(1);
  return route;
}

absl::StatusOr<std::unique_ptr<AgentRendezvous>> NewRelayedRendezvous(RelayRoute route,
                                                                      absl::Duration wait_for_relay,
                                                                      ClientOptions direct,
                                                                      AgentRendezvous::Post post) {
  absl::StatusOr<std::unique_ptr<AgentRendezvous>> through_relay =
      NewRemoteRendezvous(route.options, post);
  if (!through_relay.ok()) return through_relay.status();
  absl::StatusOr<std::unique_ptr<AgentRendezvous>> directly =
      NewRemoteRendezvous(std::move(direct), post);
  if (!directly.ok()) return directly.status();
  return std::make_unique<RelayedRendezvous>(std::move(route), wait_for_relay,
                                             *std::move(through_relay), *std::move(directly),
                                             std::move(post));
}

}  // namespace rdzv
