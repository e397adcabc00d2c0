#include "client/agent/core/relay_members.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace rdzv {

absl::Status RelayMembers::CheckJoin(const RelayJoin& join) const {
  if (join.job_id != options_.job_id || join.group) {
    return absl::NotFoundError(
        absl::StrFormat("this relay serves job %s, not %s", options_.job_id, join.job_id));
  }
  if (options_.nodes &&
      (join.node_index < options_.nodes->first || join.node_index > options_.nodes->second)) {
    return absl::NotFoundError(absl::StrFormat(
        "this relay serves nodes %d..%d of job %s, not node %d", options_.nodes->first,
        options_.nodes->second, options_.job_id, join.node_index));
  }
  return absl::OkStatus();
}

absl::StatusOr<MemberId> RelayMembers::Join(Micros now, const RelayJoin& join) {
  // The relay holds its group's joins, with room for each to come back once: a caller opening
  // more (a loop, or a process of the same user) is refused, not remembered.
  if (attached_ >= MaxHeld()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("this relay of job %s already holds %d joins for its %d agents; "
                        "start each agent once",
                        options_.job_id, attached_, options_.expected));
  }
  for (auto& [id, other] : members_) {
    if (other.attached && other.join.agent_id == join.agent_id) other.superseded = true;
  }
  const MemberId id = next_member_++;
  members_[id].join = join;
  ++attached_;
  pending_.push_back(id);
  if (pending_.size() == 1) {
    // A restart's agents come back as each has stopped its workers; after a lost server, all at
    // once, and their reconnect timeout may be short.
    const auto carried = carried_.find(join.agent_id);
    absl::Duration wait = options_.gather;
    if (carried != carried_.end()) {
      wait = carried->second == join.round ? std::min(options_.gather, options_.resume_gather)
                                           : options_.rejoin_gather;
    }
    due_at_ = now + absl::ToInt64Microseconds(wait);
  }
  return id;
}

RelayActions RelayMembers::Gone(MemberId id) {
  RelayActions actions;
  auto it = members_.find(id);
  if (it == members_.end() || !it->second.attached) return actions;
  Member& m = it->second;
  m.attached = false;
  --attached_;
  if (!m.group) {
    pending_.erase(std::remove(pending_.begin(), pending_.end(), id), pending_.end());
    // A join on its way up for members that are all gone (a server that does not answer would
    // hold it to the join timeout, and the relay's node with it) ends now.
    if (std::find(sending_.begin(), sending_.end(), id) != sending_.end() && AllGone(sending_)) {
      actions.push_back(relay_action::CancelSendingUp{});
    }
    Forget(id);
    return actions;
  }
  if (!m.ended && !m.superseded && !m.left) {
    // Its task ended without a word: the server hears that it is lost, as it would have from the
    // agent's own stream.
    m.ended = true;
    actions.emplace_back(std::in_place_type<relay_action::ReportLost>, m.join.agent_id);
  }
  MaybeRetire(*m.group, actions);
  return actions;
}

absl::Status RelayMembers::Leave(absl::string_view job_id, absl::string_view agent_id) {
  if (job_id != options_.job_id) {
    return absl::NotFoundError(
        absl::StrFormat("this relay serves job %s, not %s", options_.job_id, job_id));
  }
  for (auto& [id, m] : members_) {
    if (m.attached && m.join.agent_id == agent_id && !m.superseded) m.left = true;
  }
  return absl::OkStatus();
}

absl::Status RelayMembers::CheckReportExit(absl::string_view job_id, bool member_lost) const {
  if (job_id != options_.job_id || member_lost) {
    return absl::InvalidArgumentError(
        "the node's relay forwards its own job's failure reports only");
  }
  return absl::OkStatus();
}

bool RelayMembers::Due(Micros now) const {
  return !pending_.empty() &&
         (static_cast<int>(pending_.size() + Up()) >= options_.expected || now >= due_at_);
}

std::vector<MemberId> RelayMembers::TakeBatch(Micros now) {
  std::vector<MemberId> batch = std::move(pending_);
  pending_.clear();
  due_at_ = kNever;
  batch.erase(std::remove_if(batch.begin(), batch.end(),
                             [this](MemberId id) {
                               const Member& m = members_.at(id);
                               return !m.attached || m.superseded;
                             }),
              batch.end());
  if (batch.empty()) return batch;
  // The server takes at most max_group joins in one group: the rest go up next, at once.
  if (batch.size() > options_.max_group) {
    pending_.assign(batch.begin() + static_cast<ptrdiff_t>(options_.max_group), batch.end());
    batch.resize(options_.max_group);
    due_at_ = now;
  }
  // In task (or node) order: should the relay's own agent (the node's first task, the group's
  // first node) die, taking the group's stream with it, the server names it, the first member it
  // finds lost.
  std::stable_sort(batch.begin(), batch.end(), [this](MemberId a, MemberId b) {
    const RelayJoin& x = members_.at(a).join;
    const RelayJoin& y = members_.at(b).join;
    return std::make_pair(x.order, x.node_index) < std::make_pair(y.order, y.node_index);
  });
  for (MemberId id : batch) {
    const RelayJoin& j = members_.at(id).join;
    // Bounded: the node's tasks, each by its one agent id, and a margin for stray joins.
    if (carried_.size() < MaxHeld() || carried_.contains(j.agent_id)) {
      carried_[j.agent_id] = j.round;
    }
  }
  return batch;
}

