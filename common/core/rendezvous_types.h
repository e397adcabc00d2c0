// The vocabulary of a rendezvous, shared by the server's state machine, librdzv and the agent:
// what an agent says when it joins, what it learns, and how a job ends. Plain structs with no
// behaviour beyond a few pure helpers that put them into words; librdzv's public header
// (client/client.h) needs nothing else from the core.
//
// Thread-compatible value types.
#ifndef RDZV_COMMON_CORE_RENDEZVOUS_TYPES_H_
#define RDZV_COMMON_CORE_RENDEZVOUS_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rdzv {

// Microseconds on the caller's clock; the core only ever compares and subtracts them.
using Micros = int64_t;

// What rank assignment needs to know about one agent.
struct AgentSpec {
  std::string agent_id;
  std::string host;
  int64_t node_index = -1;  // --node-rank / SLURM_NODEID, or -1 when not given
  int64_t order = -1;       // global position (SLURM_PROCID in per-task mode), or -1
  int32_t nproc = 1;        // workers this agent runs
};

// Where one agent's workers sit in the job.
struct Slot {
  int32_t rank_offset = 0;        // global rank of the agent's first worker
  int32_t group_rank = 0;         // dense node index
  int32_t local_rank_offset = 0;  // local rank of the agent's first worker on its node
  int32_t local_world_size = 0;   // workers on this node, over all of its agents
  bool operator==(const Slot&) const = default;
};

// Why a node is left out of a job (see ExcludedNode).
enum class ExclusionKind : int32_t {
  kUnspecified = 0,
  kHealthCheckFailed = 1,    // the user's --health-check exited non-zero
  kHealthCheckTimedOut = 2,  // ... or ran past --health-check-timeout
  kGpusMissing = 3,          // a GPU the worker count relies on is missing
  kRunDir = 4,               // the run directory is not writable or has no room
  kAddress = 5,              // the node has no address other nodes could reach
  kNodeLeftOut = 6,          // another agent of the same node was left out
  kRankRequested = 7,        // a rank of the node asked for it (kWorkerExitExcludeNode)
  kWorkersStuck = 8,         // the last run's workers did not end (stuck in the GPU driver)
  kNodeLost = 9,             // the server lost the node's agent while the job ran
};
inline constexpr int32_t kMaxExclusionKind = 9;
// Whether an agent may report `kind` of its own node; the others only the server decides.
inline bool AgentMayReport(ExclusionKind kind) {
  const auto k = static_cast<int32_t>(kind);
  return k >= 1 && k <= kMaxExclusionKind && kind != ExclusionKind::kNodeLeftOut &&
         kind != ExclusionKind::kNodeLost;
}

// A stable lower-case name ("health_check"), for logs, metrics and JSON.
const char* ExclusionKindName(ExclusionKind kind);

// What an agent whose node failed its health check says instead of joining.
struct Unhealthy {
  ExclusionKind kind = ExclusionKind::kHealthCheckFailed;
  std::string detail;  // the check's last line of output; at most kMaxUnhealthyDetailBytes

  bool operator==(const Unhealthy&) const = default;
};
inline constexpr size_t kMaxUnhealthyDetailBytes = 512;
// The most agents one job may have left out. A job past it ends: so many failed checks point at
// the check or the cluster, and the records are bounded whatever a job's --nnodes.
inline constexpr int32_t kMaxExcludedAgents = 4096;

// A node left out of a job for good: it does not rejoin the job, even when its agent comes back.
struct ExcludedNode {
  std::string host;
  int64_t node_index = -1;
  Unhealthy why;

  bool operator==(const ExcludedNode&) const = default;
};

// "n2 (node 1): health check failed: no space left on /scratch".
std::string DescribeExcluded(const ExcludedNode& node);

struct ProgressEvent {
  int32_t joined = 0;
  int32_t expected = 0;
  std::vector<std::string> joined_hosts;      // a few, for messages
  std::vector<int64_t> missing_node_indices;  // a few, when nodes carry indices
  std::vector<ExcludedNode> excluded;         // a few: nodes left out of the job
};

