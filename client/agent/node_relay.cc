#include "client/agent/node_relay.h"

#include <dirent.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <functional>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "client/client_channel.h"
#include "common/auth.h"
#include "common/core/host_port.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "common/proto_convert.h"
#include "rdzv/v1/rdzv.grpc.pb.h"
#include "server/connection_guard.h"
#include "server/header_auth.h"
#include "server/request_limits.h"

namespace rdzv {

namespace {

// A new connection's time to be let in before it may be dropped to make room for another of its
// host (as rdzvd's kUnprovenGrace).
constexpr absl::Duration kRelayUnprovenGrace = absl::Seconds(2);

// How long a relay waits for the rest of its agents when they resume the same round after the
// server's stream was lost: all of them heard it at the same moment.
constexpr absl::Duration kResumeGather = absl::Milliseconds(200);

// $TMPDIR when it names an absolute path (Slurm sites may give each job a private one, which every
// task of the job on a node shares), else /tmp.
std::string RelayBase() {
  const char* tmp = std::getenv("TMPDIR");
  if (tmp != nullptr && tmp[0] == '/') {
    std::string base = tmp;
    while (base.size() > 1 && base.back() == '/') base.pop_back();
    return base;
  }
  return "/tmp";
}

}  // namespace

absl::StatusOr<std::string> RelayDirectory(uid_t uid) {
  const std::string dir = absl::StrCat(RelayBase(), "/rdzv-", uid);
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot make %s: %s", dir, std::strerror(errno)));
  }
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot stat %s: %s", dir, std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != uid || (st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is not a directory of uid %d's own that only it may enter (mode %o, owner %d); "
        "remove it",
        dir, uid, st.st_mode & 07777, st.st_uid));
  }
  return dir;
}

std::string RelaySocketPath(uid_t uid, absl::string_view job_key, absl::string_view node) {
  std::string name = absl::StrCat(job_key, "-", node);
  for (char& c : name) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '.' || c == '_' || c == '-';
    if (!plain) c = '_';
  }
  const std::string dir = absl::StrCat(RelayBase(), "/rdzv-", uid, "/relay-");
  // A socket's path has room for 107 bytes; a directory too long leaves the relay unable to
  // listen, and the node's tasks then join directly.
  const size_t limit = sizeof(sockaddr_un::sun_path) - 1;
  const size_t room = dir.size() + 5 + 8 < limit ? limit - dir.size() - 5 : 8;
  if (name.size() > room) name = name.substr(name.size() - room);
  return absl::StrCat(dir, name, ".sock");
}

bool RelayListening(const std::string& socket_path) {
  const size_t slash = socket_path.rfind('/');
  if (slash == std::string::npos) return false;
  struct stat st;
  const std::string dir = socket_path.substr(0, slash);
  if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() ||
      (st.st_mode & 077) != 0) {
    return false;
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(addr.sun_path)) return false;
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;
  const bool up = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 ||
                  errno == EAGAIN || errno == EINPROGRESS;
  close(fd);
  return up;
}

namespace {

// Removes the relay sockets in `dir` that relays killed without a chance to clean up (SIGKILL, a
// crash) left behind: this user's sockets that no one listens on and that were made over a minute
// ago (a relay that is just starting has bound its socket but may not listen yet). Looks at a
// bounded number of sockets, so that a crowded directory cannot hold a relay's start up.
void SweepDeadSockets(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  const time_t made_before = time(nullptr) - 60;
  int looked = 0, removed = 0;
  while (const dirent* entry = readdir(d)) {
    const absl::string_view name = entry->d_name;
    if (!absl::StartsWith(name, "relay-") || !absl::EndsWith(name, ".sock")) continue;
    if (++looked > 256) break;
    const std::string path = absl::StrCat(dir, "/", name);
    struct stat st;
    if (lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_uid != getuid() ||
        st.st_mtime > made_before || RelayListening(path)) {
      continue;
    }
    if (unlink(path.c_str()) == 0) ++removed;
  }
  closedir(d);
  if (removed > 0)
    SPDLOG_DEBUG("removed {} relay sockets no relay listens on from {}", removed, dir);
}

class LocalStream;
class GroupCall;

// One agent of the node, as the relay knows it from its local Join.
struct Member {
  std::string agent_id;
  LocalStream* local = nullptr;  // null once its local stream is done
  v1::JoinRequest request;
  GroupCall* group = nullptr;  // the group stream it went up on; null while it waits to go up
  bool ended = false;          // its local stream is finished, or its loss reported
  bool superseded = false;     // the same agent joined again on another local stream
  bool left = false;           // its Leave went up
};

}  // namespace

