// RendezvousService: the gRPC callback service that adapts rdzv.v1 calls into RendezvousState
// events and carries out the decisions. A waiting Join is a stored reactor, not a thread, so
// thousands of agents can wait at once. All state sits behind one mutex; no reaction blocks
// beyond it, and the core's work per event is O(log n) except at round completion. Events are
// queued on their streams under the mutex (which fixes their order) and written after it is
// released, so that a broadcast to thousands of streams never holds it for the writes.
//
// Thread-safe. Call Shutdown() before destroying the grpc::Server that serves it.
#ifndef RDZV_SERVER_RENDEZVOUS_SERVICE_H_
#define RDZV_SERVER_RENDEZVOUS_SERVICE_H_

#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/rendezvous_state.h"
#include "rdzv/v1/rdzv.grpc.pb.h"

namespace rdzv {

// Microseconds on a monotonic clock; injected so that tests can drive time.
using Clock = std::function<Micros()>;
Clock SteadyClock();

struct ServiceOptions {
  StateOptions state;
  // Log each job's failures and refusals at info level (rdzvd); an agent hosting the server
  // reports them itself and leaves this off.
  bool log_jobs = true;
  // When set, the server hosts this one job and refuses others with NOT_FOUND, so that an
  // agent that reached another job's embedded server knows to look elsewhere.
  std::string only_job;
};

class RendezvousService final : public v1::Rendezvous::CallbackService {
 public:
  RendezvousService(Clock clock, ServiceOptions options);
  ~RendezvousService() override;

  grpc::ServerWriteReactor<v1::JoinEvent>* Join(grpc::CallbackServerContext* context,
                                                const v1::JoinRequest* request) override;
  grpc::ServerUnaryReactor* ReportExit(grpc::CallbackServerContext* context,
                                       const v1::ReportExitRequest* request,
                                       v1::ReportExitResponse* response) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context,
                                  const v1::LeaveRequest* request,
                                  v1::LeaveResponse* response) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const v1::StatusRequest* request,
                                      v1::StatusResponse* response) override;

  // Advances the state's timers; the server shell calls it periodically.
  void Tick();

  // Ends every open stream with UNAVAILABLE and refuses new joins.
  void Shutdown();

  // Streams still open (for tests and status logging).
  size_t open_streams() const;

 private:
  class JoinStream;

  JoinStream* JoinLocked(grpc::CallbackServerContext* context, const v1::JoinRequest* request,
                         std::vector<JoinStream*>& writers);
  // Queues the decisions' events and closes streams; `writers` receives the streams whose
  // writes the caller must start with StartWrites once mu_ is released.
  void Apply(Decisions& decisions, std::vector<JoinStream*>& writers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartWrites(const std::vector<JoinStream*>& writers) ABSL_LOCKS_EXCLUDED(mu_);
  void StreamDone(StreamId id);

  const Clock clock_;
  const ServiceOptions options_;
  mutable absl::Mutex mu_;
  RendezvousState state_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<StreamId, JoinStream*> streams_ ABSL_GUARDED_BY(mu_);
  StreamId next_stream_ ABSL_GUARDED_BY(mu_) = 1;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace rdzv

#endif  // RDZV_SERVER_RENDEZVOUS_SERVICE_H_