// One agent's place in a completed round: everything its workers' environment is made of.
struct AssignmentEvent {
  int32_t round = 0;
  Slot slot;
  int32_t world_size = 0;
  int32_t group_world_size = 0;
  std::string master_addr;
  int32_t master_port = 0;
  // The job's restart count: 0 for the first run, +1 for each restart after a failure.
  int32_t restart_count = 0;
  int32_t agents = 0;
  // The longest heartbeat interval the job's agents have reported, over all its rounds
  // (--hang-timeout auto).
  Micros longest_heartbeat_interval = 0;
  // The workers on each node in node order (index = group_rank), in Slurm's compressed
  // SLURM_TASKS_PER_NODE syntax ("2(x3),1"): every agent of a round gets it, and the syntax keeps
  // it a few bytes for the usual job whose nodes run the same count. Empty when not known.
  std::string workers_per_node;
  // This agent is a hot spare of the round (JoinSpec::spare_nodes): it has no ranks (`slot` is
  // all zero) and starts no workers; it waits to take a lost node's place in the next round.
  bool spare = false;
};

// What an agent asks for when it joins a job.
struct JoinSpec {
  std::string job_id;
  AgentSpec agent;
  int32_t min_agents = 1;
  int32_t max_agents = 1;
  Micros last_call = 0;
  std::vector<std::string> addresses;  // of this host, that other nodes can reach; best first
  int32_t master_port = 0;             // free on this host, for MASTER_PORT if it gets rank 0
  std::string master_addr_override;
  int32_t master_port_override = 0;
  int32_t restart_count = 0;
  // Set by an agent whose workers run on after it lost its server: the assignment they run
  // under. It asks to rejoin that round; it never starts or joins another.
  std::optional<AssignmentEvent> resume;
  // The agent's --max-restarts; every agent of a job must have the same. Unset: not checked.
  std::optional<int32_t> max_restarts;
  // The longest interval between two heartbeats of one worker this agent has seen; 0 for none.
  Micros longest_heartbeat_interval = 0;
  // The job's nodes as a compressed Slurm hostlist, in node order, when known (a Slurm step);
  // at most kMaxNodeListBytes, else empty. The job keeps the first one, for its status.
  std::string node_list;
  // Set when this node failed its health check: the agent asks not to join but to be left out.
  std::optional<Unhealthy> unhealthy;
  // Hot spares (--spare-nodes): of the job's max_agents nodes, this many get no ranks and wait;
  // a node lost from a running job restarts it with a spare in its place, every other node
  // keeping its node rank and ranks. Needs node indices and one agent per node; every agent of
  // the job must give the same.
  int32_t spare_nodes = 0;
};

// The longest node list a join carries; rdzvd refuses a longer one, and an agent whose list
// compresses to more sends none.
inline constexpr size_t kMaxNodeListBytes = 16 * 1024;

// Why a job ended early. Carried as data from whoever decided it to every agent, so that no one
// has to read the reason's words to know what happened.
enum class AbortCause : int32_t {
  kUnspecified = 0,     // from a peer that does not say
  kWorkerFailed = 1,    // a worker exited non-zero, was killed by a signal, or could not start
  kAgentSignalled = 2,  // an agent was told to stop (SIGTERM, SIGINT, SIGHUP: scancel, Ctrl-C)
  kAgentLost = 3,       // the server lost an agent: its process died or its node went silent
  kServerLost = 4,      // an agent lost its server and could not rejoin (decided by the agent)
  kResumeTimedOut = 5,  // a restarted server gave up waiting for the job's agents to return
  kWorkerHung = 6,      // a worker's watchdog timer expired or its heartbeats stopped
  kNodeUnhealthy = 7,   // a node failed its health check and the job cannot have its minimum
};
inline constexpr int32_t kMaxAbortCause = 7;

// The exit code of an agent whose node failed its health check, and of every agent of a job
// that ended for it.
inline constexpr int kExitNodeUnhealthy = 83;

