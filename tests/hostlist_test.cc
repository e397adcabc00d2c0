#include "common/core/hostlist.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rdzv {
namespace {

using Names = std::vector<std::string>;

// Asserts that `status` is an InvalidArgumentError on one line quoting `input` (its first 200
// characters when longer) and saying `why`.
void ExpectError(const absl::Status& status, const std::string& input, const std::string& why) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  const std::string message(status.message());
  const std::string quoted =
      input.size() <= 200 ? absl::StrCat("\"", absl::CHexEscape(input), "\"")
                          : absl::StrCat("\"", absl::CHexEscape(input.substr(0, 200)), "...\"");
  EXPECT_TRUE(absl::StrContains(message, quoted)) << message;
  EXPECT_TRUE(absl::StrContains(message, why)) << message;
  EXPECT_FALSE(absl::StrContains(message, "\n")) << message;
}

struct ExpandCase {
  std::string input;
  Names expected;
};

const ExpandCase kExpandCases[] = {
    {"n1", {"n1"}},
    {"n[1-3]", {"n1", "n2", "n3"}},
    {"n[5]", {"n5"}},
    {"n[0-0]", {"n0"}},
    {"gpu[001-016]",
     {"gpu001", "gpu002", "gpu003", "gpu004", "gpu005", "gpu006", "gpu007", "gpu008", "gpu009",
      "gpu010", "gpu011", "gpu012", "gpu013", "gpu014", "gpu015", "gpu016"}},
    {"i[00-05]", {"i00", "i01", "i02", "i03", "i04", "i05"}},
    {"n[8-11]", {"n8", "n9", "n10", "n11"}},
    {"n[098-101]", {"n098", "n099", "n100", "n101"}},
    {"a[1-2,5,7-9]", {"a1", "a2", "a5", "a7", "a8", "a9"}},
    {"n[3,1]", {"n3", "n1"}},
    {"a[1-2],b3,c[7,9]", {"a1", "a2", "b3", "c7", "c9"}},
    {"login1,n[1-2]", {"login1", "n1", "n2"}},
    {"rack1-n[1-4]-ib", {"rack1-n1-ib", "rack1-n2-ib", "rack1-n3-ib", "rack1-n4-ib"}},
    {"foo[1,3]-bar", {"foo1-bar", "foo3-bar"}},
    {"r[1-2]n[1-2]", {"r1n1", "r1n2", "r2n1", "r2n2"}},
    {"r[1-2]n[01-03]-ib", {"r1n01-ib", "r1n02-ib", "r1n03-ib", "r2n01-ib", "r2n02-ib", "r2n03-ib"}},
    {"[1-2]", {"1", "2"}},
    {"10.0.0.[1-2]", {"10.0.0.1", "10.0.0.2"}},
};

TEST(ExpandHostlistTest, Expands) {
  for (const ExpandCase& c : kExpandCases) {
    absl::StatusOr<Names> hosts = ExpandHostlist(c.input);
    ASSERT_TRUE(hosts.ok()) << c.input << ": " << hosts.status();
    EXPECT_EQ(*hosts, c.expected) << c.input;
  }
}

struct ErrorCase {
  std::string input;
  std::string why;
};

const ErrorCase kExpandErrors[] = {
    {"", "is empty"},
    {"n[", "missing ']'"},
    {"n[1-3", "missing ']'"},
    {"a[1-2],n[", "missing ']' in \"n[\""},
    {"n]", "']' without '['"},
    {"n[1[2]]", "nested '['"},
    {"n[x-y]", "\"x-y\" is not a number or a range"},
    {"n[1-2,3--5]", "\"3--5\" is not a number or a range"},
    {"foo[0-1,2--5]", "\"2--5\" is not a number or a range"},
    {"n[-1]", "\"-1\" is not a number or a range"},
    {"n[1-]", "\"1-\" is not a number or a range"},
    {"n[+1]", "\"+1\" is not a number or a range"},
    {"n[5-1]", "descending range \"5-1\"); expected ascending ranges e.g. [1-5]"},
    {"n[]", "empty brackets"},
    {"n[1,,2]", "empty item in \"[1,,2]\""},
    {"a,,b", "empty host name"},
    {",a", "empty host name"},
    {"a,", "empty host name"},
    {"n 1", "contains whitespace"},
    {"n[1-99999999999999999999]", "over 18 digits"},
    {"n[1-2000000]", "expands to over 200000 names"},
    {"n[0-999999999999999999]", "expands to over 200000 names"},
    {"r[1-401]n[1-500]", "expands to over 200000 names"},
    {"a[1-100001],b[1-100000]", "expands to over 200000 names"},
    {"n1,n\x1b[2J", "contains a control character"},
    {std::string("n1\0n2", 5), "contains a control character"},
    // Names are bounded too, so that a few kilobytes cannot expand to gigabytes.
    {std::string(256, 'n'),
     "names are up to 256 characters long); expected host names of at most 255"},
    {absl::StrCat(std::string(3000, 'x'), "[0-99999]"), "names are up to 3005 characters long"},
    {absl::StrCat("login1,", std::string(251, 'r'), "[1-2]n[001-100]"),
     "are up to 256 characters long"},
};

