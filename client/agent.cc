#include "client/agent.h"

#include <fcntl.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <netdb.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <array>
#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/post.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <variant>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/rendezvous_state.h"
#include "common/worker_env.h"
#include "server/server.h"

namespace rdzv {
namespace {

constexpr size_t kTailLines = 20;
// How long a failing agent waits for its last output to be read before it exits.
constexpr absl::Duration kOutputDrainLimit = absl::Milliseconds(500);
// How much longer an agent stays after a job ended because an agent or the server was lost.
constexpr absl::Duration kLostPeerLinger = absl::Milliseconds(100);

std::string NewAgentId(const std::string& host) {
  std::random_device rd;
  return absl::StrFormat("%s:%d:%08x", host, getpid(), rd());
}

void WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the terminal or pipe went away; output is best effort
    data.remove_prefix(static_cast<size_t>(n));
  }
}

struct Worker {
  int32_t local_index = 0;
  int32_t rank = 0;
  int32_t local_rank = 0;
  pid_t pid = -1;
  std::optional<ProcessExit> exit;
  struct Pipe {
    std::unique_ptr<asio::posix::stream_descriptor> stream;
    std::array<char, 16384> buffer;
    std::string partial;
    int console_fd = -1;  // where its lines go on the console, -1 for nowhere
  };
  Pipe out, err;
  int log_fd = -1;  // the rank's log file, -1 for none
  std::string error_file;
  std::deque<std::string> err_tail;
  int open_pipes = 0;

  ~Worker() {
    if (log_fd >= 0) close(log_fd);
  }
};

// The message of a worker's torch error file (what @record writes on an uncaught exception):
// {"message": {"message": "...", "extraInfo": {"py_callstack": "..."}}}. Empty when there is
// no file or it cannot be read.
std::string ReadErrorFile(const std::string& path) {
  if (path.empty()) return "";
  std::ifstream file(path);
  if (!file) return "";
  std::stringstream text;
  text << file.rdbuf();
  google::protobuf::Struct root;
  if (!google::protobuf::util::JsonStringToMessage(text.str(), &root).ok()) {
    return absl::StrCat("unreadable error file ", path);
  }
  const auto& fields = root.fields();
  auto message = fields.find("message");
  if (message == fields.end()) return "";
  if (message->second.has_string_value()) return message->second.string_value();
  if (!message->second.has_struct_value()) return "";
  const auto& inner = message->second.struct_value().fields();
  std::string out;
  if (auto m = inner.find("message"); m != inner.end()) out = m->second.string_value();
  if (auto extra = inner.find("extraInfo"); extra != inner.end()) {
    const auto& info = extra->second.struct_value().fields();
    if (auto stack = info.find("py_callstack"); stack != info.end()) {
      absl::StrAppend(&out, "\n", absl::StripTrailingAsciiWhitespace(stack->second.string_value()));
    }
  }
  return out;
}

// A private directory for the job's error files, removed when the agent ends.
std::string MakeRunDir(const std::string& job_id) {
  const char* tmp = std::getenv("TMPDIR");
  std::string safe = job_id;
  for (char& ch : safe) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '.') ch = '_';
  }
  std::string pattern =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/rdzv-", safe, "-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) return "";
  return pattern;
}

bool ResolvesToAddress(const std::string& host) {
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  freeaddrinfo(found);
  return true;
}

// The address slurm.conf gives a node (NodeAddr), from scontrol.
absl::StatusOr<std::string> SlurmNodeAddress(const std::string& node) {
  if (node.empty() || node.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                             "0123456789._-") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("not a node name: ", node));
  }
  const std::string command = absl::StrCat("scontrol show node -o ", node, " 2>/dev/null");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::UnavailableError("cannot run scontrol");
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) out.append(buf, n);
  const int rc = pclose(pipe);
  const size_t at = out.find("NodeAddr=");
  if (rc != 0 || at == std::string::npos) {
    return absl::NotFoundError("scontrol does not know its address either");
  }
  const size_t start = at + 9;
  const size_t end = out.find_first_of(" \n", start);
  return out.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

}  // namespace

