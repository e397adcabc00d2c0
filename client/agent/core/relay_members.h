// RelayMembers: what a node's relay (client/agent/node_relay.h) decides, apart from its sockets
// and threads: which agents it holds, when their joins go up to the server as one group join and
// in what order, what each member hears when the server says something of it or the group stream
// ends, which members the server must hear are lost, and when a group stream carries nobody any
// more.
//
// A member is one agent's join on the relay's local server (MemberId, from Join); a group is one
// group stream to the server (GroupId, the shell's). The shell turns what happens into the calls
// below and carries out the actions they return (RelayActions), one Do() each, under one lock.
//
// The rules:
//   - A batch goes up once the waiting joins, with the members of their round already up, make
//     the node (`expected`), or once the first of them has waited its gather time: `gather` for a
//     first join, `rejoin_gather` for an agent whose join went up in an earlier round (a restart:
//     the others stop their workers before they come back), and at most `resume_gather` for one
//     that comes back in the same round (the server was lost: all heard it at once).
//   - A batch holds at most max_group joins; the rest go up next, at once. Members go up in task
//     order, then node order, so that the server names the first member it finds lost.
//   - The relay holds the joins of its agents, each once more, and a margin (MaxHeld); more are
//     refused. An agent that joins again supersedes its earlier join, which hears nothing more.
//   - A member whose local stream goes before it ended is reported lost to the server, as its own
//     dropped stream would have been; a group stream none of whose members is still on it is
//     cancelled, and so is a batch on its way up whose members are all gone.
//
// Pure: no clock (the time is passed in, in microseconds of a steady clock), no I/O, no threads.
// Not thread-safe.
#ifndef RDZV_CLIENT_AGENT_CORE_RELAY_MEMBERS_H_
#define RDZV_CLIENT_AGENT_CORE_RELAY_MEMBERS_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/core/rendezvous_types.h"

namespace rdzv {

// How the message of every status a live relay ends a member's stream with begins, its own or
// the server's passed on (a refusal, or an earlier round's stream ended as a new one starts): a
// member that loses its stream with any other status lost the relay (its task died or froze),
// and rejoins directly.
inline constexpr absl::string_view kRelaySaid = "through this node's relay: ";

using MemberId = uint64_t;
using GroupId = uint64_t;

// What the relay decides on of a local join (rdzv.v1 JoinRequest).
struct RelayJoin {
  std::string job_id;
  std::string agent_id;
  int64_t node_index = 0;
  int64_t order = 0;   // the task's place in the job
  int32_t round = 0;   // restart_count
  bool group = false;  // it carries members of its own
};

namespace relay_action {

// Hand the server's event at hand to the member's local stream.
struct Push {
  MemberId member;
};
// End the member's local stream with `status`.
struct End {
  End(MemberId member, absl::Status status) : member(member), status(std::move(status)) {}
  MemberId member;
  absl::Status status;
};
// Tell the server that agent `agent_id` of this relay is lost (ReportExitRequest.member_lost).
struct ReportLost {
  explicit ReportLost(std::string agent_id) : agent_id(std::move(agent_id)) {}
  std::string agent_id;
};
// Cancel the group stream: it carries no member any more.
struct CancelGroup {
  GroupId group;
};
// Cancel the batch on its way up: its members are all gone.
struct CancelSendingUp {};

}  // namespace relay_action

using RelayAction = std::variant<relay_action::Push, relay_action::End, relay_action::ReportLost,
                                 relay_action::CancelGroup, relay_action::CancelSendingUp>;
using RelayActions = std::vector<RelayAction>;

class RelayMembers {
 public:
  struct Options {
    std::string job_id;  // the job the relay serves
    int expected = 1;    // the node's tasks (or the group's nodes)
    // A relay of a group of nodes serves these nodes only; a node's relay, any.
    std::optional<std::pair<int64_t, int64_t>> nodes;
    absl::Duration gather = absl::Milliseconds(500);
    absl::Duration rejoin_gather = absl::Seconds(5);
    absl::Duration resume_gather = absl::Milliseconds(200);
    size_t max_group = 512;  // joins one group join may carry
  };
  static constexpr Micros kNever = std::numeric_limits<Micros>::max();

