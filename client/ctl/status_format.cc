#include "client/ctl/status_format.h"

#include <algorithm>
#include <set>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/core/hostlist.h"
#include "common/proto_convert.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.pb.h"
#include "rdzv/v1/rdzv.pb.h"

namespace rdzv {
namespace {

std::string Expected(const JobStatusView& job) {
  if (job.min_agents == job.max_agents) return absl::StrCat(job.max_agents);
  return absl::StrCat(job.min_agents, "-", job.max_agents);
}

std::string JoinedHosts(const JobStatusView& job) {
  std::vector<std::string> hosts;
  absl::flat_hash_set<std::string> seen;
  for (const AgentStatusView& agent : job.agents) {
    if (!agent.host.empty() && seen.insert(agent.host).second) hosts.push_back(agent.host);
  }
  std::sort(hosts.begin(), hosts.end());
  return CompressHostlist(hosts);
}

// The job's nodes as its agents gave them to rdzvd, or none when there is no list, it does not
// parse, or it does not name the host of every agent that joined (--host-name renamed one), so
// that a node is never shown missing while its agent is there under another name.
std::vector<std::string> JobNodes(const JobStatusView& job) {
  if (job.node_list.empty()) return {};
  absl::StatusOr<std::vector<std::string>> nodes = ExpandHostlist(job.node_list);
  if (!nodes.ok()) return {};
  const absl::flat_hash_set<std::string> names(nodes->begin(), nodes->end());
  for (const AgentStatusView& agent : job.agents) {
    if (!names.contains(agent.host)) return {};
  }
  return *std::move(nodes);
}

std::string Failure(const JobStatusView& job) {
  if (!job.abort) return job.state == "ended" ? "ended" : "";
  return job.abort->reason;
}

// `message` in protobuf's JSON mapping, field names as in its .proto, zero values included.
std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options).ok()) return "{}";
  return json;
}

grpc::health::v1::HealthCheckResponse::ServingStatus HealthProto(ServingStatus status) {
  using Proto = grpc::health::v1::HealthCheckResponse;
  switch (status) {
    case ServingStatus::kUnknown:
      return Proto::UNKNOWN;
    case ServingStatus::kServing:
      return Proto::SERVING;
    case ServingStatus::kNotServing:
      return Proto::NOT_SERVING;
    case ServingStatus::kServiceUnknown:
      return Proto::SERVICE_UNKNOWN;
  }
  return Proto::UNKNOWN;
}

}  // namespace

std::string MissingNodes(const JobStatusView& job, const std::vector<std::string>& nodelist) {
  // Nodes left out of the job are not waited for.
  const int64_t expected = job.max_agents - static_cast<int64_t>(job.excluded.size());
  if (job.state != "filling" || job.joined >= expected) return "";
  const std::string more = absl::StrCat(expected - job.joined, " more");
  const std::vector<std::string> nodes = nodelist.empty() ? JobNodes(job) : nodelist;
  absl::flat_hash_set<int64_t> out_indices;
  for (const ExcludedNode& node : job.excluded) out_indices.insert(node.node_index);
  if (!nodes.empty()) {
    absl::flat_hash_set<std::string> joined;
    for (const AgentStatusView& agent : job.agents) joined.insert(agent.host);
    for (const ExcludedNode& node : job.excluded) joined.insert(node.host);
    std::vector<std::string> missing;
    for (const std::string& host : nodes) {
      if (!joined.contains(host)) missing.push_back(host);
    }
    // With several agents on a node (one per task), every node may have one while more are due.
    return missing.empty() ? more : CompressHostlist(missing);
  }
  std::set<int64_t> indices;
  for (const AgentStatusView& agent : job.agents) {
    if (agent.node_index < 0) return more;
    indices.insert(agent.node_index);
  }
  std::vector<std::string> missing;
  for (int64_t i = 0; i < job.max_agents; ++i) {
    if (!indices.contains(i) && !out_indices.contains(i)) missing.push_back(absl::StrCat(i));
  }
  std::string list = CompressHostlist(missing);
  // A single index comes back bare; a hostlist of indices reads better bracketed throughout.
  if (!list.empty() && list.front() != '[') list = absl::StrCat("[", list, "]");
  return list;
}

