#include "common/core/join_validation.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"

namespace rdzv {

namespace {

// Why the assignment `spec` resumes cannot be one this server handed out, or "".
std::string ImpossibleResume(const JoinSpec& spec) {
  const AssignmentEvent& r = *spec.resume;
  const Slot& slot = r.slot;
  if (r.spare && slot != Slot{}) return "a spare's, with ranks";
  if (r.spare && spec.spare_nodes < 1) return "a spare's, in a job without --spare-nodes";
  const int64_t last_rank = int64_t{slot.rank_offset} + spec.agent.nproc - 1;
  const int64_t last_local = int64_t{slot.local_rank_offset} + spec.agent.nproc - 1;
  if (r.round < 1) return absl::StrFormat("round %d", r.round);
  if (r.agents < 1 || r.agents > spec.max_agents) {
    return absl::StrFormat("%d agents where --nnodes allows %d", r.agents, spec.max_agents);
  }
  if (r.group_world_size < 1 || r.group_world_size > r.agents) {
    return absl::StrFormat("%d nodes for %d agents", r.group_world_size, r.agents);
  }
  if (!r.spare && (slot.group_rank < 0 || slot.group_rank >= r.group_world_size)) {
    return absl::StrFormat("node %d of %d", slot.group_rank, r.group_world_size);
  }
  if (!r.spare && (slot.rank_offset < 0 || last_rank >= r.world_size)) {
    return absl::StrFormat("ranks %d-%d of world size %d", slot.rank_offset, last_rank,
                           r.world_size);
  }
  if (!r.spare && (slot.local_rank_offset < 0 || last_local >= slot.local_world_size ||
                   slot.local_world_size > r.world_size)) {
    return absl::StrFormat("local ranks %d-%d of %d on its node", slot.local_rank_offset,
                           last_local, slot.local_world_size);
  }
  if (r.master_port < 0 || r.master_port > 65535) {
    return absl::StrFormat("master port %d", r.master_port);
  }
  if (r.restart_count < 0) return absl::StrFormat("restart count %d", r.restart_count);
  if (r.longest_heartbeat_interval < 0 || r.longest_heartbeat_interval > kMaxJoinSpan) {
    return absl::StrFormat("a heartbeat interval of %d us", r.longest_heartbeat_interval);
  }
  return "";
}

// --nnodes as a user gives it: MIN:MAX, or N when they are the same.
std::string SizeText(int32_t min, int32_t max) {
  return min == max ? absl::StrFormat("%d", max) : absl::StrFormat("%d:%d", min, max);
}

// One line for a duration from the wire, whatever its value.
std::string Span(Micros span) { return absl::FormatDuration(absl::Microseconds(span)); }

absl::Status OutOfRange(absl::string_view what, int64_t value, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrFormat("%s is %d; expected %s", what, value, expected));
}

}  // namespace

