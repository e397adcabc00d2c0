#include "client/agent/node_relay.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <deque>
#include <functional>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "client/agent/relay_streams.h"
#include "client/join_stream.h"
#include "client/server_list.h"
#include "common/auth.h"
#include "common/clock.h"
#include "common/core/host_port.h"
#include "common/grpc_status.h"
#include "common/proto_convert.h"
#include "guard/connection_guard.h"
#include "guard/header_auth.h"
#include "guard/request_limits.h"
#include "rdzv/v1/rdzv.grpc.pb.h"

namespace rdzv {
namespace {

// A new connection's time to be let in before it may be dropped to make room for another of its
// host (as rdzvd's kUnprovenGrace).
constexpr absl::Duration kRelayUnprovenGrace = absl::Seconds(2);

// How long a relay waits for the rest of its agents when they resume the same round after the
// server's stream was lost: all of them heard it at the same moment.
constexpr absl::Duration kResumeGather = absl::Milliseconds(200);

// How often the worker looks at its timers (the connections' bounds, the relay's key) when
// nothing else wakes it.
constexpr absl::Duration kWorkerTick = absl::Milliseconds(200);

grpc::Status Unavailable(const std::string& why) {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, why);
}

RelayMembers::Options MembersOptions(const NodeRelayOptions& options) {
  RelayMembers::Options m;
  m.job_id = options.job_id;
  m.expected = options.expected;
  if (!options.listen.empty()) m.nodes = std::make_pair(options.first_node, options.last_node);
  m.gather = options.gather;
  m.rejoin_gather = options.rejoin_gather;
  m.resume_gather = kResumeGather;
  m.max_group = kMaxGroupMembers;
  return m;
}

RelayJoin RelayJoinOf(const v1::JoinRequest& request) {
  RelayJoin join;
  join.job_id = request.job_id();
  join.agent_id = request.agent_id();
  join.node_index = request.node_index();
  join.order = request.order();
  join.round = request.restart_count();
  join.group = request.members_size() > 0;
  return join;
}

}  // namespace

// The relay's shell: its gRPC server for the node's agents, the calls it makes upstream, and a
// worker thread for those that block (credentials and proofs may wait for munged). Every
// decision is RelayMembers'; Do() carries out what it decides.
class NodeRelay::Impl final : public v1::Rendezvous::CallbackService, public RelayStreamOwner {
 public:
  explicit Impl(NodeRelayOptions options)
      : options_(std::move(options)), members_(MembersOptions(options_)) {}
  ~Impl() override;

  absl::Status Init();

