// rdzv-bench: a load generator for rdzvd, and a timer for rdzv-agent launches.
//
// Scale mode (the default) starts rdzvd as a separate process on a free loopback port and, for
// each agent count N, forks P client processes (this program again, in worker mode) that
// simulate N/P agents each. Every simulated agent is a librdzv Client with a channel of its own,
// run on a thread of its own as rdzv-agent runs its join. For every N it measures, on a fresh
// rdzvd:
//   - the floor: N fresh channels each making one empty unary call (GetStatus of a job that does
//     not exist), from the start barrier to the last answer;
//   - the rendezvous: N fresh Clients joining one job with node indices 0..N-1, from the start
//     barrier to the last assignment, with rdzvd's CPU time and memory while all N are attached;
//   - the fail-fast fan-out: one agent reports a failure; the time until every agent's on_abort
//     ran, per client process.
// Every assignment is checked (rank == node index, world size N). --check makes any error or
// wrong assignment fail the run, for the scale smoke test.
//
// With --tasks-per-node G, each of the N simulated nodes is a per-task launch (srun
// --ntasks-per-node=G): G agents that reach rdzvd as the node's relay (client/agent/node_relay.h)
// sends them, one group join of G members on one channel with one credential, run on the node's
// thread. Every member's assignment is checked (rank == its global task index, world size N*G,
// local rank and local world size), and in the fan-out one member's failure goes up over its
// node's channel and every member of every node must hear the abort. The floor stays N channels,
// which is what rdzvd sees. rdzvd then serves its metrics, read once with every agent assigned:
// the join streams it holds (N) and the agents attached (N*G). --compare tasks runs per-node
// (one agent per node) and per-task launches of the same N nodes in turns.
//
// With --fan-in K, the N agents join as a large per-node job's tree does: in groups of K, each
// through a real relay (client/agent/node_relay.h) that the worker processes host, each on a
// loopback address of its own (127.1.x.y) so that 100,000 connections find ports. Each agent is
// a channel and Join stream of its own (SimulatedNode in single mode, started from a few threads:
// a thread per agent would not fit 100,000). The floor is then N fresh channels to those relays,
// one empty call each; rdzvd must hold about a stream per group.
//
// With --fan-in K --simulated-children, rdzvd sees what a job of N per-node agents in a tree of
// relays sends it, without the leaf connections this machine could not hold at 100,000 agents:
// each group of K nodes is one relay's upstream side, simulated in-process (SimulatedNode in
// group mode), with its children's joins made up rather than received. What reaches rdzvd is
// byte for byte the group join a per-node tree relay sends (client/agent/node_relay.cc, Flush):
// the job id, the group protocol version, and the members' own JoinRequests as their agents sent
// them, in node order, each with its agent id, host, node index, order -1, nproc, sizes,
// addresses and master port. The bench's --fan-in K without it makes those same agents and
// sends their joins through real relays, and the two send the same members (SpecFor). One fresh
// channel per group carries it, with one credential. Left out: the relays' own work (their
// children's connections and streams, the gather wait, the relay's hand-over of each event to
// its child), which a real cluster spreads over one node in K, and the batches a relay sends
// when its group fills late (one group join per group here). The floor is one fresh channel per
// group to rdzvd, one empty call each: what rdzvd's side of the tree costs before any work. The
// rendezvous ends when every group holds every member's assignment; the abort, when every group
// has heard it for every member.
//
// Launch mode (--launch) times real rdzv-agent processes: `--standalone -- true` (wall time and
// peak RSS, median of K runs), and N agents on loopback against one rdzvd running `true`.
//
// Loss mode (--loss) times a running job's recovery from the loss of its rdzvd: for each N, the
// agents join, rdzvd is killed with SIGKILL, and every agent resumes its job (JoinSpec::resume),
// once on rdzvd restarted at once on the same port, once on a backup rdzvd that the agents list
// after it (rdzvd --peers); from the kill to the last agent back.
//
// Soak mode (--soak N) runs N consecutive rendezvous of two fresh clients each on one rdzvd and
// prints rdzvd's RSS, open fds and threads before, halfway and after: fds and threads must not
// keep growing.
//
// The parent never touches gRPC (except in soak mode, after its only fork), so forking it is safe;
// workers exec this binary afresh. Every process it starts dies with it (PR_SET_PDEATHSIG) and is
// killed and reaped on every path out, and every wait is bounded.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/agent/node_relay.h"
#include "client/client.h"
#include "client/client_channel.h"
#include "common/auth.h"
#include "common/core/env.h"
#include "common/core/flags.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/process_env.h"
#include "common/proto_convert.h"
#include "rdzv/v1/rdzv.grpc.pb.h"
#include "tests/bench/metrics_scrape.h"

namespace rdzv::bench {
namespace {

// RunScale's result when calls failed but --check was not given: exit 0, keep the logs.
constexpr int kErrorsSeen = -1;

// rdzvd's --max-agents-per-user when not given.
constexpr int64_t kDefaultMaxAgentsPerUser = 100'000;

// --simulated-children: the simulated relays one client process holds, when --procs is not given.
constexpr int64_t kGroupsPerProcess = 256;

// The job nobody joins: the floor's empty call asks for its status.
constexpr char kFloorJob[] = "rdzv-bench-floor";

// CLOCK_MONOTONIC is one clock for every process on the machine, so the parent and its workers
// compare these directly.
int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// CPU time of this whole process (all threads).
int64_t CpuNs() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data.remove_prefix(static_cast<size_t>(n));
  }
}

// One reply line from a worker: "kind key=value ... msg=free text".
struct Reply {
  std::string kind;
  std::map<std::string, std::string> fields;
  std::string message;

  int64_t Int(const std::string& key) const {
    int64_t v = 0;
    auto it = fields.find(key);
    if (it != fields.end() && absl::SimpleAtoi(it->second, &v)) return v;
    return 0;
  }
  std::vector<int64_t> List(const std::string& key) const {
    std::vector<int64_t> out;
    auto it = fields.find(key);
    if (it == fields.end()) return out;
    for (absl::string_view s : absl::StrSplit(it->second, ',', absl::SkipEmpty())) {
      int64_t v;
      if (absl::SimpleAtoi(s, &v)) out.push_back(v);
    }
    return out;
  }
};

Reply ParseReply(absl::string_view line) {
  Reply r;
  if (size_t m = line.find(" msg="); m != absl::string_view::npos) {
    r.message = std::string(line.substr(m + 5));
    line = line.substr(0, m);
  }
  std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
  if (words.empty()) return r;
  r.kind = std::string(words[0]);
  for (size_t i = 1; i < words.size(); ++i) {
    std::pair<std::string, std::string> kv = absl::StrSplit(words[i], absl::MaxSplits('=', 1));
    r.fields[kv.first] = kv.second;
  }
  return r;
}

std::string OneLine(absl::string_view text) {
  std::string s(text);
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

// ---------------------------------------------------------------------------------------------
// Worker: a client process simulating agents [first, first + count) of an N-agent job. It reads
// commands on stdin and answers each with one line on stdout.

// One thread per simulated agent, each blocked in a call for most of its life, as an agent's
// join thread is. Small stacks: a worker runs a thousand or more of them.
class AgentThreads {
 public:
  AgentThreads(size_t count, std::function<void(size_t)> body) : body_(std::move(body)) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    args_.resize(count);
    for (size_t i = 0; i < count; ++i) {
      args_[i] = {this, i};
      pthread_t t;
      if (pthread_create(&t, &attr, &AgentThreads::Main, &args_[i]) != 0) {
        start_error_ = absl::ResourceExhaustedError(
            absl::StrFormat("cannot start thread %d of %d: %s", i, count, strerror(errno)));
        break;
      }
      threads_.push_back(t);
    }
    pthread_attr_destroy(&attr);
  }
  ~AgentThreads() {
    Go();
    Join();
  }
  AgentThreads(const AgentThreads&) = delete;
  AgentThreads& operator=(const AgentThreads&) = delete;

  const absl::Status& start_error() const { return start_error_; }
  void Go() {
    if (!go_.HasBeenNotified()) go_.Notify();
  }
  // Each body ends by itself: every call it makes has a deadline.
  void Join() {
    for (pthread_t t : threads_) pthread_join(t, nullptr);
    threads_.clear();
  }

 private:
  struct Arg {
    AgentThreads* self;
    size_t index;
  };
  static void* Main(void* p) {
    auto* arg = static_cast<Arg*>(p);
    arg->self->go_.WaitForNotification();
    arg->self->body_(arg->index);
    return nullptr;
  }

  std::function<void(size_t)> body_;
  std::vector<Arg> args_;
  std::vector<pthread_t> threads_;
  absl::Notification go_;
  absl::Status start_error_;
};

struct WorkerConfig {
  std::string endpoint;
  std::string job;
  int64_t first = 0;  // the first simulated node, and how many
  int64_t count = 0;
  int64_t n = 0;  // nodes in the job
  int64_t tasks_per_node = 1;
  ClientAuth::Mode auth = ClientAuth::Mode::kNone;
  // Above 0, the nodes join in groups of fan_in through a relay each (--fan-in); this process
  // holds whole groups, and their relays.
  int64_t fan_in = 0;
  // With fan_in: each group is its relay's upstream side alone, its children simulated in-process
  // (--simulated-children): one group join per group, no relay, no leaf connections.
  bool simulated_children = false;
};

// Records the first abort an agent heard, at the time it arrived.
void MarkAbort(std::atomic<int64_t>& slot) {
  int64_t zero = 0;
  slot.compare_exchange_strong(zero, NowNs());
}

// One simulated node of a per-task launch (--tasks-per-node G), as its relay
// (client/agent/node_relay.cc) reaches rdzvd: one group join that carries the joins of the node's
// G agents, on a channel of the node's own, made with one credential and taken only from a server
// that proves itself; its events are read and unpacked as the relay reads them, every member's
// assignment and abort kept apart. Join and ReportFailure are called from the node's thread, the
// reactions run on gRPC's. The object is the call's reactor: its destructor ends the call and
// waits until gRPC is done with it, so that the channel it owns goes on this thread.
class SimulatedNode final : public grpc::ClientReadReactor<v1::JoinEvent> {
 public:
  // `members`: the joins of the node's agents, by local rank. `abort_ns`: a slot per member,
  // MarkAbort'ed when its abort arrives after its assignment.
  //
  // With `single`, the node is one agent of a tree (--fan-in) that joins its group's relay at
  // `endpoint` as rdzv-agent's client does: its own channel and stream, a plain join, and events
  // that name no agent.
  SimulatedNode(const ClientOptions& options, const ClientChannelSetup& setup,
                const std::vector<JoinSpec>& members, std::atomic<int64_t>* abort_ns,
                bool single = false, const std::string& endpoint = "")
      : options_(options),
        endpoint_(endpoint.empty() ? options.endpoint : endpoint),
        single_(single),
        channel_(grpc::CreateCustomChannel(endpoint_, setup.credentials, setup.args)),
        stub_(v1::Rendezvous::NewStub(channel_)),
        abort_ns_(abort_ns),
        assignments_(members.size()),
        refusals_(members.size()) {
    job_ = members.front().job_id;
    for (const JoinSpec& spec : members) member_ids_.push_back(spec.agent.agent_id);
    if (single_) {
      request_ = ToProto(members.front());
      request_.set_job_id(job_);
      return;
    }
    request_.set_job_id(job_);
    request_.set_protocol_version(kGroupJoinProtocolVersion);
    for (const JoinSpec& spec : members) *request_.add_members() = ToProto(spec);
  }

  ~SimulatedNode() override {
    if (!started_) return;
    {
      absl::MutexLock lock(&mu_);
      leaving_ = true;
    }
    context_.TryCancel();
    done_.WaitForNotification();
  }
  SimulatedNode(const SimulatedNode&) = delete;
  SimulatedNode& operator=(const SimulatedNode&) = delete;

  // Sends the group join and blocks until every member has its assignment (OK), a member was
  // refused or the stream ended (the first reason), or `deadline` passed. Call once.
  absl::Status Join(absl::Time deadline) {
    if (absl::Status s = Start(); !s.ok()) return s;
    if (absl::Status s = Proceed(deadline); !s.ok()) return s;
    return AwaitSettled(deadline);
  }