class Agent::Impl {
 public:
  Impl(AgentConfig config, std::unique_ptr<ProcessLauncher> launcher)
      : config_(std::move(config)), launcher_(std::move(launcher)) {}

  ~Impl() {
    if (!run_dir_.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(run_dir_, ignored);
    }
    if (client_) client_->Cancel();
    if (join_thread_.joinable()) join_thread_.join();
    if (report_thread_.joinable()) report_thread_.join();
  }

  int Run();

 private:
  enum class Phase { kJoining, kRunning, kStopping, kDone };

  absl::Status Prepare();
  void WaitSignal();
  // Joins the job's current round; with `resume`, rejoins the round the workers run in.
  void StartJoin(std::optional<AssignmentEvent> resume = std::nullopt);
  bool MayRestart(const AbortEvent& abort) const;
  void Restart();
  void OnSignal(int sig);
  void OnJoined(absl::StatusOr<AssignmentEvent> result);
  void OnLost(const absl::Status& status);
  void OnResumed(const absl::StatusOr<AssignmentEvent>& result);
  // Ends the job (exit code 1) because the rendezvous server is gone for good.
  void EndForLostServer(std::string reason);
  absl::Status StartWorkers();
  void ReadPipe(Worker& w, Worker::Pipe& pipe);
  void EmitLines(Worker& w, Worker::Pipe& pipe, absl::string_view data, bool eof);
  void ReapWorkers();
  void LocalFailure(Worker& w);
  FailureInfo NewFailure() const;
  // The job fails here: remember why, tell the server, stop the workers.
  void Fail(const FailureInfo& failure);
  void ReportFailure(FailureInfo failure);
  void OnAbort(const AbortEvent& abort);
  void StopWorkers(absl::string_view why);
  void MaybeFinish();
  void AwaitOtherAgents(absl::Time until, int code);
  void Finish(int code);
  void PrintRootCause(const AbortEvent& abort) const;
  std::string RankPrefix(const Worker& w) const;

  AgentConfig config_;
  std::unique_ptr<ProcessLauncher> launcher_;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  asio::signal_set signals_{io_};
  asio::steady_timer kill_timer_{io_};
  asio::steady_timer wait_timer_{io_};

  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> client_;
  // --standalone: the one-agent rendezvous runs in-process, without a server, a port or gRPC.
  std::unique_ptr<RendezvousState> local_;
  StreamId local_stream_ = 0;
  std::string endpoint_;                // the server this agent talks to first
  std::vector<std::string> endpoints_;  // every candidate, when not hosting the server
  JoinSpec spec_;
  std::optional<ReservedPort> master_port_;
  std::thread join_thread_;
  std::thread report_thread_;
  std::string run_dir_;  // the workers' error files

  Phase phase_ = Phase::kJoining;
  AssignmentEvent assignment_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::optional<AbortEvent> outcome_;  // why the job is ending, once it is
  bool server_lost_ = false;           // it is ending because the rendezvous server went away
  int exit_code_ = 0;
  bool waiting_logged_ = false;
  int attempt_ = 0;   // joins started, to tell current events from stale ones
  int restarts_ = 0;  // restarts this agent has made
};

Agent::Agent(AgentConfig config, std::unique_ptr<ProcessLauncher> launcher)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(launcher))) {}
Agent::~Agent() = default;
int Agent::Run() { return impl_->Run(); }