  grpc::ServerWriteReactor<v1::JoinEvent>* Join(grpc::CallbackServerContext* context,
                                                const v1::JoinRequest* request) override;
  grpc::ServerUnaryReactor* ReportExit(grpc::CallbackServerContext* context,
                                       const v1::ReportExitRequest* request,
                                       v1::ReportExitResponse* response) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context,
                                  const v1::LeaveRequest* request,
                                  v1::LeaveResponse* response) override;

  // RelayStreamOwner's.
  void LocalGone(LocalStream* local) override;
  void Deliver(GroupCall* call, const v1::JoinEvent& event) override;
  void GroupDone(GroupCall* call, const grpc::Status& status) override;

  bool WaitIdle(absl::Duration timeout);
  const std::string& endpoint() const { return endpoint_; }
  int upstream_streams() const {
    absl::MutexLock lock(&mu_);
    return upstream_streams_;
  }

 private:
  // Listens on the UNIX socket, or on the first free TCP candidate with the callers' check.
  absl::Status ListenLocal();
  absl::Status ListenTcp();
  void ConfigureBuilder(grpc::ServerBuilder& builder);
  // For a TCP relay: checks the call's credential (HeaderAuth has checked its headers) and puts
  // the relay's proof into its answer. OK at once on a UNIX socket, whose directory vouches.
  absl::Status Admit(grpc::CallbackServerContext* context, absl::string_view method,
                     absl::string_view job_id);

  // Carries out what RelayMembers decided; `event` is the server's event a Push hands on.
  void Do(const RelayActions& actions, const v1::JoinEvent* event = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues the report that member `agent_id` is lost (ReportExitRequest.member_lost).
  void ReportLostLocked(const std::string& agent_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The worker: runs the queued calls, and sends the waiting joins up once they are due.
  void RunWorker();
  void Post(std::function<void()> task);
  void Flush();
  // The group join of `batch`, as its members asked.
  v1::JoinRequest GroupJoin(const std::vector<MemberId>& batch) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends `request` up for `batch`, trying the servers in turn: nothing once a server has taken
  // it, else what the members are to hear.
  std::optional<grpc::Status> GoUp(const std::vector<MemberId>& batch,
                                   const v1::JoinRequest& request);
  // What the members hear of a server that did not take their join (`opening`, `call` at
  // `server`).
  grpc::Status Refusal(GroupCall& call, const JoinOpening& opening, const std::string& server);
  // One unary call upstream, made with the relay's credential, its answer taken only from a
  // server that proves itself. Blocks; runs on the worker.
  template <typename Call>
  grpc::Status Upstream(absl::string_view method, Call call);
  // A member's unary call of `method`: let in (Admit), accepted by `check` (under the lock),
  // then made upstream on the worker by `call`, whose answer is the member's.
  template <typename Request, typename Response, typename Check, typename Call>
  grpc::ServerUnaryReactor* PassUp(grpc::CallbackServerContext* context, absl::string_view method,
                                   const Request* request, Response* response, Check check,
                                   Call call);

  const NodeRelayOptions options_;
  const Clock clock_ = SteadyClock();
  std::unique_ptr<ServerList> servers_;
  // A TCP relay's check of its callers, and its bounds on their connections; null on a UNIX
  // socket.
  std::unique_ptr<ConnectionGuard> connections_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<HeaderAuth> header_auth_;
  std::string endpoint_;  // where a TCP relay listens
  std::unique_ptr<grpc::Server> server_;

  mutable absl::Mutex mu_;
  RelayMembers members_ ABSL_GUARDED_BY(mu_);
  // The local streams of the members RelayMembers holds attached.
  absl::flat_hash_map<MemberId, LocalStream*> locals_ ABSL_GUARDED_BY(mu_);
  // The group streams that carry members, until they are done.
  absl::flat_hash_map<GroupId, GroupCall*> groups_ ABSL_GUARDED_BY(mu_);
  GroupId next_group_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // the worker runs a task
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int upstream_streams_ ABSL_GUARDED_BY(mu_) = 0;
  // The group call the worker waits on for the server's proof, so that stopping can end it.
  std::shared_ptr<GroupCall> inflight_ ABSL_GUARDED_BY(mu_);
  std::thread worker_;
};

absl::Status NodeRelay::Impl::Init() {
  absl::StatusOr<std::unique_ptr<ServerList>> servers = ServerList::Make(options_.upstream);
  if (!servers.ok()) return servers.status();
  servers_ = *std::move(servers);
  if (absl::Status s = options_.listen.empty() ? ListenLocal() : ListenTcp(); !s.ok()) return s;
  worker_ = std::thread([this] { RunWorker(); });
  return absl::OkStatus();
}

void NodeRelay::Impl::ConfigureBuilder(grpc::ServerBuilder& builder) {
  builder.RegisterService(this);
  builder.SetMaxReceiveMessageSize(kMaxRequestBytes);
  // The agents keep one quiet stream open for the whole job and ping it, as they would rdzvd's
  // (server/server.cc): gRPC's defaults would answer their pings with GOAWAY.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
}

absl::Status NodeRelay::Impl::ListenLocal() {
  absl::StatusOr<std::string> dir = RelaySocketDirectory(options_.socket_path, getuid());
  if (!dir.ok()) return dir.status();
  // A socket left by an earlier step of a requeued job, and those of relays that were killed.
  unlink(options_.socket_path.c_str());
  SweepDeadSockets(*dir);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("unix:", options_.socket_path),
                           grpc::InsecureServerCredentials());
  ConfigureBuilder(builder);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    return absl::UnavailableError(
        absl::StrFormat("cannot listen on the relay socket %s", options_.socket_path));
  }
  return absl::OkStatus();
}