class NodeRelay::Impl final : public v1::Rendezvous::CallbackService {
 public:
  explicit Impl(NodeRelayOptions options) : options_(std::move(options)) {}
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

  // From LocalStream.
  void LocalGone(LocalStream* local);
  // From GroupCall.
  void Deliver(GroupCall* call, const v1::JoinEvent& event);
  void GroupDone(GroupCall* call, const grpc::Status& status);

  bool WaitIdle(absl::Duration timeout);
  const std::string& endpoint() const { return endpoint_; }
  int upstream_streams() const {
    absl::MutexLock lock(&mu_);
    return upstream_streams_;
  }

 private:
  struct Endpoint {
    std::string name;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Rendezvous::Stub> stub;
  };

  // Listens on the UNIX socket, or on the first free TCP candidate with the callers' check.
  absl::Status ListenLocal();
  absl::Status ListenTcp();
  void ConfigureBuilder(grpc::ServerBuilder& builder);
  // For a TCP relay: checks the call's credential (HeaderAuth has checked its headers) and puts
  // the relay's proof into its answer. OK at once on a UNIX socket, whose directory vouches.
  absl::Status Admit(grpc::CallbackServerContext* context, absl::string_view method,
                     absl::string_view job_id);
  void RunWorker();
  void Post(std::function<void()> task);
  void Flush();
  // Ends the local streams of `members` still on `call` (or waiting) with `status`.
  void EndMembers(const std::vector<std::shared_ptr<Member>>& members, const grpc::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues the report that member `agent_id` is lost (ReportExitRequest.member_lost).
  void ReportLostLocked(const std::string& agent_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The members of the round the first waiting member joins that went up already, on a group
  // stream that still carries them: with the waiting ones, they may make the whole node (group).
  size_t UpLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The joins the relay holds at most: its agents', each once more, and a margin.
  size_t MaxHeld() const { return static_cast<size_t>(options_.expected) * 2 + 16; }
  // Cancels `call` once no member it carries is still on it.
  void MaybeRetire(GroupCall* call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One unary call upstream, made with the relay's credential, its answer taken only from a
  // server that proves itself. Blocks; runs on the worker.
  template <typename Call>
  grpc::Status Upstream(absl::string_view method, Call call);
  void PushLocal(Member& m, const v1::JoinEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool several() const { return endpoints_.size() > 1; }

  const NodeRelayOptions options_;
  std::vector<Endpoint> endpoints_;
  // A TCP relay's check of its callers, and its bounds on their connections; null on a UNIX
  // socket.
  std::unique_ptr<ConnectionGuard> connections_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<HeaderAuth> header_auth_;
  std::string endpoint_;  // where a TCP relay listens
  std::unique_ptr<grpc::Server> server_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<LocalStream*, std::shared_ptr<Member>> by_local_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Member>> pending_ ABSL_GUARDED_BY(mu_);
  absl::Time flush_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // The agents whose joins went up before, with the round they went up in: one of them joining
  // again in a later round is a restart, in the same round a resume.
  absl::flat_hash_map<std::string, int32_t> carried_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<GroupCall*, std::vector<std::shared_ptr<Member>>> groups_
      ABSL_GUARDED_BY(mu_);
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // the worker runs a task
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;  // the endpoint in use
  int upstream_streams_ ABSL_GUARDED_BY(mu_) = 0;
  // The group call the worker waits on for the server's proof, so that stopping can end it.
  std::shared_ptr<GroupCall> inflight_ ABSL_GUARDED_BY(mu_);
  // The members whose joins inflight_ carries: once all are gone, it is cancelled.
  std::vector<std::shared_ptr<Member>> inflight_batch_ ABSL_GUARDED_BY(mu_);
  std::thread worker_;
};

namespace {

// A member's Join stream on the local socket. Events are written one at a time from a queue;
// End finishes it once the queue has drained. Pushed to only under the relay's lock, and forgets
// the relay's record of it (LocalGone) before it is deleted, so the relay never holds a dangling
// pointer. Owned by gRPC: deleted in OnDone.
class LocalStream final : public grpc::ServerWriteReactor<v1::JoinEvent> {
 public:
  explicit LocalStream(NodeRelay::Impl* relay) : relay_(relay) {}

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

  NodeRelay::Impl* const relay_;
  absl::Mutex mu_;
  std::deque<v1::JoinEvent> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status finish_ ABSL_GUARDED_BY(mu_);
};

// The group stream to the server. Holds itself until OnDone; the relay's worker holds it too
// while it decides whether the server proved itself.
class GroupCall final : public grpc::ClientReadReactor<v1::JoinEvent>,
                        public std::enable_shared_from_this<GroupCall> {
 public:
  GroupCall(NodeRelay::Impl* relay, v1::JoinRequest request)
      : relay_(relay), request_(std::move(request)) {}

  grpc::ClientContext& context() { return context_; }

  // The server this call was made to ("host:port"): its members hear it with their events.
  void set_server(std::string server) { server_ = std::move(server); }
  const std::string& server() const { return server_; }

  void Start(v1::Rendezvous::Stub* stub) {
    self_ = shared_from_this();
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::hours(24 * 30));
    stub->async()->Join(&context_, &request_, this);
    AddHold();  // until the proof is checked: no event counts before it
    StartCall();
  }

  enum class Headers { kWaiting, kArrived, kNone };
  Headers AwaitHeaders(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithDeadline(absl::Condition(
                              +[](GroupCall* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) {
                                return c->headers_ != Headers::kWaiting;
                              },
                              this),
                          deadline);
    return headers_;
  }

  void Proceed() {
    StartRead(&event_);
    RemoveHold();
  }
  // Lets a call that ended without initial metadata finish: its status goes to OnDone.
  void LetEnd() { RemoveHold(); }
  // Ends the call with `why` for its members instead of the status gRPC gives it.
  void Abandon(grpc::Status why) {
    {
      absl::MutexLock lock(&mu_);
      override_ = std::move(why);
    }
    context_.TryCancel();
    RemoveHold();
  }
  void Cancel() { context_.TryCancel(); }

  void OnReadInitialMetadataDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    headers_ = ok ? Headers::kArrived : Headers::kNone;
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    relay_->Deliver(this, event_);
    StartRead(&event_);
  }

  void OnDone(const grpc::Status& status) override {
    std::shared_ptr<GroupCall> keep = std::move(self_);
    grpc::Status final = status;
    {
      absl::MutexLock lock(&mu_);
      if (override_) final = *override_;
    }
    relay_->GroupDone(this, final);
    absl::MutexLock lock(&mu_);
    status_ = final;
    done_ = true;
  }

  // The call's status once it is done.
  grpc::Status AwaitDone() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    return status_;
  }

 private:
  std::string server_;
  NodeRelay::Impl* const relay_;
  grpc::ClientContext context_;
  v1::JoinRequest request_;
  v1::JoinEvent event_;
  absl::Mutex mu_;
  Headers headers_ ABSL_GUARDED_BY(mu_) = Headers::kWaiting;
  std::optional<grpc::Status> override_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<GroupCall> self_;
};

grpc::Status Unavailable(const std::string& why) {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, why);
}

}  // namespace

