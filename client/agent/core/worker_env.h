// The environment of one worker process: torchrun's variable names, so that training scripts
// written for torchrun run unchanged, plus RDZV_* variables for scripts that want to reach the
// rendezvous. Pure: the caller supplies the agent's own environment and gets back the merged
// one and a note for every user value it had to replace.
#ifndef RDZV_CLIENT_AGENT_CORE_WORKER_ENV_H_
#define RDZV_CLIENT_AGENT_CORE_WORKER_ENV_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/core/env.h"
#include "common/core/rendezvous_types.h"

namespace rdzv {

// Everything one agent's workers' environment is made of: the assignment of its round, and
// what the agent itself adds.
struct WorkerContext {
  AssignmentEvent assignment;
  int32_t nproc = 1;  // workers this agent runs
  int32_t max_restarts = 0;
  std::string run_id;
  std::string role = "default";
  std::string rdzv_endpoint;  // the server the agent uses now
  // The other servers of the agent's list, in its order: RDZV_ENDPOINT names rdzv_endpoint first,
  // then these (at most kMaxServerList in all), so that a worker's client fails over as its agent
  // does.
  std::vector<std::string> other_endpoints;
  // How the agent reaches rdzv_endpoint, passed on (RDZV_TOKEN_FILE, RDZV_MUNGE_SOCKET,
  // RDZV_TLS_CA, RDZV_TLS_SERVER_NAME) so that a worker's rdzvctl or librdzv client reaches it as
  // the agent does; each empty when the agent uses none.
  std::string token_file;
  std::string munge_socket;
  std::string tls_ca;
  std::string tls_server_name;
  // Where workers write torch's error file (TORCHELASTIC_ERROR_FILE, what @record writes);
  // empty for none.
  std::string error_file_dir;
  // The agent's watchdog FIFO (TORCHELASTIC_TIMER_FILE, torch's file timers and rdzv's
  // heartbeats); empty for none.
  std::string timer_file;
};

// The error file of the worker with local index `local_index`, or "" when ctx has no dir.
std::string ErrorFilePath(const WorkerContext& ctx, int32_t local_index);

// The variables rdzv sets for the worker with local index `local_index` (0..nproc-1).
EnvList WorkerVariables(const WorkerContext& ctx, int32_t local_index);

struct MergedEnv {
  std::vector<std::string> entries;  // "NAME=value", ready for execve
  std::vector<std::string> notes;    // one line per user value replaced or kept
};

// Merges `vars` over `base` (the agent's environment). Defaults (OMP_NUM_THREADS,
// TORCHELASTIC_TIMER_FILE, PYTHONFAULTHANDLER and the like) yield to a user's own value; everything
// else replaces it, with a note when the value differs.
MergedEnv MergeWorkerEnv(const EnvList& base, const EnvList& vars);

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_CORE_WORKER_ENV_H_