absl::Status Agent::Impl::Prepare() {
  // Where the server is, as an address: the name may not resolve (inside containers, or with
  // Slurm node names that only slurm.conf knows), so ask Slurm for the node's address then.
  std::string server_address;
  if (!config_.rdzv_host.empty()) {
    if (ResolvesToAddress(config_.rdzv_host)) {
      server_address = config_.rdzv_host;
    } else if (absl::StatusOr<std::string> a = SlurmNodeAddress(config_.rdzv_host); a.ok()) {
      spdlog::debug("{} does not resolve; Slurm knows it as {}", config_.rdzv_host, *a);
      server_address = *a;
    } else {
      return absl::UnavailableError(absl::StrFormat(
          "cannot resolve the rendezvous host %s (%s); pass --rdzv-endpoint ADDRESS:PORT",
          config_.rdzv_host, a.status().message()));
    }
  }

  if (config_.mode == "standalone") {
    local_ = std::make_unique<RendezvousState>();
  } else if (config_.embedded_server) {
    absl::Status last;
    for (int port : config_.embedded_ports) {
      ServerOptions options;
      options.listen = FormatHostPort(config_.embedded_listen_host, port);
      options.service.log_jobs = false;
      options.service.only_job = config_.job_id;
      absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
      if (server.ok()) {
        server_ = std::move(*server);
        break;
      }
      last = server.status();
      spdlog::debug("{}; trying the next port", last.message());
    }
    if (server_ == nullptr) {
      return absl::UnavailableError(absl::StrFormat(
          "cannot host the rendezvous: %s (tried %d ports); pass --rdzv-endpoint to use an "
          "rdzvd instead",
          last.message(), config_.embedded_ports.size()));
    }
    const std::string self = config_.embedded_listen_host == "0.0.0.0"
                                 ? std::string("127.0.0.1")
                                 : config_.embedded_listen_host;
    endpoint_ = FormatHostPort(self, server_->port());
    spdlog::debug("hosting the rendezvous for job {} on port {}", config_.job_id, server_->port());
  } else {
    for (int port : config_.rdzv_ports) {
      endpoints_.push_back(FormatHostPort(server_address, port));
    }
    endpoint_ = endpoints_.front();
  }

  if (!local_) {
    ClientOptions client_options;
    client_options.endpoint = endpoint_;
    if (endpoints_.size() > 1) {
      client_options.alternate_endpoints.assign(endpoints_.begin() + 1, endpoints_.end());
    }
    client_options.join_timeout = config_.join_timeout;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(client_options);
    if (!client.ok()) return client.status();
    client_ = std::move(*client);
  }

  absl::StatusOr<ReservedPort> port = ReservedPort::Reserve();
  if (!port.ok()) return port.status();
  master_port_ = std::move(*port);

  spec_.job_id = config_.job_id;
  spec_.agent.host = config_.host;
  spec_.agent.agent_id = NewAgentId(config_.host);
  spec_.agent.node_index = config_.node_index;
  spec_.agent.order = config_.order;
  spec_.agent.nproc = config_.nproc;
  spec_.min_agents = config_.min_agents;
  spec_.max_agents = config_.max_agents;
  spec_.max_restarts = config_.max_restarts;
  spec_.last_call = absl::ToInt64Microseconds(config_.last_call);
  // The address that routes to the rendezvous server is one the other nodes, which reach the
  // same server, can use to reach us; the interfaces' addresses follow as fallbacks.
  const std::string toward = server_address.empty() ? std::string("127.0.0.1") : server_address;
  if (absl::StatusOr<std::string> a = LocalAddressToward(toward, 29400); a.ok()) {
    spec_.addresses.push_back(*a);
  }
  for (std::string& a : InterfaceAddresses()) spec_.addresses.push_back(std::move(a));
  spec_.master_port = master_port_->port();
  spec_.master_addr_override = config_.master_addr;
  spec_.master_port_override = config_.master_port;

  run_dir_ = MakeRunDir(config_.job_id);
  if (!config_.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(config_.log_dir, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrFormat("--log-dir %s cannot be created: %s", config_.log_dir, ec.message()));
    }
  }
  return absl::OkStatus();
}

int Agent::Impl::Run() {
  signal(SIGPIPE, SIG_IGN);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGCHLD}) signals_.add(s);
  WaitSignal();

  if (absl::Status s = Prepare(); !s.ok()) {
    spdlog::error("{}", s.message());
    return 1;
  }

  StartJoin();
  io_.run();

  // A rejoin may still be waiting for a server that is gone.
  if (client_) client_->Cancel();
  if (join_thread_.joinable()) join_thread_.join();
  if (report_thread_.joinable()) report_thread_.join();
  client_.reset();
  if (server_) server_->Shutdown();
  // A failed job's explanation is the line users look for; see that it has left this process.
  if (exit_code_ != 0) AwaitOutputRead(kOutputDrainLimit);
  // When another agent (or the server's) was killed, srun drops output still on its way once
  // the last task has exited: stay a little longer, so that what the others wrote gets through.
  if (outcome_ && (server_lost_ || IsLostAgent(*outcome_))) absl::SleepFor(kLostPeerLinger);
  return exit_code_;
}

