// The real process environment, for main()s and the shells around the pure parsers, which take
// an EnvLookup (env.h) instead of calling getenv themselves.
#ifndef RDZV_COMMON_PROCESS_ENV_H_
#define RDZV_COMMON_PROCESS_ENV_H_

#include "common/core/env.h"

namespace rdzv {

// An EnvLookup over the real process environment (getenv). Not safe against a concurrent
// setenv, like getenv itself.
EnvLookup ProcessEnv();

// The current process environment as a list, in its own order.
EnvList ProcessEnvList();

}  // namespace rdzv

#endif  // RDZV_COMMON_PROCESS_ENV_H_
