#include "client/join_stream.h"

#include <chrono>
#include <utility>

namespace rdzv {

void JoinStream::Start(v1::Rendezvous::Stub* stub, const v1::JoinRequest& request) {
  request_ = request;
  // The stream lasts as long as the job; its deadline only bounds a forgotten stream.
  context_.set_deadline(std::chrono::system_clock::now() + std::chrono::hours(24 * 30));
  self_ = shared_from_this();
  stub->async()->Join(&context_, &request_, this);
  // Until then the call cannot be done, whatever the server does: the joining thread decides.
  AddHold();
  {
    absl::MutexLock lock(&mu_);
    held_ = true;
  }
  StartCall();
}

JoinStream::Headers JoinStream::AwaitHeaders(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithDeadline(absl::Condition(
                            +[](JoinStream* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
                              return s->headers_ != Headers::kWaiting;
                            },
                            this),
                        deadline);
  return headers_;
}

void JoinStream::Proceed() {
  if (!Release()) return;
  StartRead(&event_);
  RemoveHold();
}

void JoinStream::LetEnd() {
  if (Release()) RemoveHold();
}

void JoinStream::Abandon() {
  context_.TryCancel();
  if (Release()) RemoveHold();
}

grpc::Status JoinStream::AwaitDone() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
  return status_;
}

void JoinStream::OnReadInitialMetadataDone(bool ok) {
  absl::MutexLock lock(&mu_);
  headers_ = ok ? Headers::kArrived : Headers::kNone;
}

void JoinStream::OnReadDone(bool ok) {
  if (!ok) return;  // OnDone follows with the status.
  OnEvent(event_);
  StartRead(&event_);
}

void JoinStream::OnDone(const grpc::Status& status) {
  std::shared_ptr<JoinStream> keep = std::move(self_);
  OnEnd(status);
  absl::MutexLock lock(&mu_);
  status_ = status;
  done_ = true;
}

bool JoinStream::Release() {
  absl::MutexLock lock(&mu_);
  return std::exchange(held_, false);
}

}  // namespace rdzv
