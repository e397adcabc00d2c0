// The one place that converts between absl::Status and grpc::Status. Both use the same set of
// canonical codes, so the conversion keeps code and message as they are.
#ifndef RDZV_COMMON_GRPC_STATUS_H_
#define RDZV_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace rdzv {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace rdzv

#endif  // RDZV_COMMON_GRPC_STATUS_H_
