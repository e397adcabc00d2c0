#include "common/core/hostlist.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace rdzv {
namespace {

// Debian's abseil is built with its own string_view type (ABSL_OPTION_USE_STD_STRING_VIEW is 0),
// so the std::string_view of our API is converted once at the boundary.
absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr absl::string_view kHostlistExpected = "e.g. n[1-3,5]";
constexpr absl::string_view kTasksExpected = "e.g. 2(x3),1";

// Longer numbers could overflow uint64_t; no host or task count needs 19 digits.
constexpr std::size_t kMaxDigits = 18;

// Error messages quote the input, but a multi-megabyte value would drown the one line that is
// supposed to tell the user what to fix.
constexpr std::size_t kMaxQuoted = 200;

// Quotes `value` for an error message, escaped so that the message stays on one line.
std::string Quote(absl::string_view value) {
  if (value.size() <= kMaxQuoted) return absl::StrCat("\"", absl::CHexEscape(value), "\"");
  return absl::StrCat("\"", absl::CHexEscape(value.substr(0, kMaxQuoted)), "...\"");
}

absl::Status Malformed(absl::string_view input, absl::string_view why, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat(Quote(input), " is malformed (", why, "); expected ", expected));
}

absl::Status Invalid(absl::string_view input, absl::string_view why, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat(Quote(input), " is invalid (", why, "); expected ", expected));
}

// `unit` names what is counted, e.g. "names".
absl::Status TooLarge(absl::string_view input, absl::string_view why, absl::string_view unit) {
  return absl::InvalidArgumentError(absl::StrCat(Quote(input), " is too large (", why,
                                                 "); expected at most ", kMaxHostlistExpansion, " ",
                                                 unit));
}

absl::Status TooManyNames(absl::string_view input) {
  return TooLarge(input, absl::StrCat("expands to over ", kMaxHostlistExpansion, " names"),
                  "names");
}

bool IsAllDigits(absl::string_view s) {
  for (char c : s) {
    if (!absl::ascii_isdigit(c)) return false;
  }
  return true;
}

// Parses a non-empty run of decimal digits of at most kMaxDigits. Unlike absl::SimpleAtoi it
// refuses signs and whitespace, which Slurm never writes.
std::optional<uint64_t> ParseDigits(absl::string_view s) {
  if (s.empty() || s.size() > kMaxDigits || !IsAllDigits(s)) return std::nullopt;
  uint64_t value = 0;
  for (char c : s) value = value * 10 + static_cast<uint64_t>(c - '0');
  return value;
}