  explicit RelayMembers(Options options) : options_(std::move(options)) {}

  // Whether `join` is for this relay: NotFound, as from a server of another job, for another job,
  // a group join, or (a group's relay) a node outside the group.
  absl::Status CheckJoin(const RelayJoin& join) const;
  // Holds `join` (which CheckJoin accepted) until its batch goes up: its member, or
  // ResourceExhausted past the joins the relay holds. The same agent's earlier joins are
  // superseded.
  absl::StatusOr<MemberId> Join(Micros now, const RelayJoin& join);
  // The member's local stream is gone.
  RelayActions Gone(MemberId member);
  // A Leave of `agent_id` goes up (the end of its stream is then no loss); NotFound for another
  // job.
  absl::Status Leave(absl::string_view job_id, absl::string_view agent_id);
  // Whether a failure report may go up: one of this job's, not a loss (which the relay reports
  // itself). InvalidArgument otherwise.
  absl::Status CheckReportExit(absl::string_view job_id, bool member_lost) const;

  // Whether the waiting joins go up now, and when they go at the latest (kNever: none waits).
  bool Due(Micros now) const;
  Micros due_at() const { return pending_.empty() ? kNever : due_at_; }
  // The waiting joins as one batch in the order the server is to see them; the rest wait for the
  // next batch, which is due at once. Empty when none waits that is still there.
  std::vector<MemberId> TakeBatch(Micros now);
  const RelayJoin& join(MemberId member) const { return members_.at(member).join; }

  // `batch` is on its way up (SendingUp), or no longer (NotSendingUp). Gone cancels it once its
  // members are all gone.
  void SendingUp(std::vector<MemberId> batch) { sending_ = std::move(batch); }
  void NotSendingUp() { sending_.clear(); }
  // Whether every member of `batch` is gone.
  bool AllGone(const std::vector<MemberId>& batch) const;
  // `batch` went up on group stream `group`; the members gone meanwhile are reported lost.
  RelayActions WentUp(GroupId group, const std::vector<MemberId>& batch);
  // `batch` could not go up: its members hear `status`.
  RelayActions Failed(const std::vector<MemberId>& batch, const absl::Status& status);

  // An event of group stream `group`: for every member on it (`agent_id` ""), or for one agent,
  // which `member_end` ends.
  RelayActions Event(GroupId group, absl::string_view agent_id,
                     const std::optional<absl::Status>& member_end);
  // Group stream `group` ended with `status`: its members hear it as the relay's word.
  RelayActions GroupEnded(GroupId group, const absl::Status& status);

  // The group streams that carry members now.
  std::vector<GroupId> groups() const;
  // No member is attached and none waits.
  bool Idle() const { return attached_ == 0 && pending_.empty(); }

 private:
  struct Member {
    RelayJoin join;
    bool attached = true;          // its local stream is there
    std::optional<GroupId> group;  // the group stream it went up on
    bool ended = false;            // its local stream is finished, or its loss reported
    bool superseded = false;       // the same agent joined again on another local stream
    bool left = false;             // its Leave went up
  };

  // The joins the relay holds at most: its agents', each once more, and a margin.
  size_t MaxHeld() const { return static_cast<size_t>(options_.expected) * 2 + 16; }
  // The members of the first waiting member's round that went up already and are still carried:
  // with the waiting ones, they may make the whole node.
  size_t Up() const;
  // Cancels `group` once no member is still on it.
  void MaybeRetire(GroupId group, RelayActions& actions) const;
  // Forgets `member` once nothing refers to it any more.
  void Forget(MemberId member);

  const Options options_;
  std::map<MemberId, Member> members_;
  MemberId next_member_ = 1;
  size_t attached_ = 0;
  std::vector<MemberId> pending_;
  Micros due_at_ = kNever;
  // The agents whose joins went up before, with the round they went up in: one of them joining
  // again in a later round is a restart, in the same round a resume.
  absl::flat_hash_map<std::string, int32_t> carried_;
  absl::flat_hash_map<GroupId, std::vector<MemberId>> groups_;
  std::vector<MemberId> sending_;
};

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_CORE_RELAY_MEMBERS_H_