void Agent::Impl::StartJoin(std::optional<AssignmentEvent> resume) {
  const int attempt = ++attempt_;
  if (local_) {
    Decisions d;
    const StreamId stream = ++local_stream_;
    local_->Join(absl::ToUnixMicros(absl::Now()), stream, spec_, d);
    absl::StatusOr<AssignmentEvent> result = absl::InternalError("no assignment");
    for (const Decisions::Send& send : d.sends) {
      const auto* a = std::get_if<AssignmentEvent>(&send.event);
      if (send.stream == stream && a != nullptr) result = *a;
    }
    // Closes of earlier rounds' streams are this agent's own past; only its refusal counts.
    for (const Decisions::Close& close : d.closes) {
      if (close.stream == stream) result = close.status;
    }
    asio::post(io_, [this, result] { OnJoined(result); });
    return;
  }
  // Events from an earlier round's stream are stale once a new round has begun.
  const auto current = [this, attempt] { return attempt == attempt_ && phase_ != Phase::kDone; };
  Handlers handlers;
  handlers.on_progress = [this, current](const ProgressEvent& p) {
    asio::post(io_, [this, current, p] {
      if (!current() || phase_ != Phase::kJoining) return;
      std::string missing;
      if (!p.missing_node_indices.empty()) {
        missing = absl::StrCat(
            "; missing node ranks ", absl::StrJoin(p.missing_node_indices, ","),
            p.missing_node_indices.size() < static_cast<size_t>(p.expected - p.joined) ? ",..."
                                                                                       : "");
      }
      spdlog::info("job {}: waiting for {} of {} {} (joined: {}{}{})", config_.job_id,
                   p.expected - p.joined, p.expected, config_.order >= 0 ? "tasks" : "nodes",
                   absl::StrJoin(p.joined_hosts, ","),
                   p.joined > static_cast<int32_t>(p.joined_hosts.size()) ? ",..." : "", missing);
    });
  };
  handlers.on_abort = [this, current](const AbortEvent& a) {
    asio::post(io_, [this, current, a] {
      if (current()) OnAbort(a);
    });
  };
  handlers.on_lost = [this, current](const absl::Status& s) {
    asio::post(io_, [this, current, s] {
      if (current()) OnLost(s);
    });
  };

  spdlog::debug("joining job {} at {} as {} ({} workers, restart {})", config_.job_id, endpoint_,
                spec_.agent.agent_id, config_.nproc, spec_.restart_count);
  if (join_thread_.joinable()) join_thread_.join();
  JoinSpec spec = spec_;
  spec.resume = std::move(resume);
  join_thread_ = std::thread([this, handlers, spec = std::move(spec)] {
    const bool resuming = spec.resume.has_value();
    absl::StatusOr<AssignmentEvent> result =
        client_->Join(spec, handlers, resuming ? config_.reconnect_timeout : config_.join_timeout);
    asio::post(io_, [this, resuming, result] {
      if (resuming) {
        OnResumed(result);
      } else {
        OnJoined(result);
      }
    });
  });
}

void Agent::Impl::OnLost(const absl::Status& status) {
  if (phase_ != Phase::kRunning) return;
  if (config_.reconnect_timeout <= absl::ZeroDuration()) {
    EndForLostServer(
        absl::StrFormat("lost the rendezvous server at %s (%s)", endpoint_, status.message()));
    return;
  }
  spdlog::warn(
      "job {}: lost the rendezvous server at {} ({}); the workers go on while this agent "
      "reconnects, for up to {}",
      config_.job_id, endpoint_, status.message(), absl::FormatDuration(config_.reconnect_timeout));
  StartJoin(assignment_);
}