// Formats `value` with at least `width` digits, zero-padded, as Slurm prints hostlist numbers.
std::string FormatNumber(uint64_t value, std::size_t width) {
  std::string digits = absl::StrCat(value);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

std::size_t DigitCount(uint64_t value) {
  std::size_t digits = 1;
  for (; value >= 10; value /= 10) ++digits;
  return digits;
}

// One comma-separated item inside brackets. The width of the low end as written decides the
// zero padding of every name in the range, as in Slurm.
struct Range {
  uint64_t lo = 0;
  uint64_t hi = 0;
  std::size_t width = 0;
};

// One comma-separated group such as "r[1-2]n[1-2]-ib": literals[i] precedes brackets[i], and the
// last literal follows the last bracket.
struct Group {
  std::vector<std::string> literals;
  std::vector<std::vector<Range>> brackets;
  std::size_t longest = 0;  // the longest name it expands to
};

// Parses the inside of one bracket pair, e.g. "1-3,5", into `ranges`; returns how many numbers
// they hold.
absl::StatusOr<uint64_t> ParseBracket(absl::string_view input, absl::string_view content,
                                      absl::string_view where, std::vector<Range>& ranges) {
  if (content.empty()) {
    return Malformed(input, absl::StrCat("empty brackets \"[]\"", where), kHostlistExpected);
  }
  uint64_t count = 0;
  for (absl::string_view item : absl::StrSplit(content, ',')) {
    if (item.empty()) {
      return Malformed(input, absl::StrCat("empty item in \"[", content, "]\""), kHostlistExpected);
    }
    const std::size_t dash = item.find('-');
    const absl::string_view lo_text = item.substr(0, dash);
    const absl::string_view hi_text =
        dash == absl::string_view::npos ? item : item.substr(dash + 1);
    const std::optional<uint64_t> lo = ParseDigits(lo_text);
    const std::optional<uint64_t> hi = ParseDigits(hi_text);
    if (!lo || !hi) {
      if (IsAllDigits(lo_text) && IsAllDigits(hi_text) && !lo_text.empty() && !hi_text.empty()) {
        return Malformed(input,
                         absl::StrCat(Quote(item), " has a number over ", kMaxDigits, " digits"),
                         kHostlistExpected);
      }
      return Malformed(input, absl::StrCat(Quote(item), " is not a number or a range lo-hi"),
                       kHostlistExpected);
    }
    if (*lo > *hi) {
      return Malformed(input, absl::StrCat("descending range ", Quote(item)),
                       absl::StrCat("ascending ranges e.g. [", hi_text, "-", lo_text, "]"));
    }
    const uint64_t size = *hi - *lo + 1;
    if (size > kMaxHostlistExpansion - count) return TooManyNames(input);
    count += size;
    ranges.push_back(Range{*lo, *hi, lo_text.size()});
  }
  return count;
}

// Parses one group and returns how many names it expands to, refusing more than
// kMaxHostlistExpansion without allocating them.
absl::StatusOr<uint64_t> ParseGroup(absl::string_view input, absl::string_view text, Group& group) {
  // Naming the group only helps when the input holds more than one.
  const std::string where = text.size() == input.size() ? "" : absl::StrCat(" in ", Quote(text));
  if (text.empty()) return Malformed(input, "empty host name", kHostlistExpected);
  uint64_t count = 1;
  // The longest name the group expands to: its literals plus the widest number of each bracket.
  std::size_t length = 0;
  std::string literal;
  std::size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == ']') {
      return Malformed(input, absl::StrCat("']' without '['", where), kHostlistExpected);
    }
    if (c != '[') {
      literal.push_back(c);
      ++i;
      continue;
    }
    const std::size_t close = text.find_first_of("[]", i + 1);
    if (close == absl::string_view::npos) {
      return Malformed(input, absl::StrCat("missing ']'", where), kHostlistExpected);
    }
    if (text[close] == '[') {
      return Malformed(input, absl::StrCat("nested '['", where), kHostlistExpected);
    }
    std::vector<Range> ranges;
    absl::StatusOr<uint64_t> bracket_count =
        ParseBracket(input, text.substr(i + 1, close - i - 1), where, ranges);
    if (!bracket_count.ok()) return bracket_count.status();
    // Both factors are at most kMaxHostlistExpansion, so the product cannot overflow.
    count *= *bracket_count;
    if (count > kMaxHostlistExpansion) return TooManyNames(input);
    std::size_t widest = 0;
    for (const Range& r : ranges) widest = std::max({widest, r.width, DigitCount(r.hi)});
    length += literal.size() + widest;
    group.literals.push_back(std::move(literal));
    group.brackets.push_back(std::move(ranges));
    literal.clear();
    i = close + 1;
  }
  length += literal.size();
  if (length > kMaxHostNameLength) {
    return Invalid(input, absl::StrCat("names", where, " are up to ", length, " characters long"),
                   absl::StrCat("host names of at most ", kMaxHostNameLength, " characters"));
  }
  group.literals.push_back(std::move(literal));
  group.longest = length;
  return count;
}

// Splits at commas outside brackets, so "a[1,2],b" is two groups.
std::vector<absl::string_view> SplitGroups(absl::string_view input) {
  std::vector<absl::string_view> groups;
  bool in_bracket = false;
  std::size_t start = 0;
  for (std::size_t i = 0; i < input.size(); ++i) {
    if (input[i] == '[') in_bracket = true;
    if (input[i] == ']') in_bracket = false;
    if (input[i] == ',' && !in_bracket) {
      groups.push_back(input.substr(start, i - start));
      start = i + 1;
    }
  }
  groups.push_back(input.substr(start));
  return groups;
}

void ExpandGroup(const Group& group, std::vector<std::string>& out) {
  std::vector<std::vector<std::string>> numbers;
  numbers.reserve(group.brackets.size());
  for (const std::vector<Range>& ranges : group.brackets) {
    std::vector<std::string>& formatted = numbers.emplace_back();
    for (const Range& r : ranges) {
      for (uint64_t n = r.lo; n <= r.hi; ++n) formatted.push_back(FormatNumber(n, r.width));
    }
  }
  // An odometer over the brackets whose last digit turns fastest, so the first bracket varies
  // slowest as in Slurm.
  std::vector<std::size_t> index(numbers.size(), 0);
  while (true) {
    std::string name = group.literals[0];
    for (std::size_t b = 0; b < numbers.size(); ++b) {
      absl::StrAppend(&name, numbers[b][index[b]], group.literals[b + 1]);
    }
    out.push_back(std::move(name));
    std::size_t b = numbers.size();
    while (true) {
      if (b == 0) return;
      --b;
      if (++index[b] < numbers[b].size()) break;
      index[b] = 0;
    }
  }
}

// A host name split around its last run of digits, the part CompressHostlist turns into ranges.
struct NumberedName {
  absl::string_view prefix;
  absl::string_view digits;
  absl::string_view suffix;
  uint64_t value = 0;
};

