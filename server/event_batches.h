// EventBatches: the events one round of decisions sends to group streams (JoinRequest.members),
// gathered into one message per group, in order: its members' events as an EventBatch, or a lone
// event as itself.
//
// Each event is serialized as it is added, and a group's batch waits for its write as those bytes:
// a message whose body is the bytes of its `batch` field, kept as a field the message does not
// parse (its unknown fields), which serializes back to exactly what a JoinEvent with that batch
// would. A round of 100,000 agents in groups then waits as about 60 bytes a member rather than
// some 300 bytes of message objects, and makes no allocation per member.
//
// EventMessages: the messages of one round of decisions' events, each made once.
//
// Not thread-safe.
#ifndef RDZV_SERVER_EVENT_BATCHES_H_
#define RDZV_SERVER_EVENT_BATCHES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "common/core/rendezvous_state.h"
#include "rdzv/v1/rdzv.pb.h"

namespace rdzv {

class EventBatches {
 public:
  // Adds the event whose serialized form is `event` (a JoinEvent without agent_id and server) to
  // `group`'s batch, for its member `agent_id`, or for all its members when that is empty.
  void Add(StreamId group, absl::string_view event, absl::string_view agent_id);
  // Whether `group` has an event here.
  bool Has(StreamId group) const { return batches_.contains(group); }

  struct Message {
    StreamId group;
    std::shared_ptr<const v1::JoinEvent> event;
    int64_t bytes;  // serialized
  };
  // Every group's message, in the order the groups got their first event; empties this.
  std::vector<Message> Take();

 private:
  struct Batch {
    std::string bytes;  // the EventBatch's serialized body
    size_t first = 0;   // where the first event's own bytes start in `bytes`
    size_t events = 0;
  };
  absl::flat_hash_map<StreamId, Batch> batches_;
  std::vector<StreamId> order_;
};

// The messages of one round of decisions' events, each made once: one that every queue shares (an
// abort, progress) and its serialized bytes for group batches; for a round's assignments, the
// parts every member shares, which each member's copy starts from. Holds `decisions`, which must
// outlive it.
class EventMessages {
 public:
  explicit EventMessages(const Decisions& decisions)
      : decisions_(decisions),
        messages_(decisions.events.size()),
        bytes_(decisions.events.size()) {}

  const std::shared_ptr<const v1::JoinEvent>& Message(uint32_t event);
  int64_t Bytes(uint32_t event) { return static_cast<int64_t>(Serialized(event).size()); }
  const std::string& Serialized(uint32_t event);

  // `send`'s assignment, the round's message with the agent's own part, into `out` (cleared).
  void AssignmentInto(const Decisions::Send& send, v1::JoinEvent& out);

 private:
  const Decisions& decisions_;
  std::vector<std::shared_ptr<const v1::JoinEvent>> messages_;
  std::vector<std::string> bytes_;
};

}  // namespace rdzv

#endif  // RDZV_SERVER_EVENT_BATCHES_H_
