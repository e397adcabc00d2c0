// RendezvousService: the gRPC callback service that adapts rdzv.v1 calls into RendezvousState
// events and carries out the decisions. A waiting Join is a stored reactor, not a thread, so
// thousands of agents can wait at once. All state sits behind one mutex; no reaction blocks
// beyond it, and the core's work per event is O(log n) except at round completion.
//
// Events and closes are queued on their streams under the mutex (which fixes their order); the
// writes that send them are started by a fixed pool of writer threads, never by a reaction nor
// under the mutex, so that a broadcast to thousands of streams holds neither a gRPC thread nor
// the lock. The pool's threads are made once, with the service.
//
// What the service decides beyond the state is pure and apart: whether a join fits its user's
// limits and what each user holds (server/core/service_ledger.h), and which of a group's events
// its stream carries once for all its members (server/core/group_batching.h). The members are
// defined by concern: the calls here (rendezvous_service.cc), group joins (group_streams.cc),
// queueing the decisions on streams (deliver_decisions.cc, with JoinStream in join_stream.h),
// the operator's calls (job_control.cc) and taking up jobs with peers (job_takeover.cc).
//
// Thread-safe. Call Shutdown() before shutting down the grpc::Server that serves it, and
// StopWriters() after that server has stopped, before destroying either.
#ifndef RDZV_SERVER_RENDEZVOUS_SERVICE_H_
#define RDZV_SERVER_RENDEZVOUS_SERVICE_H_

#include <asio/thread_pool.hpp>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/core/rendezvous_state.h"
#include "guard/authenticator.h"
#include "guard/connection_guard.h"
#include "rdzv/v1/rdzv.grpc.pb.h"
#include "server/core/job_claims.h"
#include "server/core/service_ledger.h"
#include "server/peer_servers.h"
#include "server/service_metrics.h"

namespace rdzv {

struct ServiceOptions {
  StateOptions state;
  // Log each job's failures and refusals at info level (rdzvd); an agent hosting the server
  // reports them itself and leaves this off.
  bool log_jobs = true;
  // When set, the server hosts this one job and refuses others with NOT_FOUND, so that an
  // agent that reached another job's embedded server knows to look elsewhere.
  std::string only_job;
  // Who may call, and how callers prove it. Jobs are kept per owner (see Authenticator).
  AuthPolicy auth;
  // Where the service reports what it sees for rdzvd's metrics; null for none. Not owned; must
  // outlive the service.
  ServiceMetrics* metrics = nullptr;
  // Told of each call whose caller proved who it is, so that its connection is kept; null for
  // none. Not owned; must outlive the service.
  ConnectionGuard* connections = nullptr;
  // A running agent's stream that ends while its connection stays up was reset on this side
  // (gRPC resets streams when its memory quota is pressed), not lost: its agent, which sees the
  // reset and rejoins, has this long to come back before it counts as lost. Its connection
  // closing meanwhile ends the wait. Needs `connections`; 0: every ended stream is a lost agent.
  Micros reattach_window = 2'000'000;
  // What one user (one owner) may hold on this server at once: jobs, whatever their state, and
  // open Join streams (one per agent). A join past either is refused with RESOURCE_EXHAUSTED.
  int64_t max_jobs_per_user = 1000;
  int64_t max_agents_per_user = 100'000;
  // The memory one user's attached agents hold on this server, counted as kAgentBaseBytes per
  // agent (gRPC's stream, call and connection, the job state's entry) plus its join request and
  // the events queued for it. A join that would pass it is refused with RESOURCE_EXHAUSTED, to
  // that user only. Zero: no limit here; the server (server.h) makes it half of max_memory_bytes
  // (1.5 GiB, about 40,000 agents, by default), so that no one user can take all of it.
  int64_t max_memory_per_user_bytes = 0;
  // The same for all users together: a join past it is refused, to whoever joins, so that
  // gRPC's own quota (ServerOptions::memory_limit_bytes) is never pressed by attached agents and
  // never resets one. Zero: no limit here; the server makes it three quarters of its memory
  // limit.
  int64_t max_memory_bytes = 0;
  // Events queued on one stream whose agent does not read them: past this many bytes the
  // stream is ended with RESOURCE_EXHAUSTED (and that agent is lost to its job).
  int64_t max_queued_bytes_per_stream = int64_t{1} << 20;
  // The other rdzvds of the agents' server list (rdzvd --peers), "host:port" each; empty: none.
  // Before it takes up a job it does not know, the server asks them (job_takeover.cc): a job one
  // of them serves is refused with NOT_FOUND naming it, so that its agents go back to it.
  std::vector<std::string> peers;
  // PEM of the CA that signed the peers' certificates, when they serve TLS.
  std::string peer_tls_ca_pem;
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
  // In job_control.cc.
  grpc::ServerUnaryReactor* AbortJob(grpc::CallbackServerContext* context,
                                     const v1::AbortJobRequest* request,
                                     v1::AbortJobResponse* response) override;
  // In job_takeover.cc.
  grpc::ServerUnaryReactor* HoldsJob(grpc::CallbackServerContext* context,
                                     const v1::HoldsJobRequest* request,
                                     v1::HoldsJobResponse* response) override;

