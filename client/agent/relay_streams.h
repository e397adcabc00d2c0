// The two kinds of stream a node's relay (node_relay.h) keeps: a LocalStream to each member (a
// Join on the relay's own server), and a GroupCall to the server (the members' group join). Each
// tells the relay what becomes of it through RelayStreamOwner, from gRPC's threads.
//
// Internal to node_relay.cc. Thread-safe.
#ifndef RDZV_CLIENT_AGENT_RELAY_STREAMS_H_
#define RDZV_CLIENT_AGENT_RELAY_STREAMS_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <deque>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/agent/core/relay_members.h"
#include "client/join_stream.h"
#include "rdzv/v1/rdzv.grpc.pb.h"

namespace rdzv {

class LocalStream;
class GroupCall;

// What the relay hears of its streams. Called on gRPC's threads; must not block.
class RelayStreamOwner {
 public:
  virtual ~RelayStreamOwner() = default;
  // `local` ends (its task went, or the relay ended it); called again as it is deleted.
  virtual void LocalGone(LocalStream* local) = 0;
  // An event of the group stream `call`.
  virtual void Deliver(GroupCall* call, const v1::JoinEvent& event) = 0;
  // `call` ended with `status`; nothing follows.
  virtual void GroupDone(GroupCall* call, const grpc::Status& status) = 0;
};

// A member's Join stream on the relay's own server. Events are written one at a time from a
// queue; End finishes it once the queue has drained. Pushed to only under the relay's lock, and
// forgets the relay's record of it (LocalGone) before it is deleted, so the relay never holds a
// dangling pointer. Owned by gRPC: deleted in OnDone.
class LocalStream final : public grpc::ServerWriteReactor<v1::JoinEvent> {
 public:
  LocalStream(RelayStreamOwner* relay, const v1::JoinRequest& request)
      : relay_(relay), request_(request) {}

  const v1::JoinRequest& request() const { return request_; }
  // The member it is (RelayMembers), once the relay holds it; 0 before. Under the relay's lock.
  MemberId member = 0;

  void Push(v1::JoinEvent event) {
    absl::MutexLock lock(&mu_);
    if (finishing_) return;
    queue_.push_back(std::move(event));
    if (!writing_) WriteNextLocked();
  }

  void End(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    if (finishing_) return;
    finishing_ = true;
    finish_ = status;
    if (!writing_) WriteNextLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    queue_.pop_front();
    writing_ = false;
    if (!ok) {
      queue_.clear();
      if (!finishing_) {
        finishing_ = true;
        finish_ = grpc::Status::CANCELLED;
      }
    }
    WriteNextLocked();
  }

  void OnCancel() override {
    End(grpc::Status::CANCELLED);
    relay_->LocalGone(this);
  }

  void OnDone() override {
    relay_->LocalGone(this);
    delete this;
  }

 private:
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    if (!queue_.empty()) {
      writing_ = true;
      StartWrite(&queue_.front());
    } else if (finishing_) {
      finished_ = true;
      Finish(finish_);
    }
  }

  RelayStreamOwner* const relay_;
  const v1::JoinRequest request_;
  absl::Mutex mu_;
  std::deque<v1::JoinEvent> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status finish_ ABSL_GUARDED_BY(mu_);
};

// The group stream to the server: its events go to the relay's members, its end too.
class GroupCall final : public JoinStream {
 public:
  GroupCall(RelayStreamOwner* relay, std::string server)
      : relay_(relay), server_(std::move(server)) {}

  // The server this call was made to ("host:port"): its members hear it with their events.
  const std::string& server() const { return server_; }
  // The group it carries (RelayMembers), once the server has taken it; 0 before.
  GroupId group() const { return group_; }
  void set_group(GroupId group) { group_ = group; }

 private:
  void OnEvent(const v1::JoinEvent& event) override { relay_->Deliver(this, event); }
  void OnEnd(const grpc::Status& status) override { relay_->GroupDone(this, status); }

  RelayStreamOwner* const relay_;
  const std::string server_;
  std::atomic<GroupId> group_{0};
};

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_RELAY_STREAMS_H_
