#include "guard/core/credential_queue.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace rdzv {
namespace {

// Items that note their name when run.
struct Log {
  std::vector<std::string> ran;
  CredentialQueue::Item Note(std::string name) {
    return [this, name = std::move(name)] { ran.push_back(name); };
  }
};

void RunAll(CredentialQueue& q) {
  while (std::optional<CredentialQueue::Item> item = q.Pop()) (*item)();
}

TEST(CredentialQueueTest, SharesTakeTurnsAndEachKeepsItsOrder) {
  CredentialQueue q(CredentialQueue::Limits{});
  Log log;
  for (const char* name : {"a1", "a2", "a3"}) q.Push("uid:1", log.Note(name));
  q.Push("uid:2", log.Note("b1"));
  q.Push(CredentialQueue::kUnproven, log.Note("u1"));
  q.Push("uid:2", log.Note("b2"));
  RunAll(q);
  EXPECT_EQ(log.ran, (std::vector<std::string>{"a1", "b1", "u1", "a2", "b2", "a3"}));
  EXPECT_EQ(q.size(), 0u);
}

TEST(CredentialQueueTest, AFullShareRefusesOnlyItsOwn) {
  CredentialQueue::Limits limits;
  limits.total = 10;
  limits.per_user = 3;
  limits.unproven = 2;
  CredentialQueue q(limits);
  Log log;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(q.Push("uid:65534", log.Note("flood")), CredentialQueue::Pushed::kQueued);
  }
  EXPECT_EQ(q.Push("uid:65534", log.Note("flood")), CredentialQueue::Pushed::kShareFull);
  EXPECT_EQ(q.Push("uid:0", log.Note("root")), CredentialQueue::Pushed::kQueued);
  EXPECT_EQ(q.Push(CredentialQueue::kUnproven, log.Note("new")), CredentialQueue::Pushed::kQueued);
  EXPECT_EQ(q.Push(CredentialQueue::kUnproven, log.Note("new")), CredentialQueue::Pushed::kQueued);
  EXPECT_EQ(q.Push(CredentialQueue::kUnproven, log.Note("new")),
            CredentialQueue::Pushed::kShareFull);
  EXPECT_EQ(q.waiting("uid:65534"), 3u);
  EXPECT_EQ(q.waiting("uid:0"), 1u);
}

TEST(CredentialQueueTest, AllSharesTogetherAreBounded) {
  CredentialQueue::Limits limits;
  limits.total = 4;
  limits.per_user = 3;
  CredentialQueue q(limits);
  Log log;
  for (int i = 0; i < 3; ++i) q.Push("uid:1", log.Note("a"));
  EXPECT_EQ(q.Push("uid:2", log.Note("b")), CredentialQueue::Pushed::kQueued);
  EXPECT_EQ(q.Push("uid:3", log.Note("c")), CredentialQueue::Pushed::kFull);
  RunAll(q);
  EXPECT_EQ(q.Push("uid:3", log.Note("c")), CredentialQueue::Pushed::kQueued);
}

// While munged is slow, one user floods: its calls keep the decoders busy with its own share
// full, and another user's call is decoded after at most one of the flood's per share waiting.
// The old queue (one FIFO for all) ran it after the whole flood, or refused it once 20,000 were
// waiting.
TEST(CredentialQueueTest, AFloodDelaysOnlyItsOwnUsersCalls) {
  CredentialQueue q(CredentialQueue::Limits{});
  Log log;
  size_t refused = 0;
  for (int i = 0; i < 30'000; ++i) {
    if (q.Push("uid:65534", log.Note("flood")) != CredentialQueue::Pushed::kQueued) ++refused;
  }
  EXPECT_EQ(refused, 30'000u - CredentialQueue::Limits{}.per_user);
  // Another user's first call on a new connection, and a proven user's call.
  EXPECT_EQ(q.Push(CredentialQueue::kUnproven, log.Note("root-new")),
            CredentialQueue::Pushed::kQueued);
  EXPECT_EQ(q.Push("uid:0", log.Note("root")), CredentialQueue::Pushed::kQueued);
  // Decoders take items in turn while the flood goes on (each decode, another flood credential).
  size_t decoded = 0;
  size_t root_done = 0;
  while (root_done < 2 && decoded < 100) {
    std::optional<CredentialQueue::Item> item = q.Pop();
    ASSERT_TRUE(item.has_value());
    (*item)();
    ++decoded;
    if (log.ran.back() != "flood") ++root_done;
    q.Push("uid:65534", log.Note("flood"));
  }
  EXPECT_EQ(root_done, 2u);
  EXPECT_LE(decoded, 3u) << "the other user's calls waited behind the flood";
}

}  // namespace
}  // namespace rdzv