  // Advances the state's timers; the server shell calls it periodically.
  void Tick();

  // Ends every open stream with UNAVAILABLE and refuses new joins.
  void Shutdown();

  // Waits for the writer threads to finish what they were given and stops them. Call it once
  // the grpc::Server has stopped (its Wait() returned).
  void StopWriters();

  // Counts a call refused before it reached a job, by reason (Metrics::kRefused*), for the
  // checks in front of the service (authentication, limits). Does nothing without metrics.
  void CountRefused(absl::string_view reason);

  // Streams still open (for tests and status logging): a group join's is one.
  size_t open_streams() const;
  // Agents that have joined since the start (a group join's members each), and those attached
  // now.
  int64_t agents_joined() const;
  int64_t agents_attached() const;

  // The bytes attached agents hold, as counted against max_memory_bytes (for tests and metrics).
  int64_t memory_held() const { return total_usage_->bytes.load(std::memory_order_relaxed); }

  // Checks calls' credentials; the server's HeaderAuth checks headers with it.
  const Authenticator& authenticator() const { return auth_; }

 private:
  class JoinStream;

  // A job the server must ask its peers about first: (job id, owner).
  using PeerQuestion = std::pair<std::string, std::string>;
  JoinStream* JoinLocked(grpc::CallbackServerContext* context, const v1::JoinRequest* request,
                         const Caller& caller, std::vector<JoinStream*>& writers,
                         std::optional<PeerQuestion>& ask);
  // ---- Taking up a job with peers (job_takeover.cc).
  // A join of a job this server does not know, held while the peers are asked (ParkLocked); the
  // peers' answer either joins it to the state or refuses it (PeersAnswered).
  struct ParkedJoin {
    StreamId id;
    v1::JoinRequest request;
    std::string peer;
  };
  struct Parked {
    RendezvousState* state;
    std::string owner;
    std::string job_id;
    std::vector<ParkedJoin> joins;
  };
  static std::string ParkKey(absl::string_view owner, absl::string_view job_id);
  // Holds the join on stream `id`; sets `ask` when it is the job's first.
  void ParkLocked(StreamId id, RendezvousState& state, const Caller& caller,
                  const v1::JoinRequest& request, const std::string& peer,
                  std::optional<PeerQuestion>& ask) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the peers about `ask` (without mu_).
  void AskPeers(const PeerQuestion& ask) ABSL_LOCKS_EXCLUDED(mu_);
  // The peers answered about the parked job `key`: `holder` serves it, or none ("").
  void PeersAnswered(const std::string& key, const std::string& holder) ABSL_LOCKS_EXCLUDED(mu_);
  // One join, taken from the parked or straight from the call, given to the state; `converted`
  // is `request` as a JoinSpec when the caller has it already (null: converted here).
  void JoinStateLocked(StreamId id, RendezvousState& state, const v1::JoinRequest& request,
                       const std::string& peer, const JoinSpec* converted, Decisions& decisions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ---- Group joins (group_streams.cc).
  // The members of a group join (JoinRequest.members), each joined to the state as an agent of
  // its own on an id of its own, all answered on `id`'s stream; `client` is the address the
  // group's relay connected from.
  void JoinMembersLocked(StreamId id, RendezvousState& state, const v1::JoinRequest& request,
                         const std::string& client, Decisions& decisions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the group member `id`: its group no longer answers for it.
  void EraseMember(StreamId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs an agent's report that its node is unhealthy.
  static void LogUnhealthy(const JoinSpec& spec);
  // ---- Delivery (deliver_decisions.cc).
  // Queues the decisions' events and closes on their streams; `writers` receives the streams
  // whose writes must be started with StartWrites once mu_ is released.
  void Apply(Decisions& decisions, std::vector<JoinStream*>& writers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Apply's steps, in order: which groups get an abort for all their members
  // (GroupBatching::CountAbort); the sends, queued on agents' streams or added to their groups'
  // batches; the closes (a member's as its group's member_end); the batches, one message per
  // group.
  struct Outbox;
  void CountGroupAborts(const Decisions& decisions, Outbox& box) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void QueueSends(const Decisions& decisions, Outbox& box) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void QueueCloses(const Decisions& decisions, Outbox& box) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void QueueBatches(Outbox& box) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the streams to the writer threads, which start their writes.
  void StartWrites(std::vector<JoinStream*> writers) ABSL_LOCKS_EXCLUDED(mu_);
  // Stream `id` is over: `cancelled` when it ended without the server finishing it (its agent,
  // its connection, or gRPC's own reset under memory pressure).
  void StreamDone(StreamId id, bool cancelled);
  // Whether the Join stream `id` of `state`, just cancelled, ended with its connection still up
  // while its agent runs: then its agent is given reattach_window to come back.
  bool MayReattach(StreamId id) ABSL_LOCKS_EXCLUDED(mu_);
  // The caller of `context`'s call of `method` on `job_id`, or why not (logged and counted):
  // unauthenticated, or `limits` (the request's check, server/request_limits.h) when not OK.
  absl::StatusOr<Caller> Authenticate(grpc::CallbackServerContext* context,
                                      absl::string_view method, absl::string_view job_id,
                                      const absl::Status& limits);
  // The jobs of `owner`, made on first use.
  RendezvousState& StateOf(const std::string& owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Bytes held for one user (or all), updated by streams as they queue and write events.
  struct Usage {
    std::atomic<int64_t> bytes{0};
  };
  // A group join's members. The core sees each as an agent on a stream of its own: member k has
  // the id first + k, and its events go out on the group's stream under its agent id. Kept
  // compact, as the group's one record of them: their agent ids back to back, and a byte each.
  struct Group {
    enum class Member : uint8_t {
      kJoined,   // the core holds it
      kRefused,  // refused before it reached the core (out of range): never counted
      kGone,     // its join ended (the core's close, or its relay reported it lost)
    };
    StreamId first = 0;          // 0 until its members are given ids (a parked join's wait)
    std::string ids;             // the members' agent ids, back to back
    std::vector<uint32_t> ends;  // where each member's id ends in `ids`
    std::vector<Member> members;
    size_t live = 0;  // members not gone

    absl::string_view agent_id(size_t k) const {
      const uint32_t begin = k == 0 ? 0 : ends[k - 1];
      return absl::string_view(ids).substr(begin, ends[k] - begin);
    }
  };
  struct Stream {
    JoinStream* stream;
    RendezvousState* state;  // the owner's jobs the stream joined
    std::string peer;        // the call's peer, as gRPC names it
    // What it counts toward max_agents_per_user: 1, or a group's member count.
    int64_t agents = 1;
    // A group join's stream: its members; null for an agent's own stream.
    std::unique_ptr<Group> group;
  };
  // A member of a group join, by the id the state knows it by: its group's stream and place.
  struct MemberRef {
    StreamId group_id = 0;
    Stream* stream = nullptr;  // the group's; null: no member of a group still open
    size_t index = 0;
    Group& group() const { return *stream->group; }
    Group::Member state() const { return group().members[index]; }
    absl::string_view agent_id() const { return group().agent_id(index); }
  };
  MemberRef FindMember(StreamId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FindMember, through the member `box` found last (a round's sends name a group's members one
  // after another).
  MemberRef MemberOf(Outbox& box, StreamId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The relay of `member`'s group lost it: as if its own stream had dropped.
  void LoseMemberLocked(const MemberRef& member, Decisions& decisions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the stream of `group` when no member is left on it.
  void EndIfEmpty(StreamId group, std::vector<JoinStream*>& writers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The stream the metrics counted the agent on stream `id` on: its own, its group's for a
  // member, or 0 for a member refused before it was counted.
  StreamId CountedOn(StreamId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Streams ended with their connection up, whose agents may come back until `deadline`.
  struct Reattaching {
    RendezvousState* state;
    std::string peer;
    Micros deadline;
  };
  // Forgets stream `it` (a group's with its members), and counts it off its owner's streams.
  void EraseStream(absl::flat_hash_map<StreamId, Stream>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stream `it` ended from the agent's side: forgets it and tells the state that its agent (each
  // member still on a group's stream) is gone. With `relay_alive` (a group's stream that its
  // relay ended with its connection still up), members that the state only awaits after their
  // job's end are not: they are on their way back through the relay, which reports the loss of
  // any of them (ReportExit member_lost) itself.
  void LoseStreamLocked(absl::flat_hash_map<StreamId, Stream>::iterator it, Micros now,
                        Decisions& decisions, bool relay_alive = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether stream `id` is a group's whose relay's connection is still up.
  bool RelayAlive(StreamId id);
  // Why `caller` may not open another stream into `job_id` of `state`, one that holds
  // `join_bytes` (ServiceOptions' memory limits), or OK.
  absl::Status CheckUserLimits(const Caller& caller, const RendezvousState& state,
                               const std::string& job_id, int64_t join_bytes, int64_t agents) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Charges the records of agents left out of `state`'s jobs, as they grow or are forgotten, to
  // its user's memory and to all users'.
  void ChargeExcluded(const RendezvousState& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the streams of `overfull` (whose queues passed max_queued_bytes_per_stream): their
  // agents are lost to their jobs.
  void EndOverfull(const std::vector<StreamId>& overfull, std::vector<JoinStream*>& writers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Whether the caller of `context` may control `job_id` (abort it): the job's owner or root.
  // Keeps the first abort of `owner`'s job `job_id` for GetStatus (job_control.cc).
  void RecordAbort(const std::string& owner, const std::string& job_id, const AbortEvent& abort)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock clock_;
  const ServiceOptions options_;
  mutable absl::Mutex mu_;
  const Authenticator auth_;
  // Each owner's streams, parked jobs and left-out agents, by the state of its jobs, against
  // the per-user limits.
  ServiceLedger ledger_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<RendezvousState>> states_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<StreamId, Stream> streams_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<StreamId, Reattaching> reattaching_ ABSL_GUARDED_BY(mu_);
  // The open groups by their first member's id (FindMember): one entry per group, not per member.
  absl::btree_map<StreamId, StreamId> groups_by_member_ ABSL_GUARDED_BY(mu_);
  // Memory held per owner's state, and by all (ServiceOptions::max_memory_per_user_bytes).
  absl::flat_hash_map<const RendezvousState*, std::shared_ptr<Usage>> usage_ ABSL_GUARDED_BY(mu_);
  const std::shared_ptr<Usage> total_usage_ = std::make_shared<Usage>();
  StreamId next_stream_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t agents_joined_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  // The first abort of each job, from failure reports and AbortJob, and when it came; kept a
  // while after the job is gone, and bounded (job_control.cc).
  struct RecordedAbort {
    std::string owner;
    std::string job_id;
    AbortEvent abort;
    Micros at = 0;
  };
  absl::flat_hash_map<std::string, RecordedAbort> aborts_ ABSL_GUARDED_BY(mu_);
  // Adds the recorded aborts of `job_id` (all jobs when empty) that `caller` may see to `jobs`
  // (whose owners are `owners`): the abort of a job listed there, and an "ended" entry for one
  // the state has forgotten.
  void AddRecordedAborts(const Caller& caller, const std::string& job_id,
                         const std::vector<const std::string*>& owners,
                         std::vector<JobStatusView>& jobs,
                         std::vector<std::pair<size_t, AbortEvent>>& aborts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::flat_hash_map<std::string, Parked> parked_ ABSL_GUARDED_BY(mu_);
  // Which server of the list takes up a job asked about from both sides (with peers only). Tick()
  // forgets its past concessions.
  std::optional<JobClaims> claims_ ABSL_GUARDED_BY(mu_);
  asio::thread_pool writer_pool_;
  // Null without peers. Last: it goes first, waiting for the answers still due, which call back.
  std::unique_ptr<PeerServers> peers_;
};

}  // namespace rdzv

#endif  // RDZV_SERVER_RENDEZVOUS_SERVICE_H_
