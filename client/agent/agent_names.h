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

// Makes a directory of mode 0700 named rdzv-JOB-XXXXXX under `tmp_dir` ("/tmp" when empty), with
// every character of `job_id` but letters, digits, '-' and '.' replaced by '_' (a job id may
// hold '/'). FailedPrecondition, naming the directory, when it cannot be made.
absl::StatusOr<std::string> MakeRunDir(absl::string_view tmp_dir, absl::string_view job_id);

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_AGENT_NAMES_H_
