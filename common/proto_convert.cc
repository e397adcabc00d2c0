#include "common/proto_convert.h"

#include <limits>
#include <type_traits>

namespace rdzv {
namespace {

// A cause from the wire: values this build does not know are unspecified.
AbortCause CauseFromProto(int value) {
  if (value < 0 || value > kMaxAbortCause) return AbortCause::kUnspecified;
  return static_cast<AbortCause>(value);
}

static_assert(v1::AbortCause_MAX == kMaxAbortCause, "AbortCause and v1.AbortCause differ");

v1::AbortCause CauseToProto(AbortCause cause) { return static_cast<v1::AbortCause>(cause); }

// Milliseconds from the wire in microseconds. A value beyond what microseconds hold saturates
// instead of overflowing; the range checks that follow (ValidateJoinSpec) refuse it.
Micros MicrosFromMillis(int64_t ms) {
  constexpr int64_t kLimit = std::numeric_limits<int64_t>::max() / 1000;
  if (ms > kLimit) return std::numeric_limits<int64_t>::max();
  if (ms < -kLimit) return std::numeric_limits<int64_t>::min();
  return ms * 1000;
}

ExclusionKind KindFromProto(int value) {
  if (value < 0 || value > kMaxExclusionKind) return ExclusionKind::kUnspecified;
  return static_cast<ExclusionKind>(value);
}

static_assert(v1::ExclusionKind_MAX == kMaxExclusionKind, "ExclusionKind and v1 differ");
static_assert(v1::RankRequest_MAX == kMaxRankRequest, "RankRequest and v1 differ");

void ToProto(const ExcludedNode& e, v1::ExcludedNode& p) {
  p.set_host(e.host);
  p.set_node_index(e.node_index);
  p.set_kind(static_cast<v1::ExclusionKind>(e.why.kind));
  p.set_detail(e.why.detail);
}

ExcludedNode FromProto(const v1::ExcludedNode& p) {
  return ExcludedNode{p.host(), p.node_index(), Unhealthy{KindFromProto(p.kind()), p.detail()}};
}

}  // namespace

v1::JoinRequest ToProto(const JoinSpec& spec) {
  v1::JoinRequest r;
  r.set_job_id(spec.job_id);
  r.set_agent_id(spec.agent.agent_id);
  r.set_host(spec.agent.host);
  r.set_node_index(spec.agent.node_index);
  r.set_order(spec.agent.order);
  r.set_nproc(spec.agent.nproc);
  r.set_min_agents(spec.min_agents);
  r.set_max_agents(spec.max_agents);
  r.set_last_call_ms(spec.last_call / 1000);
  for (const std::string& a : spec.addresses) r.add_addresses(a);
  r.set_master_port(spec.master_port);
  r.set_master_addr_override(spec.master_addr_override);
  r.set_master_port_override(spec.master_port_override);
  r.set_restart_count(spec.restart_count);
  // The oldest revision that knows every field set: an older server refuses what it would
  // misread (a resume taken for a fresh join, an unhealthy node taken in).
  r.set_protocol_version(spec.spare_nodes > 0 ? kSpareJoinProtocolVersion
                         : spec.unhealthy     ? kUnhealthyJoinProtocolVersion
                         : spec.resume        ? 2
                                              : 1);
  r.set_spare_nodes(spec.spare_nodes);
  if (spec.unhealthy) {
    r.mutable_unhealthy()->set_kind(static_cast<v1::ExclusionKind>(spec.unhealthy->kind));
    r.mutable_unhealthy()->set_detail(spec.unhealthy->detail);
  }
  if (spec.resume) *r.mutable_resume() = ToProto(*spec.resume);
  if (spec.max_restarts) r.set_max_restarts(*spec.max_restarts);
  r.set_longest_heartbeat_interval_ms(spec.longest_heartbeat_interval / 1000);
  r.set_node_list(spec.node_list);
  return r;
}

JoinSpec FromProto(const v1::JoinRequest& r) {
  JoinSpec spec;
  FromProto(r, &spec);
  return spec;
}

void FromProto(const v1::JoinRequest& r, JoinSpec* out) {
  JoinSpec& spec = *out;
  spec.job_id = r.job_id();
  spec.agent.agent_id = r.agent_id();
  spec.agent.host = r.host();
  spec.agent.node_index = r.node_index();
  spec.agent.order = r.order();
  spec.agent.nproc = r.nproc();
  spec.min_agents = r.min_agents();
  spec.max_agents = r.max_agents();
  spec.last_call = MicrosFromMillis(r.last_call_ms());
  spec.addresses.assign(r.addresses().begin(), r.addresses().end());
  spec.master_port = r.master_port();
  spec.master_addr_override = r.master_addr_override();
  spec.master_port_override = r.master_port_override();
  spec.restart_count = r.restart_count();
  spec.resume.reset();
  if (r.has_resume()) spec.resume = FromProto(r.resume());
  spec.max_restarts.reset();
  if (r.has_max_restarts()) spec.max_restarts = r.max_restarts();
  spec.longest_heartbeat_interval = MicrosFromMillis(r.longest_heartbeat_interval_ms());
  spec.node_list = r.node_list();
  spec.spare_nodes = r.spare_nodes();
  spec.unhealthy.reset();
  if (r.has_unhealthy()) {
    spec.unhealthy = Unhealthy{KindFromProto(r.unhealthy().kind()), r.unhealthy().detail()};
  }
}

v1::WorkerFailure ToProto(const FailureInfo& f) {
  v1::WorkerFailure p;
  p.set_host(f.host);
  p.set_group_rank(f.group_rank);
  p.set_rank(f.rank);
  p.set_local_rank(f.local_rank);
  p.set_exit_code(f.exit_code);
  p.set_signal(f.signal);
  p.set_stderr_tail(f.stderr_tail);
  p.set_error_message(f.error_message);
  p.set_time_us(f.time_us);
  p.set_cause(CauseToProto(f.cause));
  p.set_hang_detail(f.hang_detail);
  p.set_request(static_cast<v1::RankRequest>(f.request));
  p.set_request_reason(f.request_reason);
  return p;
}

FailureInfo FromProto(const v1::WorkerFailure& p) {
  FailureInfo f;
  f.host = p.host();
  f.group_rank = p.group_rank();
  f.rank = p.rank();
  f.local_rank = p.local_rank();
  f.exit_code = p.exit_code();
  f.signal = p.signal();
  f.stderr_tail = p.stderr_tail();
  f.error_message = p.error_message();
  f.time_us = p.time_us();
  f.cause = CauseFromProto(p.cause());
  f.hang_detail = p.hang_detail();
  // A request this side does not know is no request.
  if (p.request() > 0 && p.request() <= kMaxRankRequest) {
    f.request = static_cast<RankRequest>(p.request());
    f.request_reason = p.request_reason();
  }
  // Agents that predate causes reported only their workers' failures.
  if (f.cause == AbortCause::kUnspecified) f.cause = AbortCause::kWorkerFailed;
  return f;
}

v1::Abort ToProto(const AbortEvent& a) {
  v1::Abort p;
  if (a.first_failure) *p.mutable_first_failure() = ToProto(*a.first_failure);
  p.set_reason(a.reason);
  p.set_exit_code(a.exit_code);
  p.set_cause(CauseToProto(a.cause));
  return p;
}

AbortEvent FromProto(const v1::Abort& p) {
  AbortEvent a;
  if (p.has_first_failure()) a.first_failure = FromProto(p.first_failure());
  a.reason = p.reason();
  a.exit_code = p.exit_code();
  a.cause = CauseFromProto(p.cause());
  return a;
}

v1::JobStatus ToProto(const JobStatusView& j) {
  v1::JobStatus p;
  p.set_job_id(j.job_id);
  p.set_round(j.round);
  p.set_state(j.state);
  p.set_joined(j.joined);
  p.set_min_agents(j.min_agents);
  p.set_max_agents(j.max_agents);
  p.set_world_size(j.world_size);
  p.set_node_list(j.node_list);
  p.set_omitted_agents(j.omitted_agents);
  if (j.abort) *p.mutable_abort() = ToProto(*j.abort);
  for (const ExcludedNode& e : j.excluded) ToProto(e, *p.add_excluded());
  p.set_server(j.server);
  for (const AgentStatusView& a : j.agents) {
    v1::AgentStatus* ap = p.add_agents();
    ap->set_agent_id(a.agent_id);
    ap->set_host(a.host);
    ap->set_node_index(a.node_index);
    ap->set_nproc(a.nproc);
    ap->set_rank_offset(a.rank_offset);
    ap->set_state(a.state);
  }
  return p;
}

JobStatusView FromProto(const v1::JobStatus& p) {
  JobStatusView j;
  j.job_id = p.job_id();
  j.round = p.round();
  j.state = p.state();
  j.joined = p.joined();
  j.min_agents = p.min_agents();
  j.max_agents = p.max_agents();
  j.world_size = p.world_size();
  j.node_list = p.node_list();
  j.omitted_agents = p.omitted_agents();
  if (p.has_abort()) j.abort = FromProto(p.abort());
  for (const v1::ExcludedNode& e : p.excluded()) j.excluded.push_back(FromProto(e));
  j.server = p.server();
  for (const v1::AgentStatus& a : p.agents()) {
    j.agents.push_back(
        {a.agent_id(), a.host(), a.node_index(), a.nproc(), a.rank_offset(), a.state()});
  }
  return j;
}

ProgressEvent FromProto(const v1::Progress& p) {
  ProgressEvent e;
  e.joined = p.joined();
  e.expected = p.expected();
  e.joined_hosts.assign(p.joined_hosts().begin(), p.joined_hosts().end());
  e.missing_node_indices.assign(p.missing_node_indices().begin(), p.missing_node_indices().end());
  for (const v1::ExcludedNode& x : p.excluded()) e.excluded.push_back(FromProto(x));
  return e;
}

AssignmentEvent FromProto(const v1::Assignment& p) {
  AssignmentEvent a;
  a.round = p.round();
  a.slot.rank_offset = p.rank_offset();
  a.slot.group_rank = p.group_rank();
  a.slot.local_rank_offset = p.local_rank_offset();
  a.slot.local_world_size = p.local_world_size();
  a.world_size = p.world_size();
  a.group_world_size = p.group_world_size();
  a.master_addr = p.master_addr();
  a.master_port = p.master_port();
  a.restart_count = p.restart_count();
  a.agents = p.agents();
  a.longest_heartbeat_interval = MicrosFromMillis(p.longest_heartbeat_interval_ms());
  a.workers_per_node = p.workers_per_node();
  a.spare = p.spare();
  return a;
}

v1::Assignment ToProto(const AssignmentEvent& e) {
  v1::Assignment a;
  a.set_round(e.round);
  a.set_rank_offset(e.slot.rank_offset);
  a.set_world_size(e.world_size);
  a.set_group_rank(e.slot.group_rank);
  a.set_group_world_size(e.group_world_size);
  a.set_local_rank_offset(e.slot.local_rank_offset);
  a.set_local_world_size(e.slot.local_world_size);
  a.set_master_addr(e.master_addr);
  a.set_master_port(e.master_port);
  a.set_restart_count(e.restart_count);
  a.set_agents(e.agents);
  a.set_longest_heartbeat_interval_ms(e.longest_heartbeat_interval / 1000);
  a.set_workers_per_node(e.workers_per_node);
  a.set_spare(e.spare);
  return a;
}

v1::JoinEvent ToProto(const Event& event) {
  v1::JoinEvent out;
  std::visit(
      [&out](const auto& e) {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, ProgressEvent>) {
          v1::Progress* p = out.mutable_progress();
          p->set_joined(e.joined);
          p->set_expected(e.expected);
          for (const auto& h : e.joined_hosts) p->add_joined_hosts(h);
          for (int64_t i : e.missing_node_indices) p->add_missing_node_indices(i);
          for (const ExcludedNode& x : e.excluded) ToProto(x, *p->add_excluded());
        } else if constexpr (std::is_same_v<T, AssignmentEvent>) {
          *out.mutable_assignment() = ToProto(e);
        } else {
          *out.mutable_abort() = ToProto(e);
        }
      },
      event);
  return out;
}

}  // namespace rdzv
