// The agent's command line: its flags, their variables and its help text.
#include <algorithm>
#include <limits>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "client/agent/core/agent_options.h"
#include "client/agent/core/launcher_env.h"
#include "common/core/connection_flags.h"
#include "common/core/flags.h"
#include "common/core/host_port.h"
#include "common/core/hostlist.h"
#include "common/core/slurm_env.h"

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

FlagParser MakeParser(AgentFlags& f) {
  FlagParser p("rdzv-agent", kUsage);
  p.SetUnknownFlagHint("put the training command after --");
  p.Add({"nnodes", "RDZV_NNODES", "N|MIN:MAX",
         "how many agents (nodes) the job has; MIN:MAX lets the job start with MIN after\n"
         "--last-call (default under Slurm: the step's node or task count)",
         [&f](absl::string_view v) -> absl::Status {
           std::vector<absl::string_view> parts = absl::StrSplit(v, ':');
           absl::StatusOr<int64_t> lo = ParseInt(parts.front(), 1, 1'000'000);
           absl::StatusOr<int64_t> hi = ParseInt(parts.back(), 1, 1'000'000);
           if (parts.size() > 2 || !lo.ok() || !hi.ok() || *lo > *hi) {
             return absl::InvalidArgumentError("expected N or MIN:MAX with 1 <= MIN <= MAX");
           }
           f.nnodes_min = static_cast<int32_t>(*lo);
           f.nnodes_max = static_cast<int32_t>(*hi);
           return absl::OkStatus();
         }});
  p.Add({"nproc-per-node", "RDZV_NPROC_PER_NODE", "N",
         "workers to start on this node (default: SLURM_GPUS_ON_NODE, else the devices in\n"
         "CUDA_VISIBLE_DEVICES, else 1)",
         IntSetter(&f.nproc_per_node, 1, kMaxNprocPerNode)});
  p.Add({"node-rank", "RDZV_NODE_RANK", "N",
         "this node's index 0..nnodes-1; orders the nodes (default: SLURM_NODEID; without it\n"
         "nodes are ordered by host name)",
         IntSetter(&f.node_rank, 0, 1'000'000)});
  p.Add({"rdzv-endpoint", "RDZV_ENDPOINT", "HOST:PORT[,HOST:PORT...]",
         "the rdzvd to meet at, or a primary and its backups in order (default: none; under\n"
         "Slurm node 0 hosts one in-process)",
         StringSetter(&f.rdzv_endpoint)});
  p.Add({"rdzv-id", "RDZV_ID", "ID",
         "the job id shared by all agents of one job (default under Slurm: job and step id)",
         StringSetter(&f.rdzv_id)});
  p.Add({"standalone", "RDZV_STANDALONE", "",
         "one node only: host the rendezvous in-process on loopback", BoolSetter(&f.standalone)});
  p.Add({"node-relay", "RDZV_NODE_RELAY", "on|off",
         "per-task launches: the tasks of a node reach the rendezvous server through its first "
         "task, over one connection (default on)",
         [&f](absl::string_view v) -> absl::Status {
           if (v == "on") {
             f.node_relay = true;
           } else if (v == "off") {
             f.node_relay = false;
           } else {
             return absl::InvalidArgumentError(
                 absl::StrCat("expected on or off, got \"", absl::CHexEscape(v), "\""));
           }
           return absl::OkStatus();
         }});
  p.Add({"fan-in", "RDZV_FAN_IN", "N",
         absl::StrFormat("per-node launches of more than N nodes: the nodes join in groups of N, "
                         "each through its first node, so that the rendezvous server holds a "
                         "connection per group (default %d; 0: every node joins it itself)",
                         kDefaultFanIn),
         [&f](absl::string_view v) -> absl::Status {
           absl::StatusOr<int64_t> n = ParseInt(v, 0, 512);
           if (!n.ok()) return n.status();
           if (*n == 1) {
             return absl::InvalidArgumentError(
                 "a group of 1 node relays nothing; give 2..512, or 0 for no groups");
           }
           f.fan_in = static_cast<int>(*n);
           return absl::OkStatus();
         }});
  p.Add({"max-restarts", "RDZV_MAX_RESTARTS", "N",
         "how often the job may restart its workers after a failure (default 0)",
         IntSetter(&f.max_restarts, 0, 1'000'000)});
  p.Add({"spare-nodes", "RDZV_SPARE_NODES", "K",
         "keep K of the job's nodes as hot spares: they run no workers, and one takes the place\n"
         "of a node lost while the job runs (its agent gone, its health check failed, or a rank\n"
         "asked it out); the job restarts (within --max-restarts) and every other node keeps\n"
         "its node rank and ranks (default 0)",
         IntSetter(&f.spare_nodes, 0, 1'000'000)});
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
  p.Add({"health-check", "RDZV_HEALTH_CHECK", "COMMAND",
         "run COMMAND (with /bin/sh -c) before each join but a resume: exiting non-zero or\n"
         "running past --health-check-timeout leaves this node out of the job for good, with\n"
         "the command's last line of output as the reason; the agent then exits with code 83\n"
         "(default: none; the built-in checks always run)",
         StringSetter(&f.health_check)});
  p.Add({"health-check-timeout", "RDZV_HEALTH_CHECK_TIMEOUT", "DURATION",
         "how long --health-check may run (default 60s)", [&f](absl::string_view v) {
           absl::Duration d;
           if (absl::Status s = DurationSetter(&d)(v); !s.ok()) return s;
           if (d <= absl::ZeroDuration() || d > absl::Hours(24)) {
             return absl::InvalidArgumentError(
                 "expected a duration above 0 and at most 24h, such as 30s or 2m");
           }
           f.health_check_timeout = d;
           return absl::OkStatus();
         }});
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
  p.Add({"failover-timeout", "RDZV_FAILOVER_TIMEOUT", "DURATION",
         "with a server list, how long a lost rdzvd is tried before the agent moves its job to\n"
         "the next one of the list (default 3s)",
         DurationSetter(&f.failover_timeout)});
  p.Add({"hang-timeout", "RDZV_HANG_TIMEOUT", "DURATION|auto",
         "a worker that has sent a heartbeat and then none for this long is hung: it is sent\n"
         "SIGABRT for its stack and the job fails (or restarts); auto learns the timeout from\n"
         "the intervals seen (default 0: heartbeats are not watched; torch's timers always are)",
         [&f](absl::string_view v) {
           f.hang_timeout_auto = v == "auto";
           if (f.hang_timeout_auto) return absl::OkStatus();
           double seconds;
           absl::Duration d;
           if (!absl::SimpleAtod(v, &seconds) && !absl::ParseDuration(v, &d)) {
             return absl::InvalidArgumentError(
                 "expected a duration such as 60s or 5m, auto to learn it, or 0 for none");
           }
           // A duration, but out of range.
           if (absl::Status s = DurationSetter(&f.hang_timeout)(v); !s.ok()) {
             return absl::InvalidArgumentError(absl::StrCat(s.message(), ", or auto"));
           }
           return absl::OkStatus();
         }});
  p.Add({"hang-timeout-min", "RDZV_HANG_TIMEOUT_MIN", "DURATION",
         "with --hang-timeout auto: the learned timeout is never shorter than this (default\n"
         "30s); it is 5 times the longest heartbeat interval the job has seen, once each node\n"
         "has seen 5 intervals or an earlier attempt of the job taught it one",
         [&f](absl::string_view v) {
           absl::Duration d;
           if (absl::Status s = DurationSetter(&d)(v); !s.ok()) return s;
           if (d <= absl::ZeroDuration()) {
             return absl::InvalidArgumentError("expected a positive duration such as 30s");
           }
           f.hang_timeout_min = d;
           return absl::OkStatus();
         }});
  p.Add({"host-name", "RDZV_HOST_NAME", "NAME",
         "this node's name in the rendezvous (default: SLURMD_NODENAME, else the host name)",
         StringSetter(&f.host_name)});
  p.Add({"mode", "RDZV_MODE", "auto|node|task",
         "under Slurm: one agent per node that starts --nproc-per-node workers (node), or one\n"
         "agent per task that is one rank (task); auto picks task when the step has more than\n"
         "one task on a node",
         [&f](absl::string_view v) {
           if (v == "auto") {
             f.mode = SlurmAgents::kAuto;
           } else if (v == "node") {
             f.mode = SlurmAgents::kPerNode;
           } else if (v == "task") {
             f.mode = SlurmAgents::kPerTask;
           } else {
             return absl::InvalidArgumentError("expected auto, node or task");
           }
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
             absl::StatusOr<int64_t> r = ParseInt(part, 0, 1'000'000);
             if (!r.ok()) {
               return absl::InvalidArgumentError("expected local ranks such as 0 or 0,1");
             }
             f.local_ranks_filter.push_back(static_cast<int32_t>(*r));
           }
           return absl::OkStatus();
         }});
  p.Add({"slurm-env", "RDZV_SLURM_ENV", "tasks|keep",
         "inside a Slurm job, give each worker the SLURM_* task variables srun would give it as\n"
         "a task of the job's layout (SLURM_PROCID=RANK, SLURM_LOCALID=LOCAL_RANK,\n"
         "SLURM_NTASKS=WORLD_SIZE, ...; tasks, the default), or leave the agent's own (keep:\n"
         "the workers of one agent then share its Slurm rank)",
         [&f](absl::string_view v) {
           if (v != "tasks" && v != "keep")
             return absl::InvalidArgumentError("expected tasks or keep");
           f.slurm_env = std::string(v);
           return absl::OkStatus();
         }});
  p.Add({"mpi-env", "RDZV_MPI_ENV", "drop|keep",
         "where the agent starts its workers itself (all but per-task mode), drop the variables\n"
         "and descriptors that give the agent its own place in srun --mpi or mpirun (PMI_RANK,\n"
         "PMI_FD, PMIX_*, OMPI_COMM_WORLD_*, ...; drop, the default), or pass them on (keep)",
         [&f](absl::string_view v) {
           if (v != "drop" && v != "keep") {
             return absl::InvalidArgumentError("expected drop or keep");
           }
           f.mpi_env = std::string(v);
           return absl::OkStatus();
         }});
  p.Add({"pass-local-rank", "RDZV_PASS_LOCAL_RANK", "",
         "append --local_rank=LOCAL_RANK to each worker's command, for scripts written for\n"
         "torch.distributed.launch without --use_env",
         BoolSetter(&f.pass_local_rank)});
  p.Add({"log-level", "RDZV_LOG_LEVEL", "LEVEL",
         "trace, debug, info, warn, error or off (default info)", StringSetter(&f.log_level)});
  p.Add({"auth", "RDZV_AUTH", "auto|munge|token|none",
         "how this agent proves who it is to the rendezvous server: a MUNGE credential,\n"
         "the job's token, or nothing (default auto: the token when given, else MUNGE when\n"
         "munged runs on this host)",
         [&f](absl::string_view v) {
           if (v != "auto" && v != "munge" && v != "token" && v != "none") {
             return absl::InvalidArgumentError("expected auto, munge, token or none");
           }
           f.auth = std::string(v);
           return absl::OkStatus();
         }});
  AddConnectionFlags(p, &f.connection);
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

}  // namespace rdzv