absl::Status NodeRelay::Impl::ListenTcp() {
  if (absl::Status s = CheckServerAuth(options_.callers, options_.listen.front()); !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot relay on %s: %s", options_.listen.front(), s.message()));
  }
  auth_ = std::make_unique<Authenticator>(options_.callers);
  // Under MUNGE the relay proves itself with a key of its own, vouched for once by munged.
  if (absl::Status s = auth_->RefreshServerKey(absl::Now()); !s.ok()) return s;
  if (options_.callers.mode != AuthMode::kNone) {
    header_auth_ = std::make_unique<HeaderAuth>(auth_.get(), [](absl::StatusCode) {});
  }
  // As rdzvd bounds its callers' connections (guard/connection_guard.h), by the same rules: a
  // host may hold a few more than the whole group would need, of which as many as the group has
  // nodes (and a few more) not yet let in; at a bound one of those not let in makes room for the
  // next; and a connection that carries no call the relay lets in soon is closed.
  ConnectionTable::Limits limits;
  limits.max_per_host = options_.max_connections_per_host < 0 ? options_.expected * 2 + 16
                                                              : options_.max_connections_per_host;
  limits.max_unproven_per_host =
      options_.max_connections_per_host < 0 ? options_.expected + 16 : limits.max_per_host;
  limits.grace = kRelayUnprovenGrace;
  limits.first_call_within = options_.unused_connection_timeout;
  connections_ =
      std::make_unique<ConnectionGuard>(limits, TcpKeepalive{options_.ping, options_.ping_timeout});
  absl::Status last = absl::UnavailableError("no address to relay on");
  for (const std::string& listen : options_.listen) {
    grpc::ServerBuilder builder;
    connections_->InstallOn(&builder);
    int port = 0;
    builder.AddListeningPort(
        listen,
        header_auth_ != nullptr ? header_auth_->Credentials({}) : grpc::InsecureServerCredentials(),
        &port);
    ConfigureBuilder(builder);
    // A second relay on a taken port would split a group between two relays (server/server.cc).
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    // Each node's agent is a caller here: one that stops answering is reported lost.
    const auto millis = [](absl::Duration d) {
      return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1, INT_MAX));
    };
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, millis(options_.ping));
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, millis(options_.ping_timeout));
    // What one connection may hold open, as at rdzvd: a member needs one stream and a call beside
    // it, and each stream's window is small before its caller has proved who it is.
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxStreamsPerConnection);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16 * 1024);
    server_ = builder.BuildAndStart();
    if (server_ != nullptr && port > 0) {
      // The candidate's host, with the port the server got (a candidate may ask for any, :0).
      absl::string_view host = absl::string_view(listen).substr(0, listen.rfind(':'));
      if (absl::ConsumePrefix(&host, "[")) absl::ConsumeSuffix(&host, "]");
      endpoint_ = FormatHostPort(host, port);
      return absl::OkStatus();
    }
    server_.reset();
    last = absl::UnavailableError(absl::StrFormat("cannot listen on %s", listen));
  }
  return last;
}

absl::Status NodeRelay::Impl::Admit(grpc::CallbackServerContext* context, absl::string_view method,
                                    absl::string_view job_id) {
  if (auth_ == nullptr) return absl::OkStatus();
  const CallCredentials credentials = CredentialsOf(*context);
  absl::StatusOr<Caller> caller = auth_->Authenticate(credentials, method, job_id);
  if (!caller.ok()) return caller.status();
  connections_->CallAccepted(context->peer());
  auth_->AddProof(*context, credentials, method, job_id, *caller);
  return absl::OkStatus();
}

NodeRelay::Impl::~Impl() {
  // The worker still answers the calls the shutdown waits for.
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
  }
  if (header_auth_ != nullptr) header_auth_->Stop();
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (inflight_ != nullptr) inflight_->Cancel();
  }
  if (worker_.joinable()) worker_.join();
  if (options_.listen.empty()) unlink(options_.socket_path.c_str());
  // The group streams end before the channels they use go.
  absl::MutexLock lock(&mu_);
  for (auto& [group, call] : groups_) call->Cancel();
  mu_.Await(absl::Condition(
      +[](absl::flat_hash_map<GroupId, GroupCall*>* g) { return g->empty(); }, &groups_));
}

