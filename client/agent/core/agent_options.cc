#include "client/agent/core/agent_options.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "client/agent/core/launcher_env.h"
#include "common/core/flags.h"
#include "common/core/host_port.h"
#include "common/core/hostlist.h"
#include "common/core/slurm_env.h"

namespace rdzv {

int DerivedPort(absl::string_view job_id, absl::string_view step_id) {
  // FNV-1a: stable across builds and platforms, unlike std::hash.
  uint32_t h = 2166136261u;
  for (absl::string_view part : {job_id, absl::string_view("."), step_id}) {
    for (char ch : part) {
      h ^= static_cast<uint8_t>(ch);
      h *= 16777619u;
    }
  }
  return 20000 + static_cast<int>(h % 10000);
}

namespace {

// The GPUs of this node that set its worker count when --nproc-per-node is not given: those
// Slurm gave it, else the devices the user made visible; 0 when neither says (one worker).
int32_t GpusForWorkers(const std::optional<SlurmEnv>& slurm, const EnvLookup& env) {
  if (slurm && slurm->gpus_on_node > 0) return slurm->gpus_on_node;
  if (std::optional<std::string> cvd = env("CUDA_VISIBLE_DEVICES"); cvd && !cvd->empty()) {
    const std::vector<absl::string_view> devices =
        absl::StrSplit(*cvd, ',', absl::SkipWhitespace());
    if (!devices.empty()) return static_cast<int32_t>(devices.size());
  }
  return 0;
}

// The job's nodes as a join carries them to rdzvd's status, or "" when they do not fit.
std::string NodeListForJoin(const std::vector<std::string>& nodes) {
  std::string list = CompressHostlist(nodes);
  return list.size() <= kMaxNodeListBytes ? list : "";
}

std::vector<int> PortRange(int first) {
  std::vector<int> ports;
  for (int i = 0; i < kEmbeddedPortCandidates; ++i) ports.push_back(first + i);
  return ports;
}

void HostOnFirstNode(const std::string& first_node, int port, bool here, AgentConfig& c) {
  c.rdzv_host = first_node;
  c.rdzv_ports = PortRange(port);
  if (here) {
    c.embedded_server = true;
    c.embedded_listen_host = "0.0.0.0";
    c.embedded_ports = c.rdzv_ports;
  }
}

// Under --fan-in K, a job of more than K nodes joins in groups of K nodes (node order), each
// through its first node's relay, at ports derived from the job; `names` holds the nodes' names
// in node order.
void PlanGroups(int fan_in, int64_t node, const std::vector<std::string>& names,
                absl::string_view job_id, absl::string_view step_id, AgentConfig& c) {
  const int64_t nodes = static_cast<int64_t>(names.size());
  if (fan_in < 2 || nodes <= fan_in || node < 0 || node >= nodes) return;
  const int64_t first = node / fan_in * fan_in;
  const int64_t last = std::min(first + fan_in, nodes) - 1;
  if (first == last) return;  // a group of one joins directly
  c.group.fan_in = fan_in;
  c.group.first_node = first;
  c.group.last_node = last;
  c.group.host = node == first;
  c.group.relay_node = names[first];
  c.group.ports = PortRange(DerivedPort(job_id, absl::StrCat(step_id, ".relay")));
}

// Whether this step is one of several, one per node, that are to form one job: it runs one task
// on fewer nodes than the allocation has, and --nnodes names the allocation's node count (the
// shape of `srun -N1 -n1 -w NODE rdzv-agent --nnodes $SLURM_NNODES --node-rank I &` in a loop).
bool OneStepOfManyPerNode(const AgentFlags& flags, const SlurmEnv& slurm, bool per_node) {
  return per_node && flags.nnodes_max && *flags.nnodes_min == *flags.nnodes_max &&
         slurm.job_num_nodes > slurm.num_nodes && *flags.nnodes_max == slurm.job_num_nodes;
}

// The steps meet on the allocation's first node, at a port derived from the job alone (each step
// has its own step id), and rank their nodes by --node-rank, else by the node's place in the
// allocation. Every step's agent starts with its own step: whichever comes first waits for the
// others, within --join-timeout.
absl::Status ResolveOneJobOfSteps(const AgentFlags& flags, const SlurmEnv& slurm, AgentConfig& c) {
  c.mode = AgentMode::kSlurmStepPerNode;
  c.join.min_agents = c.join.max_agents = slurm.job_num_nodes;
  c.join.node_list = NodeListForJoin(slurm.job_nodes);
  const auto own = std::find(slurm.job_nodes.begin(), slurm.job_nodes.end(), slurm.node_name);
  const int place = own == slurm.job_nodes.end() || slurm.node_name.empty()
                        ? -1
                        : static_cast<int>(own - slurm.job_nodes.begin());
  if (flags.node_rank) {
    if (*flags.node_rank >= slurm.job_num_nodes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--node-rank %d is out of range for the allocation's %d nodes; expected 0..%d",
          *flags.node_rank, slurm.job_num_nodes, slurm.job_num_nodes - 1));
    }
    c.join.agent.node_index = *flags.node_rank;
  } else if (place >= 0) {
    c.join.agent.node_index = place;
  } else {
    return absl::InvalidArgumentError(absl::StrFormat(
        "this node (SLURMD_NODENAME=%s) is not in SLURM_JOB_NODELIST, so its place among the "
        "allocation's %d nodes is unknown; pass --node-rank I",
        absl::CHexEscape(slurm.node_name), slurm.job_num_nodes));
  }
  // Workers' SLURM_NODELIST names the allocation when node ranks follow it.
  if (place == c.join.agent.node_index) c.worker_shape.job_nodes = slurm.job_nodes;
  if (place == c.join.agent.node_index) {
    PlanGroups(flags.fan_in, c.join.agent.node_index, slurm.job_nodes, slurm.job_id, "steps", c);
  }
  if (flags.rdzv_id.empty()) c.join.job_id = absl::StrCat("slurm-", slurm.job_id);