absl::Status NodeRelay::Impl::Init() {
  absl::StatusOr<ClientChannelSetup> setup = MakeClientChannelSetup(options_.upstream);
  if (!setup.ok()) return setup.status();
  std::vector<std::string> names = {options_.upstream.endpoint};
  names.insert(names.end(), options_.upstream.alternate_endpoints.begin(),
               options_.upstream.alternate_endpoints.end());
  for (const std::string& name : names) {
    Endpoint e;
    e.name = name;
    e.channel = grpc::CreateCustomChannel(name, setup->credentials, setup->args);
    e.stub = v1::Rendezvous::NewStub(e.channel);
    endpoints_.push_back(std::move(e));
  }
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
  const size_t slash = options_.socket_path.rfind('/');
  if (slash == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the relay socket %s is not a path", options_.socket_path));
  }
  absl::StatusOr<std::string> dir = RelayDirectory(getuid());
  if (!dir.ok()) return dir.status();
  if (*dir != options_.socket_path.substr(0, slash)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the relay socket %s is not in %s", options_.socket_path, *dir));
  }
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
    header_auth_ = std::make_unique<HeaderAuth>(auth_.get(), [](absl::string_view) {});
  }
  // As rdzvd bounds its callers' connections (server/connection_guard.h), by the same rules: a
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
  connections_ = std::make_unique<ConnectionGuard>(
      limits, TcpKeepalive{options_.ping, options_.ping_timeout});
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
  for (auto& [call, members] : groups_) call->Cancel();
  mu_.Await(absl::Condition(
      +[](absl::flat_hash_map<GroupCall*, std::vector<std::shared_ptr<Member>>>* g) {
        return g->empty();
      },
      &groups_));
}