absl::Status ValidateJoinSpec(const JoinSpec& spec) {
  if (spec.job_id.empty()) return absl::InvalidArgumentError("the job id is empty; pass --rdzv-id");
  if (spec.agent.agent_id.empty()) return absl::InvalidArgumentError("the agent id is empty");
  const AgentSpec& agent = spec.agent;
  if (agent.nproc < 1 || agent.nproc > kMaxWorkersPerAgent) {
    return OutOfRange("--nproc-per-node", agent.nproc,
                      absl::StrFormat("1 to %d", kMaxWorkersPerAgent));
  }
  if (spec.min_agents < 1 || spec.max_agents < spec.min_agents) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--nnodes %d:%d is not a valid range; expected 1 <= MIN <= MAX",
                        spec.min_agents, spec.max_agents));
  }
  // Ranks are 32-bit in torch and on the wire. No agent of the job runs more workers than
  // --nnodes times its own count allows, so the job's world fits once every agent's does.
  const int64_t world = int64_t{agent.nproc} * spec.max_agents;
  if (world > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d agents of %d workers each make %d ranks, over the limit of %d; lower --nnodes or "
        "--nproc-per-node",
        spec.max_agents, agent.nproc, world, std::numeric_limits<int32_t>::max()));
  }
  if (agent.order < -1 || agent.order >= spec.max_agents) {
    return absl::InvalidArgumentError(
        absl::StrFormat("global position %d is out of range for %d agents; expected 0..%d",
                        agent.order, spec.max_agents, spec.max_agents - 1));
  }
  // A node holds at least one agent, so there are never more nodes than agents.
  if (agent.node_index < -1 || agent.node_index >= spec.max_agents) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--node-rank %d is out of range for %d nodes; expected 0..%d",
                        agent.node_index, spec.max_agents, spec.max_agents - 1));
  }
  if (spec.last_call < 0 || spec.last_call > kMaxJoinSpan) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--last-call (last_call_ms) is %s; expected 0 to 365 days", Span(spec.last_call)));
  }
  if (spec.master_port < 0 || spec.master_port > 65535) {
    return OutOfRange("the master port", spec.master_port, "0 to 65535");
  }
  if (spec.master_port_override < 0 || spec.master_port_override > 65535) {
    return OutOfRange("--master-port", spec.master_port_override, "1 to 65535, or 0 for none");
  }
  if (spec.restart_count < 0) return OutOfRange("the restart count", spec.restart_count, ">= 0");
  if (spec.max_restarts && *spec.max_restarts < 0) {
    return OutOfRange("--max-restarts", *spec.max_restarts, ">= 0");
  }
  if (spec.longest_heartbeat_interval < 0 || spec.longest_heartbeat_interval > kMaxJoinSpan) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the longest heartbeat interval is %s; expected 0 to 365 days",
                        Span(spec.longest_heartbeat_interval)));
  }
  if (spec.spare_nodes < 0 || spec.spare_nodes >= spec.max_agents) {
    return OutOfRange("--spare-nodes", spec.spare_nodes,
                      absl::StrFormat("0 to %d (fewer than the job's %d nodes)",
                                      spec.max_agents - 1, spec.max_agents));
  }
  if (spec.spare_nodes > 0 && (agent.node_index < 0 || agent.order >= 0)) {
    return absl::InvalidArgumentError(
        "--spare-nodes needs one agent per node with its node rank: launch one task per node "
        "(srun --ntasks-per-node=1), or pass --node-rank to every agent");
  }
  if (spec.unhealthy) {
    const auto kind = static_cast<int32_t>(spec.unhealthy->kind);
    if (!AgentMayReport(spec.unhealthy->kind)) {
      return OutOfRange("the health check's kind", kind, "1 to 8 but 6");
    }
    if (spec.unhealthy->detail.size() > kMaxUnhealthyDetailBytes) {
      return OutOfRange("the health check's line (bytes)",
                        static_cast<int64_t>(spec.unhealthy->detail.size()),
                        absl::StrFormat("at most %d", kMaxUnhealthyDetailBytes));
    }
    for (const char c : spec.unhealthy->detail) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
        return absl::InvalidArgumentError(
            "the health check's line holds a control character; send printable text");
      }
    }
    if (spec.resume) {
      return absl::InvalidArgumentError("a join cannot both resume and report its node unhealthy");
    }
  }
  if (spec.resume) {
    if (const std::string why = ImpossibleResume(spec); !why.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "agent %s asks back into an assignment that no rendezvous hands out (%s); stop the "
          "agent and restart the job",
          agent.agent_id, why));
    }
  }
  return absl::OkStatus();
}

