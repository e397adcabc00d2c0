// guard/connection_guard.h, by the path the rendezvous service's files still name it by; new code
// includes guard/ itself (tests/layering_test.py lists who may use this path).
#ifndef RDZV_SERVER_CONNECTION_GUARD_H_
#define RDZV_SERVER_CONNECTION_GUARD_H_

#include "guard/connection_guard.h"

#endif  // RDZV_SERVER_CONNECTION_GUARD_H_