grpc::ServerWriteReactor<v1::JoinEvent>* NodeRelay::Impl::Join(grpc::CallbackServerContext* context,
                                                               const v1::JoinRequest* request) {
  auto* local = new LocalStream(this);
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
  if (request->job_id() != options_.job_id || request->members_size() > 0) {
    local->End(grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrFormat("this relay serves job %s, not %s", options_.job_id, request->job_id())));
    return local;
  }
  if (!options_.listen.empty() &&
      (request->node_index() < options_.first_node || request->node_index() > options_.last_node)) {
    local->End(grpc::Status(grpc::StatusCode::NOT_FOUND,
                            absl::StrFormat("this relay serves nodes %d..%d of job %s, not node %d",
                                            options_.first_node, options_.last_node,
                                            options_.job_id, request->node_index())));
    return local;
  }
  // The headers (with the relay's proof, over TCP) go before any event can.
  local->StartSendInitialMetadata();
  auto member = std::make_shared<Member>();
  member->agent_id = request->agent_id();
  member->local = local;
  member->request = *request;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      local->End(Unavailable("the node's relay is stopping"));
      return local;
    }
    // The relay holds its group's joins, with room for each to come back once: a caller
    // opening more (a loop, or a process of the same user) is refused, not remembered.
    if (by_local_.size() >= MaxHeld()) {
      local->End(grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrFormat("this relay of job %s already holds %d joins for its %d agents; "
                          "start each agent once",
                          options_.job_id, by_local_.size(), options_.expected)));
      return local;
    }
    for (auto& [other_local, other] : by_local_) {
      if (other->agent_id == member->agent_id) other->superseded = true;
    }
    by_local_[local] = member;
    pending_.push_back(member);
    if (pending_.size() == 1) {
      // A restart's agents come back as each has stopped its workers; after a lost server, all
      // at once, and their reconnect timeout may be short.
      const auto carried = carried_.find(member->agent_id);
      absl::Duration wait = options_.gather;
      if (carried != carried_.end()) {
        wait = carried->second == request->restart_count()
                   ? std::min(options_.gather, kResumeGather)
                   : options_.rejoin_gather;
      }
      flush_at_ = absl::Now() + wait;
    }
  }
  return local;
}

