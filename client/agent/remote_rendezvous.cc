// The agent's rendezvous in an rdzvd, through rdzv::Client.
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "client/agent/agent_rendezvous.h"

namespace rdzv {
namespace {

class RemoteRendezvous final : public AgentRendezvous {
 public:
  RemoteRendezvous(std::unique_ptr<Client> client, Post post)
      : client_(std::move(client)), post_(std::move(post)), joiner_([this] { RunJoins(); }) {}

  ~RemoteRendezvous() override {
    client_->Cancel();  // a join in progress returns at once
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    wake_.notify_one();
    joiner_.join();
  }

  void Join(const JoinSpec& spec, absl::Duration timeout, Handlers events,
            std::function<void(absl::StatusOr<AssignmentEvent>)> done) override {
    // The join before this one, if it still waits, makes way.
    client_->CancelJoin();
    // The client calls them on gRPC threads; the agent hears them on its loop.
    const Handlers handlers = {.on_progress = Posted(std::move(events.on_progress)),
                               .on_abort = Posted(std::move(events.on_abort)),
                               .on_lost = Posted(std::move(events.on_lost)),
                               .on_released = PostedCall(std::move(events.on_released))};
    {
      std::lock_guard<std::mutex> lock(mu_);
      joins_.push_back([this, spec, timeout, handlers, done = std::move(done)] {
        absl::StatusOr<AssignmentEvent> result = client_->Join(spec, handlers, timeout);
        post_([done, result = std::move(result)] { done(result); });
      });
    }
    wake_.notify_one();
  }

  void ReportFailure(const FailureInfo& failure,
                     std::function<void(absl::StatusOr<AbortEvent>)> done) override {
    client_->ReportFailureAsync(
        failure, [post = post_, done = std::move(done)](absl::StatusOr<AbortEvent> result) {
          post([done, result = std::move(result)] { done(result); });
        });
  }

  void Leave(std::function<void(absl::Status)> done) override {
    client_->LeaveAsync([post = post_, done = std::move(done)](absl::Status status) {
      post([done, status = std::move(status)] { done(status); });
    });
  }

  // The agent is done with the server: a report or departure it still waits for is given up.
  void Cancel() override {
    client_->Cancel();
    client_->AbandonCalls();
  }

  // The server the client talks to now: the first of a list, or the one it moved to.
  std::string endpoint() const override { return client_->endpoint(); }
  std::string relayed_server() const override { return client_->relayed_server(); }

 private:
  // `f`, run through post_; empty for an empty `f`.
  template <typename Arg>
  std::function<void(const Arg&)> Posted(std::function<void(const Arg&)> f) const {
    if (!f) return nullptr;
    return [post = post_, f = std::move(f)](const Arg& arg) { post([f, arg] { f(arg); }); };
  }
  std::function<void()> PostedCall(std::function<void()> f) const {
    if (!f) return nullptr;
    return [post = post_, f = std::move(f)] { post(f); };
  }

  // Client::Join blocks until the round completes: joins run here, one after another, and
  // report back through post_.
  void RunJoins() {
    for (;;) {
      std::function<void()> join;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [this] { return stopping_ || !joins_.empty(); });
        if (stopping_) return;
        join = std::move(joins_.front());
        joins_.pop_front();
      }
      join();
    }
  }

  const std::unique_ptr<Client> client_;
  const Post post_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> joins_;
  bool stopping_ = false;
  std::thread joiner_;  // last: it starts running in the constructor
};

}  // namespace

absl::StatusOr<std::unique_ptr<AgentRendezvous>> NewRemoteRendezvous(ClientOptions options,
                                                                     AgentRendezvous::Post post) {
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(std::move(options));
  if (!client.ok()) return client.status();
  return std::make_unique<RemoteRendezvous>(*std::move(client), std::move(post));
}

}  // namespace rdzv