  if (!flags.rdzv_endpoint.empty()) return absl::OkStatus();
  if (slurm.job_nodes.empty()) {
    return absl::InvalidArgumentError(
        "SLURM_JOB_NODELIST is not set, so the allocation's first node (which hosts the "
        "rendezvous of one step per node) is unknown; pass --rdzv-endpoint HOST:PORT");
  }
  HostOnFirstNode(slurm.job_nodes.front(), DerivedPort(slurm.job_id, "steps"), place == 0, c);
  return absl::OkStatus();
}

absl::Status ResolveSlurm(const AgentFlags& flags, const SlurmEnv& slurm, AgentConfig& c) {
  if (!slurm.in_step()) {
    return absl::FailedPreconditionError(
        "inside a Slurm allocation but not in a job step: launch the agent with srun "
        "(srun rdzv-agent -- python train.py), or pass --standalone for one node");
  }
  int max_tasks_on_a_node = 1;
  for (int t : slurm.tasks_per_node) max_tasks_on_a_node = std::max(max_tasks_on_a_node, t);
  if (slurm.tasks_per_node.empty() && slurm.num_tasks > slurm.num_nodes) {
    max_tasks_on_a_node = 2;  // more tasks than nodes: some node runs several
  }
  SlurmAgents mode = flags.mode;
  if (mode == SlurmAgents::kAuto) {
    mode = max_tasks_on_a_node > 1 ? SlurmAgents::kPerTask : SlurmAgents::kPerNode;
  }
  const bool per_node = mode == SlurmAgents::kPerNode;
  if (OneStepOfManyPerNode(flags, slurm, per_node && max_tasks_on_a_node == 1)) {
    return ResolveOneJobOfSteps(flags, slurm, c);
  }

  if (per_node) {
    if (max_tasks_on_a_node > 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--mode node needs one task per node, but this step runs up to %d on a node; use "
          "srun --ntasks-per-node=1, or --mode task",
          max_tasks_on_a_node));
    }
    c.mode = AgentMode::kSlurmPerNode;
    c.join.min_agents = c.join.max_agents = slurm.num_nodes;
    if (!flags.node_rank && static_cast<int>(slurm.nodes.size()) == slurm.num_nodes) {
      PlanGroups(flags.fan_in, slurm.node_id, slurm.nodes, slurm.job_id, slurm.step_id, c);
    }
  } else {
    if (flags.nproc_per_node.value_or(1) != 1) {
      return absl::InvalidArgumentError(
          "in per-task mode each agent is one rank; drop --nproc-per-node, or launch one task "
          "per node (srun --ntasks-per-node=1) to start several workers per agent");
    }
    c.mode = AgentMode::kSlurmPerTask;
    c.join.agent.nproc = 1;
    c.join.agent.order = slurm.proc_id;
    const int tasks = slurm.num_tasks > 0 ? slurm.num_tasks : slurm.num_nodes;
    c.join.min_agents = c.join.max_agents = tasks;
    const int on_node =
        slurm.node_id >= 0 && static_cast<size_t>(slurm.node_id) < slurm.tasks_per_node.size()
            ? slurm.tasks_per_node[slurm.node_id]
            : 0;
    if (flags.node_relay && on_node > 1) {
      c.relay.tasks_on_node = on_node;
      c.relay.host = slurm.local_id == 0;
      c.relay.node = !slurm.node_name.empty() ? slurm.node_name : absl::StrCat(slurm.node_id);
    }
  }
  if (flags.nnodes_max && *flags.nnodes_max == c.join.max_agents &&
      *flags.nnodes_min < *flags.nnodes_max) {
    // --nnodes MIN:MAX with the step's count as MAX: the job may start with MIN of them (a node
    // left out by its health check, or late past --last-call).
    c.join.min_agents = *flags.nnodes_min;
  } else if (flags.nnodes_max &&
             (*flags.nnodes_min != c.join.min_agents || *flags.nnodes_max != c.join.max_agents)) {
    const std::string step =
        absl::StrFormat("the Slurm step, which runs %d %s%s", c.join.max_agents,
                        per_node ? "node" : "task", c.join.max_agents == 1 ? "" : "s");
    if (slurm.job_num_nodes <= slurm.num_nodes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--nnodes %d:%d contradicts %s; drop --nnodes inside srun",
                          *flags.nnodes_min, *flags.nnodes_max, step));
    }
    return absl::InvalidArgumentError(absl::StrFormat(
        "--nnodes %d:%d matches neither %s, nor the allocation's %d nodes; drop --nnodes inside "
        "srun, or to join one step per node (srun -N1 -n1) into one job pass the allocation's "
        "node count",
        *flags.nnodes_min, *flags.nnodes_max, step, slurm.job_num_nodes));
  }
  if (!flags.node_rank) c.join.agent.node_index = slurm.node_id;
  c.join.node_list = NodeListForJoin(slurm.nodes);
  if (flags.rdzv_id.empty()) {
    c.join.job_id = absl::StrCat("slurm-", slurm.job_id, ".", slurm.step_id);
  }

  if (!flags.rdzv_endpoint.empty()) return absl::OkStatus();
  if (slurm.nodes.empty()) {
    return absl::InvalidArgumentError(
        "SLURM_STEP_NODELIST is not set, so the first node (which hosts the rendezvous) is "
        "unknown; pass --rdzv-endpoint HOST:PORT");
  }
  HostOnFirstNode(slurm.nodes.front(), DerivedPort(slurm.job_id, slurm.step_id),
                  slurm.node_id == 0 && slurm.local_id <= 0, c);
  return absl::OkStatus();
}

