#include "client/agent/agent.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <deque>
#include <filesystem>
#include <limits>
#include <optional>
#include <variant>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "client/agent/agent_names.h"
#include "client/agent/agent_rendezvous.h"
#include "client/agent/connect_rendezvous.h"
#include "client/agent/core/agent_lifecycle.h"
#include "client/agent/core/worker_launches.h"
#include "client/agent/health_check.h"
#include "client/agent/watchdog_fifo.h"
#include "client/agent/worker_group.h"
#include "client/local_endpoint.h"
#include "common/clock.h"
#include "common/core/file_names.h"
#include "common/logging.h"

namespace rdzv {
namespace {

// How long a failing agent waits for its last output to be read before it exits.
constexpr absl::Duration kOutputDrainLimit = absl::Milliseconds(500);
// How much longer an agent stays after a job ended because an agent or the server was lost.
constexpr absl::Duration kLostPeerLinger = absl::Milliseconds(100);
// How long an agent that hosts its node's relay waits, once done, for the node's other agents.
constexpr absl::Duration kRelayLinger = absl::Minutes(10);
// How often the hosting agent looks whether the other agents have gone.
constexpr std::chrono::milliseconds kAwaitPoll(50);

// `path` from the agent's working directory, which a worker may leave; "" stays "".
std::string AbsolutePath(const std::string& path) {
  if (path.empty()) return path;
  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::absolute(path, error);
  return error ? path : absolute.string();
}

}  // namespace

// The agent's shell: it carries out the lifecycle's actions with the worker group, the
// rendezvous and Asio's signals and timers, and feeds back what happens. Everything runs on
// io_'s thread; the rendezvous and the worker group post their news there.
class Agent::Impl {
 public:
  Impl(AgentConfig config, std::unique_ptr<ProcessLauncher> launcher, AgentEnv env)
      : config_(std::move(config)),
        launcher_(std::move(launcher)),
        clock_(std::move(env.steady_clock)),
        wall_clock_(std::move(env.wall_clock)),
        variables_(std::move(env.variables)),
        env_(EnvFromList(variables_)),
        temp_dir_(TempDirectory(env_)) {}

  ~Impl() {
    health_.reset();  // a check still running is killed
    if (!run_dir_.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(run_dir_, ignored);
    }
  }

  int Run();

 private:
  absl::Status Prepare();
  void WaitSignal();
  // Carries out `actions`, and whatever they lead to, in order.
  void Handle(AgentActions actions);
  void Do(const agent_action::Join& join);
  void Do(const agent_action::CheckHealth& check);
  void Do(const agent_action::CancelHealthCheck&) {
    if (health_) health_->Cancel();
  }
  void Do(const agent_action::StartWorkers& start);
  void Do(const agent_action::StopWorkers& stop);
  void Do(const agent_action::KillWorkers&) { workers_->Kill(); }
  void Do(const agent_action::AbortWorker& abort) { workers_->Abort(abort.rank); }
  void Do(const agent_action::AwaitStack& await);
  void Do(const agent_action::AwaitEarlierHang& await);
  absl::Status OpenWatchdog();
  // Hands the lifecycle what the workers asked on the watchdog FIFO.
  void TakeRankRequests() {
    if (!watchdog_) return;
    for (WatchdogFifo::RankAsk& ask : watchdog_->TakeRequests()) {
      Handle(lifecycle_->RankAsked(ask.rank, ask.request, ask.reason));
    }
  }
  void Do(const agent_action::ForwardSignal& forward);
  void Do(const agent_action::ReportFailure& report);
  void Do(const agent_action::CancelJoin&) { rendezvous_->Cancel(); }
  void Do(const agent_action::Leave&);
  void Do(const agent_action::AwaitOthers& await);
  void Do(const agent_action::Log& log);
  void Do(const agent_action::Exit& exit);
  // Polls until no other agent is attached to the hosted server or `until` (clock_) has passed.
  void AwaitOthers(Micros until, bool logged);