bool RelayMembers::AllGone(const std::vector<MemberId>& batch) const {
  return std::all_of(batch.begin(), batch.end(), [this](MemberId id) {
    auto it = members_.find(id);
    return it == members_.end() || !it->second.attached;
  });
}

RelayActions RelayMembers::WentUp(GroupId group, const std::vector<MemberId>& batch) {
  RelayActions actions;
  for (MemberId id : batch) {
    Member& m = members_.at(id);
    m.group = group;
    // Its task ended while the batch was on its way: the server hears it is lost.
    if (!m.attached && !m.ended) {
      m.ended = true;
      actions.emplace_back(std::in_place_type<relay_action::ReportLost>, m.join.agent_id);
    }
  }
  groups_[group] = batch;
  return actions;
}

RelayActions RelayMembers::Failed(const std::vector<MemberId>& batch, const absl::Status& status) {
  RelayActions actions;
  for (MemberId id : batch) {
    Member& m = members_.at(id);
    if (m.attached && !m.ended)
      actions.emplace_back(std::in_place_type<relay_action::End>, id, status);
    m.ended = true;
  }
  for (MemberId id : batch) Forget(id);
  return actions;
}

RelayActions RelayMembers::Event(GroupId group, absl::string_view agent_id,
                                 const std::optional<absl::Status>& member_end) {
  RelayActions actions;
  auto it = groups_.find(group);
  if (it == groups_.end()) return actions;
  for (MemberId id : it->second) {
    Member& m = members_.at(id);
    if (m.group != group || m.superseded) continue;
    const bool listening = m.attached && !m.ended;
    if (agent_id.empty()) {
      // Progress, or the job's abort: the same for every member still on the stream.
      if (listening) actions.push_back(relay_action::Push{id});
      continue;
    }
    if (m.join.agent_id != agent_id) continue;
    if (member_end) {
      if (listening) {
        actions.emplace_back(
            std::in_place_type<relay_action::End>, id,
            absl::Status(member_end->code(), absl::StrCat(kRelaySaid, member_end->message())));
      }
      m.ended = true;
      MaybeRetire(group, actions);
    } else if (listening) {
      actions.push_back(relay_action::Push{id});
    }
    break;
  }
  return actions;
}

RelayActions RelayMembers::GroupEnded(GroupId group, const absl::Status& status) {
  RelayActions actions;
  auto it = groups_.find(group);
  if (it == groups_.end()) return actions;
  // Said by the relay, which lives: the members ask it again (RelayedRendezvous).
  absl::Status for_members = status;
  if (status.code() == absl::StatusCode::kCancelled ||
      status.code() == absl::StatusCode::kNotFound) {
    for_members = absl::UnavailableError(
        absl::StrCat(kRelaySaid, "it lost its stream to the server (", status.message(), ")"));
  } else if (!status.ok()) {
    for_members = absl::Status(status.code(), absl::StrCat(kRelaySaid, status.message()));
  }
  const std::vector<MemberId> members = std::move(it->second);
  groups_.erase(it);
  for (MemberId id : members) {
    Member& m = members_.at(id);
    if (m.group != group) continue;
    m.group.reset();
    if (m.superseded || m.ended) continue;
    if (m.attached) actions.emplace_back(std::in_place_type<relay_action::End>, id, for_members);
    m.ended = true;
  }
  for (MemberId id : members) Forget(id);
  return actions;
}

std::vector<GroupId> RelayMembers::groups() const {
  std::vector<GroupId> ids;
  for (const auto& [id, members] : groups_) ids.push_back(id);
  return ids;
}

size_t RelayMembers::Up() const {
  if (pending_.empty()) return 0;
  const int32_t round = members_.at(pending_.front()).join.round;
  size_t up = 0;
  for (const auto& [id, m] : members_) {
    if (m.attached && m.group && !m.ended && !m.superseded && m.join.round == round) ++up;
  }
  return up;
}

void RelayMembers::MaybeRetire(GroupId group, RelayActions& actions) const {
  auto it = groups_.find(group);
  if (it == groups_.end()) return;
  for (MemberId id : it->second) {
    const Member& m = members_.at(id);
    if (m.group == group && !m.ended && !m.superseded) return;
  }
  actions.push_back(relay_action::CancelGroup{group});
}

void RelayMembers::Forget(MemberId id) {
  auto it = members_.find(id);
  if (it == members_.end() || it->second.attached || it->second.group) return;
  if (std::find(sending_.begin(), sending_.end(), id) != sending_.end()) return;
  members_.erase(it);
}

}  // namespace rdzv
