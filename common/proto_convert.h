// Conversions between the core's plain structs and the rdzv.v1 protobuf messages, shared by
// the server and the client so that each field is mapped in one place.
#ifndef RDZV_COMMON_PROTO_CONVERT_H_
#define RDZV_COMMON_PROTO_CONVERT_H_

#include "common/core/rendezvous_state.h"
#include "rdzv/v1/rdzv.pb.h"

namespace rdzv {

// The protocol revision this build speaks; a server refuses requests newer than itself. A
// request states the lowest revision it needs: 5 for a join with hot spares
// (JoinRequest.spare_nodes), 4 for an unhealthy node's join (JoinRequest.unhealthy), 3 for a group
// join (JoinRequest.members), 2 for a resume, else 1, so that joins still work against an older
// server.
inline constexpr int32_t kProtocolVersion = 5;
inline constexpr int32_t kSpareJoinProtocolVersion = 5;
inline constexpr int32_t kUnhealthyJoinProtocolVersion = 4;
inline constexpr int32_t kGroupJoinProtocolVersion = 3;

v1::JoinRequest ToProto(const JoinSpec& spec);
JoinSpec FromProto(const v1::JoinRequest& request);
// The same into `*spec`, every field overwritten, reusing the room its strings have: converting
// the members of a group join one after another into one spec allocates next to nothing.
void FromProto(const v1::JoinRequest& request, JoinSpec* spec);

v1::JoinEvent ToProto(const Event& event);

ProgressEvent FromProto(const v1::Progress& progress);
v1::Assignment ToProto(const AssignmentEvent& assignment);
AssignmentEvent FromProto(const v1::Assignment& assignment);

v1::WorkerFailure ToProto(const FailureInfo& failure);
FailureInfo FromProto(const v1::WorkerFailure& failure);

v1::Abort ToProto(const AbortEvent& abort);
v1::JobStatus ToProto(const JobStatusView& job);
JobStatusView FromProto(const v1::JobStatus& job);
AbortEvent FromProto(const v1::Abort& abort);

}  // namespace rdzv

#endif  // RDZV_COMMON_PROTO_CONVERT_H_