absl::StatusOr<AgentConfig> ResolveExplicit(const AgentFlags& flags, AgentConfig& c) {
  if (!flags.nnodes_max) {
    return absl::InvalidArgumentError(
        "--nnodes is required with --rdzv-endpoint (how many agents to wait for)");
  }
  if (flags.rdzv_id.empty()) {
    return absl::InvalidArgumentError(
        "--rdzv-id is required with --rdzv-endpoint so that different jobs never meet; "
        "give all agents of one job the same id, e.g. --rdzv-id exp1");
  }
  c.mode = AgentMode::kExplicit;
  c.join.min_agents = *flags.nnodes_min;
  c.join.max_agents = *flags.nnodes_max;
  if (c.join.agent.node_index >= c.join.max_agents) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--node-rank %d is out of range for --nnodes %d; expected 0..%d",
                        c.join.agent.node_index, c.join.max_agents, c.join.max_agents - 1));
  }
  return c;
}

// What the flags say of the job and of this agent whatever the launch: the join's policies, the
// timeouts, the workers' command and output.
absl::Status ResolveJob(const AgentFlags& flags, const EnvLookup& env, const LocalProcess& self,
                        AgentConfig& c) {
  c.join.job_id = flags.rdzv_id;
  c.join.agent.host =
      !flags.host_name.empty() ? flags.host_name : env("SLURMD_NODENAME").value_or(self.hostname);
  c.join.agent.node_index = flags.node_rank.value_or(-1);
  c.join.max_restarts = flags.max_restarts;
  c.join.spare_nodes = flags.spare_nodes;
  c.join.master_addr_override = flags.master_addr;
  c.join.master_port_override = flags.master_port;
  c.join.last_call = absl::ToInt64Microseconds(flags.last_call);
  c.health.command = flags.health_check;
  c.health.timeout = flags.health_check_timeout;
  c.join_timeout = flags.join_timeout;
  c.term_timeout = flags.term_timeout;
  c.reconnect_timeout = flags.reconnect_timeout.value_or(
      flags.rdzv_endpoint.empty() ? absl::ZeroDuration() : absl::Seconds(30));
  c.hang.heartbeat_timeout = flags.hang_timeout;
  c.hang.auto_timeout = flags.hang_timeout_auto;
  c.hang.auto_floor = flags.hang_timeout_min;
  c.output = {flags.rank_prefix, flags.log_dir, flags.tee, flags.local_ranks_filter};
  c.command = flags.command;
  if (c.command.empty()) {
    return absl::InvalidArgumentError(
        "no training command given; put it after --, e.g. rdzv-agent --standalone -- python "
        "train.py");
  }
  if (absl::EndsWith(c.command.front(), ".py")) {
    c.command.insert(c.command.begin(), env("RDZV_PYTHON").value_or("python3"));
  }
  return absl::OkStatus();
}