grpc::ServerWriteReactor<v1::JoinEvent>* NodeRelay::Impl::Join(grpc::CallbackServerContext* context,
                                                               const v1::JoinRequest* request) {
  auto* local = new LocalStream(this, *request);
  if (absl::Status admitted = Admit(context, "Join", request->job_id()); !admitted.ok()) {
    local->End(ToGrpcStatus(admitted));
    return local;
  }
  // Bounded as rdzvd bounds a join, member by member: one bad join is refused alone, and does
  // not make the server refuse the whole batch it would have gone up in.
  if (absl::Status checked = CheckJoinRequest(*request); !checked.ok()) {
    local->End(ToGrpcStatus(checked));
    return local;
  }
  const RelayJoin join = RelayJoinOf(*request);
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status ours = members_.CheckJoin(join); !ours.ok()) {
      local->End(ToGrpcStatus(ours));
      return local;
    }
  }
  // The headers (with the relay's proof, over TCP) go before any event can.
  local->StartSendInitialMetadata();
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    local->End(Unavailable("the node's relay is stopping"));
    return local;
  }
  absl::StatusOr<MemberId> member = members_.Join(clock_(), join);
  if (!member.ok()) {
    local->End(ToGrpcStatus(member.status()));
    return local;
  }
  local->member = *member;
  locals_[*member] = local;
  return local;
}

void NodeRelay::Impl::LocalGone(LocalStream* local) {
  absl::MutexLock lock(&mu_);
  if (local->member == 0 || locals_.erase(local->member) == 0) return;
  Do(members_.Gone(local->member));
}

void NodeRelay::Impl::Do(const RelayActions& actions, const v1::JoinEvent* event) {
  for (const RelayAction& action : actions) {
    if (const auto* push = std::get_if<relay_action::Push>(&action)) {
      if (event == nullptr) continue;
      auto it = locals_.find(push->member);
      if (it != locals_.end()) it->second->Push(*event);
    } else if (const auto* end = std::get_if<relay_action::End>(&action)) {
      auto it = locals_.find(end->member);
      if (it != locals_.end()) it->second->End(ToGrpcStatus(end->status));
    } else if (const auto* lost = std::get_if<relay_action::ReportLost>(&action)) {
      ReportLostLocked(lost->agent_id);
    } else if (const auto* retire = std::get_if<relay_action::CancelGroup>(&action)) {
      auto it = groups_.find(retire->group);
      if (it != groups_.end()) it->second->Cancel();
    } else if (std::holds_alternative<relay_action::CancelSendingUp>(action)) {
      if (inflight_ != nullptr) inflight_->Cancel();
    }
  }
}

void NodeRelay::Impl::ReportLostLocked(const std::string& agent_id) {
  tasks_.push_back([this, agent_id] {
    v1::ReportExitRequest request;
    request.set_job_id(options_.job_id);
    request.set_agent_id(agent_id);
    request.set_member_lost(true);
    v1::ReportExitResponse response;
    const grpc::Status s =
        Upstream("ReportExit", [&](v1::Rendezvous::Stub& stub, grpc::ClientContext* ctx) {
          return stub.ReportExit(ctx, request, &response);
        });
    // NOT_FOUND: the server had let the member go already (the job ended, or it left).
    if (!s.ok() && s.error_code() != grpc::StatusCode::NOT_FOUND) {
      spdlog::warn("job {}: could not tell the server that agent {} of this node is gone: {}",
                   options_.job_id, agent_id, s.error_message());
    }
  });
}

void NodeRelay::Impl::Deliver(GroupCall* call, const v1::JoinEvent& event) {
  if (event.has_batch()) {
    for (const v1::JoinEvent& e : event.batch().events()) Deliver(call, e);
    return;
  }
  std::optional<absl::Status> member_end;
  if (event.has_member_end()) {
    member_end = absl::Status(static_cast<absl::StatusCode>(event.member_end().code()),
                              event.member_end().message());
  }
  // The member's agent names the server in use in its messages and its workers' RDZV_ENDPOINT.
  v1::JoinEvent for_member = event;
  for_member.clear_agent_id();
  for_member.set_server(call->server());
  absl::MutexLock lock(&mu_);
  Do(members_.Event(call->group(), event.agent_id(), member_end), &for_member);
}

void NodeRelay::Impl::GroupDone(GroupCall* call, const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  const GroupId group = call->group();
  if (groups_.erase(group) == 0) return;
  Do(members_.GroupEnded(group, FromGrpcStatus(status)));
}

