#include "server/status_reply.h"

#include <google/protobuf/io/coded_stream.h>

#include <utility>

namespace rdzv {
namespace {

// The bytes `message` adds to a reply as one element of a repeated field: tag, length, body.
size_t ElementBytes(size_t body) {
  return 1 + google::protobuf::io::CodedOutputStream::VarintSize64(body) + body;
}

}  // namespace

void FitStatusReply(std::vector<v1::JobStatus> jobs, size_t max_bytes, v1::StatusResponse* reply) {
  // The counts of what is left out take a few bytes of their own.
  constexpr size_t kCountBytes = 16;
  size_t used = kCountBytes;
  std::vector<std::pair<v1::JobStatus*, google::protobuf::RepeatedPtrField<v1::AgentStatus>>>
      listed;
  int omitted_jobs = 0;
  for (v1::JobStatus& job : jobs) {
    google::protobuf::RepeatedPtrField<v1::AgentStatus> agents;
    agents.Swap(job.mutable_agents());
    // A job's own counts of left-out agents, and the field's growth as agents are added.
    const size_t bytes = ElementBytes(job.ByteSizeLong() + kCountBytes);
    if (used + bytes > max_bytes) {
      ++omitted_jobs;
      continue;
    }
    used += bytes;
    v1::JobStatus* added = reply->add_jobs();
    *added = std::move(job);
    listed.emplace_back(added, std::move(agents));
  }
  // Agents: an equal share of what is left for each job; a job that needs less leaves the rest
  // to the jobs after it.
  size_t left = max_bytes > used ? max_bytes - used : 0;
  for (size_t i = 0; i < listed.size(); ++i) {
    auto& [job, agents] = listed[i];
    const size_t share = left / (listed.size() - i);
    size_t spent = 0;
    int kept = 0;
    for (v1::AgentStatus& agent : agents) {
      const size_t bytes = ElementBytes(agent.ByteSizeLong());
      if (spent + bytes > share) break;
      spent += bytes;
      *job->add_agents() = std::move(agent);
      ++kept;
    }
    if (kept < agents.size()) job->set_omitted_agents(agents.size() - kept);
    left -= spent;
  }
  if (omitted_jobs > 0) reply->set_omitted_jobs(omitted_jobs);
}

}  // namespace rdzv