// How the agent proves who it is, what its server must prove, and TLS toward an rdzvd.
absl::Status ResolveAuth(const AgentFlags& flags, const LocalProcess& self, AgentConfig& c) {
  c.auth.mode = flags.auth == "munge"   ? ClientAuth::Mode::kMunge
                : flags.auth == "token" ? ClientAuth::Mode::kToken
                : flags.auth == "none"  ? ClientAuth::Mode::kNone
                                        : ClientAuth::Mode::kAuto;
  c.auth.munge_socket = flags.connection.munge_socket;
  // Without an endpoint the server is hosted by this job's agent on node 0, which runs as this
  // user (--standalone needs no proof: its rendezvous is in-process).
  c.auth.server_uid =
      flags.rdzv_endpoint.empty() ? std::optional<uid_t>(self.uid) : flags.connection.server_uid;
  c.token_file = flags.connection.token_file;
  if (c.auth.mode == ClientAuth::Mode::kToken && c.token_file.empty()) {
    return absl::InvalidArgumentError(
        "--auth token needs the job's token: pass --rdzv-token-file FILE (the same file for "
        "every agent of the job)");
  }
  c.tls = {flags.connection.tls_ca, flags.connection.tls_server_name};
  if (absl::Status s = CheckTlsServerName(c.tls.ca_file, c.tls.server_name); !s.ok()) return s;
  if (!c.tls.ca_file.empty() && flags.rdzv_endpoint.empty() && !flags.standalone) {
    return absl::InvalidArgumentError(
        "--tls-ca (RDZV_TLS_CA) is for an rdzvd that serves TLS, but without --rdzv-endpoint "
        "the job's first agent hosts the rendezvous in plaintext; pass --rdzv-endpoint "
        "HOST:PORT of that rdzvd, or unset --tls-ca/RDZV_TLS_CA");
  }
  return absl::OkStatus();
}

// This node's workers: how many, and what each launch gets on top of torchrun's variables.
absl::Status ResolveWorkers(const AgentFlags& flags, const std::optional<SlurmEnv>& slurm,
                            const EnvLookup& env, AgentConfig& c) {
  c.worker_shape =
      ResolveWorkerShape(flags.slurm_env == "tasks", flags.pass_local_rank, slurm, env);
  const int32_t gpus = GpusForWorkers(slurm, env);
  c.join.agent.nproc = flags.nproc_per_node.value_or(std::max(gpus, 1));
  // The built-in health check makes sure that GPUs a worker count was taken from are there.
  if (!flags.nproc_per_node) c.health.gpus = gpus;
  if (c.join.agent.nproc > kMaxNprocPerNode) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d workers per node (one per GPU or visible device) is over %d; pass --nproc-per-node",
        c.join.agent.nproc, kMaxNprocPerNode));
  }
  return absl::OkStatus();
}

