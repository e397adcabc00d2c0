// JoinStream: one Join stream to a rendezvous server, read with gRPC's callback API: librdzv's
// join (Client::JoinCall, client_calls.h) and a node relay's group join (client/agent/
// node_relay.cc) are each one. Nothing a stream carries counts before its server has proved
// itself: Start opens the call but reads no event; once the answer's headers have come
// (AwaitHeaders) and their proof has been checked (OpenJoin, server_list.h), Proceed reads the
// events, or LetEnd or Abandon lets the call end without one read.
//
// A subclass hears the events (OnEvent) and the end (OnEnd) on gRPC's threads, and must not block
// there. A stream lives until gRPC calls OnDone (it holds a reference to itself from Start until
// then), so its owner may drop it at any time. Internal to librdzv and rdzv-agent; not installed.
// Thread-safe.
#ifndef RDZV_CLIENT_JOIN_STREAM_H_
#define RDZV_CLIENT_JOIN_STREAM_H_

#include <grpcpp/client_context.h>

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rdzv/v1/rdzv.grpc.pb.h"

namespace rdzv {

class JoinStream : public grpc::ClientReadReactor<v1::JoinEvent>,
                   public std::enable_shared_from_this<JoinStream> {
 public:
  // `keep` is let go of last, once the call has let go of its channel (a Client's LiveCallToken,
  // client_calls.h, which its destructor waits for).
  explicit JoinStream(std::shared_ptr<void> keep = nullptr) : keep_(std::move(keep)) {}
  ~JoinStream() override = default;
  JoinStream(const JoinStream&) = delete;
  JoinStream& operator=(const JoinStream&) = delete;

  // For the credential, before Start.
  grpc::ClientContext& context() { return context_; }

  // Starts the call (the stream must be held by a shared_ptr) but reads no event yet: the
  // server's headers come first, then one of Proceed, LetEnd or Abandon.
  void Start(v1::Rendezvous::Stub* stub, const v1::JoinRequest& request);

  enum class Headers { kWaiting, kArrived, kNone };
  // Waits until the server's headers have arrived (kArrived: they may be checked in context()),
  // the call ended without any (kNone), or `deadline` (kWaiting).
  Headers AwaitHeaders(absl::Time deadline);

  // Reads the stream's events: the server proved itself.
  void Proceed();
  // Lets a call that ended without headers finish: its status comes to OnEnd.
  void LetEnd();
  // Ends the call without reading an event of it: the server did not prove itself.
  void Abandon();
  // Ends the call, read or not.
  void Cancel() { context_.TryCancel(); }

  // Waits until OnEnd has run, and returns the status it was given.
  grpc::Status AwaitDone();

  // gRPC's.
  void OnReadInitialMetadataDone(bool ok) final;
  void OnReadDone(bool ok) final;
  void OnDone(const grpc::Status& status) final;

 protected:
  // An event of the stream, once the caller has let it proceed.
  virtual void OnEvent(const v1::JoinEvent& event) = 0;
  // The call's end, with its status; no event follows.
  virtual void OnEnd(const grpc::Status& status) = 0;

 private:
  // True the first time: the caller then removes the hold of Start.
  bool Release();

  const std::shared_ptr<void> keep_;  // first, so that it goes last: after context_
  grpc::ClientContext context_;
  v1::JoinRequest request_;
  v1::JoinEvent event_;
  std::shared_ptr<JoinStream> self_;

  absl::Mutex mu_;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  Headers headers_ ABSL_GUARDED_BY(mu_) = Headers::kWaiting;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rdzv

#endif  // RDZV_CLIENT_JOIN_STREAM_H_
