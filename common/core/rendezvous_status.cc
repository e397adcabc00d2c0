// RendezvousState's views: what a filling round's agents hear of it (progress), what rdzvctl
// sees of every job (Status), and which stream holds an agent.
#include <algorithm>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/core/rendezvous_job.h"
#include "common/core/rendezvous_state.h"

namespace rdzv {

namespace {

const char* PhaseName(Phase p) {
  switch (p) {
    case Phase::kFilling:
      return "filling";
    case Phase::kRunning:
      return "running";
    case Phase::kEnded:
      return "ended";
  }
  return "?";
}
}  // namespace

ProgressEvent RendezvousState::MakeProgress(const Job& job) const {
  ProgressEvent p;
  p.joined = static_cast<int32_t>(job.members.size());
  p.expected = job.Expected();
  const size_t excluded = std::min(job.excluded.size(), kProgressExcluded);
  p.excluded.assign(job.excluded.begin(), job.excluded.begin() + excluded);
  std::vector<absl::string_view> hosts;
  hosts.reserve(job.members.size());
  for (Index i : job.members) hosts.push_back(job.members.host(i));
  std::sort(hosts.begin(), hosts.end());
  hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
  if (hosts.size() > kProgressHosts) hosts.resize(kProgressHosts);
  p.joined_hosts.reserve(hosts.size());
  for (absl::string_view host : hosts) p.joined_hosts.emplace_back(host);
  if (!job.claims.empty()) {
    for (int64_t i = 0; i < job.max_agents && p.missing_node_indices.size() < kProgressMissing;
         ++i) {
      if (!job.claims.contains(i) && !job.excluded_positions.contains(i) &&
          !job.gone_positions.contains(i)) {
        p.missing_node_indices.push_back(i);
      }
    }
  }
  return p;
}

std::vector<JobStatusView> RendezvousState::Status(const std::string& job_id) const {
  std::vector<JobStatusView> views;
  for (const auto& [id, job_ptr] : jobs_) {
    if (!job_id.empty() && id != job_id) continue;
    const Job& job = *job_ptr;
    JobStatusView v;
    v.job_id = id;
    v.round = job.round;
    v.state = PhaseName(job.phase);
    v.joined = static_cast<int32_t>(job.members.size());
    v.min_agents = job.min_agents;
    v.max_agents = job.max_agents;
    v.world_size = job.world_size;
    v.node_list = job.node_list;
    v.excluded = job.excluded;
    v.agents.reserve(job.members.size());
    for (Index i : job.members) {
      const AgentRecord& m = job.members[i];
      AgentStatusView a;
      a.agent_id = std::string(job.members.agent_id(i));
      a.host = std::string(job.members.host(i));
      a.node_index = m.node_index;
      a.nproc = m.nproc;
      a.rank_offset =
          job.phase == Phase::kFilling || m.spare || m.unranked ? -1 : m.slot.rank_offset;
      a.state = m.left       ? "left"
                : m.spare    ? "spare"
                : m.unranked ? "waiting"
                             : (m.stream != 0 ? "attached" : "detached");
      v.agents.push_back(std::move(a));
    }
    std::sort(v.agents.begin(), v.agents.end(),
              [](const AgentStatusView& l, const AgentStatusView& r) {
                return std::tie(l.rank_offset, l.host, l.agent_id) <
                       std::tie(r.rank_offset, r.host, r.agent_id);
              });
    views.push_back(std::move(v));
  }
  std::sort(views.begin(), views.end(),
            [](const JobStatusView& l, const JobStatusView& r) { return l.job_id < r.job_id; });
  return views;
}

StreamId RendezvousState::StreamOf(const std::string& job_id, absl::string_view agent_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return 0;
  const Job& job = *it->second;
  if (const Index i = job.members.Find(agent_id); i != AgentTable::kNone) {
    return job.members[i].stream;
  }
  if (const Index i = job.awaited.Find(agent_id); i != AgentTable::kNone) {
    return job.awaited[i].stream;
  }
  return 0;
}
}  // namespace rdzv