void Agent::Impl::OnResumed(const absl::StatusOr<AssignmentEvent>& result) {
  // Stopping already: the job ended (an Abort on rejoining), a worker failed, or a signal.
  if (phase_ != Phase::kRunning) return;
  if (result.ok()) {
    spdlog::info("job {}: back in touch with the rendezvous server at {}", config_.job_id,
                 endpoint_);
    return;
  }
  EndForLostServer(absl::StrFormat(
      "lost the rendezvous server at %s and could not rejoin within %s (%s)", endpoint_,
      absl::FormatDuration(config_.reconnect_timeout), result.status().message()));
}

void Agent::Impl::EndForLostServer(std::string reason) {
  AbortEvent abort;
  abort.reason = std::move(reason);
  abort.exit_code = 1;
  outcome_ = std::move(abort);
  server_lost_ = true;
  StopWorkers(outcome_->reason);
}

bool Agent::Impl::MayRestart(const AbortEvent& abort) const {
  if (restarts_ >= config_.max_restarts) return false;
  // A worker's failure, or (with --nnodes MIN:MAX) a lost node the others can go on without.
  // A stop request (a signal to an agent) ends the job.
  if (abort.first_failure) return abort.first_failure->rank >= 0;
  return config_.min_agents < config_.max_agents && IsLostAgent(abort);
}

void Agent::Impl::Restart() {
  ++restarts_;
  spdlog::warn("job {}: restarting the workers (restart {} of {}) after: {}", config_.job_id,
               restarts_, config_.max_restarts, outcome_->reason);
  if (report_thread_.joinable()) report_thread_.join();
  workers_.clear();
  outcome_.reset();
  phase_ = Phase::kJoining;
  spec_.restart_count = assignment_.restart_count + 1;
  if (absl::StatusOr<ReservedPort> port = ReservedPort::Reserve(); port.ok()) {
    master_port_ = std::move(*port);
    spec_.master_port = master_port_->port();
  }
  StartJoin();
}

void Agent::Impl::WaitSignal() {
  signals_.async_wait([this](const std::error_code& ec, int sig) {
    if (ec) return;
    OnSignal(sig);
    WaitSignal();
  });
}

void Agent::Impl::OnSignal(int sig) {
  if (sig == SIGCHLD) {
    ReapWorkers();
    return;
  }
  if (sig == SIGUSR1 || sig == SIGUSR2) {
    int forwarded = 0;
    for (auto& w : workers_) {
      if (!w->exit && launcher_->SignalGroup(w->pid, sig).ok()) ++forwarded;
    }
    spdlog::info("forwarded {} to {} workers", SignalName(sig), forwarded);
    return;
  }
  // SIGINT, SIGTERM, SIGHUP: stop the job, everywhere.
  switch (phase_) {
    case Phase::kJoining:
      exit_code_ = 128 + sig;
      phase_ = Phase::kStopping;
      spdlog::warn("{} while joining; giving up", SignalName(sig));
      if (client_) client_->Cancel();
      break;
    case Phase::kRunning: {
      FailureInfo f = NewFailure();
      f.signal = sig;
      f.exit_code = 128 + sig;
      Fail(f);
      break;
    }
    case Phase::kStopping:
      spdlog::warn("{} again: killing the workers now", SignalName(sig));
      for (auto& w : workers_) {
        if (!w->exit) (void)launcher_->SignalGroup(w->pid, SIGKILL);
      }
      break;
    case Phase::kDone:
      break;
  }
}

void Agent::Impl::OnJoined(absl::StatusOr<AssignmentEvent> result) {
  if (phase_ != Phase::kJoining) {
    Finish(exit_code_);
    return;
  }
  if (!result.ok()) {
    if (outcome_) {
      // The job had already ended when this agent joined (it came back to a job that failed).
      PrintRootCause(*outcome_);
      Finish(outcome_->exit_code);
      return;
    }
    spdlog::error("job {}: {}", config_.job_id, result.status().message());
    Finish(1);
    return;
  }
  assignment_ = *result;
  const AssignmentEvent& a = assignment_;
  spdlog::info("job {} round {}: node {} of {}, ranks {}-{} of {}, master {}", config_.job_id,
               a.round, a.slot.group_rank, a.group_world_size, a.slot.rank_offset,
               a.slot.rank_offset + config_.nproc - 1, a.world_size,
               FormatHostPort(a.master_addr, a.master_port));
  // Rank 0's first worker binds this port for its TCPStore.
  master_port_.reset();
  if (outcome_) {
    // The job ended elsewhere while this agent's assignment was on its way: start nothing.
    phase_ = Phase::kStopping;
    MaybeFinish();
    return;
  }
  phase_ = Phase::kRunning;
  if (absl::Status s = StartWorkers(); !s.ok()) {
    FailureInfo f = NewFailure();
    f.rank = a.slot.rank_offset;
    f.local_rank = a.slot.local_rank_offset;
    f.exit_code = 127;
    f.error_message = std::string(s.message());
    Fail(f);
  }
}

