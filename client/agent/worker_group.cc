#include "client/agent/worker_group.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <asio/post.hpp>
#include <cstdio>
#include <utility>

#include "client/agent/error_file.h"
#include "common/logging.h"

namespace rdzv {

WorkerGroup::WorkerGroup(asio::io_context& io, ProcessLauncher& launcher, OutputOptions output,
                         absl::Duration term_timeout, Callbacks callbacks)
    : io_(io),
      launcher_(launcher),
      output_(std::move(output)),
      term_timeout_(term_timeout),
      callbacks_(std::move(callbacks)),
      kill_timer_(io) {}

WorkerGroup::~WorkerGroup() = default;

absl::Status WorkerGroup::Start(const std::vector<std::string>& command,
                                const std::vector<WorkerLaunch>& workers) {
  workers_.clear();
  done_reported_ = false;
  absl::Status status;
  for (const WorkerLaunch& launch : workers) {
    auto w = std::make_unique<Worker>();
    w->launch = launch;
    // A file from an earlier round is not this round's failure.
    if (!launch.error_file.empty()) std::remove(launch.error_file.c_str());
    absl::StatusOr<std::unique_ptr<WorkerOutput>> output =
        WorkerOutput::Open(io_, output_, launch.rank, launch.local_rank);
    if (!output.ok()) {
      status = output.status();
      break;
    }
    ProcessSpec spec;
    spec.argv = command;
    spec.env = launch.env;
    spec.remove_if_orphaned = launch.remove_if_orphaned;
    spec.workers_per_node = launch.workers_per_node;
    absl::StatusOr<SpawnedProcess> spawned = launcher_.Spawn(spec);
    if (!spawned.ok()) {
      status = spawned.status();
      break;
    }
    w->pid = spawned->pid;
    w->process = spawned->worker;
    w->output = *std::move(output);
    w->output->Start(spawned->stdout_fd, spawned->stderr_fd, [this, worker = w.get()] {
      if (worker->held_end) ReleaseHeld(*worker);
      CheckDone();
    });
    workers_.push_back(std::move(w));
  }
  // A worker may have ended before its SIGCHLD found it in the table.
  Reap();
  CheckDone();
  return status;
}

void WorkerGroup::Reap() {
  for (const ProcessExit& e : launcher_.Reap()) {
    for (auto& w : workers_) {
      if (w->pid != e.pid || w->exit) continue;
      w->exit = e;
      // Whatever the worker left behind in its group goes with it.
      (void)launcher_.SignalGroup(w->pid, SIGKILL);
      spdlog::debug("rank {} (pid {}) ended with code {}", w->launch.rank, w->pid, e.code());
      WorkerEnd end;
      end.rank = w->launch.rank;
      end.local_rank = w->launch.local_rank;
      end.exit = e;
      if (e.code() != 0) {
        // Its last words may still be in the pipe.
        w->output->DrainAvailable();
        end.stderr_tail = w->output->StderrTail();
        end.error_message = ReadErrorFile(w->launch.error_file);
      }
      if (e.code() != 0 && !w->output->closed()) {
        // A line read but not yet handed to the forwarder is not in the tail yet.
        w->held_end = std::move(end);
        w->hold_timer = std::make_unique<asio::steady_timer>(io_);
        w->hold_timer->expires_after(absl::ToChronoMicroseconds(kOutputGrace));
        w->hold_timer->async_wait([this, worker = w.get()](const std::error_code& ec) {
          if (ec || !worker->held_end) return;
          worker->output->DrainAvailable();
          ReleaseHeld(*worker);
        });
      } else {
        ReportEnd(std::move(end));
      }
    }
  }
  CheckDone();
}

void WorkerGroup::ReleaseHeld(Worker& w) {
  if (w.hold_timer) w.hold_timer->cancel();
  w.held_end->stderr_tail = w.output->StderrTail();
  ReportEnd(*std::exchange(w.held_end, std::nullopt));
}

void WorkerGroup::ReportEnd(WorkerEnd end) {
  if (callbacks_.on_exit) {
    asio::post(io_, [on_exit = callbacks_.on_exit, end = std::move(end)] { on_exit(end); });
  }
}

void WorkerGroup::CheckDone() {
  if (done_reported_) return;
  for (const auto& w : workers_) {
    if (!w->exit || !w->output->closed()) return;
  }
  done_reported_ = true;
  kill_timer_.cancel();
  kill_armed_ = false;
  if (callbacks_.on_all_done) asio::post(io_, callbacks_.on_all_done);
}

int WorkerGroup::Stop() {
  int signalled = 0;
  for (auto& w : workers_) {
    if (!w->exit && !w->aborting && launcher_.SignalGroup(w->pid, SIGTERM).ok()) ++signalled;
  }
  if (signalled > 0) ArmKillTimer();
  return signalled;
}

void WorkerGroup::Abort(int32_t rank) {
  for (auto& w : workers_) {
    if (w->launch.rank != rank || w->exit || w->aborting) continue;
    w->aborting = true;
    w->output->CaptureStack();
    (void)launcher_.SignalGroup(w->pid, SIGABRT);
    ArmKillTimer();
  }
}

std::vector<pid_t> WorkerGroup::pids() const {
  std::vector<pid_t> pids;
  for (const auto& w : workers_) pids.push_back(w->pid);
  return pids;
}

std::vector<pid_t> WorkerGroup::processes() const {
  std::vector<pid_t> processes;
  for (const auto& w : workers_) processes.push_back(w->process);
  return processes;
}

void WorkerGroup::ArmKillTimer() {
  // One deadline for everything signalled now: arming it again would push it back.
  if (kill_armed_) return;
  kill_armed_ = true;
  kill_timer_.expires_after(absl::ToChronoMicroseconds(term_timeout_));
  kill_timer_.async_wait([this](const std::error_code& ec) {
    if (ec) return;
    kill_armed_ = false;
    for (auto& w : workers_) {
      if (w->exit) continue;
      spdlog::warn("rank {} did not stop within {}; sending SIGKILL", w->launch.rank,
                   absl::FormatDuration(term_timeout_));
      (void)launcher_.SignalGroup(w->pid, SIGKILL);
    }
  });
}

void WorkerGroup::Kill() {
  for (auto& w : workers_) {
    if (!w->exit) (void)launcher_.SignalGroup(w->pid, SIGKILL);
  }
}

int WorkerGroup::Signal(int sig) {
  int signalled = 0;
  for (auto& w : workers_) {
    if (!w->exit && launcher_.SignalGroup(w->pid, sig).ok()) ++signalled;
  }
  return signalled;
}

}  // namespace rdzv