// --standalone: one node, the rendezvous in-process on loopback.
absl::StatusOr<AgentConfig> ResolveStandalone(const AgentFlags& flags,
                                              const std::optional<SlurmEnv>& slurm,
                                              const LocalProcess& self, AgentConfig& c) {
  if (!flags.rdzv_endpoint.empty()) {
    return absl::InvalidArgumentError(
        "--standalone hosts its own rendezvous; drop --rdzv-endpoint or --standalone");
  }
  if (flags.nnodes_max.value_or(1) != 1) {
    return absl::InvalidArgumentError(
        "--standalone runs a single node; drop --nnodes or use --rdzv-endpoint");
  }
  c.mode = AgentMode::kStandalone;
  // Under sbatch or salloc the agent's SLURM_NODELIST is the allocation's, of which the
  // workers of a standalone job see one node, this one.
  if (slurm && !slurm->node_name.empty()) c.worker_shape.job_nodes = {slurm->node_name};
  c.embedded_server = true;
  c.embedded_listen_host = "127.0.0.1";
  c.embedded_ports = {0};
  if (c.join.job_id.empty()) c.join.job_id = absl::StrCat("standalone-", self.pid);
  c.join.agent.node_index = 0;
  return c;
}

// --rdzv-endpoint: one rdzvd, or a list: the primary and its backups, in the order to try them.
absl::Status ResolveServerList(const AgentFlags& flags, AgentConfig& c) {
  absl::StatusOr<std::vector<std::string>> list =
      SplitServerList("--rdzv-endpoint", flags.rdzv_endpoint);
  if (!list.ok()) return list.status();
  for (size_t i = 0; i < list->size(); ++i) {
    absl::StatusOr<HostPort> hp = ParseHostPort((*list)[i], 29400);
    if (!hp.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--rdzv-endpoint: ", hp.status().message(),
                       list->size() > 1 ? " (in a list, HOST:PORT,HOST:PORT)" : ""));
    }
    if (i == 0) {
      c.rdzv_host = hp->host;
      c.rdzv_ports = {hp->port};
    } else {
      c.backup_endpoints.push_back(FormatHostPort(hp->host, hp->port));
    }
  }
  return absl::OkStatus();
}

// --rdzv-endpoint outside Slurm, where a launcher (mpirun) may number the nodes and name the job.
absl::StatusOr<AgentConfig> ResolveLaunched(const AgentFlags& flags, const EnvLookup& env,
                                            AgentConfig& c) {
  absl::StatusOr<std::optional<LauncherEnv>> mpi = ParseLauncherEnv(env);
  if (!mpi.ok()) return mpi.status();
  AgentFlags f = flags;
  if (*mpi) {
    if (!f.node_rank) c.join.agent.node_index = (*mpi)->rank;
    if (!f.nnodes_max && (*mpi)->size > 0) f.nnodes_min = f.nnodes_max = (*mpi)->size;
    if (f.rdzv_id.empty() && !(*mpi)->job_id.empty()) {
      f.rdzv_id = c.join.job_id = absl::StrCat("mpi-", (*mpi)->job_id);
    }
    // MPICH's Hydra names no job, and a PMIx launcher other than Open MPI's may give no size:
    // say what the launcher left out rather than only what is missing.
    if (!f.nnodes_max) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--nnodes is required: %s gives this agent its rank but not how many were started; "
          "pass the number of agents, e.g. --nnodes 2",
          (*mpi)->launcher));
    }
    if (f.rdzv_id.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--rdzv-id is required: %s gives no job id, and jobs that share rdzvd must not meet; "
          "pass every agent of the job the same id, e.g. --rdzv-id exp1",
          (*mpi)->launcher));
    }
  }
  return ResolveExplicit(f, c);
}