  AgentConfig config_;
  std::unique_ptr<ProcessLauncher> launcher_;
  const Clock clock_;
  const Clock wall_clock_;
  const EnvList variables_;
  const EnvLookup env_;  // over variables_
  const std::string temp_dir_;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  asio::signal_set signals_{io_};
  asio::steady_timer await_timer_{io_};
  asio::steady_timer stack_timer_{io_};
  asio::steady_timer earlier_hang_timer_{io_};
  asio::steady_timer report_timer_{io_};  // a report that must be answered soon

  ServerLocation location_;
  std::unique_ptr<NodeRelay> relay_;  // the node's, when this agent hosts it
  std::unique_ptr<AgentRendezvous> rendezvous_;
  JoinSpec spec_;  // this agent's join, as of its latest round
  std::optional<ReservedPort> master_port_;
  std::string run_dir_;  // the workers' error files
  bool run_dir_made_ = false;
  std::unique_ptr<WorkerGroup> workers_;
  std::unique_ptr<WatchdogFifo> watchdog_;  // null when the user names a timer file of their own
  int32_t first_local_rank_ = 0;            // of the workers that run
  std::unique_ptr<AgentLifecycle> lifecycle_;
  std::unique_ptr<HealthCheck> health_;  // the check that runs, or ran last
  std::deque<AgentAction> pending_;
  bool handling_ = false;
  int exit_code_ = 1;
  bool linger_ = false;
  int64_t await_joins_ = 0;  // AwaitOthers waits until the server has seen this many joins
};

Agent::Agent(AgentConfig config, std::unique_ptr<ProcessLauncher> launcher, AgentEnv env)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(launcher), std::move(env))) {}
Agent::~Agent() = default;
int Agent::Run() { return impl_->Run(); }

absl::Status Agent::Impl::Prepare() {
  absl::StatusOr<ConnectedRendezvous> connected =
      ConnectRendezvous(config_, {clock_, temp_dir_},
                        [this](std::function<void()> task) { asio::post(io_, std::move(task)); });
  if (!connected.ok()) return connected.status();
  location_ = std::move(connected->location);
  relay_ = std::move(connected->relay);
  rendezvous_ = std::move(connected->rendezvous);

  spec_ = config_.join;
  spec_.agent.agent_id = NewAgentId(spec_.agent.host, getpid());
  absl::StatusOr<ReservedPort> port = PrepareLocalEndpoint(spec_, location_.server_host);
  if (!port.ok()) return port.status();
  master_port_ = *std::move(port);

  if (!config_.output.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(config_.output.log_dir, ec);
    if (ec) {
      return absl::FailedPreconditionError(absl::StrFormat("--log-dir %s cannot be created: %s",
                                                           config_.output.log_dir, ec.message()));
    }
  }

  WorkerGroup::Callbacks callbacks;
  callbacks.on_exit = [this](const WorkerEnd& end) {
    // What the worker asked on the FIFO just before it ended counts for its end.
    TakeRankRequests();
    if (watchdog_) watchdog_->WorkerEnded(end.local_rank - first_local_rank_);
    Handle(lifecycle_->WorkerEnded(end, wall_clock_()));
  };
  callbacks.on_all_done = [this] { Handle(lifecycle_->AllWorkersDone()); };
  workers_ = std::make_unique<WorkerGroup>(io_, *launcher_, config_.output, config_.term_timeout,
                                           std::move(callbacks));

  lifecycle_ = std::make_unique<AgentLifecycle>(
      LifecycleOptionsFor(config_, location_.embedded != nullptr,
                          location_.endpoints.empty() ? "" : location_.endpoints.front()));
  return absl::OkStatus();
}

