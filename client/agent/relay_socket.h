// Where a node's relay (node_relay.h) listens for the node's agents, and what vouches for both
// ends: a UNIX socket in a directory only this user may enter. A socket's path is worked out by
// each task alone (RelaySocketPath), from the job, the node and the agent's TempDirectory
// (common/core/file_names.h), so that the node's tasks agree on it.
//
// Thread-safe (no state). The functions touch the file system; none blocks for long.
#ifndef RDZV_CLIENT_AGENT_RELAY_SOCKET_H_
#define RDZV_CLIENT_AGENT_RELAY_SOCKET_H_

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rdzv {

// The private directory the relay's socket lives in: `temp_dir`/rdzv-<uid>, made 0700 when
// missing. FailedPrecondition naming the path when it is not a directory of this user's own that
// no one else may enter (a symlink, another owner, group or world access).
absl::StatusOr<std::string> RelayDirectory(absl::string_view temp_dir, uid_t uid);

// The socket of job `job_key`'s relay on node `node` for user `uid`, in RelayDirectory's path
// (which this does not create or check), named as FileNamePart writes the job and node.
std::string RelaySocketPath(absl::string_view temp_dir, uid_t uid, absl::string_view job_key,
                            absl::string_view node);

// The directory of `socket_path` (a RelaySocketPath of user `uid`) once RelayDirectory has
// checked it; InvalidArgument for a path that is no relay socket's.
absl::StatusOr<std::string> RelaySocketDirectory(absl::string_view socket_path, uid_t uid);

// Whether a relay listens at `socket_path` in a directory RelayDirectory accepts. Does not block.
bool RelayListening(const std::string& socket_path);

// Removes the relay sockets in `dir` that relays killed without a chance to clean up (SIGKILL, a
// crash) left behind: this user's sockets that no one listens on and that were made over a minute
// ago (a relay that is just starting has bound its socket but may not listen yet). Looks at a
// bounded number of sockets, so that a crowded directory cannot hold a relay's start up.
void SweepDeadSockets(const std::string& dir);

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_RELAY_SOCKET_H_
