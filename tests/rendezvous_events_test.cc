// The rendezvous state machine under sequences of protocol events (tests/fuzz/
// rendezvous_events.h checks its invariants after each): the fuzzer's seed corpus and every
// input it ever found a violation with (kept in the same directory), and a fixed sweep of
// pseudo-random sequences so that the invariants are checked on every build, fuzzer or not.
#include "tests/fuzz/rendezvous_events.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace rdzv {
namespace {

std::string RunEvents(const std::string& bytes) {
  return RunRendezvousEvents(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

TEST(RendezvousEventsTest, CorpusAndFindingsHoldTheInvariants) {
  const std::filesystem::path dir =
      std::filesystem::path(RDZV_SOURCE_DIR) / "tests/fuzz/corpus/rendezvous_events";
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream file(entry.path(), std::ios::binary);
    std::stringstream bytes;
    bytes << file.rdbuf();
    EXPECT_EQ(RunEvents(bytes.str()), "") << entry.path();
    ++files;
  }
  EXPECT_GE(files, 5) << "the corpus is missing from " << dir;
}

TEST(RendezvousEventsTest, RandomSequencesHoldTheInvariants) {
  std::mt19937 random(20240611);
  for (int i = 0; i < 3000; ++i) {
    std::string bytes(std::uniform_int_distribution<int>(1, 600)(random), '\0');
    for (char& b : bytes) b = static_cast<char>(random());
    const std::string violation = RunEvents(bytes);
    ASSERT_EQ(violation, "") << "sequence " << i;
  }
}

}  // namespace
}  // namespace rdzv
