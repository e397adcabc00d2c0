// rdzv-agent's configuration: the flags (each also an RDZV_* variable), parsed and then resolved
// against the environment (Slurm's, when inside an allocation) into what the agent will do.
// Parsing and resolution are pure: they take the arguments and an EnvLookup, and every problem
// comes back as one line that names the flag or variable and the fix.
//
// Thread-safe: the functions keep no state (the EnvLookup given must be safe to call), and the
// structs are plain values.
#ifndef RDZV_CLIENT_AGENT_CORE_AGENT_OPTIONS_H_
#define RDZV_CLIENT_AGENT_CORE_AGENT_OPTIONS_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/agent/core/hang_watchdog.h"
#include "client/agent/core/worker_shape.h"
#include "client/client.h"
#include "common/core/connection_flags.h"
#include "common/core/env.h"
#include "common/core/rendezvous_state.h"
#include "common/core/rendezvous_types.h"

namespace rdzv {

// The most workers one agent starts: as many as the rendezvous lets one agent run.
inline constexpr int32_t kMaxNprocPerNode = kMaxWorkersPerAgent;

// How many nodes' agents one relay gathers by default in a job of more nodes than that.
inline constexpr int kDefaultFanIn = 64;

// --mode: under Slurm, one agent per node that starts the node's workers, or one agent per task
// that is one rank; auto picks per task when a node runs more than one of the step's tasks.
enum class SlurmAgents { kAuto, kPerNode, kPerTask };

// What the user asked for, before defaults are filled in from the environment.
struct AgentFlags {
  std::optional<int32_t> nnodes_min, nnodes_max;  // --nnodes N or MIN:MAX
  std::optional<int32_t> nproc_per_node;          // --nproc-per-node
  std::optional<int64_t> node_rank;               // --node-rank
  std::string rdzv_endpoint;
  std::string rdzv_id;
  bool standalone = false;
  bool node_relay = true;      // --node-relay
  int fan_in = kDefaultFanIn;  // --fan-in; 0: every node joins the server itself
  int32_t max_restarts = 0;
  int32_t spare_nodes = 0;  // --spare-nodes
  std::string master_addr;
  int32_t master_port = 0;
  absl::Duration join_timeout = absl::Minutes(10);
  absl::Duration last_call = absl::Seconds(1);
  absl::Duration term_timeout = absl::Seconds(3);
  std::optional<absl::Duration> reconnect_timeout;
  // --failover-timeout: how long a lost server of a list is tried before the next one.
  absl::Duration failover_timeout = absl::Seconds(3);
  std::string health_check;  // --health-check
  absl::Duration health_check_timeout = absl::Seconds(60);
  // --hang-timeout: a heartbeat timeout, or auto to learn it; zero for none.
  absl::Duration hang_timeout = absl::ZeroDuration();
  bool hang_timeout_auto = false;
  absl::Duration hang_timeout_min = absl::Seconds(30);  // auto's floor
  std::string host_name;  // --host-name: how this node is named in the rendezvous
  std::string log_level = "info";
  SlurmAgents mode = SlurmAgents::kAuto;  // --mode auto, node or task
  std::string auth = "auto";              // auto, munge, token or none
  ConnectionFlags connection;             // the token, munged's socket, the server's uid, TLS
  bool rank_prefix = true;
  std::string log_dir;
  bool tee = false;
  std::vector<int32_t> local_ranks_filter;  // empty: every local rank
  std::string slurm_env = "tasks";          // tasks or keep: the workers' SLURM_* layout variables
  std::string mpi_env = "drop";             // drop or keep: the agent's PMI_*, PMIX_*, OMPI_* place
  bool pass_local_rank = false;             // append --local_rank=N to each worker's command
  bool help = false;
  bool version = false;
  std::vector<std::string> command;
};

// Parses argv (without argv[0]) and the RDZV_* variables.
absl::StatusOr<AgentFlags> ParseAgentFlags(const std::vector<std::string>& args,
                                           const EnvLookup& env);

std::string AgentHelp();

// Where worker output goes: one file per rank in log_dir (when set), and on the console when
// there is no log_dir or with tee, for the local ranks in local_ranks_filter (all when empty).
struct OutputOptions {
  bool rank_prefix = true;
  std::string log_dir;
  bool tee = false;
  std::vector<int32_t> local_ranks_filter;
};

// What the agent does, all decided.
// The node's health checks before each join (health_check.h).
struct HealthCheckOptions {
  std::string command;  // --health-check; empty: the built-in checks only
  absl::Duration timeout = absl::Seconds(60);
  // GPUs the node's worker count was taken from (SLURM_GPUS_ON_NODE, CUDA_VISIBLE_DEVICES); 0
  // when the count was given or is the default of one.
  int32_t gpus = 0;
};

// How the agent came by its place in the job.
enum class AgentMode {
  kStandalone,        // --standalone: one node, the rendezvous in-process
  kExplicit,          // --rdzv-endpoint, --rdzv-id and --nnodes (or what a launcher says)
  kSlurmPerNode,      // an srun step with one agent per node
  kSlurmPerTask,      // an srun step with one agent per task, each one rank
  kSlurmStepPerNode,  // one of several one-node steps that form one job
};

struct AgentConfig {
  AgentMode mode = AgentMode::kExplicit;
  // What this agent asks of the rendezvous, except what only the running agent knows (its agent
  // id, its addresses and master port): the job id, this node, the job's size and policies.
  JoinSpec join;
  // Where the rendezvous server is: a host name or address, and the ports it may listen on,
  // tried in order. The agent that hosts the server uses the host only to learn its own
  // address as the other nodes see it.
  std::string rdzv_host;
  std::vector<int> rdzv_ports;
  // The backups of a server list (--rdzv-endpoint primary,backup,...), "host:port" each, tried
  // after the primary (rdzv_host and rdzv_ports) in this order.
  std::vector<std::string> backup_endpoints;
  // How long a resuming agent keeps trying a lost server of the list before the next one.
  absl::Duration failover_after = absl::Seconds(3);
  // This agent hosts the server in-process, listening on the first free port of
  // embedded_ports (0: any free port) on embedded_listen_host.
  bool embedded_server = false;
  // How this agent proves who it is (mode and munge socket; rdzv-agent's main reads the token
  // from token_file and resolves the mode, LoadClientAuth), and the uid its server must prove it
  // runs as.
  ClientAuth auth;
  std::string token_file;
  // TLS toward an rdzvd (never toward a server hosted by an agent, which serves plaintext).
  ClientTls tls;
  std::string embedded_listen_host;
  std::vector<int> embedded_ports;
  absl::Duration join_timeout;
  absl::Duration term_timeout;
  // After losing the server mid-job: how long the workers go on while the agent rejoins. Zero
  // stops them at once (the default when the server lives in an agent, as it cannot come back).
  absl::Duration reconnect_timeout;
  // The watchdog's heartbeat timeout (torch's file timers are always served).
  HangWatchdogOptions hang;
  OutputOptions output;
  std::vector<std::string> command;
  // What each worker's launch gets on top of its torchrun environment (ShapingLauncher).
  WorkerShape worker_shape;
  // Per-task under Slurm with several tasks on this node: the node's agents reach the server
  // through one relay (node_relay.h) that its first task hosts. tasks_on_node 0: no relay.
  struct NodeRelayConfig {
    int tasks_on_node = 0;
    bool host = false;  // this agent is the node's first task
    std::string node;   // names the relay's socket, with the job id
  };
  NodeRelayConfig relay;
  // Per-node under Slurm with more nodes than --fan-in: the nodes join in groups of fan-in, in
  // node order, each through a relay its group's first node hosts (node_relay.h), so that the
  // server holds a stream per group. A group of one node joins directly. fan_in 0: no tree.
  struct GroupRelayConfig {
    int fan_in = 0;
    int64_t first_node = 0;  // the group's nodes, first_node..last_node
    int64_t last_node = 0;
    bool host = false;       // this agent is the group's first node
    std::string relay_node;  // the group's first node's name
    std::vector<int> ports;  // the ports the relay may listen on, tried in order
  };
  GroupRelayConfig group;
  HealthCheckOptions health;
  // Lines the agent logs as warnings when it starts: a choice the user made that has a cost.
  std::vector<std::string> warnings;
};

// What ResolveAgentConfig needs to know about the process it configures.
struct LocalProcess {
  std::string hostname;  // used when nothing better names this node
  int64_t pid = 0;       // names a standalone job
  uid_t uid = 0;         // the user a server hosted by the job's agent runs as
};

// How many ports after the derived one an embedded server may move to.
inline constexpr int kEmbeddedPortCandidates = 8;

// The first port an embedded server tries for a Slurm job step: 20000..29999, spread by job.
int DerivedPort(absl::string_view job_id, absl::string_view step_id);

// Fills in what the flags leave open: from --standalone, from RDZV_ENDPOINT, or from Slurm's
// variables.
//
// Inside an srun step the job id is Slurm's job and step id, the node index SLURM_NODEID and
// the agent count the step's node count (per-node mode) or task count (per-task mode, where
// each agent runs one worker at RANK = SLURM_PROCID). Without an endpoint, the agent with
// SLURM_NODEID 0 and SLURM_LOCALID 0 hosts the server and the others find it on the step's
// first node, on a port derived from the job and step id (or one of the few after it).
//
// A one-task step on fewer nodes than the allocation whose --nnodes is the allocation's node
// count is one of several steps, one per node, that form one job: its id is the Slurm job's, the
// node index --node-rank (else the node's place in SLURM_JOB_NODELIST), and the agent on the
// allocation's first node hosts the server at a port derived from the job id alone.
//
// The join it makes passes the rendezvous's own checks (ValidateJoinSpec), or their one-line
// refusal comes back.
//
// Workers get Slurm task variables for the job's layout inside any Slurm job (--slurm-env
// tasks); --standalone describes this node alone. Where the agent starts its workers itself
// (every mode but per-task) they do not see its launcher's place variables (--mpi-env drop).
// --slurm-env keep where one agent starts several workers adds a warning: Slurm then names
// every worker of a node with the same rank.
absl::StatusOr<AgentConfig> ResolveAgentConfig(const AgentFlags& flags, const EnvLookup& env,
                                               const LocalProcess& self);

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_CORE_AGENT_OPTIONS_H_