void NodeRelay::Impl::Post(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

void NodeRelay::Impl::RunWorker() {
  absl::Time key_checked = absl::Now();
  absl::Time ticked = absl::Now();
  for (;;) {
    if (connections_ != nullptr && absl::Now() - ticked >= absl::Seconds(1)) {
      ticked = absl::Now();
      connections_->Tick();
    }
    // The credential vouching for a TCP relay's key is renewed before it expires.
    if (auth_ != nullptr && absl::Now() - key_checked >= absl::Seconds(10)) {
      key_checked = absl::Now();
      if (absl::Status s = auth_->RefreshServerKey(key_checked); !s.ok()) {
        spdlog::warn("job {}: this relay cannot renew the credential it proves itself with: {}",
                     options_.job_id, std::string(s.message()));
      }
    }
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      busy_ = false;
      const auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !tasks_.empty() || members_.Due(clock_());
      };
      if (!ready()) {
        absl::Duration wait = kWorkerTick;
        if (const Micros due = members_.due_at(); due != RelayMembers::kNever) {
          wait = std::min(wait, absl::Microseconds(due - clock_()));
        }
        mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
        if (!ready()) continue;  // the timers above are due now and then
      }
      if (stopping_) return;
      busy_ = true;
      if (!tasks_.empty()) {
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
    }
    if (task) {
      task();
    } else {
      Flush();
    }
  }
}

void NodeRelay::Impl::Flush() {
  std::vector<MemberId> batch;
  v1::JoinRequest request;
  {
    absl::MutexLock lock(&mu_);
    batch = members_.TakeBatch(clock_());
    if (batch.empty()) return;
    request = GroupJoin(batch);
  }
  const std::optional<grpc::Status> failed = GoUp(batch, request);
  if (!failed) return;
  absl::MutexLock lock(&mu_);
  Do(members_.Failed(batch, FromGrpcStatus(*failed)));
}

v1::JoinRequest NodeRelay::Impl::GroupJoin(const std::vector<MemberId>& batch) const {
  v1::JoinRequest request;
  request.set_job_id(options_.job_id);
  request.set_protocol_version(kGroupJoinProtocolVersion);
  for (MemberId member : batch) {
    const v1::JoinRequest& asked = locals_.at(member)->request();
    *request.add_members() = asked;
    // A server that predates a member's fields refuses the group instead of misreading it.
    request.set_protocol_version(std::max(request.protocol_version(), asked.protocol_version()));
  }
  return request;
}

std::optional<grpc::Status> NodeRelay::Impl::GoUp(const std::vector<MemberId>& batch,
                                                  const v1::JoinRequest& request) {
  // Like a single agent, the relay moves on to the next candidate at once when one is
  // unreachable, serves another job or does not prove itself; after a round over all of them the
  // members hear Unavailable, and their own joins retry with backoff.
  grpc::Status last = Unavailable("no rendezvous server to try");
  for (size_t tries = 0; tries < servers_->size(); ++tries) {
    const size_t at = servers_->current();
    const std::string& server = servers_->at(at).name;
    auto call = std::make_shared<GroupCall>(this, server);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
      if (members_.AllGone(batch)) {
        last = grpc::Status(grpc::StatusCode::CANCELLED, "the joining agents are gone");
        break;
      }
      inflight_ = call;
      members_.SendingUp(batch);
    }
    const absl::Time wait_until =
        absl::Now() +
        (servers_->several() ? options_.upstream.rpc_timeout : options_.upstream.join_timeout);
    absl::StatusOr<JoinOpening> opening =
        OpenJoin(*call, *servers_, at, options_.upstream.auth, request, wait_until);
    {
      absl::MutexLock lock(&mu_);
      inflight_.reset();
      members_.NotSendingUp();
      if (opening.ok() && opening->headers == JoinStream::Headers::kArrived &&
          opening->proof.ok()) {
        const GroupId group = next_group_++;
        call->set_group(group);
        groups_[group] = call.get();
        ++upstream_streams_;
        Do(members_.WentUp(group, batch));
        call->Proceed();
        return std::nullopt;
      }
    }
    if (!opening.ok()) {
      last = ToGrpcStatus(opening.status());
      break;
    }
    const grpc::Status status = Refusal(*call, *opening, server);
    if (!MovesOn(static_cast<absl::StatusCode>(status.error_code()), servers_->several())) {
      last = status;  // a refusal: the members hear it as it is
      break;
    }
    last = Unavailable(status.error_message());
    servers_->MoveOn(at);
  }
  return last;
}