TEST(ExpandHostlistTest, RefusesMalformedInput) {
  for (const ErrorCase& c : kExpandErrors) {
    SCOPED_TRACE(c.input);
    ExpectError(ExpandHostlist(c.input).status(), c.input, c.why);
  }
}

TEST(ExpandHostlistTest, MessageNamesTheProblemAndTheFix) {
  EXPECT_EQ(ExpandHostlist("n[").status().message(),
            "\"n[\" is malformed (missing ']'); expected e.g. n[1-3,5]");
}

TEST(ExpandHostlistTest, MessageEscapesControlCharactersAndShortensHugeInput) {
  EXPECT_TRUE(absl::StrContains(ExpandHostlist("n\t1").status().message(), "\"n\\t1\""));
  const std::string huge = absl::StrCat(std::string(100000, 'n'), "[");
  const absl::Status status = ExpandHostlist(huge).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(status.message().size(), 400u) << status;
}

TEST(ExpandHostlistTest, AcceptsExactlyTheLimit) {
  absl::StatusOr<Names> hosts = ExpandHostlist("n[1-200000]");
  ASSERT_TRUE(hosts.ok()) << hosts.status();
  ASSERT_EQ(hosts->size(), kMaxHostlistExpansion);
  EXPECT_EQ(hosts->front(), "n1");
  EXPECT_EQ(hosts->back(), "n200000");
}

TEST(ExpandHostlistTest, AcceptsNamesOfTheLongestLength) {
  const std::string rack(250, 'r');
  absl::StatusOr<Names> hosts = ExpandHostlist(absl::StrCat(rack, "[1-2]n[001-100]"));
  ASSERT_TRUE(hosts.ok()) << hosts.status();
  ASSERT_EQ(hosts->size(), 200u);
  EXPECT_EQ(hosts->back(), absl::StrCat(rack, "2n100"));
  EXPECT_EQ(hosts->back().size(), kMaxHostNameLength);
}

TEST(ExpandHostlistTest, RefusesManyLongNamesTogether) {
  // The most names and 255-character names are each accepted, but not both at once; nor the
  // million names of 67 characters the fuzzer once spent 8.6 s on (r x 60, then [1-1000000]).
  const std::string rack(200, 'r');
  EXPECT_EQ(ExpandHostlist(absl::StrCat(std::string(60, 'r'), "[1-1000000]")).status().code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status status = ExpandHostlist(absl::StrCat(rack, "[1-200000]")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "KiB of host names")) << status;
  EXPECT_LT(status.message().size(), 400u) << status;
  // Split over groups, the names still count together.
  const std::string half = absl::StrCat(rack, "a[1-20000],", rack, "b[1-20000]");
  EXPECT_EQ(ExpandHostlist(half).status().code(), absl::StatusCode::kInvalidArgument);
  // What the largest job needs: 100,000 nodes of 64-character names.
  absl::StatusOr<Names> hosts =
      ExpandHostlist(absl::StrCat(std::string(58, 'r'), "[000001-100000]"));
  ASSERT_TRUE(hosts.ok()) << hosts.status();
  EXPECT_EQ(hosts->size(), 100000u);
  EXPECT_EQ(hosts->back().size(), 64u);
}

struct CompressCase {
  Names hosts;
  std::string expected;
};

const CompressCase kCompressCases[] = {
    {{}, ""},
    {{"n1"}, "n1"},
    {{"n1", "n2", "n3", "n5"}, "n[1-3,5]"},
    {{"gpu001", "gpu002"}, "gpu[001-002]"},
    {{"a", "b"}, "a,b"},
    {{"n9", "n10", "n11"}, "n[9-11]"},
    {{"n09", "n10"}, "n[09-10]"},
    {{"n099", "n100"}, "n[099-100]"},
    {{"n01", "n2"}, "n01,n2"},
    {{"n1", "n02"}, "n1,n02"},
    {{"n08", "n9"}, "n08,n9"},
    {{"rack1-n1-ib", "rack1-n2-ib", "rack1-n3-ib", "rack1-n4-ib"}, "rack1-n[1-4]-ib"},
    {{"n1-ib", "n2-ib", "n3"}, "n[1-2]-ib,n3"},
    {{"r1n1", "r1n2", "r2n1", "r2n2"}, "r1n[1-2],r2n[1-2]"},
    {{"login", "n1", "n2"}, "login,n[1-2]"},
    {{"a1", "b1", "a2"}, "a1,b1,a2"},
    {{"n3", "n1", "n2"}, "n[3,1-2]"},
    {{"n1", "n1"}, "n[1,1]"},
    {{"10.0.0.1", "10.0.0.2"}, "10.0.0.[1-2]"},
    {{"n1234567890123456789", "n1234567890123456790"}, "n1234567890123456789,n1234567890123456790"},
};