std::optional<NumberedName> SplitAtLastNumber(absl::string_view name) {
  std::size_t end = name.size();
  while (end > 0 && !absl::ascii_isdigit(name[end - 1])) --end;
  if (end == 0) return std::nullopt;
  std::size_t begin = end;
  while (begin > 0 && absl::ascii_isdigit(name[begin - 1])) --begin;
  const absl::string_view digits = name.substr(begin, end - begin);
  const std::optional<uint64_t> value = ParseDigits(digits);
  if (!value) return std::nullopt;
  return NumberedName{name.substr(0, begin), digits, name.substr(end), *value};
}

bool IsZeroPadded(absl::string_view digits) { return digits.size() > 1 && digits[0] == '0'; }

// Adjacent names being merged into one bracket by CompressHostlist.
class BracketBuilder {
 public:
  explicit BracketBuilder(const NumberedName& first)
      : prefix_(first.prefix),
        suffix_(first.suffix),
        first_width_(first.digits.size()),
        any_padded_(IsZeroPadded(first.digits)) {
    runs_.push_back(
        Run{first.value, first.value, std::string(first.digits), std::string(first.digits)});
  }

  // Adds `name` if it can share this bracket. A padded number only joins numbers of its own
  // width, since "n[01-02,3]" would read as a typo even though it expands correctly.
  bool TryAdd(const NumberedName& name) {
    if (name.prefix != prefix_ || name.suffix != suffix_) return false;
    const bool padded = IsZeroPadded(name.digits);
    if (padded || any_padded_) {
      if (!same_width_ || name.digits.size() != first_width_) return false;
    }
    any_padded_ = any_padded_ || padded;
    same_width_ = same_width_ && name.digits.size() == first_width_;
    Run& last = runs_.back();
    // Extending is only right when the range's width reproduces the name exactly: "n9,n10" is
    // n[9-10], but "n08,n9" is not n[08-09].
    if (name.value == last.hi + 1 &&
        FormatNumber(name.value, last.lo_digits.size()) == name.digits) {
      last.hi = name.value;
      last.hi_digits = std::string(name.digits);
    } else {
      runs_.push_back(
          Run{name.value, name.value, std::string(name.digits), std::string(name.digits)});
    }
    return true;
  }

  std::string ToString() const {
    if (runs_.size() == 1 && runs_[0].lo == runs_[0].hi) {
      return absl::StrCat(prefix_, runs_[0].lo_digits, suffix_);
    }
    const std::string ranges = absl::StrJoin(runs_, ",", [](std::string* out, const Run& run) {
      if (run.lo == run.hi) {
        absl::StrAppend(out, run.lo_digits);
      } else {
        absl::StrAppend(out, run.lo_digits, "-", run.hi_digits);
      }
    });
    return absl::StrCat(prefix_, "[", ranges, "]", suffix_);
  }

 private:
  struct Run {
    uint64_t lo;
    uint64_t hi;
    std::string lo_digits;
    std::string hi_digits;
  };

  absl::string_view prefix_;
  absl::string_view suffix_;
  std::size_t first_width_;
  bool any_padded_;
  bool same_width_ = true;
  std::vector<Run> runs_;
};

// Parses one "count" or "count(xrepeat)" number of SLURM_TASKS_PER_NODE. `what` names the
// number and `unit` what it counts, for error messages.
absl::StatusOr<uint64_t> ParseTaskNumber(absl::string_view input, absl::string_view text,
                                         absl::string_view what, absl::string_view unit) {
  if (text.empty()) return Malformed(input, absl::StrCat("missing ", what), kTasksExpected);
  if (text.size() > 1 && text[0] == '-' && IsAllDigits(text.substr(1))) {
    return Invalid(input, absl::StrCat("negative ", what, " ", Quote(text)),
                   absl::StrCat("positive counts ", kTasksExpected));
  }
  if (!IsAllDigits(text)) {
    return Malformed(input, absl::StrCat(Quote(text), " is not a number"), kTasksExpected);
  }
  const std::optional<uint64_t> value = ParseDigits(text);
  if (!value || *value > kMaxHostlistExpansion) {
    return TooLarge(input, absl::StrCat(what, " ", Quote(text), " is over ", kMaxHostlistExpansion),
                    unit);
  }
  if (*value == 0) {
    return Invalid(input, absl::StrCat(what, " 0"),
                   absl::StrCat("positive counts ", kTasksExpected));
  }
  return *value;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandHostlist(std::string_view hostlist_view) {
  const absl::string_view hostlist = ToAbsl(hostlist_view);
  if (hostlist.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"\" is empty; expected a host name or a hostlist ", kHostlistExpected));
  }
  for (char c : hostlist) {
    if (absl::ascii_isspace(c)) {
      return Malformed(hostlist, "contains whitespace",
                       "comma-separated names without spaces e.g. n[1-3,5],login1");
    }
    // Host names end up in logs and messages: nothing a terminal would act on.
    if (absl::ascii_iscntrl(c)) {
      return Malformed(hostlist, "contains a control character",
                       "comma-separated names e.g. n[1-3,5],login1");
    }
  }
  std::vector<Group> groups;
  uint64_t total = 0;
  uint64_t characters = 0;
  for (absl::string_view text : SplitGroups(hostlist)) {
    absl::StatusOr<uint64_t> count = ParseGroup(hostlist, text, groups.emplace_back());
    if (!count.ok()) return count.status();
    if (*count > kMaxHostlistExpansion - total) return TooManyNames(hostlist);
    total += *count;
    // At most kMaxHostlistExpansion names of at most 255 characters in all: no overflow.
    characters += *count * groups.back().longest;
    if (characters > kMaxHostlistCharacters) {
      return absl::InvalidArgumentError(absl::StrCat(
          Quote(hostlist), " is too large (expands to over ", kMaxHostlistCharacters >> 10,
          " KiB of host names); expected fewer or shorter names"));
    }
  }
  std::vector<std::string> hosts;
  hosts.reserve(total);
  for (const Group& group : groups) ExpandGroup(group, hosts);
  return hosts;
}

