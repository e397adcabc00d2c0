#include "server/event_batches.h"

#include <google/protobuf/unknown_field_set.h>

#include "common/proto_convert.h"

namespace rdzv {
namespace {

// Protobuf's wire format: a field's tag (its number and wire type 2, length-delimited), then
// its length as a base-128 varint, then its bytes.
void AppendVarint(std::string& out, uint64_t n) {
  while (n >= 0x80) {
    out.push_back(static_cast<char>((n & 0x7f) | 0x80));
    n >>= 7;
  }
  out.push_back(static_cast<char>(n));
}

void AppendLengthDelimited(std::string& out, int field, absl::string_view bytes) {
  AppendVarint(out, (static_cast<uint64_t>(field) << 3) | 2);
  AppendVarint(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}

size_t VarintBytes(uint64_t n) {
  size_t bytes = 1;
  while (n >= 0x80) {
    n >>= 7;
    ++bytes;
  }
  return bytes;
}

}  // namespace

void EventBatches::Add(StreamId group, absl::string_view event, absl::string_view agent_id) {
  auto [it, fresh] = batches_.try_emplace(group);
  if (fresh) order_.push_back(group);
  Batch& batch = it->second;
  // The event's fields come before agent_id (field 6) in field-number order, as protobuf
  // writes them, so that the bytes are those of the JoinEvent with agent_id set.
  const size_t tag_bytes = VarintBytes(v1::JoinEvent::kAgentIdFieldNumber << 3);
  const size_t size =
      event.size() +
      (agent_id.empty() ? 0 : tag_bytes + VarintBytes(agent_id.size()) + agent_id.size());
  AppendVarint(batch.bytes, (v1::EventBatch::kEventsFieldNumber << 3) | 2);
  AppendVarint(batch.bytes, size);
  if (batch.events++ == 0) batch.first = batch.bytes.size();
  batch.bytes.append(event.data(), event.size());
  if (!agent_id.empty()) {
    AppendLengthDelimited(batch.bytes, v1::JoinEvent::kAgentIdFieldNumber, agent_id);
  }
}

std::vector<EventBatches::Message> EventBatches::Take() {
  std::vector<Message> messages;
  messages.reserve(order_.size());
  for (const StreamId group : order_) {
    Batch& batch = batches_[group];
    auto message = std::make_shared<v1::JoinEvent>();
    if (batch.events == 1) {
      // A lone event goes as itself.
      message->ParseFromArray(batch.bytes.data() + batch.first,
                              static_cast<int>(batch.bytes.size() - batch.first));
    } else {
      message->GetReflection()
          ->MutableUnknownFields(message.get())
          ->AddLengthDelimited(v1::JoinEvent::kBatchFieldNumber)
          ->swap(batch.bytes);
    }
    const auto bytes = static_cast<int64_t>(message->ByteSizeLong());
    messages.push_back({group, std::move(message), bytes});
  }
  batches_.clear();
  order_.clear();
  return messages;
}

const std::shared_ptr<const v1::JoinEvent>& EventMessages::Message(uint32_t event) {
  if (messages_[event] == nullptr) {
    messages_[event] = std::make_shared<const v1::JoinEvent>(ToProto(decisions_.events[event]));
  }
  return messages_[event];
}

const std::string& EventMessages::Serialized(uint32_t event) {
  if (bytes_[event].empty()) bytes_[event] = Message(event)->SerializeAsString();
  return bytes_[event];
}

void EventMessages::AssignmentInto(const Decisions::Send& send, v1::JoinEvent& out) {
  out.Clear();
  v1::Assignment* a = out.mutable_assignment();
  *a = Message(send.event)->assignment();
  a->set_rank_offset(send.slot.rank_offset);
  a->set_group_rank(send.slot.group_rank);
  a->set_local_rank_offset(send.slot.local_rank_offset);
  a->set_local_world_size(send.slot.local_world_size);
  a->set_spare(send.spare);
}

}  // namespace rdzv