absl::Status Agent::Impl::OpenWatchdog() {
  if (run_dir_.empty()) return absl::OkStatus();
  // A timer file of the user's own has a server of their own: the workers keep it.
  if (const std::string own = env_("TORCHELASTIC_TIMER_FILE").value_or(""); !own.empty()) {
    // Heartbeats go to that file too, where rdzv-agent cannot see them.
    if (config_.hang.heartbeat_timeout > absl::ZeroDuration() || config_.hang.auto_timeout) {
      spdlog::warn(
          "TORCHELASTIC_TIMER_FILE={} is set: the workers keep that timer server, so their "
          "heartbeats are not watched and --hang-timeout has no effect; unset it to have "
          "rdzv-agent watch timers and heartbeats",
          own);
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<WatchdogFifo>> fifo =
      WatchdogFifo::Open(io_, run_dir_ + "/watchdog.fifo", config_.hang,
                         [this](const WorkerHang& hang) { Handle(lifecycle_->WorkerHung(hang)); });
  if (!fifo.ok()) return fifo.status();
  watchdog_ = *std::move(fifo);
  watchdog_->OnRequest([this] { TakeRankRequests(); });
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
  Handle(lifecycle_->Start());
  io_.run();

  // The node's other agents (or the group's other nodes) reach the server through this one's
  // relay: it stays until they are done.
  if (relay_ != nullptr && !relay_->WaitIdle(absl::Milliseconds(100))) {
    spdlog::info("waiting for the other agents that reach the server through this one to finish");
    if (!relay_->WaitIdle(kRelayLinger)) {
      spdlog::warn(
          "the agents that reach the server through this one did not finish within {}; "
          "they lose the relay",
          absl::FormatDuration(kRelayLinger));
    }
  }
  // A rejoin may still be waiting for a server that is gone.
  rendezvous_->Cancel();
  rendezvous_.reset();
  relay_.reset();
  if (location_.embedded) location_.embedded->Shutdown();
  // A failed job's explanation is the line users look for; see that it has left this process.
  if (exit_code_ != 0) AwaitOutputRead(kOutputDrainLimit);
  // When another agent (or the server's) was killed, srun drops output still on its way once
  // the last task has exited: stay a little longer, so that what the others wrote gets through.
  if (linger_) absl::SleepFor(kLostPeerLinger);
  return exit_code_;
}

void Agent::Impl::WaitSignal() {
  signals_.async_wait([this](const std::error_code& ec, int sig) {
    if (ec) return;
    if (sig == SIGCHLD) {
      if (workers_) workers_->Reap();
    } else if (lifecycle_) {
      Handle(lifecycle_->Signal(sig, wall_clock_()));
    }
    WaitSignal();
  });
}

void Agent::Impl::Handle(AgentActions actions) {
  for (AgentAction& a : actions) pending_.push_back(std::move(a));
  if (handling_) return;  // the call below us carries them out, in order
  handling_ = true;
  while (!pending_.empty()) {
    AgentAction action = std::move(pending_.front());
    pending_.pop_front();
    std::visit([this](const auto& a) { Do(a); }, action);
  }
  handling_ = false;
}

void Agent::Impl::Do(const agent_action::CheckHealth& check) {
  HealthCheckTarget target;
  target.addresses = spec_.addresses;
  target.run_parent = temp_dir_;
  // Before a restart: the last run's workers, should one still be stuck after SIGKILL.
  target.previous_workers = workers_->processes();
  if (!config_.health.command.empty()) {
    spdlog::info("checking this node's health: {}", config_.health.command);
  }
  const int32_t generation = check.generation;
  health_.reset();
  health_ = std::make_unique<HealthCheck>(
      config_.health, std::move(target), [this, generation](std::optional<Unhealthy> verdict) {
        asio::post(io_, [this, generation, verdict = std::move(verdict)] {
          Handle(lifecycle_->HealthChecked(generation, verdict));
        });
      });
}

void Agent::Impl::Do(const agent_action::Join& join) {
  spec_.restart_count = join.restart_count;
  if (!join.resume) {
    // A new round: a port for its rank 0 (the last one went to the previous round's workers).
    if (!master_port_) {
      if (absl::StatusOr<ReservedPort> port = ReservedPort::Reserve(); port.ok()) {
        master_port_ = *std::move(port);
        spec_.master_port = master_port_->port();
      }
    }
  }
  JoinSpec spec = spec_;
  spec.resume = join.resume;
  spec.unhealthy = join.unhealthy;
  if (watchdog_) spec.longest_heartbeat_interval = watchdog_->longest_interval();
  spdlog::debug("joining job {} at {} as {} ({} workers, restart {})", spec.job_id,
                rendezvous_->endpoint(), spec.agent.agent_id, spec.agent.nproc, spec.restart_count);
  const int32_t generation = join.generation;
  Handlers events;
  events.on_progress = [this, generation](const ProgressEvent& p) {
    Handle(lifecycle_->Progress(generation, p));
  };
  events.on_abort = [this, generation](const AbortEvent& a) {
    // This node's culprit may be overdue and not yet found: the agents check at different
    // moments, and once the workers stop, so does the watchdog.
    std::optional<WorkerHang> overdue;
    if (watchdog_) overdue = watchdog_->CheckNow();
    Handle(lifecycle_->Aborted(generation, a, overdue));
  };
  events.on_lost = [this, generation](const absl::Status& s) {
    Handle(lifecycle_->ServerLost(generation, s));
  };
  events.on_released = [this, generation] { Handle(lifecycle_->Released(generation)); };
  rendezvous_->Join(spec, join.timeout, std::move(events),
                    [this, generation](absl::StatusOr<AssignmentEvent> result) {
                      lifecycle_->ServerAt(rendezvous_->endpoint());
                      Handle(lifecycle_->Joined(generation, result));
                    });
}

void Agent::Impl::Do(const agent_action::StartWorkers& start) {
  // Rank 0's first worker binds this port for its TCPStore.
  master_port_.reset();
  // The run directory is made now, not while the agent waits for the others: only the workers'
  // guards remove it should the agent be killed, and before the first workers there are none.
  if (!run_dir_made_) {
    run_dir_made_ = true;
    if (absl::StatusOr<std::string> dir = MakeRunDir(temp_dir_, spec_.job_id); dir.ok()) {
      run_dir_ = *std::move(dir);
    } else {
      spdlog::warn("{}; the workers run without torch error files and the hang watchdog",
                   dir.status().message());
    }
    if (absl::Status s = OpenWatchdog(); !s.ok()) {
      Handle(lifecycle_->WorkersStartFailed(s, wall_clock_()));
      return;
    }
  }
  WorkerContext ctx = RoundContext(spec_, start.assignment);
  ctx.rdzv_endpoint = rendezvous_->endpoint();
  // A server list (not the candidate ports of a server on the first node): the workers get it all.
  if (!config_.backup_endpoints.empty()) ctx.other_endpoints = location_.endpoints;
  ctx.token_file = AbsolutePath(config_.token_file);
  ctx.munge_socket = config_.auth.munge_socket;
  ctx.tls_ca = AbsolutePath(config_.tls.ca_file);
  ctx.tls_server_name = config_.tls.server_name;
  ctx.error_file_dir = run_dir_;
  if (watchdog_) ctx.timer_file = watchdog_->path();
  WorkerLaunches launches = BuildWorkerLaunches(ctx, variables_);
  for (const std::string& note : launches.notes) spdlog::warn("{}", note);
  first_local_rank_ = start.assignment.slot.local_rank_offset;
  absl::Status s = workers_->Start(config_.command, launches.launches);
  if (watchdog_) {
    watchdog_->StartRound(workers_->pids(), start.assignment.slot.rank_offset, first_local_rank_,
                          start.assignment.longest_heartbeat_interval, workers_->processes());
  }
  if (!s.ok()) Handle(lifecycle_->WorkersStartFailed(s, wall_clock_()));
}

void Agent::Impl::Do(const agent_action::StopWorkers& stop) {
  if (watchdog_) watchdog_->StopRound();
  if (const int signalled = workers_->Stop(); signalled > 0) {
    spdlog::info("stopping {} workers: {}", signalled, stop.why);
  }
}

void Agent::Impl::Do(const agent_action::AwaitStack& await) {
  stack_timer_.expires_after(absl::ToChronoMicroseconds(await.limit));
  stack_timer_.async_wait([this](const std::error_code& ec) {
    if (!ec) Handle(lifecycle_->StackWaitOver());
  });
}

void Agent::Impl::Do(const agent_action::AwaitEarlierHang& await) {
  earlier_hang_timer_.expires_after(absl::ToChronoMicroseconds(await.limit));
  earlier_hang_timer_.async_wait([this](const std::error_code& ec) {
    if (!ec) Handle(lifecycle_->EarlierHangWaitOver());
  });
}

void Agent::Impl::Do(const agent_action::ForwardSignal& forward) {
  const int forwarded = workers_->Signal(forward.signal);
  spdlog::info("forwarded {} to {} workers", SignalName(forward.signal), forwarded);
}

void Agent::Impl::Do(const agent_action::ReportFailure& report) {
  // Answered once: by the server, or by the timer when it has not answered in time. Both run on
  // the agent's loop.
  auto answered = std::make_shared<bool>(false);
  auto answer = [this, generation = report.generation, answered](absl::StatusOr<AbortEvent> r) {
    if (std::exchange(*answered, true)) return;
    Handle(lifecycle_->FailureAnswered(generation, r));
  };
  if (report.timeout != absl::InfiniteDuration()) {
    report_timer_.expires_after(absl::ToChronoMicroseconds(report.timeout));
    report_timer_.async_wait([answer, timeout = report.timeout](const std::error_code& ec) {
      if (!ec) {
        answer(absl::DeadlineExceededError(
            absl::StrCat("no answer within ", absl::FormatDuration(timeout))));
      }
    });
  }
  rendezvous_->ReportFailure(report.failure, answer);
}

void Agent::Impl::Do(const agent_action::Leave&) {
  rendezvous_->Leave([this](absl::Status s) { Handle(lifecycle_->Left(s)); });
}

void Agent::Impl::Do(const agent_action::AwaitOthers& await) {
  const Micros until = await.limit == absl::InfiniteDuration()
                           ? std::numeric_limits<Micros>::max()
                           : clock_() + absl::ToInt64Microseconds(await.limit);
  // Those attached now have come; the rest are still to join.
  await_joins_ = 0;
  if (location_.embedded != nullptr && await.others > 0) {
    await_joins_ = location_.embedded->agents_joined() +
                   std::max<int64_t>(0, await.others - location_.embedded->agents_attached());
  }
  AwaitOthers(until, false);
}

void Agent::Impl::AwaitOthers(Micros until, bool logged) {
  const size_t others = location_.embedded ? location_.embedded->open_streams() : 0;
  const bool all_came =
      location_.embedded == nullptr || location_.embedded->agents_joined() >= await_joins_;
  if ((others == 0 && all_came) || clock_() >= until) {
    Handle(lifecycle_->OthersGone());
    return;
  }
  if (!logged) {
    spdlog::info("waiting for {} other agents to finish before stopping the rendezvous server",
                 others);
  }
  await_timer_.expires_after(kAwaitPoll);
  await_timer_.async_wait([this, until](const std::error_code& ec) {
    if (!ec) AwaitOthers(until, true);
  });
}

void Agent::Impl::Do(const agent_action::Log& log) {
  switch (log.level) {
    case agent_action::Log::kDebug:
      spdlog::debug("{}", log.text);
      break;
    case agent_action::Log::kInfo:
      spdlog::info("{}", log.text);
      break;
    case agent_action::Log::kWarn:
      spdlog::warn("{}", log.text);
      break;
    case agent_action::Log::kError:
      spdlog::error("{}", log.text);
      break;
  }
}

void Agent::Impl::Do(const agent_action::Exit& exit) {
  exit_code_ = exit.code;
  linger_ = exit.linger;
  signals_.cancel();
  await_timer_.cancel();
  stack_timer_.cancel();
  earlier_hang_timer_.cancel();
  report_timer_.cancel();
  if (watchdog_) watchdog_->StopRound();
  work_.reset();
  io_.stop();
}

}  // namespace rdzv
