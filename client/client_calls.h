// The calls a Client has in flight: its Join streams (Client::JoinCall, a JoinStream) and the
// bookkeeping that keeps the channel alive until the last of them is gone. Internal to
// client.cc; not installed.
//
// A JoinCall is used from the thread that joins and from gRPC's callback threads: its state is
// guarded by its own mutex. LiveCalls is shared by a Client and its calls.
#ifndef RDZV_CLIENT_CLIENT_CALLS_H_
#define RDZV_CLIENT_CLIENT_CALLS_H_

#include <grpcpp/client_context.h>

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "client/join_stream.h"
#include "common/grpc_status.h"
#include "common/proto_convert.h"
#include "rdzv/v1/rdzv.grpc.pb.h"

namespace rdzv {
namespace internal {

// The Join streams of one Client that still exist. A stream's ClientContext holds the channel,
// and a stream may end on a gRPC callback thread; if that dropped the last reference to the
// channel, grpc++ would shut down its callback queue from that very thread, join the thread
// itself and abort the process. So ~Client waits until none is left before the channel goes.
struct LiveCalls {
  absl::Mutex mu;
  int count ABSL_GUARDED_BY(mu) = 0;
  // The unary calls in flight (weak: a call is its callback's to end), and whether they and any
  // made later are to be ended at once.
  absl::flat_hash_map<const grpc::ClientContext*, std::weak_ptr<grpc::ClientContext>> unary
      ABSL_GUARDED_BY(mu);
  bool abandoned ABSL_GUARDED_BY(mu) = false;
};

// Counts in LiveCalls for as long as it exists.
class LiveCallToken {
 public:
  explicit LiveCallToken(std::shared_ptr<LiveCalls> calls) : calls_(std::move(calls)) {
    absl::MutexLock lock(&calls_->mu);
    ++calls_->count;
  }
  ~LiveCallToken() {
    absl::MutexLock lock(&calls_->mu);
    --calls_->count;
  }
  LiveCallToken(const LiveCallToken&) = delete;
  LiveCallToken& operator=(const LiveCallToken&) = delete;

 private:
  const std::shared_ptr<LiveCalls> calls_;
};

// One unary call made with the callback API: it owns what the call needs until its callback
// has run. The token is the first member, so that it goes last, after the context has let go
// of the channel.
template <typename Request, typename Response>
struct UnaryCall {
  explicit UnaryCall(std::shared_ptr<LiveCalls> calls) : token(calls), calls_(std::move(calls)) {}
  ~UnaryCall() {
    absl::MutexLock lock(&calls_->mu);
    calls_->unary.erase(&context);
  }
  UnaryCall(const UnaryCall&) = delete;
  UnaryCall& operator=(const UnaryCall&) = delete;

  // Made so, a call can be ended by Client::AbandonCalls while it waits for the server.
  static std::shared_ptr<UnaryCall> Make(std::shared_ptr<LiveCalls> calls) {
    auto call = std::make_shared<UnaryCall>(calls);
    absl::MutexLock lock(&calls->mu);
    calls->unary[&call->context] = std::shared_ptr<grpc::ClientContext>(call, &call->context);
    // gRPC keeps a cancel made before the call starts and applies it then.
    if (calls->abandoned) call->context.TryCancel();
    return call;
  }

  LiveCallToken token;
  grpc::ClientContext context;
  Request request;
  Response response;

 private:
  const std::shared_ptr<LiveCalls> calls_;
};

// Runs functions one after another on a thread of its own, started when one arrives and ended
// when none is left, so that a client that never needs it holds no thread. ReportFailureAsync and
// LeaveAsync make their MUNGE credential here: munged answers over a socket, and their caller is
// often an event loop that must not wait for it.
class CallThread {
 public:
  CallThread() = default;
  ~CallThread() { Drain(); }
  CallThread(const CallThread&) = delete;
  CallThread& operator=(const CallThread&) = delete;

  void Post(std::function<void()> fn) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(fn));
    if (running_) return;
    running_ = true;
    // A thread that found nothing left has cleared running_ and returns without the lock.
    if (thread_.joinable()) thread_.join();
    thread_ = std::thread([this] { Run(); });
  }