std::string FormatStatusTable(const std::vector<JobStatusView>& jobs,
                              const std::vector<std::string>& nodelist, int64_t omitted_jobs) {
  if (jobs.empty() && omitted_jobs == 0) return "no jobs\n";
  std::vector<std::vector<std::string>> rows = {
      {"JOB", "STATE", "ROUND", "AGENTS", "WORLD", "HOSTS", "MISSING", "FAILURE"}};
  // Asked of a server list, each job names the server that holds it.
  const bool servers =
      absl::c_any_of(jobs, [](const JobStatusView& j) { return !j.server.empty(); });
  if (servers) rows.front().insert(rows.front().begin() + 1, "SERVER");
  for (const JobStatusView& job : jobs) {
    const std::string missing = MissingNodes(job, nodelist);
    const std::string failure = Failure(job);
    rows.push_back({job.job_id, job.state, absl::StrCat(job.round),
                    absl::StrCat(job.joined, "/", Expected(job)),
                    job.world_size > 0 ? absl::StrCat(job.world_size) : "-",
                    JoinedHosts(job).empty() ? "-" : JoinedHosts(job),
                    missing.empty() ? "-" : missing, failure.empty() ? "-" : failure});
    if (servers) rows.back().insert(rows.back().begin() + 1, job.server.empty() ? "-" : job.server);
  }
  std::vector<size_t> widths(rows.front().size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      // The last column (the failure, free text) is not padded.
      if (i + 1 == row.size()) {
        absl::StrAppend(&line, row[i]);
      } else {
        absl::StrAppend(&line, absl::StrFormat("%-*s  ", static_cast<int>(widths[i]), row[i]));
      }
    }
    absl::StrAppend(&out, line, "\n");
  }
  // Hot spares: in the job, with no ranks, ready to take a lost node's place.
  for (const JobStatusView& job : jobs) {
    std::vector<std::string> spares;
    for (const AgentStatusView& agent : job.agents) {
      if (agent.state == "spare") spares.push_back(agent.host);
    }
    if (spares.empty()) continue;
    std::sort(spares.begin(), spares.end());
    absl::StrAppend(&out, "job ", job.job_id, " spares: ", CompressHostlist(spares), "\n");
  }
  // Nodes left out for good, and the line that keeps them out of the next run.
  for (const JobStatusView& job : jobs) {
    if (job.excluded.empty()) continue;
    std::vector<std::string> hosts;
    for (const ExcludedNode& node : job.excluded) {
      absl::StrAppend(&out, "job ", job.job_id, " left out ", DescribeExcluded(node), "\n");
      hosts.push_back(node.host);
    }
    std::sort(hosts.begin(), hosts.end());
    hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
    absl::StrAppend(&out, "  next time: sbatch --exclude=", CompressHostlist(hosts), "\n");
  }
  // rdzvd keeps its reply within a fixed size; say what it left out.
  int64_t omitted_agents = 0;
  int cut_jobs = 0;
  for (const JobStatusView& job : jobs) {
    omitted_agents += job.omitted_agents;
    if (job.omitted_agents > 0) ++cut_jobs;
  }
  if (omitted_jobs > 0 || omitted_agents > 0) {
    absl::StrAppend(&out,
                    absl::StrFormat("(too much to show: %d more jobs and %d agents of %d jobs "
                                    "left out; rdzvctl status JOB shows one job)\n",
                                    omitted_jobs, omitted_agents, cut_jobs));
  }
  return out;
}

// Back into the protocol's messages: the JSON mapping of rdzv.proto is what scripts read.
std::string StatusJson(const std::vector<JobStatusView>& jobs, int64_t omitted_jobs) {
  v1::StatusResponse response;
  for (const JobStatusView& job : jobs) *response.add_jobs() = ToProto(job);
  response.set_omitted_jobs(omitted_jobs);
  return ToJson(response);
}

std::string AbortJson(const AbortEvent& abort) {
  v1::AbortJobResponse response;
  *response.mutable_abort() = ToProto(abort);
  return ToJson(response);
}

std::string ServingStatusName(ServingStatus status) {
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(HealthProto(status));
}

std::string HealthJson(ServingStatus status) {
  grpc::health::v1::HealthCheckResponse response;
  response.set_status(HealthProto(status));
  return ToJson(response);
}

}  // namespace rdzv