  // Join in three steps, for callers that start many joins from one thread: sends the join;
  // then waits for the server's headers and checks its proof, then reads its events; then waits
  // for the outcome.
  absl::Status Start() {
    nonce_ = NewNonce();
    if (absl::Status s = AttachCredential(context_, options_.auth, "Join", job_, nonce_); !s.ok()) {
      return s;
    }
    // The stream lasts as long as the job. A relay's members join again when the server cannot be
    // reached (a burst of new connections may overflow its accept queue): waiting for the
    // connection does that here.
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::hours(24 * 30));
    context_.set_wait_for_ready(true);
    stub_->async()->Join(&context_, &request_, this);
    AddHold();  // until the server's proof is checked: no event counts before it
    StartCall();
    started_ = true;
    return absl::OkStatus();
  }

  absl::Status Proceed(absl::Time deadline) {
    // gRPC is called without the lock held: a reaction it runs at once takes it.
    headers_seen_ =
        Await(deadline, [](const SimulatedNode& n) { return n.headers_ != Headers::kWaiting; });
    absl::Status proof = absl::DeadlineExceededError("the server sent nothing in answer");
    if (headers_seen_ == Headers::kArrived) {
      proof = CheckServerProof(context_, options_.auth, "Join", job_, nonce_,
                               ProofRequiredAt(endpoint_));
      if (proof.ok()) StartRead(&event_);
    }
    if (!proof.ok()) context_.TryCancel();
    RemoveHold();
    return headers_seen_ == Headers::kWaiting || (headers_seen_ == Headers::kArrived && !proof.ok())
               ? proof
               : absl::OkStatus();
  }

  absl::Status AwaitSettled(absl::Time deadline) {
    if (headers_seen_ == Headers::kArrived) {
      Await(deadline,
            [](const SimulatedNode& n) { return n.ended_ || n.settled_ == n.member_ids_.size(); });
    } else {
      Await(absl::InfiniteFuture(), [](const SimulatedNode& n) { return n.ended_; });
    }
    absl::MutexLock lock(&mu_);
    for (const absl::Status& refusal : refusals_) {
      if (!refusal.ok()) return refusal;
    }
    if (settled_ == member_ids_.size()) return absl::OkStatus();
    if (!ended_) return absl::DeadlineExceededError("the rendezvous did not complete in time");
    return final_.ok() ? absl::InternalError("the group stream ended before every assignment")
                       : final_;
  }

  // When the last member's assignment (or refusal) arrived, on NowNs()'s clock; 0 before.
  int64_t settled_ns() {
    absl::MutexLock lock(&mu_);
    return settled_ns_;
  }

  // Member `member`'s assignment, once Join has returned OK.
  AssignmentEvent assignment(size_t member) {
    absl::MutexLock lock(&mu_);
    return assignments_[member].value_or(AssignmentEvent{});
  }

  // Agents of the node whose assignment came and whose stream then dropped.
  int64_t lost() {
    absl::MutexLock lock(&mu_);
    return lost_ ? static_cast<int64_t>(member_ids_.size()) : 0;
  }

  // Reports a worker failure of member `member` over the node's channel, as the relay forwards
  // its agent's report: with the relay's credential, the answer taken from a server that proves
  // itself. Blocks for up to rpc_timeout.
  absl::Status ReportFailure(size_t member, const FailureInfo& failure) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
    const std::string nonce = NewNonce();
    if (absl::Status s = AttachCredential(ctx, options_.auth, "ReportExit", job_, nonce); !s.ok()) {
      return s;
    }
    v1::ReportExitRequest request;
    request.set_job_id(job_);
    request.set_agent_id(member_ids_[member]);
    *request.mutable_failure() = ToProto(failure);
    v1::ReportExitResponse response;
    if (grpc::Status s = stub_->ReportExit(&ctx, request, &response); !s.ok()) {
      return FromGrpcStatus(s);
    }
    return CheckServerProof(ctx, options_.auth, "ReportExit", job_, nonce,
                            ProofRequiredAt(endpoint_));
  }

  void OnReadInitialMetadataDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    headers_ = ok ? Headers::kArrived : Headers::kNone;
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows with the status
    if (event_.has_batch()) {
      for (const v1::JoinEvent& e : event_.batch().events()) Handle(e);
    } else {
      Handle(event_);
    }
    StartRead(&event_);
  }

  void OnDone(const grpc::Status& status) override {
    {
      absl::MutexLock lock(&mu_);
      ended_ = true;
      final_ = FromGrpcStatus(status);
      lost_ = settled_ == member_ids_.size() && !leaving_ && !status.ok();
    }
    done_.Notify();  // last: the destructor may run once it returns
  }

 private:
  enum class Headers { kWaiting, kArrived, kNone };

  // Waits until `done(*this)` holds (under the lock) or `deadline`; what headers_ then is.
  template <typename Done>
  Headers Await(absl::Time deadline, Done done) {
    absl::MutexLock lock(&mu_);
    const auto cond = [this, &done]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done(*this); };
    mu_.AwaitWithDeadline(absl::Condition(&cond), deadline);
    return headers_;
  }

  // One member's event, as the relay hands it to the member's own stream.
  void Handle(const v1::JoinEvent& e) {
    // Untagged: progress, or the job's abort, the same for every member; or, on a single agent's
    // stream, any of its events.
    if (e.agent_id().empty() && !single_) {
      if (e.event_case() != v1::JoinEvent::kAbort) return;
      absl::MutexLock lock(&mu_);
      for (size_t i = 0; i < member_ids_.size(); ++i) AbortLocked(i, e.abort());
      return;
    }
    const auto it = single_ ? member_ids_.begin()
                            : std::find(member_ids_.begin(), member_ids_.end(), e.agent_id());
    if (it == member_ids_.end()) return;
    const size_t i = static_cast<size_t>(it - member_ids_.begin());
    absl::MutexLock lock(&mu_);
    const bool waiting = !assignments_[i].has_value() && refusals_[i].ok();
    switch (e.event_case()) {
      case v1::JoinEvent::kAssignment:
        if (!waiting) break;
        assignments_[i] = FromProto(e.assignment());
        SettledLocked();
        break;
      case v1::JoinEvent::kAbort:
        AbortLocked(i, e.abort());
        break;
      case v1::JoinEvent::kMemberEnd:
        if (!waiting) break;
        refusals_[i] = e.member_end().code() == 0
                           ? absl::InternalError("the member's join ended before its assignment")
                           : absl::Status(static_cast<absl::StatusCode>(e.member_end().code()),
                                          e.member_end().message());
        SettledLocked();
        break;
      default:
        break;
    }
  }

  // Before its assignment an abort ends the member's join, as it ends an agent's.
  void AbortLocked(size_t i, const v1::Abort& abort) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (assignments_[i].has_value()) {
      MarkAbort(abort_ns_[i]);
    } else if (refusals_[i].ok()) {
      refusals_[i] = absl::AbortedError(abort.reason());
      SettledLocked();
    }
  }

  void SettledLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (++settled_ == member_ids_.size()) settled_ns_ = NowNs();
  }

  const ClientOptions& options_;
  const std::string endpoint_;
  const bool single_;
  std::string job_;
  std::vector<std::string> member_ids_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::Rendezvous::Stub> stub_;
  std::atomic<int64_t>* const abort_ns_;
  // After the channel and stub: the call lets go of the channel before they go.
  grpc::ClientContext context_;
  v1::JoinRequest request_;
  v1::JoinEvent event_;
  bool started_ = false;                      // the node's thread only
  std::string nonce_;                         // the node's thread only
  Headers headers_seen_ = Headers::kWaiting;  // the node's thread only
  absl::Notification done_;

  absl::Mutex mu_;
  Headers headers_ ABSL_GUARDED_BY(mu_) = Headers::kWaiting;
  std::vector<std::optional<AssignmentEvent>> assignments_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> refusals_ ABSL_GUARDED_BY(mu_);  // a member's join that failed
  size_t settled_ ABSL_GUARDED_BY(mu_) = 0;                  // assigned or refused
  int64_t settled_ns_ ABSL_GUARDED_BY(mu_) = 0;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool leaving_ ABSL_GUARDED_BY(mu_) = false;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status final_ ABSL_GUARDED_BY(mu_);
};

class Worker {
 public:
  explicit Worker(WorkerConfig config)
      : config_(std::move(config)),
        agent_options_(AgentOptions(config_)),
        abort_ns_(static_cast<size_t>(config_.count * config_.tasks_per_node)) {}

  int Run() {
    if (config_.fan_in > 0 && !config_.simulated_children) {
      if (absl::Status s = StartRelays(); !s.ok()) Die(s);
    }
    std::string line;
    while (std::getline(std::cin, line)) {
      if (line == "floor") {
        if (config_.fan_in > 0 && !config_.simulated_children) {
          FloorThroughRelays();
        } else {
          Floor();
        }
      } else if (line == "join") {
        Join();
      } else if (line == "resume") {
        Resume();
      } else if (line == "fail") {
        Fail();
      } else if (line == "abortwait") {
        AbortWait();
      } else if (line == "quit") {
        clients_.clear();
        nodes_.clear();
        relays_.clear();
        Send("bye");
        return 0;
      } else {
        Send(absl::StrCat("error msg=unknown command ", line));
      }
    }
    return 0;  // the parent went away
  }

 private:
  static ClientOptions AgentOptions(const WorkerConfig& config) {
    ClientOptions options;
    options.endpoint = config.endpoint;
    options.join_timeout = absl::Seconds(120);
    options.rpc_timeout = absl::Seconds(60);
    options.auth.mode = config.auth;
    if (config.fan_in > 0) {
      // A tree's agents, its relays and their upstream streams share the machine's two cores
      // with up to 100,000 others: a process may run late for many seconds, and pings would take
      // that for a lost peer.
      options.keepalive_time = absl::Seconds(60);
      options.keepalive_timeout = absl::Seconds(60);
    }
    // rdzvd reads the same variable: a private munged serves both.
    if (const char* socket = std::getenv("RDZV_MUNGE_SOCKET"); socket != nullptr) {
      options.auth.munge_socket = socket;
    }
    return options;
  }

  [[noreturn]] static void Die(const absl::Status& status) {
    std::fprintf(stderr, "rdzv-bench worker: %s\n", std::string(status.message()).c_str());
    std::exit(1);
  }

  void Send(const std::string& line) { WriteAll(STDOUT_FILENO, line + "\n"); }

  // Waits for the parent's start signal; false when it sent something else or went away.
  bool AwaitGo() {
    std::string line;
    return std::getline(std::cin, line) && line == "go";
  }

  // A Client per simulated node, or per group with --simulated-children (the floor's channels).
  std::vector<std::unique_ptr<Client>> NewClients() {
    std::vector<std::unique_ptr<Client>> clients;
    const int64_t count = config_.simulated_children ? Groups() : config_.count;
    for (int64_t i = 0; i < count; ++i) {
      absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(agent_options_);
      if (!c.ok()) Die(c.status());
      clients.push_back(std::move(*c));
    }
    return clients;
  }

  std::vector<std::unique_ptr<SimulatedNode>> NewNodes() {
    absl::StatusOr<ClientChannelSetup> setup = MakeClientChannelSetup(agent_options_);
    if (!setup.ok()) Die(setup.status());
    const int64_t g = config_.tasks_per_node;
    std::vector<std::unique_ptr<SimulatedNode>> nodes;
    for (int64_t i = 0; i < config_.count; ++i) {
      std::vector<JoinSpec> members;
      for (int64_t local = 0; local < g; ++local) {
        members.push_back(SpecFor(config_.first + i, local));
      }
      nodes.push_back(
          std::make_unique<SimulatedNode>(agent_options_, *setup, members, &abort_ns_[i * g]));
    }
    return nodes;
  }

  // --simulated-children: the groups this process holds, whole (it starts at a group's first
  // node), the last one maybe short.
  int64_t Groups() const { return (config_.count + config_.fan_in - 1) / config_.fan_in; }

  // --simulated-children: group i's relay as rdzvd sees it, one group join of the group's nodes'
  // agents in node order, as the relay's Flush sends them.
  std::vector<std::unique_ptr<SimulatedNode>> NewGroups() {
    absl::StatusOr<ClientChannelSetup> setup = MakeClientChannelSetup(agent_options_);
    if (!setup.ok()) Die(setup.status());
    const int64_t k = config_.fan_in;
    std::vector<std::unique_ptr<SimulatedNode>> groups;
    for (int64_t i = 0; i < Groups(); ++i) {
      std::vector<JoinSpec> members;
      for (int64_t node = i * k; node < std::min((i + 1) * k, config_.count); ++node) {
        members.push_back(SpecFor(config_.first + node, 0));
      }
      groups.push_back(
          std::make_unique<SimulatedNode>(agent_options_, *setup, members, &abort_ns_[i * k]));
    }
    return groups;
  }

  // The join of agent `local` of simulated node `node`: the node's one agent, or one of its G
  // tasks, ordered by global task index as SLURM_PROCID orders them.
  JoinSpec SpecFor(int64_t node, int64_t local) const {
    const int64_t g = config_.tasks_per_node;
    JoinSpec spec;
    spec.job_id = config_.job;
    spec.agent.agent_id =
        g == 1 ? absl::StrCat("agent-", node) : absl::StrCat("agent-", node, "-", local);
    spec.agent.host = absl::StrCat("node", node);
    spec.agent.node_index = node;
    if (g > 1) spec.agent.order = node * g + local;
    spec.agent.nproc = 1;
    spec.min_agents = static_cast<int32_t>(config_.n * g);
    spec.max_agents = static_cast<int32_t>(config_.n * g);
    spec.addresses = {"127.0.0.1"};
    spec.master_port = 29500;
    return spec;
  }

  // Whether agent `local` of node `node` got its place: one rank per agent in task order, G per
  // node.
  absl::Status CheckAssignment(const AssignmentEvent& a, int64_t node, int64_t local) const {
    const int64_t g = config_.tasks_per_node;
    const int64_t n = config_.n;
    if (a.slot.rank_offset == node * g + local && a.slot.group_rank == node &&
        a.world_size == n * g && a.group_world_size == n && a.agents == n * g &&
        a.slot.local_rank_offset == local && a.slot.local_world_size == g) {
      return absl::OkStatus();
    }
    return absl::InternalError(absl::StrFormat(
        "wrong assignment for node %d task %d: rank %d group rank %d world %d groups %d agents %d "
        "local rank %d local world %d",
        node, local, a.slot.rank_offset, a.slot.group_rank, a.world_size, a.group_world_size,
        a.agents, a.slot.local_rank_offset, a.slot.local_world_size));
  }

  // Sends "kind ok= err= last= lat=..." for calls that ran from start[i] to end[i].
  void SendTimings(const std::string& kind, const std::vector<int64_t>& start,
                   const std::vector<int64_t>& end, const std::vector<absl::Status>& status,
                   const std::string& extra) {
    int64_t ok = 0, last = 0;
    std::string first_error;
    std::vector<int64_t> lat_us;
    for (size_t i = 0; i < start.size(); ++i) {
      if (status[i].ok()) {
        ++ok;
        last = std::max(last, end[i]);
        lat_us.push_back((end[i] - start[i]) / 1000);
      } else if (first_error.empty()) {
        first_error =
            config_.simulated_children
                ? absl::StrCat("the group of node ",
                               config_.first + static_cast<int64_t>(i) * config_.fan_in, ": ",
                               status[i].ToString())
                : absl::StrCat(config_.tasks_per_node > 1 ? "node " : "agent ",
                               config_.first + static_cast<int64_t>(i), ": ", status[i].ToString());
      }
    }
    Send(absl::StrFormat("%s cpu=%d ok=%d err=%d last=%d lat=%s %s msg=%s", kind, CpuNs(), ok,
                         static_cast<int64_t>(start.size()) - ok, last, absl::StrJoin(lat_us, ","),
                         extra, OneLine(first_error)));
  }

  // Tells the parent that a phase is ready once `threads` have started, waits for its go, and runs
  // them to their end. False when the threads could not start or the parent said something else.
  bool RunWhenTold(AgentThreads& threads) {
    if (!threads.start_error().ok()) {
      Send(absl::StrCat("error msg=", threads.start_error().ToString()));
      return false;
    }
    Send(absl::StrCat("ready cpu=", CpuNs()));
    if (!AwaitGo()) return false;
    threads.Go();
    threads.Join();
    return true;
  }

