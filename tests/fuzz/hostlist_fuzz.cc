// Fuzzes the Slurm list parsers of common/core/hostlist.h. The input is read three ways: as a
// hostlist (ExpandHostlist), as a SLURM_TASKS_PER_NODE value (ExpandTasksPerNode), and as host
// names, one per line, for CompressHostlist. Properties checked:
//   - errors are one-line InvalidArgument messages;
//   - ExpandHostlist never returns more than kMaxHostlistExpansion names, nor names longer than
//     kMaxHostNameLength;
//   - ExpandHostlist(CompressHostlist(x)) == x for names without ',', '[', ']', whitespace or
//     control characters (of at most kMaxHostNameLength characters), both for the names an
//     expansion produced (of at most kMaxRoundTrip names) and for arbitrary names;
//   - ExpandTasksPerNode returns 1..kMaxHostlistExpansion counts, each at least 1.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/core/hostlist.h"
#include "tests/fuzz/fuzz_check.h"

namespace rdzv {
namespace {

// The most names of an expansion whose round trip through CompressHostlist is checked.
constexpr std::size_t kMaxRoundTrip = 20'000;

// A name CompressHostlist promises to round-trip.
bool IsPlainName(const std::string& name) {
  if (name.empty() || name.size() > kMaxHostNameLength) return false;
  for (char c : name) {
    const auto u = static_cast<unsigned char>(c);
    if (c == ',' || c == '[' || c == ']' || absl::ascii_isspace(u) || absl::ascii_iscntrl(u)) {
      return false;
    }
  }
  return true;
}

void CheckRoundTrip(const std::vector<std::string>& names) {
  if (names.empty()) return;
  for (const std::string& name : names) {
    if (!IsPlainName(name)) return;
  }
  const std::string compressed = CompressHostlist(names);
  absl::StatusOr<std::vector<std::string>> again = ExpandHostlist(compressed);
  FuzzCheck(again.ok(), "CompressHostlist gave a list ExpandHostlist refuses",
            again.ok() ? compressed : std::string(again.status().message()));
  FuzzCheck(*again == names, "ExpandHostlist(CompressHostlist(x)) != x", compressed);
}

void FuzzExpand(std::string_view input) {
  absl::StatusOr<std::vector<std::string>> hosts = ExpandHostlist(input);
  if (!hosts.ok()) {
    CheckUserError(hosts.status());
    return;
  }
  FuzzCheck(!hosts->empty(), "a successful expansion is empty", input);
  FuzzCheck(hosts->size() <= kMaxHostlistExpansion, "over kMaxHostlistExpansion names", input);
  for (const std::string& host : *hosts) {
    FuzzCheck(host.size() <= kMaxHostNameLength, "a name over kMaxHostNameLength", input);
  }
  // The round trip of the largest lists (100,000s of names) would take most of a run's time
  // under ASan for what smaller ones check as well: every input stays within a second.
  if (hosts->size() <= kMaxRoundTrip) CheckRoundTrip(*hosts);
}

void FuzzTasks(std::string_view input) {
  absl::StatusOr<std::vector<int>> counts = ExpandTasksPerNode(input);
  if (!counts.ok()) {
    CheckUserError(counts.status());
    return;
  }
  FuzzCheck(!counts->empty(), "a successful tasks-per-node value is empty", input);
  FuzzCheck(counts->size() <= kMaxHostlistExpansion, "over kMaxHostlistExpansion counts", input);
  for (int count : *counts) {
    FuzzCheck(count >= 1, "a task count below 1", input);
    FuzzCheck(static_cast<std::size_t>(count) <= kMaxHostlistExpansion,
              "a task count over kMaxHostlistExpansion", input);
  }
}

void FuzzCompress(std::string_view input) {
  const std::vector<std::string> names =
      absl::StrSplit(absl::string_view(input.data(), input.size()), '\n');
  CheckRoundTrip(names);
}

}  // namespace
}  // namespace rdzv

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  rdzv::FuzzExpand(input);
  rdzv::FuzzTasks(input);
  rdzv::FuzzCompress(input);
  return 0;
}
