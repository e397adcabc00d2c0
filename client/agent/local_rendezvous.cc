// The agent's rendezvous in its own process (--standalone): a RendezvousState of its own, with
// no server, port or gRPC thread.
#include <variant>

#include "client/agent/agent_rendezvous.h"
#include "common/core/rendezvous_state.h"

namespace rdzv {
namespace {

class LocalRendezvous final : public AgentRendezvous {
 public:
  LocalRendezvous(Clock clock, Post post) : clock_(std::move(clock)), post_(std::move(post)) {}

  void Join(const JoinSpec& spec, absl::Duration /*timeout*/, Handlers events,
            std::function<void(absl::StatusOr<AssignmentEvent>)> done) override {
    if (cancelled_) {
      post_([done] { done(absl::CancelledError("join cancelled")); });
      return;
    }
    EndPendingJoin(absl::CancelledError("replaced by a newer join"));
    job_id_ = spec.job_id;
    agent_id_ = spec.agent.agent_id;
    stream_ = ++last_stream_;
    events_ = std::move(events);
    pending_join_ = std::move(done);
    Decisions d;
    state_.Join(clock_(), stream_, spec, d);
    Dispatch(d);
  }

  void ReportFailure(const FailureInfo& failure,
                     std::function<void(absl::StatusOr<AbortEvent>)> done) override {
    Decisions d;
    absl::StatusOr<AbortEvent> first =
        state_.ReportFailure(clock_(), job_id_, agent_id_, failure, d);
    Dispatch(d);
    post_([done, first = std::move(first)] { done(first); });
  }

  void Leave(std::function<void(absl::Status)> done) override {
    Decisions d;
    absl::Status left = state_.Leave(clock_(), job_id_, agent_id_, d);
    Dispatch(d);
    post_([done, left = std::move(left)] { done(left); });
  }

  void Cancel() override {
    cancelled_ = true;
    EndPendingJoin(absl::CancelledError("join cancelled"));
    events_ = {};
  }

  std::string endpoint() const override { return ""; }

 private:
  void EndPendingJoin(absl::Status status) {
    if (!pending_join_) return;
    post_([done = std::move(pending_join_), status = std::move(status)] { done(status); });
    pending_join_ = nullptr;
  }

  // What the state decided for this agent's stream, as the remote client would report it.
  void Dispatch(const Decisions& d) {
    for (const Decisions::Send& send : d.sends) {
      if (send.stream != stream_) continue;
      const Event event = d.EventOf(send);
      if (const auto* a = std::get_if<AssignmentEvent>(&event)) {
        if (pending_join_) {
          post_([done = std::move(pending_join_), a = *a] { done(a); });
          pending_join_ = nullptr;
        }
      } else if (const auto* p = std::get_if<ProgressEvent>(&event)) {
        if (events_.on_progress) post_([f = events_.on_progress, p = *p] { f(p); });
      } else if (const auto* abort = std::get_if<AbortEvent>(&event)) {
        if (events_.on_abort) post_([f = events_.on_abort, a = *abort] { f(a); });
        EndPendingJoin(absl::AbortedError(abort->reason));
      }
    }
    for (const Decisions::Close& close : d.closes) {
      if (close.stream != stream_) continue;
      EndPendingJoin(close.status.ok() ? absl::AbortedError("the job ended without this agent")
                                       : close.status);
    }
  }

  const Clock clock_;
  const Post post_;
  RendezvousState state_;
  std::string job_id_;
  std::string agent_id_;
  StreamId stream_ = 0;
  StreamId last_stream_ = 0;
  Handlers events_;
  std::function<void(absl::StatusOr<AssignmentEvent>)> pending_join_;
  bool cancelled_ = false;
};

}  // namespace

std::unique_ptr<AgentRendezvous> NewLocalRendezvous(Clock clock, AgentRendezvous::Post post) {
  return std::make_unique<LocalRendezvous>(std::move(clock), std::move(post));
}

}  // namespace rdzv