absl::Status Agent::Impl::StartWorkers() {
  WorkerContext ctx;
  ctx.rank_offset = assignment_.slot.rank_offset;
  ctx.world_size = assignment_.world_size;
  ctx.group_rank = assignment_.slot.group_rank;
  ctx.group_world_size = assignment_.group_world_size;
  ctx.local_rank_offset = assignment_.slot.local_rank_offset;
  ctx.local_world_size = assignment_.slot.local_world_size;
  ctx.nproc = config_.nproc;
  ctx.master_addr = assignment_.master_addr;
  ctx.master_port = assignment_.master_port;
  ctx.restart_count = assignment_.restart_count;
  ctx.max_restarts = config_.max_restarts;
  ctx.round = assignment_.round;
  ctx.run_id = config_.job_id;
  ctx.rdzv_endpoint = endpoint_;
  ctx.error_file_dir = run_dir_;
  const EnvList base = ProcessEnvList();
  const bool console = config_.log_dir.empty() || config_.tee;

  for (int32_t i = 0; i < config_.nproc; ++i) {
    MergedEnv env = MergeWorkerEnv(base, WorkerVariables(ctx, i));
    if (i == 0) {
      for (const std::string& note : env.notes) spdlog::warn("{}", note);
    }
    auto w = std::make_unique<Worker>();
    w->local_index = i;
    w->rank = ctx.rank_offset + i;
    w->local_rank = ctx.local_rank_offset + i;
    w->error_file = ErrorFilePath(ctx, i);
    std::remove(w->error_file.c_str());  // a file from an earlier round is not this failure
    if (!config_.log_dir.empty()) {
      const std::string path = absl::StrCat(config_.log_dir, "/rank-", w->rank, ".log");
      w->log_fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (w->log_fd < 0) {
        return absl::FailedPreconditionError(
            absl::StrFormat("cannot write %s: %s", path, strerror(errno)));
      }
    }
    const bool shown =
        console && (config_.local_ranks_filter.empty() ||
                    absl::c_linear_search(config_.local_ranks_filter, w->local_rank));
    absl::StatusOr<SpawnedProcess> spawned =
        launcher_->Spawn({config_.command, env.entries, {w->error_file, run_dir_}});
    if (!spawned.ok()) return spawned.status();
    w->pid = spawned->pid;
    w->out.stream = std::make_unique<asio::posix::stream_descriptor>(io_, spawned->stdout_fd);
    w->out.console_fd = shown ? STDOUT_FILENO : -1;
    w->err.stream = std::make_unique<asio::posix::stream_descriptor>(io_, spawned->stderr_fd);
    w->err.console_fd = shown ? STDERR_FILENO : -1;
    w->open_pipes = 2;
    Worker& ref = *w;
    workers_.push_back(std::move(w));
    ReadPipe(ref, ref.out);
    ReadPipe(ref, ref.err);
  }
  // A worker may have ended before its SIGCHLD found it in the table.
  ReapWorkers();
  return absl::OkStatus();
}

std::string Agent::Impl::RankPrefix(const Worker& w) const {
  return config_.rank_prefix ? absl::StrCat("[", w.rank, "]: ") : std::string();
}