// The flags, resolved in the order their errors are reported: the job and its command, the
// credentials, the workers, and then where to meet: in-process (--standalone), as an srun step
// says, or at --rdzv-endpoint.
absl::StatusOr<AgentConfig> Resolve(const AgentFlags& flags, const EnvLookup& env,
                                    const LocalProcess& self) {
  AgentConfig c;
  if (absl::Status s = ResolveJob(flags, env, self, c); !s.ok()) return s;
  if (absl::Status s = ResolveAuth(flags, self, c); !s.ok()) return s;
  absl::StatusOr<std::optional<SlurmEnv>> slurm = ParseSlurmEnv(env);
  if (!slurm.ok()) return slurm.status();
  if (absl::Status s = ResolveWorkers(flags, *slurm, env, c); !s.ok()) return s;
  if (flags.standalone) return ResolveStandalone(flags, *slurm, self, c);
  if (!flags.rdzv_endpoint.empty()) {
    if (absl::Status s = ResolveServerList(flags, c); !s.ok()) return s;
  }
  c.failover_after = flags.failover_timeout;
  // Inside an srun step Slurm says everything; in a batch script without a step and without an
  // endpoint, ResolveSlurm explains how to launch instead.
  if (*slurm && ((*slurm)->in_step() || flags.rdzv_endpoint.empty())) {
    if (absl::Status s = ResolveSlurm(flags, **slurm, c); !s.ok()) return s;
    return c;
  }
  if (!flags.rdzv_endpoint.empty()) return ResolveLaunched(flags, env, c);
  return absl::InvalidArgumentError(
      "nothing says where to meet the other nodes: pass --rdzv-endpoint HOST:PORT --rdzv-id "
      "JOB --nnodes N, or --standalone for one node (inside a Slurm allocation, srun "
      "rdzv-agent needs no flags)");
}

// A host name goes into every agent's logs and into MASTER_ADDR: text a terminal or a log reader
// would interpret is refused, as is a name no resolver accepts.
absl::Status CheckHostName(const std::string& host, const AgentFlags& flags) {
  const char* from = !flags.host_name.empty() ? "--host-name" : "the host name (SLURMD_NODENAME)";
  if (host.size() > kMaxHostNameLength) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s is %d characters long; expected at most %d", from, host.size(), kMaxHostNameLength));
  }
  for (char ch : host) {
    const auto u = static_cast<unsigned char>(ch);
    if (u <= 0x20 || u == 0x7f) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s \"%s\" contains a space or control character; expected a plain host name such as "
          "node01",
          from, absl::CHexEscape(host)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AgentConfig> ResolveAgentConfig(const AgentFlags& flags, const EnvLookup& env,
                                               const LocalProcess& self) {
  absl::StatusOr<AgentConfig> c = Resolve(flags, env, self);
  if (!c.ok()) return c;
  // In per-task mode each worker is the launcher's task: its place is the worker's own.
  const bool per_task = c->mode == AgentMode::kSlurmPerTask;
  c->worker_shape.hide_launcher_env = flags.mpi_env == "drop" && !per_task;
  const bool in_slurm =
      !env("SLURM_JOB_ID").value_or("").empty() || !env("SLURM_JOBID").value_or("").empty();
  if (flags.slurm_env == "keep" && in_slurm && !per_task && c->join.agent.nproc > 1) {
    c->warnings.push_back(absl::StrFormat(
        "--slurm-env keep: this agent's %d workers all keep its SLURM_PROCID, SLURM_LOCALID and "
        "SLURM_NTASKS, so PyTorch Lightning (SLURMEnvironment), submitit, MMEngine/mmcv "
        "(launcher slurm), idr_torch and any script reading SLURM_PROCID see duplicate ranks and "
        "hang or fail; drop --slurm-env keep (RDZV_SLURM_ENV) unless no code reads them",
        c->join.agent.nproc));
  }
  if (c->join.spare_nodes > 0 && c->join.max_restarts.value_or(0) == 0) {
    c->warnings.push_back(absl::StrFormat(
        "--spare-nodes %d with --max-restarts 0: a lost node ends the job instead of a spare "
        "taking its place; pass --max-restarts N",
        c->join.spare_nodes));
  }
  if (absl::Status s = CheckHostName(c->join.agent.host, flags); !s.ok()) return s;
  // What no rendezvous accepts (a world past 32-bit ranks, say) is refused now, with the
  // rendezvous's own words, rather than by the server once the agent has started. The agent's
  // id is made when it starts; a stand-in takes its place here.
  JoinSpec join = c->join;
  join.agent.agent_id = "-";
  if (absl::Status s = ValidateJoinSpec(join); !s.ok()) return s;
  return c;
}

}  // namespace rdzv