void NodeRelay::Impl::LocalGone(LocalStream* local) {
  absl::MutexLock lock(&mu_);
  auto it = by_local_.find(local);
  if (it == by_local_.end()) return;
  std::shared_ptr<Member> m = it->second;
  by_local_.erase(it);
  m->local = nullptr;
  if (m->group == nullptr) {
    pending_.erase(std::remove(pending_.begin(), pending_.end(), m), pending_.end());
    // A join on its way up for members that are all gone (a server that does not answer would
    // hold it to the join timeout, and the relay's node with it) ends now.
    if (inflight_ != nullptr &&
        std::find(inflight_batch_.begin(), inflight_batch_.end(), m) != inflight_batch_.end() &&
        std::all_of(inflight_batch_.begin(), inflight_batch_.end(),
                    [](const std::shared_ptr<Member>& b) { return b->local == nullptr; })) {
      inflight_->Cancel();
    }
    return;
  }
  if (m->ended || m->superseded || m->left) {
    MaybeRetire(m->group);
    return;
  }
  // Its task ended without a word: the server hears that it is lost, as it would have from the
  // agent's own stream.
  m->ended = true;
  ReportLostLocked(m->agent_id);
  MaybeRetire(m->group);
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

size_t NodeRelay::Impl::UpLocked() const {
  if (pending_.empty()) return 0;
  const int32_t round = pending_.front()->request.restart_count();
  size_t up = 0;
  for (const auto& [local, m] : by_local_) {
    if (m->group != nullptr && !m->ended && !m->superseded && m->request.restart_count() == round) {
      ++up;
    }
  }
  return up;
}

void NodeRelay::Impl::MaybeRetire(GroupCall* call) {
  auto it = groups_.find(call);
  if (it == groups_.end()) return;
  for (const std::shared_ptr<Member>& m : it->second) {
    if (m->group == call && !m->ended && !m->superseded) return;
  }
  call->Cancel();
}

void NodeRelay::Impl::PushLocal(Member& m, const v1::JoinEvent& event) {
  if (m.local == nullptr || m.ended) return;
  v1::JoinEvent copy = event;
  copy.clear_agent_id();
  // The member's agent names the server in use in its messages and its workers' RDZV_ENDPOINT.
  if (m.group != nullptr) copy.set_server(m.group->server());
  m.local->Push(std::move(copy));
}

void NodeRelay::Impl::Deliver(GroupCall* call, const v1::JoinEvent& event) {
  if (event.has_batch()) {
    for (const v1::JoinEvent& e : event.batch().events()) Deliver(call, e);
    return;
  }
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(call);
  if (it == groups_.end()) return;
  for (const std::shared_ptr<Member>& m : it->second) {
    if (m->group != call || m->superseded) continue;
    if (event.agent_id().empty()) {
      // Progress, or the job's abort: the same for every member still on the stream.
      PushLocal(*m, event);
      continue;
    }
    if (m->agent_id != event.agent_id()) continue;
    if (event.has_member_end()) {
      if (m->local != nullptr && !m->ended) {
        m->local->End(grpc::Status(static_cast<grpc::StatusCode>(event.member_end().code()),
                                   absl::StrCat(kRelaySaid, event.member_end().message())));
      }
      m->ended = true;
      MaybeRetire(call);
    } else {
      PushLocal(*m, event);
    }
    break;
  }
}

void NodeRelay::Impl::GroupDone(GroupCall* call, const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(call);
  if (it == groups_.end()) return;
  // Said by the relay, which lives: the members ask it again (RelayedRendezvous).
  grpc::Status for_members = status;
  if (status.error_code() == grpc::StatusCode::CANCELLED ||
      status.error_code() == grpc::StatusCode::NOT_FOUND) {
    for_members = Unavailable(absl::StrCat(kRelaySaid, "it lost its stream to the server (",
                                           status.error_message(), ")"));
  } else if (!status.ok()) {
    for_members =
        grpc::Status(status.error_code(), absl::StrCat(kRelaySaid, status.error_message()));
  }
  std::vector<std::shared_ptr<Member>> members = std::move(it->second);
  groups_.erase(it);
  for (const std::shared_ptr<Member>& m : members) {
    if (m->group != call) continue;
    // The call is about to go: nothing may point at it.
    m->group = nullptr;
    if (m->superseded || m->ended) continue;
    if (m->local != nullptr) m->local->End(for_members);
    m->ended = true;
  }
}

void NodeRelay::Impl::EndMembers(const std::vector<std::shared_ptr<Member>>& members,
                                 const grpc::Status& status) {
  for (const std::shared_ptr<Member>& m : members) {
    if (m->local != nullptr && !m->ended) m->local->End(status);
    m->ended = true;
  }
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
        return stopping_ || !tasks_.empty() ||
               (!pending_.empty() &&
                (static_cast<int>(pending_.size() + UpLocked()) >= options_.expected ||
                 absl::Now() >= flush_at_));
      };
      if (!ready()) {
        const absl::Time until = pending_.empty()
                                     ? absl::Now() + absl::Milliseconds(200)
                                     : std::min(flush_at_, absl::Now() + absl::Milliseconds(200));
        mu_.AwaitWithDeadline(absl::Condition(&ready), until);
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
  std::vector<std::shared_ptr<Member>> batch;
  v1::JoinRequest request;
  {
    absl::MutexLock lock(&mu_);
    batch = std::move(pending_);
    pending_.clear();
    flush_at_ = absl::InfiniteFuture();
    batch.erase(std::remove_if(batch.begin(), batch.end(),
                               [](const std::shared_ptr<Member>& m) {
                                 return m->local == nullptr || m->superseded;
                               }),
                batch.end());
    if (batch.empty()) return;
    // The server takes at most kMaxGroupMembers joins in one group: the rest go up next, at once.
    if (batch.size() > kMaxGroupMembers) {
      pending_.assign(batch.begin() + kMaxGroupMembers, batch.end());
      batch.resize(kMaxGroupMembers);
      flush_at_ = absl::Now();
    }
    // In task (or node) order: should the relay's own agent (the node's first task, the group's
    // first node) die, taking the group's stream with it, the server names it, the first member
    // it finds lost.
    std::stable_sort(batch.begin(), batch.end(),
                     [](const std::shared_ptr<Member>& a, const std::shared_ptr<Member>& b) {
                       return std::make_pair(a->request.order(), a->request.node_index()) <
                              std::make_pair(b->request.order(), b->request.node_index());
                     });
    request.set_job_id(options_.job_id);
    request.set_protocol_version(kGroupJoinProtocolVersion);
    for (const std::shared_ptr<Member>& m : batch) {
      *request.add_members() = m->request;
      // A server that predates a member's fields refuses the group instead of misreading it.
      request.set_protocol_version(
          std::max(request.protocol_version(), m->request.protocol_version()));
      // Bounded: the node's tasks, each by its one agent id, and a margin for stray joins.
      if (carried_.size() < MaxHeld() || carried_.contains(m->agent_id)) {
        carried_[m->agent_id] = m->request.restart_count();
      }
    }
  }
  // Like a single agent, the relay moves on to the next candidate at once when one is
  // unreachable, serves another job or does not prove itself; after a round over all of them the
  // members hear Unavailable, and their own joins retry with backoff.
  grpc::Status last = Unavailable("no rendezvous server to try");
  for (size_t tries = 0; tries < endpoints_.size(); ++tries) {
    size_t endpoint;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
      endpoint = current_;
    }
    const auto next_endpoint = [&] {
      absl::MutexLock lock(&mu_);
      if (current_ == endpoint) current_ = (current_ + 1) % endpoints_.size();
    };
    const Endpoint& e = endpoints_[endpoint];
    auto call = std::make_shared<GroupCall>(this, request);
    call->set_server(e.name);
    const std::string nonce = NewNonce();
    if (absl::Status s = AttachCredential(call->context(), options_.upstream.auth, "Join",
                                          options_.job_id, nonce);
        !s.ok()) {
      last = ToGrpcStatus(s);
      break;
    }
    {
      absl::MutexLock lock(&mu_);
      if (std::all_of(batch.begin(), batch.end(),
                      [](const std::shared_ptr<Member>& m) { return m->local == nullptr; })) {
        last = grpc::Status(grpc::StatusCode::CANCELLED, "the joining agents are gone");
        break;
      }
      inflight_ = call;
      inflight_batch_ = batch;
    }
    call->Start(e.stub.get());
    const absl::Time wait_until =
        absl::Now() + (several() ? options_.upstream.rpc_timeout : options_.upstream.join_timeout);
    const GroupCall::Headers headers = call->AwaitHeaders(wait_until);
    absl::Status proof = absl::OkStatus();
    if (headers == GroupCall::Headers::kArrived) {
      proof = CheckServerProof(call->context(), options_.upstream.auth, "Join", options_.job_id,
                               nonce, several() || ProofRequiredAt(e.name));
      if (proof.ok()) {
        absl::MutexLock lock(&mu_);
        inflight_.reset();
        inflight_batch_.clear();
        for (const std::shared_ptr<Member>& m : batch) {
          m->group = call.get();
          // Its task ended while the batch was on its way: the server hears it is lost.
          if (m->local == nullptr && !m->ended) {
            m->ended = true;
            ReportLostLocked(m->agent_id);
          }
        }
        groups_[call.get()] = batch;
        ++upstream_streams_;
        call->Proceed();
        return;
      }
    }
    grpc::Status status;
    if (headers == GroupCall::Headers::kNone) {
      call->LetEnd();
      status = call->AwaitDone();
    } else {
      call->Abandon(grpc::Status::CANCELLED);
      call->AwaitDone();
      status = headers == GroupCall::Headers::kWaiting
                   ? Unavailable(absl::StrFormat(
                         "the rendezvous server at %s sent nothing in answer", e.name))
                   : Unavailable(absl::StrFormat("the server at %s did not prove that it is the "
                                                 "rendezvous server of job %s: %s",
                                                 e.name, options_.job_id, proof.message()));
    }
    {
      absl::MutexLock lock(&mu_);
      inflight_.reset();
      inflight_batch_.clear();
    }
    const bool elsewhere = status.error_code() == grpc::StatusCode::NOT_FOUND && several();
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE && !elsewhere) {
      last = status;  // a refusal: the members hear it as it is
      break;
    }
    last = Unavailable(status.error_message());
    next_endpoint();
  }
  absl::MutexLock lock(&mu_);
  EndMembers(batch, last);
}