void Agent::Impl::ReadPipe(Worker& w, Worker::Pipe& pipe) {
  pipe.stream->async_read_some(
      asio::buffer(pipe.buffer), [this, &w, &pipe](const std::error_code& ec, size_t n) {
        EmitLines(w, pipe, absl::string_view(pipe.buffer.data(), n), ec.value() != 0);
        if (!ec) {
          ReadPipe(w, pipe);
          return;
        }
        pipe.stream->close();
        --w.open_pipes;
        MaybeFinish();
      });
}

void Agent::Impl::EmitLines(Worker& w, Worker::Pipe& pipe, absl::string_view data, bool eof) {
  pipe.partial.append(data.data(), data.size());
  if (eof && !pipe.partial.empty() && pipe.partial.back() != '\n') pipe.partial.push_back('\n');
  const size_t end = pipe.partial.rfind('\n');
  if (end == std::string::npos) return;
  const absl::string_view lines(pipe.partial.data(), end + 1);
  if (w.log_fd >= 0) WriteAll(w.log_fd, lines);
  if (pipe.console_fd >= 0 || &pipe == &w.err) {
    const std::string prefix = RankPrefix(w);
    std::string out;
    for (absl::string_view line : absl::StrSplit(lines.substr(0, end), '\n')) {
      if (pipe.console_fd >= 0) absl::StrAppend(&out, prefix, line, "\n");
      if (&pipe == &w.err) {
        w.err_tail.emplace_back(line);
        if (w.err_tail.size() > kTailLines) w.err_tail.pop_front();
      }
    }
    if (pipe.console_fd >= 0) WriteAll(pipe.console_fd, out);
  }
  pipe.partial.erase(0, end + 1);
}

void Agent::Impl::ReapWorkers() {
  for (const ProcessExit& e : launcher_->Reap()) {
    for (auto& w : workers_) {
      if (w->pid != e.pid || w->exit) continue;
      w->exit = e;
      // Whatever the worker left behind in its group goes with it.
      (void)launcher_->SignalGroup(w->pid, SIGKILL);
      spdlog::debug("rank {} (pid {}) ended with code {}", w->rank, w->pid, e.code());
      if (e.code() != 0 && phase_ == Phase::kRunning) LocalFailure(*w);
    }
  }
  MaybeFinish();
}

void Agent::Impl::LocalFailure(Worker& w) {
  FailureInfo f = NewFailure();
  f.rank = w.rank;
  f.local_rank = w.local_rank;
  f.exit_code = w.exit->code();
  f.signal = w.exit->signal;
  f.stderr_tail = absl::StrJoin(w.err_tail, "\n");
  f.error_message = ReadErrorFile(w.error_file);
  Fail(f);
}

FailureInfo Agent::Impl::NewFailure() const {
  FailureInfo f;
  f.host = config_.host;
  f.group_rank = assignment_.slot.group_rank;
  f.time_us = absl::ToUnixMicros(absl::Now());
  return f;
}

void Agent::Impl::Fail(const FailureInfo& failure) {
  outcome_ = AbortFor(failure);
  ReportFailure(failure);
  StopWorkers(outcome_->reason);
}

void Agent::Impl::ReportFailure(FailureInfo failure) {
  if (local_) {
    Decisions ignored;  // no other agent to tell
    (void)local_->ReportFailure(absl::ToUnixMicros(absl::Now()), spec_.job_id, spec_.agent.agent_id,
                                failure, ignored);
    return;
  }
  if (report_thread_.joinable()) return;  // one report per agent: the first failure
  report_thread_ = std::thread([this, failure, attempt = attempt_] {
    absl::StatusOr<AbortEvent> first = client_->ReportFailure(failure);
    if (!first.ok()) {
      spdlog::warn("could not report the failure to the rendezvous server: {}",
                   first.status().message());
      return;
    }
    // The server's answer names the job's first failure, which may be another node's.
    asio::post(io_, [this, attempt, abort = *first] {
      if (attempt == attempt_ && phase_ != Phase::kDone) outcome_ = abort;
    });
  });
}

void Agent::Impl::OnAbort(const AbortEvent& abort) {
  if (phase_ == Phase::kDone) return;
  outcome_ = abort;
  if (phase_ == Phase::kRunning) StopWorkers(abort.reason);
}