std::string CompressHostlist(const std::vector<std::string>& hosts) {
  std::vector<std::string> parts;
  std::optional<BracketBuilder> open;
  for (const std::string& host : hosts) {
    const std::optional<NumberedName> name = SplitAtLastNumber(host);
    if (open && name && open->TryAdd(*name)) continue;
    if (open) parts.push_back(open->ToString());
    open.reset();
    if (name) {
      open.emplace(*name);
    } else {
      parts.push_back(host);
    }
  }
  if (open) parts.push_back(open->ToString());
  return absl::StrJoin(parts, ",");
}

absl::StatusOr<std::vector<int>> ExpandTasksPerNode(std::string_view value_view) {
  const absl::string_view value = ToAbsl(value_view);
  if (value.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("\"\" is empty; expected ", kTasksExpected));
  }
  // Sizes are checked before anything is allocated, so "1(x999999),1(x999999)" fails cheaply.
  std::vector<std::pair<int, uint64_t>> runs;
  uint64_t total = 0;
  for (absl::string_view entry : absl::StrSplit(value, ',')) {
    if (entry.empty()) return Malformed(value, "empty entry", kTasksExpected);
    const std::size_t open = entry.find('(');
    uint64_t repeat = 1;
    absl::StatusOr<uint64_t> count =
        ParseTaskNumber(value, entry.substr(0, open), "task count", "tasks on a node");
    if (!count.ok()) return count.status();
    if (open != absl::string_view::npos) {
      const std::size_t close = entry.find(')', open);
      if (close == absl::string_view::npos) return Malformed(value, "missing ')'", kTasksExpected);
      if (close + 1 != entry.size()) {
        return Malformed(value,
                         absl::StrCat("unexpected ", Quote(entry.substr(close + 1)), " after ')'"),
                         kTasksExpected);
      }
      const absl::string_view inner = entry.substr(open + 1, close - open - 1);
      if (inner.empty() || inner[0] != 'x') {
        return Malformed(value, absl::StrCat("missing 'x' in ", Quote(entry.substr(open))),
                         kTasksExpected);
      }
      absl::StatusOr<uint64_t> parsed =
          ParseTaskNumber(value, inner.substr(1), "repeat count", "nodes");
      if (!parsed.ok()) return parsed.status();
      repeat = *parsed;
    }
    if (repeat > kMaxHostlistExpansion - total) {
      return TooLarge(value, absl::StrCat("over ", kMaxHostlistExpansion, " nodes in all"),
                      "nodes");
    }
    total += repeat;
    runs.emplace_back(static_cast<int>(*count), repeat);
  }
  std::vector<int> counts;
  counts.reserve(total);
  for (const auto& [count, repeat] : runs) counts.insert(counts.end(), repeat, count);
  return counts;
}

std::string FormatTasksPerNode(const std::vector<int>& counts) {
  std::string out;
  std::size_t i = 0;
  while (i < counts.size()) {
    std::size_t end = i + 1;
    while (end < counts.size() && counts[end] == counts[i]) ++end;
    if (!out.empty()) out.push_back(',');
    absl::StrAppend(&out, counts[i]);
    if (end - i > 1) absl::StrAppend(&out, "(x", end - i, ")");
    i = end;
  }
  return out;
}

}  // namespace rdzv