  // The join phase's timings, with the agents that lost their stream and the ranks they got.
  void SendJoined(const std::vector<int64_t>& start, const std::vector<int64_t>& end,
                  const std::vector<absl::Status>& status, const std::vector<int64_t>& ranks) {
    for (const std::unique_ptr<SimulatedNode>& node : nodes_) lost_ += node->lost();
    SendTimings("join", start, end, status,
                absl::StrFormat("lost=%d ranks=%s", lost_.load(), absl::StrJoin(ranks, ",")));
  }

  void Floor() {
    std::vector<std::unique_ptr<Client>> clients = NewClients();
    const size_t count = clients.size();
    std::vector<int64_t> start(count), end(count);
    std::vector<absl::Status> status(count);
    {
      AgentThreads threads(count, [&](size_t i) {
        start[i] = NowNs();
        absl::StatusOr<std::vector<JobStatusView>> r = clients[i]->Status(kFloorJob);
        end[i] = NowNs();
        if (!r.ok()) status[i] = r.status();
      });
      if (!RunWhenTold(threads)) return;
    }
    SendTimings("floor", start, end, status, "");
    // Close the floor's connections once the parent has taken rdzvd's figures, so that the
    // teardown counts in no phase and the rendezvous starts clean.
    std::string line;
    if (std::getline(std::cin, line) && line == "close") {
      clients.clear();
      Send("closed");
    }
  }

  // Simulated node i's one agent joins with a Client of its own; its rank goes to ranks[i].
  absl::Status JoinAgent(size_t i, std::vector<int64_t>& ranks) {
    const int64_t node = config_.first + static_cast<int64_t>(i);
    Handlers handlers;
    handlers.on_abort = [this, i](const AbortEvent&) { MarkAbort(abort_ns_[i]); };
    handlers.on_lost = [this, i](const absl::Status&) {
      ++lost_;
      // A stream is lost once: its Join's only on_lost.
      if (!lost_at_[i]->HasBeenNotified()) lost_at_[i]->Notify();
    };
    absl::StatusOr<AssignmentEvent> a = clients_[i]->Join(SpecFor(node, 0), handlers);
    if (!a.ok()) return a.status();
    assignments_[i] = *a;
    ranks[i] = a->slot.rank_offset;
    return CheckAssignment(*a, node, 0);
  }

  // Simulated node i's G agents join through its one group join; their ranks go to
  // ranks[i * G ...].
  absl::Status JoinNode(size_t i, std::vector<int64_t>& ranks) {
    const int64_t node = config_.first + static_cast<int64_t>(i);
    if (absl::Status s = nodes_[i]->Join(absl::Now() + agent_options_.join_timeout); !s.ok()) {
      return s;
    }
    absl::Status status;
    for (int64_t local = 0; local < config_.tasks_per_node; ++local) {
      const AssignmentEvent a = nodes_[i]->assignment(static_cast<size_t>(local));
      ranks[i * config_.tasks_per_node + local] = a.slot.rank_offset;
      status.Update(CheckAssignment(a, node, local));
    }
    return status;
  }

  // After the join phase: each agent waits until it has lost its server, then resumes its job
  // (JoinSpec::resume) as rdzv-agent does, on the server that comes back or on the next of its
  // list. The phase's "last" is when the last agent got its assignment back.
  void Resume() {
    const size_t count = clients_.size();
    std::vector<int64_t> start(count), end(count);
    std::vector<absl::Status> status(count);
    {
      AgentThreads threads(count, [&](size_t i) {
        start[i] = NowNs();
        if (!lost_at_[i]->WaitForNotificationWithTimeout(absl::Seconds(120))) {
          status[i] = absl::DeadlineExceededError("the server was never lost");
        } else {
          JoinSpec spec = SpecFor(config_.first + static_cast<int64_t>(i), 0);
          spec.resume = assignments_[i];
          status[i] = clients_[i]->Join(spec, Handlers{}, absl::Seconds(120)).status();
        }
        end[i] = NowNs();
      });
      if (!RunWhenTold(threads)) return;
    }
    SendTimings("resume", start, end, status, "");
  }

  void Join() {
    if (config_.simulated_children) {
      JoinSimulatedGroups();
      return;
    }
    if (config_.fan_in > 0) {
      JoinThroughRelays();
      return;
    }
    const bool per_task = config_.tasks_per_node > 1;
    if (per_task) {
      nodes_ = NewNodes();
    } else {
      clients_ = NewClients();
      assignments_ = std::vector<AssignmentEvent>(clients_.size());
      lost_at_.clear();
      for (size_t i = 0; i < clients_.size(); ++i) {
        lost_at_.push_back(std::make_unique<absl::Notification>());
      }
    }
    for (std::atomic<int64_t>& a : abort_ns_) a = 0;
    const size_t count = static_cast<size_t>(config_.count);
    std::vector<int64_t> start(count), end(count), ranks(abort_ns_.size(), -1);
    std::vector<absl::Status> status(count);
    lost_ = 0;
    {
      AgentThreads threads(count, [&](size_t i) {
        start[i] = NowNs();
        status[i] = per_task ? JoinNode(i, ranks) : JoinAgent(i, ranks);
        end[i] = NowNs();
      });
      if (!RunWhenTold(threads)) return;
    }
    SendJoined(start, end, status, ranks);
  }

  // --fan-in: group g's relay listens on a loopback address of its own, so that the connections
  // of 100,000 agents spread over many addresses (each pair of addresses has its own ports).
  static std::string RelayAddress(int64_t group) {
    return absl::StrFormat("127.%d.%d.%d", 1 + group / 65536, (group / 256) % 256, group % 256);
  }

  // Starts the relays of the groups this process holds, as the groups' first nodes host them
  // (client/agent/node_relay.h), with rdzv-agent's settings but for their pings: one a minute,
  // given a minute to be answered, as are the agents' own here (AgentOptions). Its callers are
  // checked as the agents' credential says.
  absl::Status StartRelays() {
    const int64_t k = config_.fan_in;
    for (int64_t g = config_.first / k; g * k < config_.first + config_.count; ++g) {
      NodeRelayOptions relay;
      relay.listen = {absl::StrCat(RelayAddress(g), ":0")};
      relay.job_id = config_.job;
      relay.first_node = g * k;
      relay.last_node = std::min(g * k + k, config_.n) - 1;
      relay.expected = static_cast<int>(relay.last_node - relay.first_node + 1);
      relay.ping = absl::Seconds(60);
      relay.ping_timeout = absl::Seconds(60);
      relay.gather = kGroupGather;
      // The floor's calls are not ones a relay lets in, and 100,000 of them on one machine take
      // longer than the relay's default allows.
      relay.unused_connection_timeout = absl::Minutes(10);
      // Every simulated node is on this one host, the floor's closing connections too.
      relay.max_connections_per_host = 0;
      relay.callers.mode =
          config_.auth == ClientAuth::Mode::kMunge ? AuthMode::kMunge : AuthMode::kNone;
      relay.callers.munge_socket = agent_options_.auth.munge_socket;
      if (relay.callers.mode == AuthMode::kMunge) relay.callers.only_uid = getuid();
      relay.upstream = agent_options_;
      absl::StatusOr<std::unique_ptr<NodeRelay>> started = NodeRelay::Start(std::move(relay));
      if (!started.ok()) return started.status();
      relay_endpoints_.push_back((*started)->endpoint());
      relays_.push_back(*std::move(started));
    }
    return absl::OkStatus();
  }

  // Where node `node`'s agent finds its group's relay.
  const std::string& RelayOf(int64_t node) const {
    return relay_endpoints_[static_cast<size_t>(node / config_.fan_in -
                                                config_.first / config_.fan_in)];
  }

  // The agents' options toward their relay: it runs as this user.
  ClientOptions RelayClientOptions() const {
    ClientOptions options = agent_options_;
    options.auth.server_uid = getuid();
    return options;
  }

  // The floor of a tree: a fresh channel per agent, to the relay the agent joins through, making
  // one empty call (GetStatus, which a relay answers UNIMPLEMENTED at once), all from this one
  // thread with gRPC's asynchronous API: a thread per agent would not fit 100,000 of them.
  void FloorThroughRelays() {
    absl::StatusOr<ClientChannelSetup> setup = MakeClientChannelSetup(agent_options_);
    if (!setup.ok()) Die(setup.status());
    const size_t count = static_cast<size_t>(config_.count);
    struct Call {
      std::shared_ptr<grpc::Channel> channel;
      std::unique_ptr<v1::Rendezvous::Stub> stub;
      grpc::ClientContext context;
      v1::StatusRequest request;
      v1::StatusResponse response;
    };
    std::vector<std::unique_ptr<Call>> calls;
    for (size_t i = 0; i < count; ++i) {
      auto call = std::make_unique<Call>();
      call->channel = grpc::CreateCustomChannel(RelayOf(config_.first + static_cast<int64_t>(i)),
                                                setup->credentials, setup->args);
      call->stub = v1::Rendezvous::NewStub(call->channel);
      call->request.set_job_id(kFloorJob);
      call->context.set_deadline(absl::ToChronoTime(absl::Now() + agent_options_.join_timeout));
      call->context.set_wait_for_ready(true);
      calls.push_back(std::move(call));
    }
    std::vector<int64_t> start(count), end(count);
    std::vector<absl::Status> status(count);
    absl::Mutex mu;
    size_t answered = 0;
    Send(absl::StrCat("ready cpu=", CpuNs()));
    if (!AwaitGo()) return;
    for (size_t i = 0; i < count; ++i) {
      Call& c = *calls[i];
      start[i] = NowNs();
      if (absl::Status s = AttachCredential(c.context, agent_options_.auth, "GetStatus", kFloorJob);
          !s.ok()) {
        status[i] = s;
        end[i] = NowNs();
        absl::MutexLock lock(&mu);
        ++answered;
        continue;
      }
      c.stub->async()->GetStatus(&c.context, &c.request, &c.response, [&, i](grpc::Status s) {
        const int64_t t = NowNs();
        absl::MutexLock lock(&mu);
        end[i] = t;
        if (!s.ok() && s.error_code() != grpc::StatusCode::UNIMPLEMENTED) {
          status[i] = FromGrpcStatus(s);
        }
        ++answered;
      });
    }
    {
      absl::MutexLock lock(&mu);
      const auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return answered == count; };
      mu.Await(absl::Condition(&all));
    }
    SendTimings("floor", start, end, status, "");
    std::string line;
    if (std::getline(std::cin, line) && line == "close") {
      calls.clear();
      Send("closed");
    }
  }

  // The agents of a tree join their relays, each on a channel and stream of its own as
  // rdzv-agent's client does (SimulatedNode in single mode), started from a few threads rather
  // than one each: a thread per agent would not fit 100,000 of them.
  void JoinThroughRelays() {
    absl::StatusOr<ClientChannelSetup> setup = MakeClientChannelSetup(agent_options_);
    if (!setup.ok()) Die(setup.status());
    relay_options_ = RelayClientOptions();
    nodes_.clear();
    const size_t count = static_cast<size_t>(config_.count);
    for (size_t i = 0; i < count; ++i) {
      const int64_t node = config_.first + static_cast<int64_t>(i);
      nodes_.push_back(std::make_unique<SimulatedNode>(relay_options_, *setup,
                                                       std::vector<JoinSpec>{SpecFor(node, 0)},
                                                       &abort_ns_[i], true, RelayOf(node)));
    }
    for (std::atomic<int64_t>& a : abort_ns_) a = 0;
    std::vector<int64_t> start(count), end(count), ranks(count, -1);
    std::vector<absl::Status> status(count);
    lost_ = 0;
    constexpr size_t kThreads = 4;
    {
      AgentThreads threads(kThreads, [&](size_t t) {
        const absl::Time deadline = absl::Now() + agent_options_.join_timeout;
        for (size_t i = t; i < count; i += kThreads) {
          start[i] = NowNs();
          status[i] = nodes_[i]->Start();
        }
        for (size_t i = t; i < count; i += kThreads) {
          if (status[i].ok()) status[i] = nodes_[i]->Proceed(deadline);
        }
        for (size_t i = t; i < count; i += kThreads) {
          if (status[i].ok()) status[i] = nodes_[i]->AwaitSettled(deadline);
          end[i] = status[i].ok() ? nodes_[i]->settled_ns() : NowNs();
          if (!status[i].ok()) continue;
          const int64_t node = config_.first + static_cast<int64_t>(i);
          const AssignmentEvent a = nodes_[i]->assignment(0);
          ranks[i] = a.slot.rank_offset;
          status[i] = CheckAssignment(a, node, 0);
        }
      });
      if (!RunWhenTold(threads)) return;
    }
    SendJoined(start, end, status, ranks);
  }

  // --simulated-children: each group's join goes up on its channel, from one thread per group;
  // every member's assignment is checked. A group's time is when it held its last assignment.
  void JoinSimulatedGroups() {
    nodes_ = NewGroups();
    for (std::atomic<int64_t>& a : abort_ns_) a = 0;
    const size_t groups = nodes_.size();
    const int64_t k = config_.fan_in;
    std::vector<int64_t> start(groups), end(groups), ranks(abort_ns_.size(), -1);
    std::vector<absl::Status> status(groups);
    lost_ = 0;
    {
      AgentThreads threads(groups, [&](size_t i) {
        start[i] = NowNs();
        status[i] = nodes_[i]->Join(absl::Now() + agent_options_.join_timeout);
        end[i] = status[i].ok() ? nodes_[i]->settled_ns() : NowNs();
        if (!status[i].ok()) return;
        const int64_t first = static_cast<int64_t>(i) * k;
        for (int64_t m = first; m < std::min(first + k, config_.count); ++m) {
          const AssignmentEvent a = nodes_[i]->assignment(static_cast<size_t>(m - first));
          ranks[m] = a.slot.rank_offset;
          status[i].Update(CheckAssignment(a, config_.first + m, 0));
        }
      });
      if (!RunWhenTold(threads)) return;
    }
    SendJoined(start, end, status, ranks);
  }

  // The first agent of this process reports a worker failure: over its own Client, or over its
  // node's channel as the node's relay forwards it.
  void Fail() {
    if (clients_.empty() && nodes_.empty()) {
      Send("error msg=no agents joined");
      return;
    }
    FailureInfo failure;
    failure.host = absl::StrCat("node", config_.first);
    failure.group_rank = static_cast<int32_t>(config_.first);
    failure.rank = static_cast<int32_t>(config_.first * config_.tasks_per_node);
    failure.local_rank = 0;
    failure.exit_code = 1;
    const int64_t t = NowNs();
    const absl::Status reported = nodes_.empty() ? clients_[0]->ReportFailure(failure).status()
                                                 : nodes_[0]->ReportFailure(0, failure);
    Send(absl::StrFormat("failed t=%d err=%d msg=%s", t, reported.ok() ? 0 : 1,
                         reported.ok() ? "" : OneLine(reported.ToString())));
  }

  void AbortWait() {
    const int64_t deadline = NowNs() + 30'000'000'000;
    const auto agents = static_cast<int64_t>(abort_ns_.size());
    int64_t received = 0, last = 0;
    while (true) {
      received = 0;
      last = 0;
      for (const std::atomic<int64_t>& a : abort_ns_) {
        const int64_t t = a.load();
        if (t != 0) {
          ++received;
          last = std::max(last, t);
        }
      }
      if (received == agents || NowNs() > deadline) break;
      absl::SleepFor(absl::Milliseconds(1));
    }
    Send(absl::StrFormat("abort received=%d last=%d", received, last));
  }

  const WorkerConfig config_;
  // Outlives nodes_, which refer to it.
  const ClientOptions agent_options_;
  std::vector<std::unique_ptr<Client>> clients_;
  // Each client's assignment, and whether it has lost its server.
  std::vector<AssignmentEvent> assignments_;
  std::vector<std::unique_ptr<absl::Notification>> lost_at_;
  // A slot per simulated agent: node i's agents from i * G.
  std::vector<std::atomic<int64_t>> abort_ns_;
  std::vector<std::unique_ptr<SimulatedNode>> nodes_;
  // --fan-in: the agents' options toward their relays (nodes_ refer to them), and the relays of
  // this process's groups with where they listen, by group.
  ClientOptions relay_options_;
  std::vector<std::unique_ptr<NodeRelay>> relays_;
  std::vector<std::string> relay_endpoints_;
  std::atomic<int64_t> lost_{0};
};

