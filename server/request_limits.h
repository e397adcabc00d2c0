// guard/request_limits.h, by the path the rendezvous service's files still name it by; new code
// includes guard/ itself (tests/layering_test.py lists who may use this path).
#ifndef RDZV_SERVER_REQUEST_LIMITS_H_
#define RDZV_SERVER_REQUEST_LIMITS_H_

#include "guard/request_limits.h"

#endif  // RDZV_SERVER_REQUEST_LIMITS_H_