template <typename Call>
grpc::Status NodeRelay::Impl::Upstream(absl::string_view method, Call call) {
  size_t endpoint;
  {
    absl::MutexLock lock(&mu_);
    endpoint = current_;
  }
  const Endpoint& e = endpoints_[endpoint];
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   absl::ToChronoMilliseconds(options_.upstream.rpc_timeout));
  const std::string nonce = NewNonce();
  if (absl::Status s =
          AttachCredential(ctx, options_.upstream.auth, method, options_.job_id, nonce);
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  grpc::Status status = call(*e.stub, &ctx);
  const absl::Status proof = CheckServerProof(ctx, options_.upstream.auth, method, options_.job_id,
                                              nonce, ProofRequiredAt(e.name));
  if (!proof.ok()) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrFormat("the server at %s did not prove itself: %s", e.name, proof.message()));
  }
  return status;
}

grpc::ServerUnaryReactor* NodeRelay::Impl::ReportExit(grpc::CallbackServerContext* context,
                                                      const v1::ReportExitRequest* request,
                                                      v1::ReportExitResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status admitted = Admit(context, "ReportExit", request->job_id()); !admitted.ok()) {
    reactor->Finish(ToGrpcStatus(admitted));
    return reactor;
  }
  if (request->job_id() != options_.job_id || request->member_lost()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "the node's relay forwards its own job's failure reports only"));
    return reactor;
  }
  Post([this, reactor, request, response] {
    reactor->Finish(
        Upstream("ReportExit", [&](v1::Rendezvous::Stub& stub, grpc::ClientContext* ctx) {
          return stub.ReportExit(ctx, *request, response);
        }));
  });
  return reactor;
}

grpc::ServerUnaryReactor* NodeRelay::Impl::Leave(grpc::CallbackServerContext* context,
                                                 const v1::LeaveRequest* request,
                                                 v1::LeaveResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status admitted = Admit(context, "Leave", request->job_id()); !admitted.ok()) {
    reactor->Finish(ToGrpcStatus(admitted));
    return reactor;
  }
  if (request->job_id() != options_.job_id) {
    reactor->Finish(grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrFormat("this relay serves job %s, not %s", options_.job_id, request->job_id())));
    return reactor;
  }
  {
    absl::MutexLock lock(&mu_);
    for (auto& [local, m] : by_local_) {
      if (m->agent_id == request->agent_id() && !m->superseded) m->left = true;
    }
  }
  Post([this, reactor, request, response] {
    reactor->Finish(Upstream("Leave", [&](v1::Rendezvous::Stub& stub, grpc::ClientContext* ctx) {
      return stub.Leave(ctx, *request, response);
    }));
  });
  return reactor;
}

bool NodeRelay::Impl::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return by_local_.empty() && pending_.empty() && tasks_.empty() && !busy_;
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