// ---------------------------------------------------------------------------------------------
// The parent: processes it starts, and what it reads about them.

// A child process that is killed (SIGKILL) and reaped when the object goes, unless it already
// ended. Its stdin/stdout may be pipes to this process.
class Child {
 public:
  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() { Kill(); }

  // Starts argv[0] (a path). With `pipes`, the child's stdin and stdout are pipes to us;
  // otherwise both are /dev/null. stderr goes to `stderr_path` (appended), or is inherited.
  absl::Status Start(const std::vector<std::string>& argv, bool pipes,
                     const std::string& stderr_path = "") {
    int in[2] = {-1, -1}, out[2] = {-1, -1};
    if (pipes && (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0)) {
      return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
    }
    std::vector<char*> cargv;
    for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    const pid_t parent = getpid();
    start_ns_ = NowNs();
    pid_ = fork();
    if (pid_ < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      setpgid(0, 0);
      const int devnull = open("/dev/null", O_RDWR);
      dup2(pipes ? in[0] : devnull, STDIN_FILENO);
      dup2(pipes ? out[1] : devnull, STDOUT_FILENO);
      if (!stderr_path.empty()) {
        const int err = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (err >= 0) dup2(err, STDERR_FILENO);
      }
      execv(cargv[0], cargv.data());
      std::fprintf(stderr, "rdzv-bench: cannot run %s: %s\n", cargv[0], strerror(errno));
      _exit(127);
    }
    if (pipes) {
      close(in[0]);
      close(out[1]);
      to_ = in[1];
      from_ = out[0];
    }
    return absl::OkStatus();
  }

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !exited_; }
  int64_t start_ns() const { return start_ns_; }

  void Send(const std::string& line) {
    if (to_ >= 0) WriteAll(to_, line + "\n");
  }

  // The next line from the child's stdout, waiting until `deadline_ns` at most, or until
  // `watch` (another child this one depends on) has ended.
  absl::StatusOr<std::string> ReadLine(int64_t deadline_ns, Child* watch = nullptr) {
    while (true) {
      if (size_t nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      const int64_t left_ms = (deadline_ns - NowNs()) / 1'000'000;
      if (left_ms <= 0) return absl::DeadlineExceededError("no answer in time");
      if (watch != nullptr && watch->Poll()) {
        return absl::UnavailableError(absl::StrCat(
            "the server it relies on ended with status (128 + signal) ", watch->code_));
      }
      pollfd p{from_, POLLIN, 0};
      const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 1000)));
      if (r < 0 && errno != EINTR) return absl::InternalError(strerror(errno));
      if (r <= 0) continue;
      char buf[65536];
      const ssize_t n = read(from_, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return absl::UnavailableError("the process ended");
      buffer_.append(buf, static_cast<size_t>(n));
    }
  }

  // Waits for the child to end until `deadline_ns`; its exit status (or 128 + signal), and
  // its resource usage. DeadlineExceeded (and the child killed) when it did not end in time.
  absl::StatusOr<int> Wait(int64_t deadline_ns, rusage* usage = nullptr) {
    if (pid_ <= 0) return absl::FailedPreconditionError("not started");
    while (!Poll()) {
      if (NowNs() > deadline_ns) {
        Kill();
        return absl::DeadlineExceededError("did not end in time");
      }
      usleep(500);
    }
    if (usage != nullptr) *usage = usage_;
    return code_;
  }

  // Whether the child has ended (reaping it if so); never blocks.
  bool Poll() {
    if (pid_ <= 0 || exited_) return true;
    int status = 0;
    rusage ru{};
    const pid_t r = wait4(pid_, &status, WNOHANG, &ru);
    if (r == pid_) {
      exited_ = true;
      end_ns_ = NowNs();
      usage_ = ru;
      code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    } else if (r < 0 && errno != EINTR) {
      exited_ = true;  // not our child any more: nothing left to wait for
    }
    return exited_;
  }
  int64_t end_ns() const { return end_ns_; }

  // SIGTERM, then SIGKILL after `grace_ns`; always reaps.
  void Stop(int64_t grace_ns) {
    if (!running()) return;
    kill(pid_, SIGTERM);
    if (!Wait(NowNs() + grace_ns).ok()) Kill();
  }

  void Kill() {
    if (running()) {
      kill(-pid_, SIGKILL);
      kill(pid_, SIGKILL);
      int status;
      while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
      exited_ = true;
    }
    if (to_ >= 0) close(to_);
    if (from_ >= 0) close(from_);
    to_ = from_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1;
  int from_ = -1;
  std::string buffer_;
  bool exited_ = false;
  int code_ = -1;
  rusage usage_{};
  int64_t start_ns_ = 0;
  int64_t end_ns_ = 0;
};

struct ProcStats {
  double cpu_s = 0;  // user + system, all threads, since start
  int64_t rss_kib = 0;
  int64_t hwm_kib = 0;
  int64_t fds = 0;
  int64_t threads = 0;
};

ProcStats ReadProcStats(pid_t pid) {
  ProcStats s;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  if (size_t close = text.rfind(')'); close != std::string::npos) {
    // After "pid (comm)": field 3 (state) onwards; utime and stime are fields 14 and 15.
    std::vector<std::string> f = absl::StrSplit(text.substr(close + 2), ' ');
    int64_t utime = 0, stime = 0;
    if (f.size() > 12 && absl::SimpleAtoi(f[11], &utime) && absl::SimpleAtoi(f[12], &stime)) {
      s.cpu_s = static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
    }
  }
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view l = line;
    int64_t v = 0;
    if (absl::ConsumePrefix(&l, "VmRSS:") &&
        absl::SimpleAtoi(absl::StripSuffix(absl::StripAsciiWhitespace(l), " kB"), &v)) {
      s.rss_kib = v;
    } else if (absl::ConsumePrefix(&l, "VmHWM:") &&
               absl::SimpleAtoi(absl::StripSuffix(absl::StripAsciiWhitespace(l), " kB"), &v)) {
      s.hwm_kib = v;
    } else if (absl::ConsumePrefix(&l, "Threads:") &&
               absl::SimpleAtoi(absl::StripAsciiWhitespace(l), &v)) {
      s.threads = v;
    }
  }
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/fd"), ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++s.fds;
  }
  return s;
}

// A port that was free a moment ago (the server binds it next; a lost race is retried).
absl::StatusOr<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return absl::InternalError(strerror(errno));
  }
  close(fd);
  return ntohs(a.sin_port);
}

bool CanConnect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

std::string Tail(const std::string& path, size_t bytes = 2000) {
  std::ifstream f(path);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return text.size() > bytes ? text.substr(text.size() - bytes) : text;
}

struct Options {
  std::string rdzvd = RDZVD_BIN;
  std::string agent = RDZV_AGENT_BIN;
  std::vector<int64_t> agents = {1, 100, 1000, 4000, 10000};
  int64_t procs = 0;  // 0: ceil(N / 1000)
  int64_t reps = 1;
  std::string csv;
  bool check = false;
  bool floor = true;
  bool verbose = false;
  int64_t hold_ms = 0;
  bool launch = false;
  bool loss = false;  // --loss
  int64_t launch_reps = 5;
  std::vector<int64_t> launch_nodes = {8, 32};
  std::vector<std::string> rdzvd_args;
  std::string auth = "none";      // rdzvd's --auth and the agents' credential; "omit": pass none
  int64_t metrics_scrape_ms = 0;  // 0: rdzvd serves no metrics (unless it counts streams)
  // Scale mode: agents per simulated node; above 1, a node's agents join as a per-task launch
  // does, through one group join.
  int64_t tasks_per_node = 1;
  // Scale mode: above 0, the nodes join in groups of this many, each through a relay (--fan-in).
  int64_t fan_in = 0;
  // With fan_in: each relay's upstream side alone, its children simulated (--simulated-children).
  bool simulated_children = false;
  // --compare: each N and repetition runs once per variant, the variants taking turns, so that
  // both see the same machine. "" runs the one configuration above.
  std::string compare;
  std::string variant;  // this configuration's name in --compare's output
  int64_t credential_cost = 0;
  std::string self;
  std::string log_dir;
  int64_t soak = 0;
};

// Whether `binary --help` mentions `flag` (an rdzvd built before it was added does not).
bool KnowsFlag(const std::string& binary, const std::string& flag) {
  static absl::Mutex mu(absl::kConstInit);
  static std::map<std::pair<std::string, std::string>, bool>* known =
      new std::map<std::pair<std::string, std::string>, bool>();
  absl::MutexLock lock(&mu);
  auto [it, added] = known->try_emplace({binary, flag}, false);
  if (!added) return it->second;
  const std::string command = absl::StrCat("'", binary, "' --help 2>&1");
  if (FILE* out = popen(command.c_str(), "r"); out != nullptr) {
    std::string text;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof(buf), out)) > 0;) text.append(buf, n);
    pclose(out);
    it->second = text.find(flag) != std::string::npos;
  }
  return it->second;
}

// The most agents one of the run's rendezvous attaches at once.
int64_t MaxAgents(const Options& o) {
  int64_t most = 0;
  for (int64_t n : o.agents) most = std::max(most, n);
  return most * (o.compare == "tasks" || o.tasks_per_node > 1 ? o.tasks_per_node : 1);
}

// Whether a scale run reads rdzvd's join streams and attached agents from its metrics: for
// per-task launches, for both sides of --compare tasks (so that they run alike), and whenever
// rdzvd serves its metrics anyway; never for --compare metrics' side without them.
bool CountsStreams(const Options& o) {
  if (o.compare == "metrics") return o.metrics_scrape_ms > 0;
  return o.tasks_per_node > 1 || o.fan_in > 0 || o.compare == "tasks" || o.metrics_scrape_ms > 0;
}

// rdzvd on a free loopback port (or on `fixed_port`), its stderr in log_dir. Retries when another
// process took the port between our probe and its bind. Given `metrics_port_out`, and when
// CountsStreams, rdzvd also serves its metrics, on the free port put there (0 when it serves none).
absl::Status StartRdzvd(const Options& o, Child& rdzvd, int& port, const std::string& log,
                        int* metrics_port_out = nullptr, int fixed_port = 0) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    absl::StatusOr<int> p = fixed_port != 0 ? absl::StatusOr<int>(fixed_port) : FreePort();
    if (!p.ok()) return p.status();
    // Pings stay on, at rdzvd's default interval, but with a longer timeout: the simulated
    // agents share two cores with rdzvd, and a client process busy with a thousand new channels
    // can take over a second to answer (a real node answers in microseconds), which rdzvd's
    // default 1 s timeout would take for a lost node. The simulated agents all come from one
    // address, where real ones come from a host each: no bound per host. --rdzvd-arg values come
    // after, and win.
    std::vector<std::string> argv = {o.rdzvd, "--listen", absl::StrCat("127.0.0.1:", *p),
                                     "--keepalive-timeout-ms=5000"};
    if (KnowsFlag(o.rdzvd, "--max-connections-per-host")) {
      argv.push_back("--max-connections-per-host=0");
    }
    if (o.auth != "omit") argv.push_back(absl::StrCat("--auth=", o.auth));
    // The bench's agents are one user's: more than rdzvd lets one user attach by default need
    // its bound raised.
    if (const int64_t agents = MaxAgents(o); agents > kDefaultMaxAgentsPerUser) {
      argv.push_back(absl::StrCat("--max-agents-per-user=", agents));
    }
    argv.insert(argv.end(), o.rdzvd_args.begin(), o.rdzvd_args.end());
    const bool metrics =
        o.metrics_scrape_ms > 0 || (metrics_port_out != nullptr && CountsStreams(o));
    absl::StatusOr<int> metrics_port = metrics ? FreePort() : 0;
    if (!metrics_port.ok()) return metrics_port.status();
    if (*metrics_port != 0) {
      argv.push_back(absl::StrCat("--metrics-listen=127.0.0.1:", *metrics_port));
    }
    if (absl::Status s = rdzvd.Start(argv, false, log); !s.ok()) return s;
    if (o.metrics_scrape_ms > 0) {
      ScrapeMetrics(*metrics_port, o.metrics_scrape_ms);
    } else {
      StopScrapingMetrics();  // a --compare variant without metrics
    }
    const int64_t deadline = NowNs() + 10'000'000'000;
    while (NowNs() < deadline) {
      if (CanConnect(*p)) {
        port = *p;
        if (metrics_port_out != nullptr) *metrics_port_out = *metrics_port;
        return absl::OkStatus();
      }
      if (rdzvd.Poll()) break;  // it exited: most likely the port was taken
      absl::SleepFor(absl::Milliseconds(5));
    }
    rdzvd.Kill();
  }
  return absl::UnavailableError(
      absl::StrCat("rdzvd did not start listening; its log:\n", Tail(log)));
}