// What a rank can ask of the job as it fails: by its exit code, or by a line on the watchdog
// FIFO before it ends (then with its own words).
enum class RankRequest : int32_t {
  kNone = 0,
  kExcludeNode = 1,  // "this node is bad": the restarted job goes on without it
  kNoRestart = 2,    // "the error is mine": the job ends, whatever --max-restarts allows
};
inline constexpr int32_t kMaxRankRequest = 2;
// The exit codes that ask it. A worker exiting 83 says what an agent exiting 83 says: the node
// is unfit for the job.
inline constexpr int kWorkerExitExcludeNode = 83;
inline constexpr int kWorkerExitNoRestart = 84;
// The rank's own words for its request, at most.
inline constexpr size_t kMaxRankRequestReasonBytes = 512;

// A stable lower-case name ("worker_failed"), for logs, metrics and JSON.
const char* AbortCauseName(AbortCause cause);

// How many of the first `max` bytes of `text` to keep so that no UTF-8 character is cut in two:
// `max`, or less by the bytes of a character it would split.
size_t Utf8Cut(const std::string& text, size_t max);

// What an agent reports when its part of the job fails: a worker's end (kWorkerFailed, with
// the worker's ranks), a hung worker (kWorkerHung, likewise), or a stop request the agent
// received (kAgentSignalled).
struct FailureInfo {
  AbortCause cause = AbortCause::kWorkerFailed;
  std::string host;
  int32_t group_rank = 0;
  // The failed worker, for kWorkerFailed.
  int32_t rank = 0;
  int32_t local_rank = 0;
  int32_t exit_code = 1;
  int32_t signal = 0;  // the signal that killed the worker, or that the agent received
  std::string stderr_tail;
  std::string error_message;
  int64_t time_us = 0;  // when, in microseconds since the Unix epoch on the reporting host
  // kWorkerHung: how the hang showed, e.g. `timer "train.py#12" expired 0.1s ago (pid 4242)`;
  // time_us is then when the worker became overdue (its deadline), not when it was found.
  std::string hang_detail;
  // kWorkerFailed: what the rank asked of the job, and its words (empty when it asked by its
  // exit code alone).
  RankRequest request = RankRequest::kNone;
  std::string request_reason;

  bool operator==(const FailureInfo&) const = default;
};

struct AbortEvent {
  AbortCause cause = AbortCause::kUnspecified;
  std::optional<FailureInfo> first_failure;  // for kWorkerFailed and kAgentSignalled
  std::string reason;                        // one line for people
  int32_t exit_code = 1;                     // never 0: the job did not succeed

  bool operator==(const AbortEvent&) const = default;
};

// "SIGSEGV" for 11; "signal 77" for a number without a name.
std::string SignalName(int sig);

// One line naming the failure for users: who (rank, local rank, node, host) and how (exit code
// or signal), e.g. "rank 4 (local rank 0, node 2) on n3 exited with code 3".
std::string DescribeFailure(const FailureInfo& failure);

// Whether DescribeFailure's line holds the failure's error message (a worker that could not
// start, an agent that failed), so that whoever shows the line need not show the message again.
bool DescribeFailureShowsMessage(const FailureInfo& failure);

// The abort that a failure causes: it names the failure, and its exit code is the failure's
// (1 when the report claims 0: a job stopped by a failure never ends as a success).
AbortEvent AbortFor(const FailureInfo& failure);

// The abort that losing a running agent causes, e.g. "lost contact with the agent on n2 (node 1,
// ranks 2-3)"; exit code 1.
AbortEvent AbortForLostAgent(const std::string& host, int32_t group_rank, int32_t first_rank,
                             int32_t last_rank);

struct AgentStatusView {
  std::string agent_id;
  std::string host;
  int64_t node_index = -1;
  int32_t nproc = 0;
  int32_t rank_offset = -1;  // -1 while the round fills
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
  std::string node_list;  // JoinSpec::node_list of the first agent that gave one
  // How the job ended, when it ended by an abort the server recorded (a failure report or an
  // operator's abort).
  std::optional<AbortEvent> abort;
  // Agents the server left out of `agents` to keep its reply within a fixed size.
  int32_t omitted_agents = 0;
  // Nodes left out of the job for good, with their reasons.
  std::vector<ExcludedNode> excluded;
  // The server that holds the job, where a client asked several ("" from rdzvd itself).
  std::string server;
};

}  // namespace rdzv

#endif  // RDZV_COMMON_CORE_RENDEZVOUS_TYPES_H_