// A member's shape is fixed once it has joined: its place among the claims and its ranks were
// (or will be) worked out from it. A join under the same agent id that changes it would take
// the member's place with a different shape, so it is refused, naming both values.
absl::Status SameShape(const std::string& job_id, absl::string_view agent_id,
                       const AgentRecord& held, const AgentSpec& asked) {
  const auto refuse = [&](absl::string_view flag, int64_t was, int64_t now) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "agent %s already joined job %s with %s %d and now asks for %d; rejoin with %s %d, or "
        "give a launcher of another shape its own agent id",
        agent_id, job_id, flag, was, now, flag, was));
  };
  if (asked.nproc != held.nproc) return refuse("--nproc-per-node", held.nproc, asked.nproc);
  if (asked.node_index != held.node_index) {
    return refuse("--node-rank", held.node_index, asked.node_index);
  }
  if (asked.order != held.order) return refuse("global position", held.order, asked.order);
  return absl::OkStatus();
}

// Ranks are assigned by node rank when the agents give one, else by host name; by global
// position when they have one (one agent per task). A job's agents must agree on both, so a
// newcomer that does not is refused, naming the agent it disagrees with; `other` is any member.
absl::Status SameRanking(const std::string& job_id, int32_t spare_nodes, const RankInput& other,
                         const AgentSpec& asked) {
  if ((asked.node_index >= 0) != (other.node_index >= 0)) {
    const auto gives = [](int64_t node_index) {
      return node_index >= 0 ? absl::StrFormat("gives --node-rank %d", node_index)
                             : std::string("gives no --node-rank");
    };
    return absl::FailedPreconditionError(absl::StrFormat(
        "the agent on %s %s, but the agent on %s, already in job %s, %s; pass --node-rank to "
        "every agent of the job or to none",
        asked.host, gives(asked.node_index), other.host, job_id, gives(other.node_index)));
  }
  if ((asked.order >= 0) != (other.order >= 0)) {
    const auto has = [](int64_t order) {
      return order >= 0 ? "has a global position (one agent per task)"
                        : "has no global position (one agent per node)";
    };
    return absl::FailedPreconditionError(absl::StrFormat(
        "the agent on %s %s, but the agent on %s, already in job %s, %s; run every agent of the "
        "job in the same --mode",
        asked.host, has(asked.order), other.host, job_id, has(other.order)));
  }
  if (spare_nodes > 0 && other.nproc != asked.nproc) {
    // A spare takes a lost node's ranks one for one, so the nodes after it keep theirs.
    return absl::FailedPreconditionError(absl::StrFormat(
        "the agent on %s runs %d workers but the agent on %s, already in job %s, runs %d; with "
        "--spare-nodes every node runs the same --nproc-per-node",
        asked.host, asked.nproc, other.host, job_id, other.nproc));
  }
  return absl::OkStatus();
}

// The refusal of a resuming agent whose workers run with `claimed` where the job has `actual`.
absl::Status ForeignWorkers(const std::string& host, int32_t round, const std::string& job_id,
                            const std::string& claimed, const std::string& actual) {
  return absl::FailedPreconditionError(absl::StrFormat(
      "the agent on %s rejoins round %d of job %s with %s, but %s; its workers are not this "
      "job's: stop it, or restart the job",
      host, round, job_id, claimed, actual));
}

