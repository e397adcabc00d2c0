#include "server/event_batches.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/core/rendezvous_types.h"
#include "common/proto_convert.h"

namespace rdzv {
namespace {

v1::JoinEvent Assignment(int32_t rank) {
  AssignmentEvent a;
  a.round = 1;
  a.slot.rank_offset = rank;
  a.slot.group_rank = rank;
  a.slot.local_world_size = 1;
  a.world_size = 100'000;
  a.group_world_size = 100'000;
  a.master_addr = "gpu-node-00000.cluster.example";  // longer than a short string's own room
  a.master_port = 29500;
  a.agents = 100'000;
  a.workers_per_node = "1(x100000)";
  return ToProto(Event(a));
}

v1::JoinEvent Tagged(v1::JoinEvent event, const std::string& agent_id) {
  event.set_agent_id(agent_id);
  return event;
}

// What a group's stream carries, as its relay parses it off the wire.
v1::JoinEvent OverTheWire(const v1::JoinEvent& sent) {
  v1::JoinEvent read;
  EXPECT_TRUE(read.ParseFromString(sent.SerializeAsString()));
  return read;
}

TEST(EventBatchesTest, ABatchIsByteForByteTheMessageBuiltWhole) {
  EventBatches batches;
  v1::JoinEvent want;
  for (int rank = 0; rank < 64; ++rank) {
    const std::string agent_id = absl::StrCat("gpu-node-", rank, ":4242:0badf00d");
    batches.Add(7, Assignment(rank).SerializeAsString(), agent_id);
    *want.mutable_batch()->add_events() = Tagged(Assignment(rank), agent_id);
  }
  const std::vector<EventBatches::Message> messages = batches.Take();
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(messages[0].group, 7u);
  EXPECT_EQ(messages[0].event->SerializeAsString(), want.SerializeAsString());
  EXPECT_EQ(messages[0].bytes, static_cast<int64_t>(want.ByteSizeLong()));
  const v1::JoinEvent read = OverTheWire(*messages[0].event);
  ASSERT_EQ(read.batch().events_size(), 64);
  EXPECT_EQ(read.batch().events(63).agent_id(), "gpu-node-63:4242:0badf00d");
  EXPECT_EQ(read.batch().events(63).assignment().rank_offset(), 63);
  EXPECT_EQ(read.batch().events(63).assignment().master_addr(), "gpu-node-00000.cluster.example");
}

TEST(EventBatchesTest, ALoneEventGoesAsItself) {
  EventBatches batches;
  AbortEvent abort;
  abort.cause = AbortCause::kWorkerFailed;
  abort.reason = "rank 3 exited with code 1";
  const v1::JoinEvent event = ToProto(Event(abort));
  batches.Add(1, event.SerializeAsString(), "");
  batches.Add(2, Assignment(5).SerializeAsString(), "agent-5");
  const std::vector<EventBatches::Message> messages = batches.Take();
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(messages[0].group, 1u) << "in the order the groups got their first event";
  EXPECT_EQ(messages[0].event->SerializeAsString(), event.SerializeAsString());
  ASSERT_TRUE(messages[0].event->has_abort());
  EXPECT_EQ(messages[0].event->abort().reason(), "rank 3 exited with code 1");
  EXPECT_TRUE(messages[0].event->agent_id().empty());
  EXPECT_EQ(messages[1].event->agent_id(), "agent-5");
  EXPECT_EQ(messages[1].event->assignment().rank_offset(), 5);
  EXPECT_TRUE(batches.Take().empty()) << "Take empties it";
}

TEST(EventBatchesTest, KeepsEachGroupsOrder) {
  EventBatches batches;
  v1::JoinEvent end;
  end.mutable_member_end()->set_code(9);
  end.mutable_member_end()->set_message(std::string(300, 'x'));  // a two-byte length
  batches.Add(1, Assignment(0).SerializeAsString(), "a");
  batches.Add(2, Assignment(1).SerializeAsString(), "b");
  batches.Add(1, end.SerializeAsString(), "a");
  EXPECT_TRUE(batches.Has(1));
  EXPECT_FALSE(batches.Has(3));
  const std::vector<EventBatches::Message> messages = batches.Take();
  ASSERT_EQ(messages.size(), 2u);
  const v1::JoinEvent first = OverTheWire(*messages[0].event);
  ASSERT_EQ(first.batch().events_size(), 2);
  EXPECT_TRUE(first.batch().events(0).has_assignment());
  EXPECT_EQ(first.batch().events(1).member_end().message().size(), 300u);
  EXPECT_EQ(first.batch().events(1).agent_id(), "a");
  EXPECT_EQ(OverTheWire(*messages[1].event).agent_id(), "b");
}

}  // namespace
}  // namespace rdzv
