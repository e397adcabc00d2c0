// RendezvousState: every job a server knows, as a pure state machine.
//
// It holds no clock, socket or thread. The server shell feeds it events stamped with the time
// (a join on a new stream, a stream closing, an exit report, a departure, a periodic tick) and
// carries out the Decisions it returns: messages to send on streams and streams to close. A
// stream is named by a StreamId the shell chooses; the state never sees the stream itself.
//
// A job goes Filling -> Running -> Ended. A round fills until max_agents have joined, or until
// at least min_agents have and the last-call window has passed since the latest join. Then the
// ranks are assigned (rank_assignment.h) and every member gets its Assignment. After that, a
// failure report or a lost stream ends the job and every attached member gets the Abort. A
// member that joins again with a higher restart count opens the next round.
//
// Not thread-safe: the shell serialises calls.
#ifndef RDZV_COMMON_RENDEZVOUS_STATE_H_
#define RDZV_COMMON_RENDEZVOUS_STATE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/rank_assignment.h"

namespace rdzv {

using Micros = int64_t;
using StreamId = uint64_t;

struct ProgressEvent {
  int32_t joined = 0;
  int32_t expected = 0;
  std::vector<std::string> joined_hosts;      // a few, for messages
  std::vector<int64_t> missing_node_indices;  // a few, when nodes carry indices
};

struct AssignmentEvent {
  int32_t round = 0;
  Slot slot;
  int32_t world_size = 0;
  int32_t group_world_size = 0;
  std::string master_addr;
  int32_t master_port = 0;
  int32_t restart_count = 0;
  int32_t agents = 0;
};

struct JoinSpec {
  std::string job_id;
  AgentSpec agent;
  int32_t min_agents = 1;
  int32_t max_agents = 1;
  Micros last_call = 0;
  std::vector<std::string> addresses;  // best first
  // The address the server saw the agent connect from (filled in by the server).
  std::string peer_address;
  int32_t master_port = 0;
  std::string master_addr_override;
  int32_t master_port_override = 0;
  int32_t restart_count = 0;
  // Set by an agent whose workers run on after it lost its server: the assignment they run
  // under. It asks to rejoin that round; it never starts or joins another.
  std::optional<AssignmentEvent> resume;
  // The agent's --max-restarts; every agent of a job must have the same. Unset: not checked.
  std::optional<int32_t> max_restarts;
};

struct FailureInfo {
  std::string host;
  int32_t group_rank = -1;
  int32_t rank = -1;
  int32_t local_rank = -1;
  int32_t exit_code = 1;
  int32_t signal = 0;
  std::string stderr_tail;
  std::string error_message;
  int64_t time_us = 0;
};

// "SIGSEGV" for 11; "signal 77" for a number without a name.
std::string SignalName(int sig);

// One line naming the failure for users: who (rank, local rank, node, host) and how (exit code
// or signal), e.g. "rank 4 (local rank 0, node 2) on n3 exited with code 3".
std::string DescribeFailure(const FailureInfo& failure);

struct AbortEvent {
  std::optional<FailureInfo> first_failure;
  std::string reason;
  int32_t exit_code = 1;
};

// The abort that a failure causes: it names the failure, and its exit code is the failure's.
AbortEvent AbortFor(const FailureInfo& failure);

// The abort that losing a running agent causes, e.g. "lost contact with the agent on n2 (node 1,
// ranks 2-3)"; exit code 1.
AbortEvent AbortForLostAgent(const std::string& host, int32_t group_rank, int32_t first_rank,
                             int32_t last_rank);

// Whether `abort` ended a job because one of its agents went away (killed, its node down).
bool IsLostAgent(const AbortEvent& abort);

using Event = std::variant<ProgressEvent, AssignmentEvent, AbortEvent>;

struct Decisions {
  struct Send {
    StreamId stream;
    Event event;
  };
  struct Close {
    StreamId stream;
    absl::Status status;  // OK for a clean end
  };
  std::vector<Send> sends;
  std::vector<Close> closes;
};

struct StateOptions {
  // How often a waiting agent hears how the round is filling.
  Micros progress_interval = 3'000'000;
  // How long an ended job is kept (so reconnecting agents learn how it ended) once no agent
  // is attached any more.
  Micros ended_job_ttl = 60'000'000;
  // How long a job that this server rebuilds from resuming agents (it restarted while the job
  // ran) waits for the rest of them; then the missing ones count as lost and the job ends.
  Micros resume_window = 30'000'000;
};

struct AgentStatusView {
  std::string agent_id;
  std::string host;
  int64_t node_index = -1;
  int32_t nproc = 0;
  int32_t rank_offset = -1;
  std::string state;
};

struct JobStatusView {
  std::string job_id;
  int32_t round = 0;
  std::string state;
  int32_t joined = 0;
  int32_t min_agents = 0;
  int32_t max_agents = 0;
  int32_t world_size = 0;
  std::vector<AgentStatusView> agents;
};

class RendezvousState {
 public:
  explicit RendezvousState(StateOptions options = {});
  ~RendezvousState();
  RendezvousState(const RendezvousState&) = delete;
  RendezvousState& operator=(const RendezvousState&) = delete;

  // An agent opened `stream` to join `spec.job_id`. A refusal (bad spec, wrong size, late,
  // duplicate node rank) comes back as a Close of `stream` in `out`. With `spec.resume` the
  // agent asks back into the round it runs in: it gets that assignment again, the job's Abort
  // if the job ended, or a refusal if the job moved on to another round.
  void Join(Micros now, StreamId stream, const JoinSpec& spec, Decisions& out);

  // `stream` ended from the agent's side (cancelled, deadline, connection lost).
  void StreamClosed(Micros now, StreamId stream, Decisions& out);

  // An agent's worker failed. Ends the job unless it already ended; returns the job's first
  // failure (which may be an earlier one from another agent). NotFound for an unknown job.
  absl::StatusOr<AbortEvent> ReportFailure(Micros now, const std::string& job_id,
                                           const std::string& agent_id, const FailureInfo& failure,
                                           Decisions& out);

  // An agent is done with the job (its workers ended, or it gave up). Closes its stream
  // cleanly; the job is forgotten once every member has left.
  void Leave(Micros now, const std::string& job_id, const std::string& agent_id, Decisions& out);

  // Time passes: last-call windows close, waiters hear progress, ended jobs are forgotten.
  void Tick(Micros now, Decisions& out);

  // A snapshot of one job, or of all jobs when `job_id` is empty.
  std::vector<JobStatusView> Status(const std::string& job_id) const;

  size_t job_count() const;

 private:
  struct Job;
  struct Member;

  Job* FindJob(const std::string& job_id);
  void CompleteRound(Job& job, Decisions& out);
  void EndJob(Job& job, Micros now, AbortEvent abort, Decisions& out);
  void OpenRound(Job& job, const JoinSpec& spec);
  void Resume(Micros now, StreamId stream, const JoinSpec& spec, Decisions& out);
  // Makes `stream` the member's (detaching any earlier one).
  void Attach(Job& job, Member& member, StreamId stream);
  void Detach(Job& job, Member& member);
  void EraseIfDone(const std::string& job_id);
  ProgressEvent MakeProgress(const Job& job) const;

  StateOptions options_;
  absl::flat_hash_map<std::string, std::unique_ptr<Job>> jobs_;
  struct StreamOwner {
    std::string job_id;
    std::string agent_id;
  };
  absl::flat_hash_map<StreamId, StreamOwner> streams_;
};

}  // namespace rdzv

#endif  // RDZV_COMMON_RENDEZVOUS_STATE_H_