// A resuming agent's claim against the round the job runs (`runs`, as the first agent back
// brought it, with the job's restart count): workers of another master or size are not this
// job's, and must not change it for the others.
absl::Status SameRun(const std::string& job_id, const AssignmentEvent& runs,
                     const AssignmentEvent& held, const std::string& host) {
  const auto refuse = [&](const std::string& claimed, const std::string& held_by_job) {
    return ForeignWorkers(host, held.round, job_id, claimed,
                          absl::StrCat("the job runs with ", held_by_job));
  };
  const auto master = [](const AssignmentEvent& a) {
    return absl::StrFormat("master %s:%d", a.master_addr, a.master_port);
  };
  if (held.master_addr != runs.master_addr || held.master_port != runs.master_port) {
    return refuse(master(held), master(runs));
  }
  if (held.restart_count != runs.restart_count) {
    return refuse(absl::StrFormat("restart count %d", held.restart_count),
                  absl::StrFormat("restart count %d", runs.restart_count));
  }
  if (held.group_world_size != runs.group_world_size || held.agents != runs.agents) {
    return refuse(absl::StrFormat("%d nodes of %d agents", held.group_world_size, held.agents),
                  absl::StrFormat("%d nodes of %d agents", runs.group_world_size, runs.agents));
  }
  return absl::OkStatus();
}
absl::Status SameSizes(const std::string& job_id, const JobTerms& terms, const JoinSpec& spec) {
  if (terms.spare_nodes != spec.spare_nodes) {
    return absl::FailedPreconditionError(
        absl::StrFormat("this agent has --spare-nodes %d but job %s was started with "
                        "--spare-nodes %d; give every agent the same",
                        spec.spare_nodes, job_id, terms.spare_nodes));
  }
  if (terms.min_agents != spec.min_agents || terms.max_agents != spec.max_agents) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "this agent expects --nnodes %s but job %s was started with --nnodes %s; give every "
        "agent the same --nnodes",
        SizeText(spec.min_agents, spec.max_agents), job_id,
        SizeText(terms.min_agents, terms.max_agents)));
  }
  return absl::OkStatus();
}

absl::Status SameMaxRestarts(const std::string& job_id, const JobTerms& terms,
                             const JoinSpec& spec) {
  if (spec.max_restarts && terms.max_restarts && *spec.max_restarts != *terms.max_restarts) {
    return absl::FailedPreconditionError(
        absl::StrFormat("this agent has --max-restarts %d but job %s was started with "
                        "--max-restarts %d; give every agent the same --max-restarts",
                        *spec.max_restarts, job_id, *terms.max_restarts));
  }
  return absl::OkStatus();
}

absl::Status MasterDiffers(const JoinSpec& spec, absl::string_view other_host,
                           absl::string_view addr, int32_t port) {
  return absl::FailedPreconditionError(absl::StrFormat(
      "the agent on %s sets the master to %s:%d but the agent on %s set %s:%d; give every agent "
      "the same --master-addr and --master-port, or none",
      spec.agent.host, spec.master_addr_override, spec.master_port_override, other_host, addr,
      port));
}

absl::Status ClaimTaken(const std::string& job_id, const AgentSpec& agent, int64_t claim,
                        absl::string_view holder_host) {
  return absl::FailedPreconditionError(
      absl::StrFormat("%s %d of job %s is already taken by the agent on %s; give each %s its own",
                      agent.order >= 0 ? "global position" : "node rank", claim, job_id,
                      holder_host, agent.order >= 0 ? "agent" : "node --node-rank"));
}

absl::Status OneTooMany(const std::string& job_id, int32_t agents, absl::string_view host) {
  return absl::FailedPreconditionError(absl::StrFormat(
      "job %s already has all %d agents; this agent on %s is one too many: check --nnodes", job_id,
      agents, host));
}

absl::Status TooLate(const std::string& job_id, int32_t round, int32_t agents,
                     absl::string_view host) {
  return absl::FailedPreconditionError(absl::StrFormat(
      "job %s already started (round %d, %d agents); this agent on %s came too late: check "
      "--nnodes, and that the job id is not reused",
      job_id, round, agents, host));
}

absl::Status SameRanks(const std::string& job_id, const AgentRecord& member,
                       const AssignmentEvent& held, const std::string& host) {
  if (member.spare == held.spare && (held.spare || member.slot == held.slot)) {
    return absl::OkStatus();
  }
  // Its workers run other ranks than the job gave it (an assignment of an earlier run of the
  // same job id), or it claims ranks as a spare or none as a node: they are not this run's.
  const auto ranks = [](bool spare, const Slot& slot) {
    return spare ? std::string("no ranks (a spare)") : absl::StrFormat("rank %d", slot.rank_offset);
  };
  return ForeignWorkers(host, held.round, job_id, ranks(held.spare, held.slot),
                        absl::StrCat("the job gave it ", ranks(member.spare, member.slot)));
}

}  // namespace rdzv