TEST(CompressHostlistTest, Compresses) {
  for (const CompressCase& c : kCompressCases) {
    EXPECT_EQ(CompressHostlist(c.hosts), c.expected) << absl::StrCat(c.hosts.size(), " names");
  }
}

TEST(CompressHostlistTest, RoundTripsEveryTableCase) {
  for (const CompressCase& c : kCompressCases) {
    if (c.hosts.empty()) continue;
    absl::StatusOr<Names> hosts = ExpandHostlist(CompressHostlist(c.hosts));
    ASSERT_TRUE(hosts.ok()) << hosts.status();
    EXPECT_EQ(*hosts, c.hosts) << CompressHostlist(c.hosts);
  }
  for (const ExpandCase& c : kExpandCases) {
    absl::StatusOr<Names> hosts = ExpandHostlist(CompressHostlist(c.expected));
    ASSERT_TRUE(hosts.ok()) << hosts.status();
    EXPECT_EQ(*hosts, c.expected) << c.input;
  }
}

TEST(CompressHostlistTest, RoundTripsGeneratedLists) {
  // A fixed linear congruential generator keeps the lists identical on every platform.
  uint64_t state = 42;
  auto next = [&state](uint64_t bound) {
    state = state * 6364136223846793005u + 1442695040888963407u;
    return (state >> 33) % bound;
  };
  const std::string prefixes[] = {"n", "gpu", "rack1-n", "x"};
  const std::string suffixes[] = {"", "-ib"};
  for (int round = 0; round < 200; ++round) {
    Names hosts;
    const int groups = 1 + static_cast<int>(next(3));
    for (int g = 0; g < groups; ++g) {
      const std::string& prefix = prefixes[next(4)];
      const std::string& suffix = suffixes[next(2)];
      const int width = next(2) == 0 ? 0 : 3;
      uint64_t n = next(20);
      const int count = 1 + static_cast<int>(next(30));
      for (int i = 0; i < count; ++i) {
        n += 1 + (next(3) == 0 ? next(5) : 0);
        const std::string digits = std::to_string(n);
        const std::string padded =
            digits.size() < static_cast<std::size_t>(width)
                ? absl::StrCat(std::string(width - digits.size(), '0'), digits)
                : digits;
        hosts.push_back(absl::StrCat(prefix, padded, suffix));
      }
    }
    const std::string compressed = CompressHostlist(hosts);
    absl::StatusOr<Names> expanded = ExpandHostlist(compressed);
    ASSERT_TRUE(expanded.ok()) << compressed << ": " << expanded.status();
    EXPECT_EQ(*expanded, hosts) << compressed;
  }
}

TEST(CompressHostlistTest, InvertsExpand) {
  for (const char* list : {"n[1-3,5]", "gpu[001-016],login1", "rack1-n[1-4]-ib"}) {
    absl::StatusOr<Names> hosts = ExpandHostlist(list);
    ASSERT_TRUE(hosts.ok()) << hosts.status();
    EXPECT_EQ(CompressHostlist(*hosts), list);
  }
}

struct TasksCase {
  std::string input;
  std::vector<int> expected;
};

const TasksCase kTasksCases[] = {
    {"4", {4}},           {"2(x3),1", {2, 2, 2, 1}},  {"2,1", {2, 1}},
    {"1(x3)", {1, 1, 1}}, {"8(x2),4(x1)", {8, 8, 4}}, {"3,2(x2),1", {3, 2, 2, 1}},
};

TEST(ExpandTasksPerNodeTest, Expands) {
  for (const TasksCase& c : kTasksCases) {
    absl::StatusOr<std::vector<int>> counts = ExpandTasksPerNode(c.input);
    ASSERT_TRUE(counts.ok()) << c.input << ": " << counts.status();
    EXPECT_EQ(*counts, c.expected) << c.input;
  }
}