void Agent::Impl::StopWorkers(absl::string_view why) {
  phase_ = Phase::kStopping;
  int signalled = 0;
  for (auto& w : workers_) {
    if (!w->exit && launcher_->SignalGroup(w->pid, SIGTERM).ok()) ++signalled;
  }
  if (signalled == 0) {
    MaybeFinish();
    return;
  }
  spdlog::info("stopping {} workers: {}", signalled, why);
  kill_timer_.expires_after(absl::ToChronoMicroseconds(config_.term_timeout));
  kill_timer_.async_wait([this](const std::error_code& ec) {
    if (ec) return;
    for (auto& w : workers_) {
      if (w->exit) continue;
      spdlog::warn("rank {} did not stop within {}; sending SIGKILL", w->rank,
                   absl::FormatDuration(config_.term_timeout));
      (void)launcher_->SignalGroup(w->pid, SIGKILL);
    }
  });
}

void Agent::Impl::MaybeFinish() {
  if (phase_ != Phase::kRunning && phase_ != Phase::kStopping) return;
  for (const auto& w : workers_) {
    if (!w->exit || w->open_pipes > 0) return;
  }
  kill_timer_.cancel();
  if (outcome_ && MayRestart(*outcome_)) {
    Restart();
    return;
  }
  int code = 0;
  if (outcome_) {
    code = outcome_->exit_code;
    PrintRootCause(*outcome_);
  } else {
    spdlog::info("job {}: all {} workers on {} succeeded", config_.job_id, workers_.size(),
                 config_.host);
  }
  phase_ = Phase::kDone;
  if (report_thread_.joinable()) report_thread_.join();
  if (local_) {
    Decisions ignored;
    local_->Leave(absl::ToUnixMicros(absl::Now()), spec_.job_id, spec_.agent.agent_id, ignored);
  } else if (absl::Status s = client_->Leave(); !s.ok()) {
    spdlog::debug("leave: {}", s.message());
  }
  if (server_) {
    // The other agents reach the job's end through this process's server: keep it up until
    // they have gone (after a failure, only as long as they need to stop their workers).
    const absl::Time until =
        outcome_ ? absl::Now() + config_.term_timeout + absl::Seconds(5) : absl::InfiniteFuture();
    AwaitOtherAgents(until, code);
    return;
  }
  Finish(code);
}

void Agent::Impl::AwaitOtherAgents(absl::Time until, int code) {
  const size_t others = server_->open_streams();
  if (others == 0 || absl::Now() >= until) {
    Finish(code);
    return;
  }
  if (!waiting_logged_) {
    spdlog::info("waiting for {} other agents to finish before stopping the rendezvous server",
                 others);
    waiting_logged_ = true;
  }
  wait_timer_.expires_after(std::chrono::milliseconds(50));
  wait_timer_.async_wait([this, until, code](const std::error_code& ec) {
    if (!ec) AwaitOtherAgents(until, code);
  });
}

void Agent::Impl::Finish(int code) {
  exit_code_ = code;
  phase_ = Phase::kDone;
  signals_.cancel();
  kill_timer_.cancel();
  wait_timer_.cancel();
  work_.reset();
  io_.stop();
}

void Agent::Impl::PrintRootCause(const AbortEvent& abort) const {
  std::string text = absl::StrFormat("job %s failed: %s", config_.job_id, abort.reason);
  const auto block = [&text](absl::string_view title, absl::string_view body) {
    absl::StrAppend(&text, "\n  ", title);
    for (absl::string_view line : absl::StrSplit(body, '\n')) {
      absl::StrAppend(&text, "\n    ", line);
    }
  };
  if (const std::optional<FailureInfo>& f = abort.first_failure) {
    if (!f->error_message.empty() && !absl::StrContains(abort.reason, f->error_message)) {
      block(absl::StrCat("rank ", f->rank, "'s error:"), f->error_message);
    } else if (!f->stderr_tail.empty()) {
      block(absl::StrCat("last lines of rank ", f->rank, "'s stderr:"), f->stderr_tail);
    }
  }
  spdlog::error("{}", text);
}

}  // namespace rdzv