// rdzvd's metrics, read once from its /metrics on `port`: each sample's value by its name (with
// its labels, if any).
absl::StatusOr<std::map<std::string, double>> ReadMetrics(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(2);
  client.set_read_timeout(10);
  const httplib::Result result = client.Get("/metrics");
  if (!result || result->status != 200) {
    return absl::UnavailableError(
        absl::StrCat("rdzvd's metrics on port ", port, " did not answer"));
  }
  std::map<std::string, double> values;
  for (absl::string_view line : absl::StrSplit(result->body, '\n', absl::SkipEmpty())) {
    if (line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    double v;
    if (space != absl::string_view::npos && absl::SimpleAtod(line.substr(space + 1), &v)) {
      values[std::string(line.substr(0, space))] = v;
    }
  }
  return values;
}

// ---------------------------------------------------------------------------------------------
// Scale mode.

struct ScaleResult {
  int64_t n = 0;  // simulated nodes
  int64_t tasks_per_node = 1;
  int64_t fan_in = 0;
  int64_t rep = 0;
  int64_t procs = 0;
  double join_wall_s = 0;
  double join_p50_ms = 0;
  double join_p99_ms = 0;
  double floor_wall_s = 0;
  double floor_p50_ms = 0;
  double floor_p99_ms = 0;
  double cpu_join_s = 0;
  double cpu_floor_s = 0;
  // CPU time of all client processes in each phase.
  double client_cpu_join_s = 0;
  double client_cpu_floor_s = 0;
  double rss_attached_mib = 0;
  double hwm_mib = 0;
  double abort_s = 0;
  // --loss: from the primary's death to the last agent resumed.
  double resume_s = 0;
  // rdzvd's CPU use while the N agents sit assigned and idle (--hold-ms), in percent of a core.
  double idle_cpu_pct = 0;
  std::vector<double> abort_per_proc_ms;
  // What rdzvd's metrics said with every agent assigned; -1 when it served none.
  int64_t streams = -1;
  int64_t attached = -1;
  int64_t errors = 0;
  bool correct = false;
  std::vector<std::string> messages;
};

double Percentile(std::vector<int64_t> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(std::ceil(q * v.size())) - 1);
  return static_cast<double>(v[q <= 0 ? 0 : i]);
}

class ScaleRun {
 public:
  // `loss`: "" for the scale phases; "restart" or "failover" for the loss of a running job's
  // rdzvd (SIGKILL) and the agents' resume on it restarted, or on its backup.
  ScaleRun(const Options& o, int64_t n, int64_t rep, std::string loss = "")
      : o_(o), loss_(std::move(loss)) {
    r_.n = n;
    r_.tasks_per_node = o.tasks_per_node;
    r_.fan_in = o.fan_in;
    r_.rep = rep;
    r_.procs = o.procs > 0 ? std::min(o.procs, n) : (n + 999) / 1000;
    // Simulated relays are a channel and a thread each, not a thousand connections: a few
    // hundred share a process.
    if (o.simulated_children && o.procs == 0) {
      r_.procs = (Groups() + kGroupsPerProcess - 1) / kGroupsPerProcess;
    }
    // A tree's processes hold whole groups.
    if (o.fan_in > 0) r_.procs = std::min(r_.procs, Groups());
    phase_timeout_ns_ = (60 + n * o.tasks_per_node / 50) * 1'000'000'000LL;
  }

