#include "client/agent_options.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/flags.h"
#include "common/net.h"
#include "common/slurm_env.h"

namespace rdzv {
namespace {

constexpr char kUsage[] =
    R"(rdzv-agent: joins a rendezvous, learns this node's ranks and the master endpoint, and runs
the training processes with the environment PyTorch expects (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, ...). Stops every worker of the job when one fails.

Usage: rdzv-agent [flags] -- COMMAND [ARGS...]

Examples:
  srun rdzv-agent -- python train.py                  # inside Slurm: no flags needed
  rdzv-agent --standalone --nproc-per-node 4 -- python train.py
  rdzv-agent --rdzv-endpoint head:29400 --rdzv-id exp1 --nnodes 2 --node-rank 0 \
             --nproc-per-node 4 -- python train.py --lr 1e-3)";

absl::Status SetInt(absl::string_view v, int64_t min, int64_t max, int64_t* out) {
  int64_t parsed;
  if (!absl::SimpleAtoi(v, &parsed) || parsed < min || parsed > max) {
    return absl::InvalidArgumentError(
        absl::StrFormat("expected a whole number in %d..%d", min, max));
  }
  *out = parsed;
  return absl::OkStatus();
}

template <typename T>
std::function<absl::Status(absl::string_view)> IntSetter(T* target, int64_t min, int64_t max) {
  return [target, min, max](absl::string_view v) {
    int64_t parsed = 0;
    if (absl::Status s = SetInt(v, min, max, &parsed); !s.ok()) return s;
    *target = static_cast<T>(parsed);
    return absl::OkStatus();
  };
}

std::function<absl::Status(absl::string_view)> StringSetter(std::string* target) {
  return [target](absl::string_view v) {
    *target = std::string(v);
    return absl::OkStatus();
  };
}

std::function<absl::Status(absl::string_view)> BoolSetter(bool* target) {
  return [target](absl::string_view v) {
    absl::StatusOr<bool> b = ParseBool(v);
    if (!b.ok()) return b.status();
    *target = *b;
    return absl::OkStatus();
  };
}

// "30" is seconds; "500ms", "2m", "1.5s" are absl durations.
std::function<absl::Status(absl::string_view)> DurationSetter(absl::Duration* target) {
  return [target](absl::string_view v) {
    double seconds;
    if (absl::SimpleAtod(v, &seconds) && seconds >= 0) {
      *target = absl::Seconds(seconds);
      return absl::OkStatus();
    }
    absl::Duration d;
    if (absl::ParseDuration(v, &d) && d >= absl::ZeroDuration()) {
      *target = d;
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError("expected a duration such as 30, 30s, 500ms or 2m");
  };
}

FlagParser MakeParser(AgentFlags& f) {
  FlagParser p("rdzv-agent", kUsage);
  p.Add({"nnodes", "RDZV_NNODES", "N|MIN:MAX",
         "how many agents (nodes) the job has; MIN:MAX lets the job start with MIN after\n"
         "--last-call (default under Slurm: the step's node or task count)",
         [&f](absl::string_view v) -> absl::Status {
           std::vector<absl::string_view> parts = absl::StrSplit(v, ':');
           int64_t lo, hi;
           if (parts.size() > 2 || !SetInt(parts.front(), 1, 1'000'000, &lo).ok() ||
               !SetInt(parts.back(), 1, 1'000'000, &hi).ok() || lo > hi) {
             return absl::InvalidArgumentError("expected N or MIN:MAX with 1 <= MIN <= MAX");
           }
           f.nnodes_min = static_cast<int32_t>(lo);
           f.nnodes_max = static_cast<int32_t>(hi);
           return absl::OkStatus();
         }});
  p.Add({"nproc-per-node", "RDZV_NPROC_PER_NODE", "N",
         "workers to start on this node (default: SLURM_GPUS_ON_NODE, else the devices in\n"
         "CUDA_VISIBLE_DEVICES, else 1)",
         [&f](absl::string_view v) {
           int64_t n = 0;
           if (absl::Status s = SetInt(v, 1, 4096, &n); !s.ok()) return s;
           f.nproc_per_node = static_cast<int32_t>(n);
           return absl::OkStatus();
         }});
  p.Add({"node-rank", "RDZV_NODE_RANK", "N",
         "this node's index 0..nnodes-1; orders the nodes (default: SLURM_NODEID; without it\n"
         "nodes are ordered by host name)",
         [&f](absl::string_view v) {
           int64_t n = 0;
           if (absl::Status s = SetInt(v, 0, 1'000'000, &n); !s.ok()) return s;
           f.node_rank = n;
           return absl::OkStatus();
         }});
  p.Add({"rdzv-endpoint", "RDZV_ENDPOINT", "HOST:PORT",
         "the rdzvd to meet at (default: none; under Slurm node 0 hosts one in-process)",
         StringSetter(&f.rdzv_endpoint)});
  p.Add({"rdzv-id", "RDZV_ID", "ID",
         "the job id shared by all agents of one job (default under Slurm: job and step id)",
         StringSetter(&f.rdzv_id)});
  p.Add({"standalone", "RDZV_STANDALONE", "",
         "one node only: host the rendezvous in-process on loopback", BoolSetter(&f.standalone)});
  p.Add({"max-restarts", "RDZV_MAX_RESTARTS", "N",
         "how often the job may restart its workers after a failure (default 0)",
         IntSetter(&f.max_restarts, 0, 1'000'000)});
  p.Add({"master-addr", "RDZV_MASTER_ADDR", "ADDR",
         "override MASTER_ADDR (default: an address of the rank-0 node that the others reach)",
         StringSetter(&f.master_addr)});
  p.Add({"master-port", "RDZV_MASTER_PORT", "PORT",
         "override MASTER_PORT (default: a port that was free on the rank-0 node)",
         IntSetter(&f.master_port, 1, 65535)});
  p.Add({"join-timeout", "RDZV_JOIN_TIMEOUT", "DURATION",
         "give up when the rendezvous has not completed (or its server not answered) in this\n"
         "long (default 600s)",
         DurationSetter(&f.join_timeout)});
  p.Add({"last-call", "RDZV_LAST_CALL", "DURATION",
         "with --nnodes MIN:MAX, how long to wait for more agents once MIN are in (default 1s)",
         DurationSetter(&f.last_call)});
  p.Add({"term-timeout", "RDZV_TERM_TIMEOUT", "DURATION",
         "after SIGTERM, how long workers get before SIGKILL (default 3s)",
         DurationSetter(&f.term_timeout)});
  p.Add({"reconnect-timeout", "RDZV_RECONNECT_TIMEOUT", "DURATION",
         "when the rendezvous server is lost mid-job, keep the workers running this long while\n"
         "rejoining it (default 30s with --rdzv-endpoint, else 0s: an agent that hosts the\n"
         "server takes it along when it dies)",
         [&f](absl::string_view v) {
           absl::Duration d;
           if (absl::Status s = DurationSetter(&d)(v); !s.ok()) return s;
           f.reconnect_timeout = d;
           return absl::OkStatus();
         }});
  p.Add({"hang-timeout", "RDZV_HANG_TIMEOUT", "DURATION|auto",
         "a worker that has sent a heartbeat and then none for this long is hung: it is sent\n"
         "SIGABRT for its stack and the job fails (or restarts); auto learns the timeout from\n"
         "the intervals seen (default 0: heartbeats are not watched; torch's timers always are)",
         [&f](absl::string_view v) {
           f.hang_timeout_auto = v == "auto";
           if (f.hang_timeout_auto) return absl::OkStatus();
           if (DurationSetter(&f.hang_timeout)(v).ok()) return absl::OkStatus();
           return absl::InvalidArgumentError("expected a duration such as 60s or 5m, or auto");
         }});
  p.Add({"host-name", "RDZV_HOST_NAME", "NAME",
         "this node's name in the rendezvous (default: SLURMD_NODENAME, else the host name)",
         StringSetter(&f.host_name)});
  p.Add({"mode", "RDZV_MODE", "auto|node|task",
         "under Slurm: one agent per node that starts --nproc-per-node workers (node), or one\n"
         "agent per task that is one rank (task); auto picks task when the step has more than\n"
         "one task on a node",
         [&f](absl::string_view v) {
           if (v != "auto" && v != "node" && v != "task") {
             return absl::InvalidArgumentError("expected auto, node or task");
           }
           f.mode = std::string(v);
           return absl::OkStatus();
         }});
  p.Add({"rank-prefix", "RDZV_RANK_PREFIX", "",
         "prefix each line of worker output with its rank, as \"[3]: \" (default true)",
         BoolSetter(&f.rank_prefix)});
  p.Add({"log-dir", "RDZV_LOG_DIR", "DIR",
         "write each rank's output to DIR/rank-RANK.log instead of the console (see --tee)",
         StringSetter(&f.log_dir)});
  p.Add({"tee", "RDZV_TEE", "", "with --log-dir, also show worker output on the console",
         BoolSetter(&f.tee)});
  p.Add({"local-ranks-filter", "RDZV_LOCAL_RANKS_FILTER", "0,1,...",
         "show only these local ranks' output on the console (default: all)",
         [&f](absl::string_view v) {
           f.local_ranks_filter.clear();
           for (absl::string_view part : absl::StrSplit(v, ',', absl::SkipWhitespace())) {
             int64_t r = 0;
             if (absl::Status s = SetInt(part, 0, 1'000'000, &r); !s.ok()) {
               return absl::InvalidArgumentError("expected local ranks such as 0 or 0,1");
             }
             f.local_ranks_filter.push_back(static_cast<int32_t>(r));
           }
           return absl::OkStatus();
         }});
  p.Add({"log-level", "RDZV_LOG_LEVEL", "LEVEL",
         "trace, debug, info, warn, error or off (default info)", StringSetter(&f.log_level)});
  p.Add({"version", "", "", "print the version", BoolSetter(&f.version)});
  p.Add({"help", "", "", "print this help", BoolSetter(&f.help)});
  return p;
}

}  // namespace

absl::StatusOr<AgentFlags> ParseAgentFlags(const std::vector<std::string>& args,
                                           const EnvLookup& env) {
  AgentFlags flags;
  FlagParser parser = MakeParser(flags);
  absl::StatusOr<std::vector<std::string>> rest = parser.Parse(args, env);
  if (!rest.ok()) return rest.status();
  flags.command = std::move(*rest);
  return flags;
}

std::string AgentHelp() {
  AgentFlags flags;
  return MakeParser(flags).Help();
}

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

// Workers per node when --nproc-per-node is not given: one per GPU Slurm gave this node, else
// one per device the user made visible, else one.
int32_t DefaultNproc(const std::optional<SlurmEnv>& slurm, const EnvLookup& env) {
  if (slurm && slurm->gpus_on_node > 0) return slurm->gpus_on_node;
  if (std::optional<std::string> cvd = env("CUDA_VISIBLE_DEVICES"); cvd && !cvd->empty()) {
    const std::vector<absl::string_view> devices =
        absl::StrSplit(*cvd, ',', absl::SkipWhitespace());
    if (!devices.empty()) return static_cast<int32_t>(devices.size());
  }
  return 1;
}

std::vector<int> PortRange(int first) {
  std::vector<int> ports;
  for (int i = 0; i < kEmbeddedPortCandidates; ++i) ports.push_back(first + i);
  return ports;
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
  std::string mode = flags.mode;
  if (mode == "auto") mode = max_tasks_on_a_node > 1 ? "task" : "node";

  if (mode == "node") {
    if (max_tasks_on_a_node > 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--mode node needs one task per node, but this step runs up to %d on a node; use "
          "srun --ntasks-per-node=1, or --mode task",
          max_tasks_on_a_node));
    }
    c.mode = "slurm per-node";
    c.join.min_agents = c.join.max_agents = slurm.num_nodes;
  } else {
    if (flags.nproc_per_node.value_or(1) != 1) {
      return absl::InvalidArgumentError(
          "in per-task mode each agent is one rank; drop --nproc-per-node, or launch one task "
          "per node (srun --ntasks-per-node=1) to start several workers per agent");
    }
    c.mode = "slurm per-task";
    c.join.agent.nproc = 1;
    c.join.agent.order = slurm.proc_id;
    const int tasks = slurm.num_tasks > 0 ? slurm.num_tasks : slurm.num_nodes;
    c.join.min_agents = c.join.max_agents = tasks;
  }
  if (flags.nnodes_max &&
      (*flags.nnodes_min != c.join.min_agents || *flags.nnodes_max != c.join.max_agents)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--nnodes %d:%d contradicts the Slurm step, which runs %d %s; drop --nnodes inside srun",
        *flags.nnodes_min, *flags.nnodes_max, c.join.max_agents,
        mode == "node" ? "nodes" : "tasks"));
  }
  if (!flags.node_rank) c.join.agent.node_index = slurm.node_id;
  if (flags.rdzv_id.empty()) {
    c.join.job_id = absl::StrCat("slurm-", slurm.job_id, ".", slurm.step_id);
  }

  if (!flags.rdzv_endpoint.empty()) return absl::OkStatus();
  if (slurm.nodes.empty()) {
    return absl::InvalidArgumentError(
        "SLURM_STEP_NODELIST is not set, so the first node (which hosts the rendezvous) is "
        "unknown; pass --rdzv-endpoint HOST:PORT");
  }
  const int port = DerivedPort(slurm.job_id, slurm.step_id);
  c.rdzv_host = slurm.nodes.front();
  c.rdzv_ports = PortRange(port);
  if (slurm.node_id == 0 && slurm.local_id <= 0) {
    c.embedded_server = true;
    c.embedded_listen_host = "0.0.0.0";
    c.embedded_ports = c.rdzv_ports;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AgentConfig> ResolveAgentConfig(const AgentFlags& flags, const EnvLookup& env,
                                               const LocalProcess& self) {
  AgentConfig c;
  c.join.job_id = flags.rdzv_id;
  c.join.agent.host =
      !flags.host_name.empty() ? flags.host_name : env("SLURMD_NODENAME").value_or(self.hostname);
  c.join.agent.node_index = flags.node_rank.value_or(-1);
  c.join.max_restarts = flags.max_restarts;
  c.join.master_addr_override = flags.master_addr;
  c.join.master_port_override = flags.master_port;
  c.join.last_call = absl::ToInt64Microseconds(flags.last_call);
  c.join_timeout = flags.join_timeout;
  c.term_timeout = flags.term_timeout;
  c.reconnect_timeout = flags.reconnect_timeout.value_or(
      flags.rdzv_endpoint.empty() ? absl::ZeroDuration() : absl::Seconds(30));
  c.hang.heartbeat_timeout = flags.hang_timeout;
  c.hang.auto_timeout = flags.hang_timeout_auto;
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

  absl::StatusOr<std::optional<SlurmEnv>> slurm = ParseSlurmEnv(env);
  if (!slurm.ok()) return slurm.status();
  c.join.agent.nproc = flags.nproc_per_node.value_or(DefaultNproc(*slurm, env));

  if (flags.standalone) {
    if (!flags.rdzv_endpoint.empty()) {
      return absl::InvalidArgumentError(
          "--standalone hosts its own rendezvous; drop --rdzv-endpoint or --standalone");
    }
    if (flags.nnodes_max.value_or(1) != 1) {
      return absl::InvalidArgumentError(
          "--standalone runs a single node; drop --nnodes or use --rdzv-endpoint");
    }
    c.mode = "standalone";
    c.embedded_server = true;
    c.embedded_listen_host = "127.0.0.1";
    c.embedded_ports = {0};
    if (c.join.job_id.empty()) c.join.job_id = absl::StrCat("standalone-", self.pid);
    c.join.agent.node_index = 0;
    return c;
  }

  if (!flags.rdzv_endpoint.empty()) {
    absl::StatusOr<HostPort> hp = ParseHostPort(flags.rdzv_endpoint, 29400);
    if (!hp.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--rdzv-endpoint: ", hp.status().message()));
    }
    c.rdzv_host = hp->host;
    c.rdzv_ports = {hp->port};
  }

  // Inside an srun step Slurm says everything; in a batch script without a step and without an
  // endpoint, ResolveSlurm explains how to launch instead.
  if (*slurm && ((*slurm)->in_step() || flags.rdzv_endpoint.empty())) {
    if (absl::Status s = ResolveSlurm(flags, **slurm, c); !s.ok()) return s;
    return c;
  }

  if (!flags.rdzv_endpoint.empty()) {
    if (!flags.nnodes_max) {
      return absl::InvalidArgumentError(
          "--nnodes is required with --rdzv-endpoint (how many agents to wait for)");
    }
    if (flags.rdzv_id.empty()) {
      return absl::InvalidArgumentError(
          "--rdzv-id is required with --rdzv-endpoint so that different jobs never meet; "
          "give all agents of one job the same id, e.g. --rdzv-id exp1");
    }
    c.mode = "explicit";
    c.join.min_agents = *flags.nnodes_min;
    c.join.max_agents = *flags.nnodes_max;
    if (c.join.agent.node_index >= c.join.max_agents) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--node-rank %d is out of range for --nnodes %d; expected 0..%d",
                          c.join.agent.node_index, c.join.max_agents, c.join.max_agents - 1));
    }
    return c;
  }

  return absl::InvalidArgumentError(
      "nothing says where to meet the other nodes: pass --rdzv-endpoint HOST:PORT --rdzv-id "
      "JOB --nnodes N, or --standalone for one node (inside a Slurm allocation, srun "
      "rdzv-agent needs no flags)");
}

}  // namespace rdzv
