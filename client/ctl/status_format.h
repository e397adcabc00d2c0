// How rdzvctl shows rdzvd's answers: a table for people, JSON for scripts, and the nodes a
// filling round still waits for. Pure functions of librdzv's structs; thread-safe.
#ifndef RDZV_CLIENT_CTL_STATUS_FORMAT_H_
#define RDZV_CLIENT_CTL_STATUS_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "client/client.h"
#include "common/core/rendezvous_types.h"

namespace rdzv {

// Who the job still waits for, as a Slurm hostlist. The job's nodes are `nodelist` (rdzvctl
// --nodelist) or else the node list its agents gave rdzvd (JobStatusView::node_list, a Slurm
// step's); when known, the missing are those of them without an agent, e.g. "n[3,5-7]", or "N more"
// when each node has one (several agents per node). Otherwise: the node indices (--node-rank) not
// yet seen, e.g. "[3,5-7]", when the agents give indices, else "N more". "" when nobody is missing
// (the round is complete or the job is past filling).
std::string MissingNodes(const JobStatusView& job, const std::vector<std::string>& nodelist);

// One line per job under a header: JOB STATE ROUND AGENTS WORLD HOSTS MISSING FAILURE (and SERVER
// after JOB when a job names the server that holds it, JobStatusView::server). AGENTS is
// joined/expected ("3/4", or "3/2-4" for a range); HOSTS the joined agents' hosts as a hostlist;
// FAILURE how the job ended. "no jobs" when there are none. A last line says what rdzvd left out
// of a reply too large to send whole: `omitted_jobs`, and each job's omitted_agents.
std::string FormatStatusTable(const std::vector<JobStatusView>& jobs,
                              const std::vector<std::string>& nodelist, int64_t omitted_jobs = 0);

// The answers of status and abort as their messages in rdzv.proto (StatusResponse,
// AbortJobResponse) read in protobuf's JSON mapping: field names as in rdzv.proto, zero values
// included, on one line. Scripts parse this, so the protocol is what defines it.
std::string StatusJson(const std::vector<JobStatusView>& jobs, int64_t omitted_jobs = 0);
std::string AbortJson(const AbortEvent& abort);

// health's answer, {"status":"SERVING"}, as grpc.health.v1's HealthCheckResponse reads in JSON.
std::string ServingStatusName(ServingStatus status);
std::string HealthJson(ServingStatus status);

}  // namespace rdzv

#endif  // RDZV_CLIENT_CTL_STATUS_FORMAT_H_