  // Waits until every function posted has run.
  void Drain() {
    std::thread done;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](bool* running) { return !*running; }, &running_));
      done = std::move(thread_);
    }
    if (done.joinable()) done.join();
  }

 private:
  void Run() {
    for (;;) {
      std::function<void()> fn;
      {
        absl::MutexLock lock(&mu_);
        if (queue_.empty()) {
          running_ = false;
          return;
        }
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace internal

// One Join stream of a Client: what it has heard (the assignment, an abort before it, the server
// a relay reached) and whether its end is a loss. The stream lives until gRPC is done with it, so
// the client may drop it at any time.
class Client::JoinCall final : public JoinStream {
 public:
  JoinCall(Handlers handlers, std::shared_ptr<internal::LiveCalls> live)
      : JoinStream(std::make_shared<internal::LiveCallToken>(std::move(live))),
        handlers_(std::move(handlers)) {}

  // Waits until the assignment arrives, the stream ends, or `deadline`.
  void Await(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithDeadline(absl::Condition(
                              +[](JoinCall* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) {
                                return c->done_ || c->assignment_.has_value();
                              },
                              this),
                          deadline);
  }

  std::optional<AssignmentEvent> assignment() {
    absl::MutexLock lock(&mu_);
    return assignment_;
  }
  std::optional<absl::Status> final_status() {
    absl::MutexLock lock(&mu_);
    if (!done_) return std::nullopt;
    return status_;
  }
  std::optional<AbortEvent> early_abort() {
    absl::MutexLock lock(&mu_);
    return early_abort_;
  }
  // The server a relay said its stream reached ("" when none said).
  std::string server() {
    absl::MutexLock lock(&mu_);
    return server_;
  }

  void MarkLeaving() {
    absl::MutexLock lock(&mu_);
    leaving_ = true;
  }
  bool leaving() {
    absl::MutexLock lock(&mu_);
    return leaving_;
  }
  // Ends the stream; its end is no loss.
  void Leave() {
    MarkLeaving();
    Cancel();
  }

 private:
  void OnEvent(const v1::JoinEvent& event) override {
    if (!event.server().empty()) {
      absl::MutexLock lock(&mu_);
      server_ = event.server();
    }
    switch (event.event_case()) {
      case v1::JoinEvent::kProgress:
        if (handlers_.on_progress) handlers_.on_progress(FromProto(event.progress()));
        break;
      case v1::JoinEvent::kAssignment: {
        absl::MutexLock lock(&mu_);
        assignment_ = FromProto(event.assignment());
        break;
      }
      case v1::JoinEvent::kAbort: {
        const AbortEvent abort = FromProto(event.abort());
        bool assigned;
        {
          absl::MutexLock lock(&mu_);
          assigned = assignment_.has_value();
          if (!assigned) early_abort_ = abort;
        }
        if (assigned && handlers_.on_abort) handlers_.on_abort(abort);
        break;
      }
      case v1::JoinEvent::kMemberEnd:  // group streams only (a node's relay)
      case v1::JoinEvent::kBatch:
      case v1::JoinEvent::EVENT_NOT_SET:
        break;
    }
  }

  void OnEnd(const grpc::Status& status) override {
    bool report_lost;
    bool released;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      status_ = FromGrpcStatus(status);
      report_lost = assignment_.has_value() && !leaving_ && !status.ok();
      released = assignment_.has_value() && !leaving_ && status.ok();
    }
    if (report_lost && handlers_.on_lost) handlers_.on_lost(FromGrpcStatus(status));
    if (released && handlers_.on_released) handlers_.on_released();
  }

  const Handlers handlers_;

  absl::Mutex mu_;
  std::optional<AssignmentEvent> assignment_ ABSL_GUARDED_BY(mu_);
  std::optional<AbortEvent> early_abort_ ABSL_GUARDED_BY(mu_);
  std::string server_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool leaving_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rdzv

#endif  // RDZV_CLIENT_CLIENT_CALLS_H_