const ErrorCase kTasksErrors[] = {
    {"", "is empty"},
    {"2(x3", "missing ')'"},
    {"2(x3,1", "missing ')'"},
    {"2(3)", "missing 'x' in \"(3)\""},
    {"x", "\"x\" is not a number"},
    {" 2", "\" 2\" is not a number"},
    {"2)", "\"2)\" is not a number"},
    {"0", "task count 0"},
    {"2,0", "task count 0"},
    {"-1", "negative task count \"-1\""},
    {"2(x0)", "repeat count 0"},
    {"2(x-1)", "negative repeat count \"-1\""},
    {"2(x)", "missing repeat count"},
    {"(x3)", "missing task count"},
    {"2,,1", "empty entry"},
    {"2(x3),1,", "empty entry"},
    {"2(x3)4", "unexpected \"4\" after ')'"},
    {"2000000", "task count \"2000000\" is over 200000"},
    {"1(x2000000)", "repeat count \"2000000\" is over 200000"},
    {"1(x99999999999999999999)", "repeat count"},
    {"1(x100001),1(x100000)", "over 200000 nodes in all"},
};

TEST(ExpandTasksPerNodeTest, RefusesMalformedInput) {
  for (const ErrorCase& c : kTasksErrors) {
    SCOPED_TRACE(c.input);
    ExpectError(ExpandTasksPerNode(c.input).status(), c.input, c.why);
  }
}

TEST(ExpandTasksPerNodeTest, MessageCanBePrefixedWithTheVariable) {
  EXPECT_EQ(absl::StrCat("SLURM_TASKS_PER_NODE=", ExpandTasksPerNode("2(x3").status().message()),
            "SLURM_TASKS_PER_NODE=\"2(x3\" is malformed (missing ')'); expected e.g. 2(x3),1");
}

struct FormatTasksCase {
  std::vector<int> counts;
  std::string expected;
};

const FormatTasksCase kFormatTasksCases[] = {
    {{}, ""},
    {{4}, "4"},
    {{1, 1, 1}, "1(x3)"},
    {{2, 2, 2, 1}, "2(x3),1"},
    {{2, 1}, "2,1"},
    {{1, 2}, "1,2"},
    {{3, 2, 2}, "3,2(x2)"},
    {{8, 8, 4}, "8(x2),4"},
    {{2, 2, 1, 1, 2, 2}, "2(x2),1(x2),2(x2)"},
    {{200000}, "200000"},
};

TEST(FormatTasksPerNodeTest, WritesSlurmsSyntax) {
  for (const FormatTasksCase& c : kFormatTasksCases) {
    EXPECT_EQ(FormatTasksPerNode(c.counts), c.expected) << absl::StrJoin(c.counts, ",");
  }
}

TEST(FormatTasksPerNodeTest, InvertsExpand) {
  for (const TasksCase& c : kTasksCases) {
    EXPECT_EQ(ExpandTasksPerNode(FormatTasksPerNode(c.expected)).value(), c.expected) << c.input;
  }
  // Written as Slurm writes them, "8(x2),4(x1)" comes back without the redundant "(x1)".
  EXPECT_EQ(FormatTasksPerNode(ExpandTasksPerNode("8(x2),4(x1)").value()), "8(x2),4");
}

TEST(FormatTasksPerNodeTest, RoundTripsGeneratedLists) {
  // Every list of up to 6 counts from 1 to 3: 1,092 lists, with every pattern of runs.
  std::vector<std::vector<int>> lists = {{}};
  for (int length = 1; length <= 6; ++length) {
    std::vector<std::vector<int>> longer;
    for (const std::vector<int>& list : lists) {
      if (static_cast<int>(list.size()) != length - 1) continue;
      for (int count = 1; count <= 3; ++count) {
        longer.push_back(list);
        longer.back().push_back(count);
      }
    }
    lists.insert(lists.end(), longer.begin(), longer.end());
  }
  ASSERT_EQ(lists.size(), 1u + 3 + 9 + 27 + 81 + 243 + 729);
  for (const std::vector<int>& list : lists) {
    if (list.empty()) continue;
    const std::string text = FormatTasksPerNode(list);
    absl::StatusOr<std::vector<int>> back = ExpandTasksPerNode(text);
    ASSERT_TRUE(back.ok()) << text << ": " << back.status();
    EXPECT_EQ(*back, list) << text;
  }
}

TEST(FormatTasksPerNodeTest, RoundTripsTheLargestAllocation) {
  const std::vector<int> counts(kMaxHostlistExpansion, 1);
  EXPECT_EQ(FormatTasksPerNode(counts), "1(x200000)");
  EXPECT_EQ(ExpandTasksPerNode(FormatTasksPerNode(counts)).value(), counts);
}

}  // namespace
}  // namespace rdzv
