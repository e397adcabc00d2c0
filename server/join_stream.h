// RendezvousService::JoinStream, one agent's (or one group's) Join stream, and the writer
// threads that start its writes: the service's own, shared by the files that define its members.
// Not for other callers.
#ifndef RDZV_SERVER_JOIN_STREAM_H_
#define RDZV_SERVER_JOIN_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "rdzv/v1/rdzv.grpc.pb.h"
#include "server/rendezvous_service.h"

namespace rdzv {

// One agent's Join stream. gRPC allows one write in flight per stream, so events queue here
// and go out one after another; a requested finish waits until the queue has drained. The queue
// is a list: it is almost always empty, and an empty std::deque still costs half a KiB, which
// thousands of idle streams pay.
//
// Events and closes are queued under the service's lock, which fixes their order (Push,
// PushClose), but the write or finish that sends them is started by a writer thread
// (StartWrites): started from a thread that is not gRPC's, a write runs to the socket inline, and
// a broadcast to thousands of streams would otherwise hold the lock, or a gRPC thread, for as
// long. A Push that asks for StartWrites holds the stream alive until that call is over.
//
// Owned by gRPC: it deletes itself once OnDone has run and no StartWrites is pending.
class RendezvousService::JoinStream final : public grpc::ServerWriteReactor<v1::JoinEvent> {
 public:
  JoinStream(RendezvousService* service, StreamId id) : service_(service), id_(id) {}

  // Counts `bytes`, and from now on the events queued here, against `user` and `total` until
  // the stream is done. Call once, before the first Push.
  void Charge(std::shared_ptr<Usage> user, std::shared_ptr<Usage> total, int64_t bytes,
              int64_t max_queued) {
    absl::MutexLock lock(&mu_);
    user_ = std::move(user);
    total_ = std::move(total);
    max_queued_ = max_queued;
    AddLocked(bytes);
  }

  enum class Pushed { kQueued, kStartWrites, kOverfull, kOverfullStartWrites };

  // Queues `event` (`bytes` long). kStartWrites when the caller must have StartWrites() called
  // (outside the service's lock); kOverfull* when the queue has passed its bound: the queue is
  // dropped, the stream ends with RESOURCE_EXHAUSTED once the write in flight is done, and the
  // caller must forget the stream (and, for kOverfullStartWrites, call StartWrites()).
  Pushed Push(std::shared_ptr<const v1::JoinEvent> event, int64_t bytes) {
    absl::MutexLock lock(&mu_);
    if (finishing_) return Pushed::kQueued;
    // Progress is a snapshot: a newer one replaces one still waiting (not the one in flight).
    if (event->has_progress() && queue_.size() > (writing_ ? 1u : 0u) &&
        queue_.back().first->has_progress()) {
      AddLocked(bytes - queue_.back().second);
      queue_.back() = {std::move(event), bytes};
      return Pushed::kQueued;
    }
    queue_.emplace_back(std::move(event), bytes);
    queued_bytes_ += bytes;
    AddLocked(bytes);
    if (max_queued_ > 0 && queued_bytes_ > max_queued_) {
      DropQueueLocked();
      finishing_ = true;
      pending_finish_ = grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          "this agent did not read its messages from the rendezvous server; its stream ended");
      return Hold() ? Pushed::kOverfullStartWrites : Pushed::kOverfull;
    }
    return Hold() ? Pushed::kStartWrites : Pushed::kQueued;
  }

  // Ends the stream with `status` once what is queued has been written. True when the caller
  // must have StartWrites() called.
  bool PushClose(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    if (finishing_) return false;
    finishing_ = true;
    pending_finish_ = status;
    return Hold();
  }

  // Starts writing the queue (or the finish) unless a write is already in flight; ends the hold
  // of a Push.
  void StartWrites() {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      if (!done_ && !writing_) WriteNextLocked();
      last = --holds_ == 0 && done_;
    }
    if (last) delete this;
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    queued_bytes_ -= queue_.front().second;
    AddLocked(-queue_.front().second);
    queue_.pop_front();
    writing_ = false;
    if (!ok) {
      // The client is gone; OnCancel/OnDone will follow.
      DropQueueLocked();
      if (!finishing_) {
        finishing_ = true;
        pending_finish_ = grpc::Status::CANCELLED;
      }
    }
    WriteNextLocked();
  }

  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      if (!finishing_) {
        finishing_ = true;
        pending_finish_ = grpc::Status::CANCELLED;
        if (!writing_ && queue_.empty()) WriteNextLocked();
      }
    }
    service_->StreamDone(id_, /*cancelled=*/true);
  }

  void OnDone() override {
    service_->StreamDone(id_, /*cancelled=*/false);
    bool last;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      AddLocked(-charged_);
      last = holds_ == 0;
    }
    if (last) delete this;
  }

 private:
  bool Hold() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_) return false;  // OnWriteDone goes on with the queue
    ++holds_;
    return true;
  }

  void AddLocked(int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (user_ == nullptr || bytes == 0) return;
    charged_ += bytes;
    user_->bytes.fetch_add(bytes, std::memory_order_relaxed);
    total_->bytes.fetch_add(bytes, std::memory_order_relaxed);
  }

  // Drops what is queued but not being written.
  void DropQueueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t keep = writing_ ? 1 : 0;
    while (queue_.size() > keep) {
      queued_bytes_ -= queue_.back().second;
      AddLocked(-queue_.back().second);
      queue_.pop_back();
    }
  }

  // The next write, or the finish once the queue is empty and one was asked for.
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    if (!queue_.empty()) {
      writing_ = true;
      StartWrite(queue_.front().first.get());
    } else if (pending_finish_) {
      finished_ = true;
      Finish(*pending_finish_);
      pending_finish_.reset();
    }
  }

  RendezvousService* const service_;
  const StreamId id_;
  absl::Mutex mu_;
  // Shared: a broadcast's one message sits in every stream's queue. With its size, as counted.
  std::list<std::pair<std::shared_ptr<const v1::JoinEvent>, int64_t>> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t max_queued_ ABSL_GUARDED_BY(mu_) = 0;
  // Where this stream's bytes are counted (null: nowhere), and how many it counts there now.
  std::shared_ptr<Usage> user_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Usage> total_ ABSL_GUARDED_BY(mu_);
  int64_t charged_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;  // a finish is asked for: queue no more
  bool finished_ ABSL_GUARDED_BY(mu_) = false;   // Finish has been called
  std::optional<grpc::Status> pending_finish_ ABSL_GUARDED_BY(mu_);
  int holds_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

// A broadcast's writes, spread over the writer threads: a round's assignment or a job's abort
// to thousands of agents is thousands of writes of a few dozen microseconds each, and the last
// agent hears it sooner when several threads share them (10,000 agents on two cores: an abort
// reached all in about 480 ms from one thread, about 390 ms from four). From 256 writes on they
// are shared: 1,000 agents heard an abort in 43 ms (median of 3) against 54 ms from one thread.
inline constexpr size_t kWriterThreads = 4;
inline constexpr size_t kWritesPerTask = 256;

}  // namespace rdzv

#endif  // RDZV_SERVER_JOIN_STREAM_H_