grpc::Status NodeRelay::Impl::Refusal(GroupCall& call, const JoinOpening& opening,
                                      const std::string& server) {
  const grpc::Status ended = call.AwaitDone();
  switch (opening.headers) {
    case JoinStream::Headers::kNone:
      return ended;
    case JoinStream::Headers::kWaiting:
      return Unavailable(
          absl::StrFormat("the rendezvous server at %s sent nothing in answer", server));
    case JoinStream::Headers::kArrived:
      break;
  }
  return Unavailable(absl::StrFormat(
      "the server at %s did not prove that it is the rendezvous server of job %s: %s", server,
      options_.job_id, opening.proof.message()));
}

template <typename Call>
grpc::Status NodeRelay::Impl::Upstream(absl::string_view method, Call call) {
  const ServerList::Server& server = servers_->server();
  absl::StatusOr<ProvenCall> answer =
      CallProven(server, options_.upstream.auth, method, options_.job_id,
                 options_.upstream.rpc_timeout, std::move(call));
  if (!answer.ok()) return ToGrpcStatus(answer.status());
  if (!answer->proof.ok()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrFormat("the server at %s did not prove itself: %s", server.name,
                                        answer->proof.message()));
  }
  return answer->status;
}

template <typename Request, typename Response, typename Check, typename Call>
grpc::ServerUnaryReactor* NodeRelay::Impl::PassUp(grpc::CallbackServerContext* context,
                                                  absl::string_view method, const Request* request,
                                                  Response* response, Check check, Call call) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status admitted = Admit(context, method, request->job_id()); !admitted.ok()) {
    reactor->Finish(ToGrpcStatus(admitted));
    return reactor;
  }
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status ours = check(); !ours.ok()) {
      reactor->Finish(ToGrpcStatus(ours));
      return reactor;
    }
  }
  Post([this, reactor, method, request, response, call] {
    reactor->Finish(Upstream(method, [&](v1::Rendezvous::Stub& stub, grpc::ClientContext* ctx) {
      return call(stub, ctx, *request, response);
    }));
  });
  return reactor;
}

grpc::ServerUnaryReactor* NodeRelay::Impl::ReportExit(grpc::CallbackServerContext* context,
                                                      const v1::ReportExitRequest* request,
                                                      v1::ReportExitResponse* response) {
  return PassUp(
      context, "ReportExit", request, response,
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return members_.CheckReportExit(request->job_id(), request->member_lost());
      },
      [](v1::Rendezvous::Stub& stub, grpc::ClientContext* ctx, const v1::ReportExitRequest& r,
         v1::ReportExitResponse* answer) { return stub.ReportExit(ctx, r, answer); });
}

grpc::ServerUnaryReactor* NodeRelay::Impl::Leave(grpc::CallbackServerContext* context,
                                                 const v1::LeaveRequest* request,
                                                 v1::LeaveResponse* response) {
  return PassUp(
      context, "Leave", request, response,
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return members_.Leave(request->job_id(), request->agent_id());
      },
      [](v1::Rendezvous::Stub& stub, grpc::ClientContext* ctx, const v1::LeaveRequest& r,
         v1::LeaveResponse* answer) { return stub.Leave(ctx, r, answer); });
}

bool NodeRelay::Impl::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return members_.Idle() && tasks_.empty() && !busy_;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

absl::StatusOr<std::unique_ptr<NodeRelay>> NodeRelay::Start(NodeRelayOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  if (absl::Status s = impl->Init(); !s.ok()) return s;
  return std::unique_ptr<NodeRelay>(new NodeRelay(std::move(impl)));
}

NodeRelay::NodeRelay(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NodeRelay::~NodeRelay() = default;

bool NodeRelay::WaitIdle(absl::Duration timeout) { return impl_->WaitIdle(timeout); }

std::string NodeRelay::endpoint() const { return impl_->endpoint(); }

int NodeRelay::upstream_streams() const { return impl_->upstream_streams(); }

}  // namespace rdzv
