// Torch's error file: what a worker's `@record` (torch.distributed.elastic.multiprocessing.errors)
// writes at TORCHELASTIC_ERROR_FILE when an exception escapes it. The agent shows its message in
// the job's root cause instead of a stderr tail.
//
// The file is written by the worker, so neither its content nor what sits at its path is trusted:
// it is opened without following links or blocking, read only when it is a regular file of at
// most kMaxErrorFileBytes, and control characters in the message come back escaped (except line
// breaks and tabs). Thread-safe (no state).
#ifndef RDZV_CLIENT_AGENT_ERROR_FILE_H_
#define RDZV_CLIENT_AGENT_ERROR_FILE_H_

#include <cstddef>
#include <string>

namespace rdzv {

// Larger error files are ignored (with a warning) rather than read: torch writes a few kilobytes.
inline constexpr size_t kMaxErrorFileBytes = 1024 * 1024;

// The message of the error file at `path`, with the Python call stack when there is one:
// {"message": {"message": "...", "extraInfo": {"py_callstack": "..."}}} (or a plain string
// message). Empty when there is no file or no message, and when what is at `path` is not a
// regular file of at most kMaxErrorFileBytes (a warning says why); a line saying so when it is
// not JSON. Never blocks.
std::string ReadErrorFile(const std::string& path);

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_ERROR_FILE_H_