  ScaleResult Run() {
    if (absl::Status s = RunPhases(); !s.ok()) Error(s.ToString());
    for (Child& w : workers_) w.Kill();
    rdzvd_.Stop(5'000'000'000);
    backup_.Stop(5'000'000'000);
    restarted_.Stop(5'000'000'000);
    return r_;
  }

 private:
  void Error(const std::string& message) {
    ++r_.errors;
    r_.messages.push_back(message);
  }

  // Sends `command` to every worker (or only `only`) and collects one reply of `kind` from each.
  absl::StatusOr<std::vector<Reply>> Ask(const std::string& command, const std::string& kind,
                                         int only = -1) {
    std::vector<Reply> replies;
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (command.empty()) continue;  // only collecting the replies of a started phase
      if (only < 0 || static_cast<int>(i) == only) workers_[i].Send(command);
    }
    const int64_t deadline = NowNs() + phase_timeout_ns_;
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (only >= 0 && static_cast<int>(i) != only) continue;
      absl::StatusOr<std::string> line = workers_[i].ReadLine(deadline, serving_);
      if (!line.ok()) {
        return absl::Status(
            line.status().code(),
            absl::StrFormat("worker %d, waiting for \"%s\": %s", i, kind, line.status().message()));
      }
      Reply reply = ParseReply(*line);
      if (reply.kind != kind) {
        return absl::InternalError(
            absl::StrFormat("worker %d answered \"%s\" instead of \"%s\"", i, *line, kind));
      }
      replies.push_back(std::move(reply));
    }
    return replies;
  }

  // Prepares a phase in every worker (clients and threads ready), then releases them at once.
  // Returns the release time.
  absl::StatusOr<int64_t> StartPhase(const std::string& phase) {
    absl::StatusOr<std::vector<Reply>> ready = Ask(phase, "ready");
    if (!ready.ok()) return ready.status();
    ready_cpu_ns_ = 0;
    for (const Reply& r : *ready) ready_cpu_ns_ += r.Int("cpu");
    const int64_t t0 = NowNs();
    for (Child& w : workers_) w.Send("go");
    return t0;
  }

  // Sums a phase's replies into wall time from t0 and latency percentiles.
  void Collect(const std::vector<Reply>& replies, int64_t t0, double& wall_s, double& p50_ms,
               double& p99_ms, double& client_cpu_s) {
    std::vector<int64_t> lat;
    int64_t last = t0;
    int64_t cpu = -ready_cpu_ns_;
    for (const Reply& rep : replies) {
      cpu += rep.Int("cpu");
      r_.errors += rep.Int("err");
      if (!rep.message.empty()) r_.messages.push_back(rep.message);
      last = std::max(last, rep.Int("last"));
      std::vector<int64_t> l = rep.List("lat");
      lat.insert(lat.end(), l.begin(), l.end());
    }
    wall_s = static_cast<double>(last - t0) / 1e9;
    client_cpu_s = static_cast<double>(cpu) / 1e9;
    p50_ms = Percentile(lat, 0.5) / 1000.0;
    p99_ms = Percentile(lat, 0.99) / 1000.0;
  }

  // Waits until rdzvd has closed the floor's connections and gone quiet.
  void Settle(int64_t baseline_fds) {
    const int64_t deadline = NowNs() + 30'000'000'000;
    double cpu = ReadProcStats(rdzvd_.pid()).cpu_s;
    while (NowNs() < deadline) {
      absl::SleepFor(absl::Milliseconds(100));
      const ProcStats s = ReadProcStats(rdzvd_.pid());
      if (s.fds <= baseline_fds + 2 && s.cpu_s - cpu < 0.005) return;
      cpu = s.cpu_s;
    }
  }

  absl::Status RunPhases() {
    const std::string log = absl::StrCat(o_.log_dir, "/rdzvd-", r_.n, "-", r_.rep, ".log");
    int& port = port_;
    std::string endpoint;
    if (loss_ == "failover") {
      // A primary and its backup, each told of the other.
      absl::StatusOr<int> primary = FreePort();
      if (!primary.ok()) return primary.status();
      Options backup = o_;
      backup.rdzvd_args.push_back(absl::StrCat("--peers=127.0.0.1:", *primary));
      if (absl::Status s =
              StartRdzvd(backup, backup_, backup_port_,
                         absl::StrCat(o_.log_dir, "/rdzvd-backup-", r_.n, "-", r_.rep, ".log"));
          !s.ok()) {
        return s;
      }
      Options first = o_;
      first.rdzvd_args.push_back(absl::StrCat("--peers=127.0.0.1:", backup_port_));
      if (absl::Status s = StartRdzvd(first, rdzvd_, port, log, nullptr, *primary); !s.ok()) {
        return s;
      }
      endpoint = absl::StrCat("127.0.0.1:", port, ",127.0.0.1:", backup_port_);
    } else {
      if (absl::Status s =
              StartRdzvd(o_, rdzvd_, port, log, loss_.empty() ? &metrics_port_ : nullptr);
          !s.ok()) {
        return s;
      }
      endpoint = absl::StrCat("127.0.0.1:", port);
    }
    const pid_t server = rdzvd_.pid();
    const int64_t baseline_fds = ReadProcStats(server).fds;

    const std::string job = absl::StrCat("bench-", r_.n, "-", r_.rep, "-", getpid());
    workers_ = std::vector<Child>(static_cast<size_t>(r_.procs));
    for (int64_t p = 0; p < r_.procs; ++p) {
      int64_t first = r_.n * p / r_.procs;
      int64_t count = r_.n * (p + 1) / r_.procs - first;
      if (r_.fan_in > 0) {
        const int64_t k = r_.fan_in;
        first = Groups() * p / r_.procs * k;
        count = std::min(Groups() * (p + 1) / r_.procs * k, r_.n) - first;
      }
      absl::Status s = workers_[p].Start(
          {o_.self, "--worker", endpoint, job, absl::StrCat(first), absl::StrCat(count),
           absl::StrCat(r_.n), o_.auth == "munge" ? "munge" : "none",
           absl::StrCat(r_.tasks_per_node), absl::StrCat(r_.fan_in),
           o_.simulated_children ? "simulated" : "relays"},
          true, absl::StrCat(o_.log_dir, "/worker-", r_.n, "-", r_.rep, "-", p, ".log"));
      if (!s.ok()) return s;
    }

    if (o_.floor && loss_.empty()) {
      if (absl::Status s = RunFloor(baseline_fds); !s.ok()) return s;
    }
    return RunRendezvous();
  }

  // The floor: N fresh channels, one empty call each.
  absl::Status RunFloor(int64_t baseline_fds) {
    const pid_t server = rdzvd_.pid();
    const double cpu0 = ReadProcStats(server).cpu_s;
    absl::StatusOr<int64_t> t0 = StartPhase("floor");
    if (!t0.ok()) return t0.status();
    absl::StatusOr<std::vector<Reply>> floor = Ask("", "floor");
    if (!floor.ok()) return floor.status();
    r_.cpu_floor_s = ReadProcStats(server).cpu_s - cpu0;
    Collect(*floor, *t0, r_.floor_wall_s, r_.floor_p50_ms, r_.floor_p99_ms, r_.client_cpu_floor_s);
    if (absl::StatusOr<std::vector<Reply>> closed = Ask("close", "closed"); !closed.ok()) {
      return closed.status();
    }
    Settle(baseline_fds);
    return absl::OkStatus();
  }

  // What rdzvd holds with every agent assigned, from its metrics: a join stream per node and an
  // agent per task are what the run sent.
  void CountStreams() {
    absl::StatusOr<std::map<std::string, double>> metrics = ReadMetrics(metrics_port_);
    if (!metrics.ok()) {
      Error(metrics.status().ToString());
      return;
    }
    const auto value = [&](const std::string& name) -> int64_t {
      auto it = metrics->find(name);
      return it == metrics->end() ? -1 : std::llround(it->second);
    };
    r_.streams = value("rdzv_join_streams");
    r_.attached = value("rdzv_agents_attached");
    const int64_t agents = r_.n * r_.tasks_per_node;
    const int64_t streams = r_.fan_in > 0 ? Groups() : r_.n;
    // A relay sends what it has once its gather time is over: a group that fills late under the
    // burst goes up in two. A simulated one sends its group whole.
    const bool streams_ok = r_.fan_in > 0 && !o_.simulated_children
                                ? r_.streams >= streams && r_.streams <= 2 * streams
                                : r_.streams == streams;
    if (!streams_ok || r_.attached != agents) {
      Error(absl::StrFormat("rdzvd held %d join streams and %d agents attached, not %d and %d",
                            r_.streams, r_.attached, streams, agents));
    }
  }

  // A tree's groups: each holds one stream at rdzvd.
  int64_t Groups() const { return r_.fan_in > 0 ? (r_.n + r_.fan_in - 1) / r_.fan_in : r_.n; }

  // The rendezvous: N fresh Clients (or N nodes' group joins) join one job; then the abort
  // fan-out.
  absl::Status RunRendezvous() {
    const pid_t server = rdzvd_.pid();
    const int64_t agents = r_.n * r_.tasks_per_node;
    const double cpu1 = ReadProcStats(server).cpu_s;
    absl::StatusOr<int64_t> t1 = StartPhase("join");
    if (!t1.ok()) return t1.status();
    absl::StatusOr<std::vector<Reply>> join = Ask("", "join");
    if (!join.ok()) return join.status();
    const ProcStats attached = ReadProcStats(server);
    r_.cpu_join_s = attached.cpu_s - cpu1;
    r_.rss_attached_mib = static_cast<double>(attached.rss_kib) / 1024.0;
    Collect(*join, *t1, r_.join_wall_s, r_.join_p50_ms, r_.join_p99_ms, r_.client_cpu_join_s);
    if (o_.hold_ms > 0) {
      // What N live agents cost rdzvd while nothing happens: keepalive pings, timers.
      absl::SleepFor(absl::Milliseconds(200));
      const double before = ReadProcStats(server).cpu_s;
      absl::SleepFor(absl::Milliseconds(o_.hold_ms));
      r_.idle_cpu_pct = 100.0 * (ReadProcStats(server).cpu_s - before) /
                        (static_cast<double>(o_.hold_ms) / 1000.0);
    }
    if (metrics_port_ != 0) CountStreams();
    std::vector<int64_t> ranks;
    for (const Reply& rep : *join) {
      if (rep.Int("lost") != 0) Error(absl::StrCat(rep.Int("lost"), " agents lost their stream"));
      std::vector<int64_t> l = rep.List("ranks");
      ranks.insert(ranks.end(), l.begin(), l.end());
    }
    std::sort(ranks.begin(), ranks.end());
    r_.correct = static_cast<int64_t>(ranks.size()) == agents;
    for (size_t i = 0; r_.correct && i < ranks.size(); ++i) {
      r_.correct = ranks[i] == static_cast<int64_t>(i);
    }
    if (!r_.correct) {
      Error(absl::StrCat("the ranks are not exactly 0..", agents - 1, ", one per agent"));
    }

    if (!loss_.empty()) return RunLoss();

    // Fail-fast: the first agent reports a failure (over its node's channel, in a per-task
    // launch); every agent must hear the abort.
    absl::StatusOr<std::vector<Reply>> failed = Ask("fail", "failed", 0);
    if (!failed.ok()) return failed.status();
    if ((*failed)[0].Int("err") != 0) Error((*failed)[0].message);
    const int64_t t_fail = (*failed)[0].Int("t");
    absl::StatusOr<std::vector<Reply>> aborts = Ask("abortwait", "abort");
    if (!aborts.ok()) return aborts.status();
    int64_t received = 0, last = t_fail;
    for (const Reply& rep : *aborts) {
      received += rep.Int("received");
      last = std::max(last, rep.Int("last"));
      r_.abort_per_proc_ms.push_back(
          rep.Int("received") > 0 ? static_cast<double>(rep.Int("last") - t_fail) / 1e6 : NAN);
    }
    r_.abort_s = static_cast<double>(last - t_fail) / 1e9;
    if (o_.verbose) {
      std::fprintf(stderr,
                   "rdzv-bench: N=%ld monotonic s: rendezvous %.6f..%.6f, abort %.6f..%.6f\n",
                   static_cast<long>(r_.n), static_cast<double>(*t1) / 1e9,
                   static_cast<double>(*t1) / 1e9 + r_.join_wall_s,
                   static_cast<double>(t_fail) / 1e9, static_cast<double>(last) / 1e9);
    }
    if (received != agents) {
      Error(absl::StrFormat("%d of %d agents received the abort", received, agents));
    }
    r_.hwm_mib = static_cast<double>(ReadProcStats(server).hwm_kib) / 1024.0;

    absl::StatusOr<std::vector<Reply>> bye = Ask("quit", "bye");
    if (!bye.ok()) return bye.status();
    for (Child& w : workers_) {
      absl::StatusOr<int> code = w.Wait(NowNs() + 10'000'000'000);
      if (!code.ok() || *code != 0) Error("a worker did not exit cleanly");
    }
    return absl::OkStatus();
  }

  // The running job's rdzvd dies (SIGKILL); every agent resumes, on it restarted at once on
  // the same port (as systemd's Restart=always would) or on its backup.
  absl::Status RunLoss() {
    absl::StatusOr<int64_t> ready = StartPhase("resume");
    if (!ready.ok()) return ready.status();
    const int64_t t0 = NowNs();
    rdzvd_.Kill();
    if (loss_ == "restart") {
      serving_ = &restarted_;
      if (absl::Status s = StartRdzvd(
              o_, restarted_, port_,
              absl::StrCat(o_.log_dir, "/rdzvd-again-", r_.n, "-", r_.rep, ".log"), nullptr, port_);
          !s.ok()) {
        return s;
      }
    } else {
      serving_ = &backup_;
    }
    absl::StatusOr<std::vector<Reply>> back = Ask("", "resume");
    if (!back.ok()) return back.status();
    int64_t last = t0;
    for (const Reply& rep : *back) {
      r_.errors += rep.Int("err");
      if (!rep.message.empty()) r_.messages.push_back(rep.message);
      last = std::max(last, rep.Int("last"));
    }
    r_.resume_s = static_cast<double>(last - t0) / 1e9;
    absl::StatusOr<std::vector<Reply>> bye = Ask("quit", "bye");
    if (!bye.ok()) return bye.status();
    return absl::OkStatus();
  }

  const Options& o_;
  const std::string loss_;
  ScaleResult r_;
  int64_t phase_timeout_ns_;
  int64_t ready_cpu_ns_ = 0;
  int metrics_port_ = 0;  // 0: rdzvd serves no metrics
  int port_ = 0;          // the (primary) rdzvd's
  Child rdzvd_;
  Child backup_;     // --loss failover's backup rdzvd
  Child restarted_;  // --loss restart's rdzvd, started again
  int backup_port_ = 0;
  Child* serving_ = &rdzvd_;  // the rdzvd the workers need: a phase ends if it does
  std::vector<Child> workers_;
};

double Median(std::vector<double> v);

// --loss: for each N, the time from a running job's rdzvd dying (SIGKILL) to every agent
// resumed: on the same rdzvd restarted at once, and on its backup (--rdzv-endpoint a,b).
int RunLoss(const Options& o) {
  std::printf("%7s %5s %12s %12s %7s\n", "N", "procs", "restart_s", "failover_s", "errors");
  int64_t total_errors = 0;
  for (int64_t n : o.agents) {
    std::vector<double> restart, failover;
    int64_t errors = 0, procs = 0;
    for (int64_t rep = 0; rep < o.reps; ++rep) {
      for (const char* loss : {"restart", "failover"}) {
        const ScaleResult r = ScaleRun(o, n, rep, loss).Run();
        procs = r.procs;
        errors += r.errors;
        for (size_t i = 0; i < r.messages.size() && i < 5; ++i) {
          std::fprintf(stderr, "rdzv-bench: %s N=%ld rep %ld: %s\n", loss, static_cast<long>(n),
                       static_cast<long>(rep), r.messages[i].c_str());
        }
        (std::string(loss) == "restart" ? restart : failover).push_back(r.resume_s);
      }
    }
    std::printf("%7ld %5ld %12.3f %12.3f %7ld\n", static_cast<long>(n), static_cast<long>(procs),
                Median(restart), Median(failover), static_cast<long>(errors));
    std::fflush(stdout);
    total_errors += errors;
  }
  if (total_errors > 0) {
    std::fprintf(stderr, "rdzv-bench: %ld errors (logs in %s)\n", static_cast<long>(total_errors),
                 o.log_dir.c_str());
    return o.check ? 1 : kErrorsSeen;
  }
  return 0;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// How a summary row names its N: the node count, and "NxG" for N nodes of G tasks each.
std::string NodesLabel(int64_t n, int64_t tasks_per_node) {
  return tasks_per_node > 1 ? absl::StrCat(n, "x", tasks_per_node) : absl::StrCat(n);
}

// A count rdzvd's metrics gave, or "-" (empty in the CSV) when it served none.
std::string Measured(int64_t v, absl::string_view none) {
  return v < 0 ? std::string(none) : absl::StrCat(v);
}

// Prints the medians of one configuration's repetitions at N. With `base` (--compare's first
// variant), also the rendezvous against the base's floor and rdzvd's CPU and memory against the
// base's.
void PrintScaleSummary(int64_t n, const std::string& variant,
                       const std::vector<ScaleResult>& results,
                       const std::vector<ScaleResult>* base, bool simulated) {
  auto med = [](const std::vector<ScaleResult>& rs, auto field) {
    std::vector<double> v;
    for (const ScaleResult& r : rs) v.push_back(field(r));
    return Median(v);
  };
  int64_t errors = 0;
  bool correct = true;
  for (const ScaleResult& r : results) {
    errors += r.errors;
    correct = correct && r.correct;
  }
  auto join_wall = [](const ScaleResult& r) { return r.join_wall_s; };
  auto floor_wall = [](const ScaleResult& r) { return r.floor_wall_s; };
  auto cpu_join = [](const ScaleResult& r) { return r.cpu_join_s; };
  const double wall = med(results, join_wall);
  const double floor = med(results, floor_wall);
  const double cpu = med(results, cpu_join);
  auto rss = [](const ScaleResult& r) { return r.rss_attached_mib; };
  const int64_t g = results.front().tasks_per_node;
  // Medians of what rdzvd's metrics said, over the repetitions where it said anything.
  auto measured = [&](auto field) -> int64_t {
    std::vector<double> v;
    for (const ScaleResult& r : results) {
      if (field(r) >= 0) v.push_back(static_cast<double>(field(r)));
    }
    return v.empty() ? -1 : std::llround(Median(v));
  };
  const int64_t streams = measured([](const ScaleResult& r) { return r.streams; });
  const int64_t attached = measured([](const ScaleResult& r) { return r.attached; });
  if (!variant.empty()) std::printf("%-12s ", variant.c_str());
  std::printf("%7s %5ld %9.3f %8.1f %8.1f %9.3f %6.2f %7.2f %8.3f %8.1f %8.1f %9.1f %7s %6ld %7s\n",
              NodesLabel(n, g).c_str(), static_cast<long>(results.front().procs), wall,
              med(results, [](const ScaleResult& r) { return r.join_p50_ms; }),
              med(results, [](const ScaleResult& r) { return r.join_p99_ms; }), floor,
              med(results,
                  [](const ScaleResult& r) {
                    return r.floor_wall_s > 0 ? r.join_wall_s / r.floor_wall_s : 0.0;
                  }),
              cpu, 1000.0 * cpu / static_cast<double>(n), med(results, rss),
              med(results, [](const ScaleResult& r) { return r.hwm_mib; }),
              1000.0 * med(results, [](const ScaleResult& r) { return r.abort_s; }),
              Measured(streams, "-").c_str(), static_cast<long>(errors), correct ? "yes" : "NO");
  std::vector<std::string> per_proc;
  for (double ms : results.back().abort_per_proc_ms) {
    per_proc.push_back(absl::StrFormat("%.1f", ms));
  }
  std::printf(
      "        floor: p50 %.1f ms, p99 %.1f ms, rdzvd cpu %.2f s; client cpu: rendezvous %.2f s, "
      "floor %.2f s\n        rdzvd idle with N attached: %.1f%% of a core; abort per process "
      "(ms): %s\n",
      med(results, [](const ScaleResult& r) { return r.floor_p50_ms; }),
      med(results, [](const ScaleResult& r) { return r.floor_p99_ms; }),
      med(results, [](const ScaleResult& r) { return r.cpu_floor_s; }),
      med(results, [](const ScaleResult& r) { return r.client_cpu_join_s; }),
      med(results, [](const ScaleResult& r) { return r.client_cpu_floor_s; }),
      med(results, [](const ScaleResult& r) { return r.idle_cpu_pct; }),
      absl::StrJoin(per_proc, " ").c_str());
  const std::string held = absl::StrFormat("rdzvd held %s join streams, %s agents attached",
                                           Measured(streams, "-"), Measured(attached, "-"));
  const int64_t k = results.front().fan_in;
  if (g > 1) {
    std::printf(
        "        per task: %ld nodes x %ld tasks = %ld agents, one group join per node; %s\n",
        static_cast<long>(n), static_cast<long>(g), static_cast<long>(n * g), held.c_str());
  } else if (k > 0 && simulated) {
    std::printf(
        "        tree: %ld agents in groups of %ld, each group one relay's group join, its "
        "children simulated in-process; the floor is a channel per relay; %s\n",
        static_cast<long>(n), static_cast<long>(k), held.c_str());
  } else if (k > 0) {
    std::printf(
        "        tree: %ld agents in groups of %ld, each through its relay; the floor's channels "
        "go to the relays; %s\n",
        static_cast<long>(n), static_cast<long>(k), held.c_str());
  } else if (streams >= 0) {
    std::printf("        %s\n", held.c_str());
  }
  if (base != nullptr && base != &results) {
    const double base_floor = med(*base, floor_wall);
    const double base_cpu = med(*base, cpu_join);
    const double base_rss = med(*base, rss);
    std::printf(
        "        against %s: rendezvous %.2fx its floor, %.2fx its rendezvous; rdzvd cpu %+.3f "
        "ms/%s (%.2fx), rss %+.1f MiB (%.2fx)\n",
        "the first variant", base_floor > 0 ? wall / base_floor : 0.0,
        med(*base, join_wall) > 0 ? wall / med(*base, join_wall) : 0.0,
        1000.0 * (cpu - base_cpu) / static_cast<double>(n),
        std::max(g, base->front().tasks_per_node) > 1 ? "node" : "agent",
        base_cpu > 0 ? cpu / base_cpu : 0.0, med(results, rss) - base_rss,
        base_rss > 0 ? med(results, rss) / base_rss : 0.0);
  }
  std::fflush(stdout);
}

// The configurations a run measures: one, or --compare's two, each a copy of `o` with its name.
absl::StatusOr<std::vector<Options>> ScaleVariants(const Options& o) {
  std::vector<Options> variants;
  auto add = [&](const std::string& name, const std::string& auth, int64_t scrape_ms,
                 int64_t tasks_per_node) {
    Options v = o;
    v.variant = name;
    v.auth = auth;
    v.metrics_scrape_ms = scrape_ms;
    v.tasks_per_node = tasks_per_node;
    variants.push_back(std::move(v));
  };
  const int64_t g = o.tasks_per_node;
  if (o.fan_in > 0 && (g > 1 || o.compare == "tasks")) {
    return absl::InvalidArgumentError(
        "--fan-in groups per-node agents; it does not go with --tasks-per-node");
  }
  if (o.simulated_children && o.fan_in == 0) {
    return absl::InvalidArgumentError(
        "--simulated-children simulates the children of a tree's relays; give --fan-in K too");
  }
  if (o.compare.empty()) {
    // The CSV's variant column tells a tree of simulated relays from one of real relays.
    add(o.simulated_children ? "simulated-children" : "", o.auth, o.metrics_scrape_ms, g);
  } else if (o.compare == "auth") {
    // rdzvd's --auth none against MUNGE: every call of the rendezvous (and of the floor) carries
    // a fresh credential that rdzvd's munged decodes.
    add("auth=none", "none", o.metrics_scrape_ms, g);
    add("auth=munge", "munge", o.metrics_scrape_ms, g);
  } else if (o.compare == "metrics") {
    add("metrics=off", o.auth, 0, g);
    add("metrics=on", o.auth, o.metrics_scrape_ms > 0 ? o.metrics_scrape_ms : 1000, g);
  } else if (o.compare == "tasks") {
    // The same N nodes as one agent each, and as G agents each joining through the node's relay:
    // what G times the agents cost rdzvd when it still holds one stream per node.
    if (g < 2) {
      return absl::InvalidArgumentError("--compare tasks needs --tasks-per-node 2 or more");
    }
    add("tasks=1", o.auth, o.metrics_scrape_ms, 1);
    add(absl::StrCat("tasks=", g), o.auth, o.metrics_scrape_ms, g);
  } else {
    return absl::InvalidArgumentError("--compare takes auth, metrics or tasks");
  }
  return variants;
}

int RunScale(const Options& o) {
  absl::StatusOr<std::vector<Options>> variants = ScaleVariants(o);
  if (!variants.ok()) {
    std::fprintf(stderr, "rdzv-bench: %s\n", std::string(variants.status().message()).c_str());
    return 2;
  }
  const bool comparing = variants->size() > 1;
  std::FILE* csv = nullptr;
  if (!o.csv.empty()) {
    csv = std::fopen(o.csv.c_str(), "w");
    if (csv == nullptr) {
      std::fprintf(stderr, "rdzv-bench: cannot write %s: %s\n", o.csv.c_str(), strerror(errno));
      return 2;
    }
    // n counts nodes, each of tasks_per_node agents; streams and agents_attached are empty when
    // rdzvd served no metrics.
    std::fprintf(csv,
                 "n,rep,procs,join_wall_s,join_p50_ms,join_p99_ms,floor_wall_s,floor_p50_ms,"
                 "floor_p99_ms,ratio,rdzvd_cpu_join_s,rdzvd_cpu_floor_s,cpu_ms_per_agent,"
                 "rss_attached_mib,hwm_mib,abort_s,errors,correct,client_cpu_join_s,"
                 "client_cpu_floor_s,idle_cpu_pct,variant,tasks_per_node,cpu_ms_per_node,streams,"
                 "agents_attached,fan_in\n");
  }
  const bool per_task = std::any_of(variants->begin(), variants->end(),
                                    [](const Options& v) { return v.tasks_per_node > 1; });
  if (comparing) std::printf("%-12s ", "variant");
  std::printf("%7s %5s %9s %8s %8s %9s %6s %7s %8s %8s %8s %9s %7s %6s %7s\n", "N", "procs",
              "rdzv_s", "p50_ms", "p99_ms", "floor_s", "ratio", "cpu_s",
              per_task ? "ms/node" : "ms/agent", "rss_MiB", "hwm_MiB", "abort_ms", "streams",
              "errors", "correct");
  std::fflush(stdout);
  int64_t total_errors = 0;
  for (int64_t n : o.agents) {
    // results[v]: the repetitions of variant v, which take turns with the others.
    std::vector<std::vector<ScaleResult>> results(variants->size());
    for (int64_t rep = 0; rep < o.reps; ++rep) {
      for (size_t v = 0; v < variants->size(); ++v) {
        results[v].push_back(ScaleRun((*variants)[v], n, rep).Run());
        const ScaleResult& r = results[v].back();
        total_errors += r.errors + (r.correct ? 0 : 1);
        for (size_t i = 0; i < r.messages.size() && i < 5; ++i) {
          std::fprintf(stderr, "rdzv-bench: %sN=%ld rep %ld: %s\n",
                       comparing ? ((*variants)[v].variant + " ").c_str() : "",
                       static_cast<long>(n), static_cast<long>(rep), r.messages[i].c_str());
        }
        if (csv != nullptr) {
          std::fprintf(csv,
                       "%ld,%ld,%ld,%.4f,%.2f,%.2f,%.4f,%.2f,%.2f,%.3f,%.3f,%.3f,%.4f,%.1f,%.1f,"
                       "%.4f,%ld,%d,%.3f,%.3f,%.1f,%s,%ld,%.4f,%s,%s,%ld\n",
                       static_cast<long>(r.n), static_cast<long>(r.rep), static_cast<long>(r.procs),
                       r.join_wall_s, r.join_p50_ms, r.join_p99_ms, r.floor_wall_s, r.floor_p50_ms,
                       r.floor_p99_ms, r.floor_wall_s > 0 ? r.join_wall_s / r.floor_wall_s : 0.0,
                       r.cpu_join_s, r.cpu_floor_s,
                       1000.0 * r.cpu_join_s / static_cast<double>(n * r.tasks_per_node),
                       r.rss_attached_mib, r.hwm_mib, r.abort_s, static_cast<long>(r.errors),
                       r.correct ? 1 : 0, r.client_cpu_join_s, r.client_cpu_floor_s, r.idle_cpu_pct,
                       (*variants)[v].variant.c_str(), static_cast<long>(r.tasks_per_node),
                       1000.0 * r.cpu_join_s / static_cast<double>(n),
                       Measured(r.streams, "").c_str(), Measured(r.attached, "").c_str(),
                       static_cast<long>(r.fan_in));
          std::fflush(csv);
        }
      }
    }
    for (size_t v = 0; v < variants->size(); ++v) {
      PrintScaleSummary(n, comparing ? (*variants)[v].variant : "", results[v],
                        comparing ? &results[0] : nullptr, o.simulated_children);
    }
  }
  if (csv != nullptr) std::fclose(csv);
  if (total_errors > 0) {
    std::fprintf(stderr, "rdzv-bench: %ld errors (logs in %s)\n", static_cast<long>(total_errors),
                 o.log_dir.c_str());
    return o.check ? 1 : kErrorsSeen;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Launch mode.

struct LaunchSample {
  double wall_s = 0;
  double maxrss_mib = 0;
  bool ok = false;
};

LaunchSample TimeStandalone(const Options& o, const std::string& log) {
  LaunchSample s;
  Child agent;
  if (!agent.Start({o.agent, "--standalone", "--nproc-per-node", "1", "--", "true"}, false, log)
           .ok()) {
    return s;
  }
  rusage ru{};
  absl::StatusOr<int> code = agent.Wait(NowNs() + 60'000'000'000LL, &ru);
  s.ok = code.ok() && *code == 0;
  s.wall_s = static_cast<double>(agent.end_ns() - agent.start_ns()) / 1e9;
  s.maxrss_mib = static_cast<double>(ru.ru_maxrss) / 1024.0;
  return s;
}

LaunchSample TimeAgents(const Options& o, int port, int64_t n, const std::string& job,
                        const std::string& log) {
  LaunchSample s;
  std::vector<Child> agents(static_cast<size_t>(n));
  const int64_t start = NowNs();
  for (int64_t i = 0; i < n; ++i) {
    if (!agents[i]
             .Start({o.agent, "--rdzv-endpoint", absl::StrCat("127.0.0.1:", port), "--rdzv-id", job,
                     "--nnodes", absl::StrCat(n), "--nproc-per-node", "1", "--", "true"},
                    false, log)
             .ok()) {
      return s;
    }
  }
  s.ok = true;
  int64_t end = start;
  for (Child& a : agents) {
    rusage ru{};
    absl::StatusOr<int> code = a.Wait(start + 120'000'000'000LL, &ru);
    s.ok = s.ok && code.ok() && *code == 0;
    end = std::max(end, a.end_ns());
    s.maxrss_mib = std::max(s.maxrss_mib, static_cast<double>(ru.ru_maxrss) / 1024.0);
  }
  s.wall_s = static_cast<double>(end - start) / 1e9;
  return s;
}

int RunLaunch(const Options& o) {
  std::FILE* csv = nullptr;
  if (!o.csv.empty()) {
    csv = std::fopen(o.csv.c_str(), "w");
    if (csv == nullptr) {
      std::fprintf(stderr, "rdzv-bench: cannot write %s: %s\n", o.csv.c_str(), strerror(errno));
      return 2;
    }
    std::fprintf(csv, "case,agents,rep,wall_s,maxrss_mib,ok\n");
  }
  int failures = 0;
  auto report = [&](const std::string& name, int64_t n, const std::vector<LaunchSample>& v) {
    std::vector<double> wall, rss;
    int ok = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      wall.push_back(v[i].wall_s);
      rss.push_back(v[i].maxrss_mib);
      ok += v[i].ok ? 1 : 0;
      if (csv != nullptr) {
        std::fprintf(csv, "%s,%ld,%zu,%.4f,%.1f,%d\n", name.c_str(), static_cast<long>(n), i,
                     v[i].wall_s, v[i].maxrss_mib, v[i].ok ? 1 : 0);
      }
    }
    failures += static_cast<int>(v.size()) - ok;
    std::printf("%-22s %7.3f %7.3f %7.3f %10.1f %4d/%zu\n", name.c_str(), Median(wall),
                *std::min_element(wall.begin(), wall.end()),
                *std::max_element(wall.begin(), wall.end()), Median(rss), ok, v.size());
    std::fflush(stdout);
  };
  std::printf("%-22s %7s %7s %7s %10s %6s\n", "case", "med_s", "min_s", "max_s", "maxrss_MiB",
              "ok");
  std::vector<LaunchSample> standalone;
  for (int64_t k = 0; k < o.launch_reps; ++k) {
    standalone.push_back(TimeStandalone(o, absl::StrCat(o.log_dir, "/standalone.log")));
  }
  report("standalone true", 1, standalone);

  Child rdzvd;
  int port = 0;
  if (absl::Status s = StartRdzvd(o, rdzvd, port, absl::StrCat(o.log_dir, "/rdzvd-launch.log"));
      !s.ok()) {
    std::fprintf(stderr, "rdzv-bench: %s\n", s.ToString().c_str());
    return 1;
  }
  for (int64_t n : o.launch_nodes) {
    std::vector<LaunchSample> v;
    for (int64_t k = 0; k < o.launch_reps; ++k) {
      v.push_back(TimeAgents(o, port, n, absl::StrCat("launch-", n, "-", k, "-", getpid()),
                             absl::StrCat(o.log_dir, "/agents-", n, ".log")));
    }
    report(absl::StrCat(n, " agents true"), n, v);
  }
  rdzvd.Stop(5'000'000'000);
  if (csv != nullptr) std::fclose(csv);
  if (failures > 0) {
    std::fprintf(stderr, "rdzv-bench: %d launches failed (logs in %s)\n", failures,
                 o.log_dir.c_str());
    return 1;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Soak mode.

// One rendezvous of two fresh clients (as two agents would be) in job `job`, then both leave.
// "" when both got the right ranks, else what went wrong.
std::string SoakRendezvous(const std::string& endpoint, const std::string& job) {
  std::string errors[2];
  auto agent = [&](int index) {
    ClientOptions options;
    options.endpoint = endpoint;
    options.join_timeout = absl::Seconds(30);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
    if (!client.ok()) {
      errors[index] = client.status().ToString();
      return;
    }
    JoinSpec spec;
    spec.job_id = job;
    spec.agent.agent_id = absl::StrCat(job, "-", index);
    spec.agent.host = absl::StrCat("soak", index);
    spec.agent.node_index = index;
    spec.agent.nproc = 2;
    spec.min_agents = spec.max_agents = 2;
    spec.addresses = {"127.0.0.1"};
    spec.master_port = 29500;
    absl::StatusOr<AssignmentEvent> a = (*client)->Join(spec, {});
    if (!a.ok()) {
      errors[index] = a.status().ToString();
    } else if (a->slot.rank_offset != 2 * index || a->world_size != 4) {
      errors[index] = absl::StrFormat("agent %d got ranks from %d of %d", index,
                                      a->slot.rank_offset, a->world_size);
    } else if (absl::Status left = (*client)->Leave(); !left.ok()) {
      errors[index] = left.ToString();
    }
  };
  std::thread other(agent, 1);
  agent(0);
  other.join();
  return errors[0].empty() ? errors[1] : errors[0];
}

// What rdzvd holds once it has gone quiet: waits until its thread and fd counts stop moving.
ProcStats SettledStats(pid_t pid) {
  ProcStats last = ReadProcStats(pid);
  for (int i = 0; i < 50; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    const ProcStats now = ReadProcStats(pid);
    if (now.fds == last.fds && now.threads == last.threads && now.rss_kib == last.rss_kib) {
      return now;
    }
    last = now;
  }
  return last;
}

// --soak N: N consecutive rendezvous on one rdzvd; its RSS, open fds and threads before, halfway
// and after (after a short warm-up, so that what is allocated once is in all three). Fails when
// a rendezvous failed, a job is left, or fds or threads grew over the second half by more than
// the few a thread pool varies by. The parent starts rdzvd before it uses gRPC, and forks
// nothing after.
int RunSoak(const Options& o) {
  Child rdzvd;
  int port = 0;
  if (absl::Status s = StartRdzvd(o, rdzvd, port, absl::StrCat(o.log_dir, "/rdzvd-soak.log"));
      !s.ok()) {
    std::fprintf(stderr, "rdzv-bench: %s\n", s.ToString().c_str());
    return 1;
  }
  const std::string endpoint = absl::StrCat("127.0.0.1:", port);
  const std::string prefix = absl::StrCat("soak-", getpid(), "-");
  constexpr int kWarmUp = 50;
  int failures = 0;
  auto run = [&](int64_t first, int64_t count) {
    for (int64_t i = first; i < first + count; ++i) {
      if (std::string error = SoakRendezvous(endpoint, absl::StrCat(prefix, i)); !error.empty()) {
        if (++failures <= 5)
          std::fprintf(stderr, "rdzv-bench: rendezvous %ld: %s\n", static_cast<long>(i),
                       error.c_str());
      }
    }
  };
  run(0, kWarmUp);
  const ProcStats before = SettledStats(rdzvd.pid());
  const int64_t t0 = NowNs();
  const int64_t half = o.soak / 2;
  run(kWarmUp, half);
  const ProcStats middle = SettledStats(rdzvd.pid());
  run(kWarmUp + half, o.soak - half);
  const double wall_s = static_cast<double>(NowNs() - t0) / 1e9;
  const ProcStats after = SettledStats(rdzvd.pid());
  // What the server still holds: every job ended and was left, so nothing.
  size_t jobs_left = 0;
  ClientOptions status_options;
  status_options.endpoint = endpoint;
  if (absl::StatusOr<std::unique_ptr<Client>> c = Client::Create(status_options); c.ok()) {
    absl::StatusOr<std::vector<JobStatusView>> jobs = (*c)->Status("");
    if (jobs.ok()) jobs_left = jobs->size();
  }
  rdzvd.Stop(5'000'000'000);

  std::printf("%ld rendezvous of 2 agents in %.2f s (%.1f ms each), %d failed\n",
              static_cast<long>(o.soak), wall_s, 1000.0 * wall_s / static_cast<double>(o.soak),
              failures);
  std::printf("%-8s %9s %5s %8s\n", "rdzvd", "rss_MiB", "fds", "threads");
  for (const auto& [name, stats] :
       {std::pair{"before", before}, std::pair{"halfway", middle}, std::pair{"after", after}}) {
    std::printf("%-8s %9.1f %5ld %8ld\n", name, static_cast<double>(stats.rss_kib) / 1024.0,
                static_cast<long>(stats.fds), static_cast<long>(stats.threads));
  }
  std::printf("jobs still held: %zu\n", jobs_left);
  std::fflush(stdout);
  // gRPC's thread pool grows and shrinks with load, by a few threads: what leaks grows with the
  // rendezvous, in the second half as in the first, so the second half is held to a small slack.
  constexpr int64_t kSlack = 4;
  const int64_t reference_fds = std::max(before.fds, middle.fds);
  const int64_t reference_threads = std::max(before.threads, middle.threads);
  const bool grew =
      after.fds > reference_fds + kSlack || after.threads > reference_threads + kSlack;
  if (grew) {
    std::fprintf(stderr, "rdzv-bench: rdzvd's fds or threads kept growing over the soak\n");
  }
  return failures > 0 || grew || jobs_left > 0 ? 1 : 0;
}

// --credential-cost K: what authenticating one call costs, measured call by call on one thread:
// K MUNGE encodes (the client's side) and K decodes (rdzvd's side) through the local munged,
// and K token checks (digest and constant-time compare, rdzvd's side of --auth token).
int RunCredentialCost(const Options& o) {
  const std::string payload = CallPayload("/rdzv.v1.Rendezvous/Join", "slurm-123456.0");
  std::vector<std::string> credentials;
  credentials.reserve(static_cast<size_t>(o.credential_cost));
  auto timed = [&](const char* what, auto&& one) -> bool {
    const int64_t cpu0 = CpuNs();
    const int64_t t0 = NowNs();
    for (int64_t i = 0; i < o.credential_cost; ++i) {
      if (absl::Status s = one(); !s.ok()) {
        std::fprintf(stderr, "rdzv-bench: %s %ld: %s\n", what, static_cast<long>(i),
                     s.ToString().c_str());
        return false;
      }
    }
    const double k = static_cast<double>(o.credential_cost);
    std::printf("%-14s %9.1f us/call wall %9.1f us/call cpu (this process)\n", what,
                static_cast<double>(NowNs() - t0) / 1e3 / k,
                static_cast<double>(CpuNs() - cpu0) / 1e3 / k);
    return true;
  };
  const bool munge_ok = timed("munge encode",
                              [&]() -> absl::Status {
                                absl::StatusOr<std::string> c = MungeEncode(payload, "");
                                if (!c.ok()) return c.status();
                                credentials.push_back(*std::move(c));
                                return absl::OkStatus();
                              }) &&
                        timed("munge decode", [&, i = size_t{0}]() mutable -> absl::Status {
                          absl::StatusOr<MungeIdentity> id = MungeDecode(credentials[i++], "");
                          if (!id.ok()) return id.status();
                          return id->payload == payload
                                     ? absl::OkStatus()
                                     : absl::InternalError("the payload came back changed");
                        });
  const std::string token(64, 'k');
  const std::string digest = TokenDigest(token);
  const bool token_ok = timed("token check", [&]() -> absl::Status {
    return ConstantTimeEquals(TokenDigest(token), digest) ? absl::OkStatus()
                                                          : absl::InternalError("no match");
  });
  if (!credentials.empty()) {
    std::printf("credential size: %zu bytes of metadata per call\n", credentials.front().size());
  }
  return munge_ok && token_ok ? 0 : 1;
}

absl::Status ParseList(absl::string_view v, std::vector<int64_t>& out) {
  out.clear();
  for (absl::string_view s : absl::StrSplit(v, ',', absl::SkipEmpty())) {
    int64_t n;
    if (!absl::SimpleAtoi(s, &n) || n < 1) {
      return absl::InvalidArgumentError("expected a comma-separated list of counts >= 1");
    }
    out.push_back(n);
  }
  if (out.empty()) return absl::InvalidArgumentError("expected at least one count");
  return absl::OkStatus();
}

absl::Status ParseCount(absl::string_view v, int64_t& out, int64_t min) {
  if (!absl::SimpleAtoi(v, &out) || out < min) {
    return absl::InvalidArgumentError(absl::StrFormat("expected a whole number >= %d", min));
  }
  return absl::OkStatus();
}

constexpr char kUsage[] =
    R"(rdzv-bench: load generator for rdzvd (scale mode) and timer for rdzv-agent (--launch).

Usage: rdzv-bench [--agents 1,100,1000,4000,10000] [--reps R] [--csv FILE] [--check]
       rdzv-bench --launch [--launch-reps K] [--launch-nodes 8,32] [--csv FILE]
       rdzv-bench --soak 1000
       rdzv-bench --compare auth|metrics [--agents 1000,10000] [--reps R]
       rdzv-bench --tasks-per-node 8 [--compare tasks] [--agents 1000,10000] [--check]
       rdzv-bench --fan-in 64 [--agents 10000,20000] [--check]
       rdzv-bench --fan-in 64 --simulated-children [--agents 100000] [--check]
       rdzv-bench --credential-cost 10000
Scale mode prints, per agent count N: rendezvous wall time and join latency, the floor (N
fresh channels, one empty call each) and the ratio, rdzvd's CPU time and memory, the time for
an abort to reach every agent, errors and whether every assignment was right. With
--tasks-per-node G, N counts nodes of G agents each (shown NxG), each node one group join.)";

int Main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--worker") {
    if (argc != 11) {
      std::fprintf(stderr,
                   "rdzv-bench: --worker ENDPOINT JOB FIRST COUNT N AUTH TASKS_PER_NODE FAN_IN "
                   "simulated|relays\n");
      return 2;
    }
    WorkerConfig c;
    c.endpoint = argv[2];
    c.job = argv[3];
    if (!absl::SimpleAtoi(argv[4], &c.first) || !absl::SimpleAtoi(argv[5], &c.count) ||
        !absl::SimpleAtoi(argv[6], &c.n) || !absl::SimpleAtoi(argv[8], &c.tasks_per_node) ||
        c.tasks_per_node < 1 || !absl::SimpleAtoi(argv[9], &c.fan_in) || c.fan_in < 0) {
      std::fprintf(stderr, "rdzv-bench: bad worker arguments\n");
      return 2;
    }
    c.auth = std::string(argv[7]) == "munge" ? ClientAuth::Mode::kMunge : ClientAuth::Mode::kNone;
    c.simulated_children = c.fan_in > 0 && std::string(argv[10]) == "simulated";
    // As rdzvd does: Debian's abseil (no NDEBUG) would otherwise run its deadlock detector on
    // every lock, which costs the simulated agents more than their real work.
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
    // The relays log as rdzv-agent does, to stderr: stdout is the worker's answers.
    if (absl::Status s = SetUpLogging("rdzv-bench worker", "warn"); !s.ok()) {
      std::fprintf(stderr, "rdzv-bench: %s\n", std::string(s.message()).c_str());
      return 2;
    }
    return Worker(c).Run();
  }

  Options o;
  bool help = false;
  auto text = [](std::string& out) {
    return [&out](absl::string_view v) {
      out = std::string(v);
      return absl::OkStatus();
    };
  };
  auto on = [](bool& out) {
    return [&out](absl::string_view v) {
      absl::StatusOr<bool> b = ParseBool(v);
      if (!b.ok()) return b.status();
      out = *b;
      return absl::OkStatus();
    };
  };
  FlagParser p("rdzv-bench", kUsage);
  p.Add({"rdzvd", "", "PATH", "the rdzvd to measure (default: the one built with this)",
         text(o.rdzvd)});
  p.Add({"rdzv-agent", "", "PATH", "the rdzv-agent for --launch (default: the one built)",
         text(o.agent)});
  p.Add({"agents", "", "N,N,...", "agent counts (default 1,100,1000,4000,10000)",
         [&](absl::string_view v) { return ParseList(v, o.agents); }});
  p.Add({"procs", "", "P", "client processes per N (default ceil(N/1000))",
         [&](absl::string_view v) { return ParseCount(v, o.procs, 1); }});
  p.Add({"reps", "", "R", "repetitions per N, each on a fresh rdzvd; medians shown (default 1)",
         [&](absl::string_view v) { return ParseCount(v, o.reps, 1); }});
  p.Add({"csv", "", "FILE", "also write one row per repetition (or launch) to FILE", text(o.csv)});
  p.Add({"check", "", "", "exit 1 on any client error or wrong assignment", on(o.check)});
  p.Add({"floor", "", "BOOL", "measure the floor before each rendezvous (default true)",
         on(o.floor)});
  p.Add({"hold-ms", "", "MS",
         "keep the N agents attached this long after the rendezvous and report rdzvd's CPU use "
         "meanwhile (default 0: no hold)",
         [&](absl::string_view v) { return ParseCount(v, o.hold_ms, 0); }});
  p.Add({"verbose", "", "", "print each phase's CLOCK_MONOTONIC span (to line up profiles)",
         on(o.verbose)});
  p.Add({"auth", "", "none|munge|omit",
         "rdzvd's --auth, and the credential the simulated agents send (default none; omit\n"
         "passes no --auth, for an rdzvd that predates it); RDZV_MUNGE_SOCKET names\n"
         "the munged of both rdzvd and the agents",
         [&](absl::string_view v) {
           if (v != "none" && v != "munge" && v != "omit") {
             return absl::InvalidArgumentError("expected none, munge or omit");
           }
           o.auth = std::string(v);
           return absl::OkStatus();
         }});
  p.Add({"rdzvd-arg", "", "ARG",
         "pass ARG to rdzvd (repeatable; after the bench's own --keepalive-timeout-ms=5000\n"
         "and --max-connections-per-host=0)",
         [&](absl::string_view v) {
           o.rdzvd_args.emplace_back(v);
           return absl::OkStatus();
         }});
  p.Add({"metrics-scrape-ms", "", "MS",
         "rdzvd serves its metrics and the bench scrapes them every MS ms (default 0: off)",
         [&](absl::string_view v) { return ParseCount(v, o.metrics_scrape_ms, 0); }});
  p.Add({"tasks-per-node", "", "G",
         "simulate per-task launches: each of the N nodes runs G agents, which reach rdzvd as\n"
         "its relay sends them, one group join per node on one channel (default 1: an agent\n"
         "per node, each with its own stream); rdzvd then serves its metrics, read once for\n"
         "the join streams and agents it holds",
         [&](absl::string_view v) { return ParseCount(v, o.tasks_per_node, 1); }});
  p.Add({"fan-in", "", "K",
         "simulate a tree: the N nodes join in groups of K, each through a relay\n"
         "(client/agent/node_relay.h) on a loopback address of its own, in the worker processes,\n"
         "so that rdzvd holds N/K streams; the floor's channels go to those relays (default 0:\n"
         "every agent joins rdzvd)",
         [&](absl::string_view v) { return ParseCount(v, o.fan_in, 2); }});
  p.Add({"simulated-children", "", "",
         "with --fan-in: each relay is only its upstream side, in the client processes, sending\n"
         "rdzvd the group join a per-node tree relay sends for its K nodes, their agents\n"
         "simulated in-process (no leaf connections: 100,000 agents fit this machine); the\n"
         "floor is one fresh channel per relay to rdzvd, one call each. Without it the relays\n"
         "are real and each agent a connection of its own (up to about 20,000 agents here)",
         on(o.simulated_children)});
  p.Add({"compare", "", "auth|metrics|tasks",
         "run every N and repetition twice, the two taking turns: with --auth none and with\n"
         "MUNGE (auth), with rdzvd's metrics off and on, scraped every --metrics-scrape-ms\n"
         "(default 1000) (metrics), or with N nodes of one agent and of --tasks-per-node\n"
         "agents (tasks); the second is also shown against the first's floor",
         [&](absl::string_view v) {
           if (v != "auth" && v != "metrics" && v != "tasks") {
             return absl::InvalidArgumentError("expected auth, metrics or tasks");
           }
           o.compare = std::string(v);
           return absl::OkStatus();
         }});
  p.Add({"credential-cost", "", "K",
         "time K MUNGE encodes, K decodes and K token checks, one call at a time, and print the "
         "cost of each",
         [&](absl::string_view v) { return ParseCount(v, o.credential_cost, 1); }});
  p.Add({"launch", "", "", "time real rdzv-agent launches instead", on(o.launch)});
  p.Add({"loss", "", "",
         "instead of the scale phases: N agents join, their rdzvd is killed (SIGKILL), and the "
         "time\nuntil every agent has resumed is measured, with rdzvd restarted at once on its "
         "port\n(restart_s) and with a backup rdzvd (failover_s: --rdzv-endpoint primary,backup, "
         "3 s\nbefore the agents move)",
         on(o.loss)});
  p.Add({"launch-reps", "", "K", "runs per launch case (default 5)",
         [&](absl::string_view v) { return ParseCount(v, o.launch_reps, 1); }});
  p.Add({"launch-nodes", "", "N,N,...", "agent counts for launch mode (default 8,32)",
         [&](absl::string_view v) { return ParseList(v, o.launch_nodes); }});
  p.Add({"soak", "", "N",
         "run N consecutive rendezvous on one rdzvd and print its RSS, open fds and threads "
         "before, halfway and after (e.g. --soak 1000)",
         [&](absl::string_view v) { return ParseCount(v, o.soak, 1); }});
  p.Add({"help", "", "", "print this help", on(help)});
  absl::StatusOr<std::vector<std::string>> rest =
      p.Parse(std::vector<std::string>(argv + 1, argv + argc), ProcessEnv());
  if (!rest.ok()) {
    std::fprintf(stderr, "rdzv-bench: %s\n", std::string(rest.status().message()).c_str());
    return 2;
  }
  if (help) {
    std::printf("%s", p.Help().c_str());
    return 0;
  }
  if (!rest->empty()) {
    std::fprintf(stderr, "rdzv-bench: unexpected argument \"%s\"; see --help\n",
                 rest->front().c_str());
    return 2;
  }
  std::error_code ec;
  o.self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) {
    std::fprintf(stderr, "rdzv-bench: cannot find its own executable: %s\n", ec.message().c_str());
    return 1;
  }
  char dir[] = "/tmp/rdzv-bench.XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    std::fprintf(stderr, "rdzv-bench: cannot make a log directory: %s\n", strerror(errno));
    return 1;
  }
  o.log_dir = dir;
  // A worker that dies must not take us down with SIGPIPE; its silence is reported instead.
  signal(SIGPIPE, SIG_IGN);
  const int code = o.credential_cost > 0 ? RunCredentialCost(o)
                   : o.soak > 0          ? RunSoak(o)
                   : o.launch            ? RunLaunch(o)
                   : o.loss              ? RunLoss(o)
                                         : RunScale(o);
  // Logs are kept only when something went wrong.
  if (code == 0) std::filesystem::remove_all(o.log_dir, ec);
  return code == kErrorsSeen ? 0 : code;
}

}  // namespace
}  // namespace rdzv::bench

int main(int argc, char** argv) { return rdzv::bench::Main(argc, argv); }
