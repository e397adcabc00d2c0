// How rdzvctl shows rdzvd's answers: a table for people, JSON for scripts, and the nodes a
// filling round still waits for. Pure functions of the protocol messages; thread-safe.
#ifndef RDZV_CLIENT_CTL_STATUS_FORMAT_H_
#define RDZV_CLIENT_CTL_STATUS_FORMAT_H_

#include <string>
#include <vector>

#include "google/protobuf/message.h"
#include "rdzv/v1/rdzv.pb.h"

namespace rdzv {

// Who the job still waits for, as a Slurm hostlist. The job's nodes are `nodelist` (rdzvctl
// --nodelist) or else the node list its agents gave rdzvd (JobStatus.node_list, a Slurm step's);
// when known, the missing are those of them without an agent, e.g. "n[3,5-7]", or "N more" when
// each node has one (several agents per node). Otherwise: the node indices (--node-rank) not yet
// seen, e.g. "[3,5-7]", when the agents give indices, else "N more". "" when nobody is missing
// (the round is complete or the job is past filling).
std::string MissingNodes(const v1::JobStatus& job, const std::vector<std::string>& nodelist);

// One line per job under a header: JOB STATE ROUND AGENTS WORLD HOSTS MISSING FAILURE. AGENTS is
// joined/expected ("3/4", or "3/2-4" for a range); HOSTS the joined agents' hosts as a hostlist;
// FAILURE how the job ended. "no jobs" when there are none. A last line says what rdzvd left out
// of a reply too large to send whole (StatusResponse.omitted_jobs, JobStatus.omitted_agents).
std::string FormatStatusTable(const v1::StatusResponse& status,
                              const std::vector<std::string>& nodelist);

// `message` in protobuf's JSON mapping (field names as in rdzv.proto, zero values included), on
// one line.
std::string ToJson(const google::protobuf::Message& message);

}  // namespace rdzv

#endif  // RDZV_CLIENT_CTL_STATUS_FORMAT_H_
