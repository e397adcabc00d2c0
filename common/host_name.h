// This host's name, as gethostname(2) gives it: what rdzv-agent and librdzv's C interface call
// the node when nothing better names it.
#ifndef RDZV_COMMON_HOST_NAME_H_
#define RDZV_COMMON_HOST_NAME_H_

#include <string>

namespace rdzv {

// gethostname(2), or "localhost" when it fails or is empty. Thread-safe.
std::string HostName();

}  // namespace rdzv

#endif  // RDZV_COMMON_HOST_NAME_H_
