// Torch's error file: what a worker's `@record` (torch.distributed.elastic.multiprocessing.errors)
// writes at TORCHELASTIC_ERROR_FILE when an exception escapes it. The agent shows its message in
// the job's root cause instead of a stderr tail.
//
// The file is written by the worker, so its content is untrusted. Thread-safe (no state).
#ifndef RDZV_CLIENT_ERROR_FILE_H_
#define RDZV_CLIENT_ERROR_FILE_H_

#include <string>

namespace rdzv {

// The message of the error file at `path`, with the Python call stack when there is one:
// {"message": {"message": "...", "extraInfo": {"py_callstack": "..."}}} (or a plain string
// message). Empty when there is no file or no message; a line saying so when it is not JSON.
std::string ReadErrorFile(const std::string& path);

}  // namespace rdzv

#endif  // RDZV_CLIENT_ERROR_FILE_H_
