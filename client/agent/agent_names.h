// The names an agent gives itself when it starts: its id in the rendezvous, and the private
// directory that holds its workers' error files and its watchdog FIFO.
//
// Thread-safe (no state).
#ifndef RDZV_CLIENT_AGENT_AGENT_NAMES_H_
#define RDZV_CLIENT_AGENT_AGENT_NAMES_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rdzv {

// "HOST:PID:RANDOM" (RANDOM: 8 hex digits). The random part tells apart two agents that reuse
// a pid on one host, such as an agent restarted in a new container.
std::string NewAgentId(absl::string_view host, int64_t pid);

// Makes a directory of mode 0700 named rdzv-JOB-XXXXXX under `parent` (the agent's TempDirectory,
// common/core/file_names.h), JOB being `job_id` as FileNamePart writes it. FailedPrecondition,
// naming the directory, when it cannot be made.
absl::StatusOr<std::string> MakeRunDir(absl::string_view parent, absl::string_view job_id);

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_AGENT_NAMES_H_
