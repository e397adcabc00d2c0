#include "client/agent/core/worker_env.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/core/host_port.h"

namespace rdzv {
namespace {

// Set only when the user has not chosen a value. OMP_NUM_THREADS=1 keeps N workers on one node
// from each starting one thread per core; it is what torchrun does for more than one worker. A
// user's own TORCHELASTIC_TIMER_FILE names a timer server of their own.
bool IsDefault(const std::string& name) {
  return name == "OMP_NUM_THREADS" || name == "NCCL_ASYNC_ERROR_HANDLING" ||
         name == "TORCHELASTIC_TIMER_FILE" || name == "PYTHONFAULTHANDLER";
}

}  // namespace

std::string ErrorFilePath(const WorkerContext& ctx, int32_t local_index) {
  if (ctx.error_file_dir.empty()) return "";
  return absl::StrCat(ctx.error_file_dir, "/error-",
                      ctx.assignment.slot.local_rank_offset + local_index, ".json");
}

EnvList WorkerVariables(const WorkerContext& ctx, int32_t local_index) {
  const AssignmentEvent& a = ctx.assignment;
  const int32_t rank = a.slot.rank_offset + local_index;
  const auto n = [](int64_t v) { return absl::StrCat(v); };
  EnvList vars = {
      {"RANK", n(rank)},
      {"LOCAL_RANK", n(a.slot.local_rank_offset + local_index)},
      {"WORLD_SIZE", n(a.world_size)},
      {"LOCAL_WORLD_SIZE", n(a.slot.local_world_size)},
      {"GROUP_RANK", n(a.slot.group_rank)},
      {"GROUP_WORLD_SIZE", n(a.group_world_size)},
      {"NODE_RANK", n(a.slot.group_rank)},
      {"ROLE_RANK", n(rank)},
      {"ROLE_WORLD_SIZE", n(a.world_size)},
      {"ROLE_NAME", ctx.role},
      {"MASTER_ADDR", a.master_addr},
      {"MASTER_PORT", n(a.master_port)},
      {"TORCHELASTIC_RUN_ID", ctx.run_id},
      {"TORCHELASTIC_RESTART_COUNT", n(a.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", n(ctx.max_restarts)},
      // The agent hosts no TCPStore: rank 0 creates it at MASTER_ADDR:MASTER_PORT.
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      {"RDZV_RUN_ID", ctx.run_id},
      {"RDZV_ROUND", n(a.round)},
  };
  // A standalone agent keeps its rendezvous in-process: there is no server to name.
  if (!ctx.rdzv_endpoint.empty()) {
    std::vector<std::string> list = {ctx.rdzv_endpoint};
    for (const std::string& e : ctx.other_endpoints) {
      if (list.size() < kMaxServerList && std::find(list.begin(), list.end(), e) == list.end()) {
        list.push_back(e);
      }
    }
    vars.emplace_back("RDZV_ENDPOINT", absl::StrJoin(list, ","));
    const auto pass = [&vars](const char* name, const std::string& value) {
      if (!value.empty()) vars.emplace_back(name, value);
    };
    pass("RDZV_TOKEN_FILE", ctx.token_file);
    pass("RDZV_MUNGE_SOCKET", ctx.munge_socket);
    pass("RDZV_TLS_CA", ctx.tls_ca);
    pass("RDZV_TLS_SERVER_NAME", ctx.tls_server_name);
  }
  if (!ctx.error_file_dir.empty()) {
    vars.emplace_back("TORCHELASTIC_ERROR_FILE", ErrorFilePath(ctx, local_index));
  }
  if (!ctx.timer_file.empty()) {
    vars.emplace_back("TORCHELASTIC_TIMER_FILE", ctx.timer_file);
    // A hung worker is sent SIGABRT first: with faulthandler on, Python prints every thread's
    // stack, which the root cause shows.
    vars.emplace_back("PYTHONFAULTHANDLER", "1");
  }
  if (a.slot.local_world_size > 1) vars.emplace_back("OMP_NUM_THREADS", "1");
  vars.emplace_back("NCCL_ASYNC_ERROR_HANDLING", "1");
  return vars;
}

MergedEnv MergeWorkerEnv(const EnvList& base, const EnvList& vars) {
  absl::flat_hash_map<std::string, size_t> position;
  MergedEnv merged;
  merged.entries.reserve(base.size() + vars.size());
  for (const auto& [name, value] : base) {
    auto [it, inserted] = position.emplace(name, merged.entries.size());
    if (inserted) {
      merged.entries.push_back(absl::StrCat(name, "=", value));
    } else {
      merged.entries[it->second] = absl::StrCat(name, "=", value);
    }
  }
  for (const auto& [name, value] : vars) {
    auto it = position.find(name);
    if (it == position.end()) {
      position.emplace(name, merged.entries.size());
      merged.entries.push_back(absl::StrCat(name, "=", value));
      continue;
    }
    std::string& entry = merged.entries[it->second];
    const absl::string_view old_value = absl::string_view(entry).substr(name.size() + 1);
    if (old_value == value) continue;
    if (IsDefault(name)) {
      merged.notes.push_back(absl::StrFormat("keeping %s=%s from the environment (default is %s)",
                                             name, old_value, value));
      continue;
    }
    merged.notes.push_back(
        absl::StrFormat("replacing %s=%s from the environment with %s", name, old_value, value));
    entry = absl::StrCat(name, "=", value);
  }
  return merged;
}

}  // namespace rdzv
