#include "common/core/flags.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/core/env.h"

namespace rdzv {
namespace {

// What a small program's flags set.
struct Settings {
  int nproc = 1;
  std::string name = "unset";
  bool verbose = false;
};

FlagParser MakeParser(Settings& s) {
  FlagParser p("prog", "Usage: prog [flags] -- COMMAND");
  p.Add({"nproc-per-node", "T_NPROC_PER_NODE", "N", "workers per node", [&s](absl::string_view v) {
           if (!absl::SimpleAtoi(v, &s.nproc) || s.nproc < 1) {
             return absl::InvalidArgumentError("expected a whole number >= 1");
           }
           return absl::OkStatus();
         }});
  p.Add({"name", "T_NAME", "NAME", "a name", [&s](absl::string_view v) {
           s.name = std::string(v);
           return absl::OkStatus();
         }});
  p.Add({"verbose", "T_VERBOSE", "", "talk more", [&s](absl::string_view v) {
           absl::StatusOr<bool> b = ParseBool(v);
           if (!b.ok()) return b.status();
           s.verbose = *b;
           return absl::OkStatus();
         }});
  p.Add({"quiet", "", "", "no variable for this one",
         [](absl::string_view) { return absl::OkStatus(); }});
  return p;
}

struct ParseCase {
  std::string name;
  std::vector<std::string> args;
  EnvList env;
  int nproc;
  std::string flag_name;
  bool verbose;
  std::vector<std::string> rest;
};

class FlagParserTest : public testing::TestWithParam<ParseCase> {};

TEST_P(FlagParserTest, Parses) {
  const ParseCase& c = GetParam();
  Settings s;
  absl::StatusOr<std::vector<std::string>> rest = MakeParser(s).Parse(c.args, EnvFromList(c.env));
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ(s.nproc, c.nproc);
  EXPECT_EQ(s.name, c.flag_name);
  EXPECT_EQ(s.verbose, c.verbose);
  EXPECT_EQ(*rest, c.rest);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, FlagParserTest,
    testing::Values(
        ParseCase{"Nothing", {}, {}, 1, "unset", false, {}},
        ParseCase{"EqualsForm", {"--nproc-per-node=4", "--name=a"}, {}, 4, "a", false, {}},
        ParseCase{"SpaceForm", {"--nproc-per-node", "4", "--name", "a"}, {}, 4, "a", false, {}},
        ParseCase{"UnderscoresAreDashes", {"--nproc_per_node=8"}, {}, 8, "unset", false, {}},
        ParseCase{"UnderscoresSpaceForm", {"--nproc_per_node", "2"}, {}, 2, "unset", false, {}},
        ParseCase{"ValueMayContainEquals", {"--name=a=b"}, {}, 1, "a=b", false, {}},
        ParseCase{"ValueMayLookLikeAFlag", {"--name", "--verbose"}, {}, 1, "--verbose", false, {}},
        ParseCase{"EmptyValue", {"--name="}, {}, 1, "", false, {}},
        ParseCase{"BareSwitch", {"--verbose"}, {}, 1, "unset", true, {}},
        ParseCase{
            "SwitchWithValue", {"--verbose=false"}, {{"T_VERBOSE", "1"}}, 1, "unset", false, {}},
        ParseCase{"SwitchDoesNotEatTheNextWord",
                  {"--verbose", "python"},
                  {},
                  1,
                  "unset",
                  true,
                  {"python"}},
        ParseCase{"EnvironmentApplies",
                  {},
                  {{"T_NPROC_PER_NODE", "6"}, {"T_NAME", "env"}, {"T_VERBOSE", "yes"}},
                  6,
                  "env",
                  true,
                  {}},
        ParseCase{"CommandLineWinsOverEnvironment",
                  {"--name", "cli", "--nproc-per-node=2"},
                  {{"T_NPROC_PER_NODE", "6"}, {"T_NAME", "env"}},
                  2,
                  "cli",
                  false,
                  {}},
        ParseCase{"EmptyVariableIsIgnored", {}, {{"T_NAME", ""}}, 1, "unset", false, {}},
        ParseCase{"StopsAtDoubleDash",
                  {"--name=a", "--", "--name=b", "x"},
                  {},
                  1,
                  "a",
                  false,
                  {"--name=b", "x"}},
        ParseCase{"StopsAtFirstNonFlag",
                  {"--name=a", "python", "train.py", "--name=b", "--", "y"},
                  {},
                  1,
                  "a",
                  false,
                  {"python", "train.py", "--name=b", "--", "y"}},
        ParseCase{
            "OnlyTheFirstDoubleDashIsEaten", {"--", "--", "z"}, {}, 1, "unset", false, {"--", "z"}},
        ParseCase{"LoneDashIsTheCommand", {"-", "x"}, {}, 1, "unset", false, {"-", "x"}}),
    [](const testing::TestParamInfo<ParseCase>& info) { return info.param.name; });

struct ErrorCase {
  std::string name;
  std::vector<std::string> args;
  EnvList env;
  std::vector<std::string> message_has;
};

class FlagParserErrorTest : public testing::TestWithParam<ErrorCase> {};

TEST_P(FlagParserErrorTest, NamesTheFlag) {
  const ErrorCase& c = GetParam();
  Settings s;
  absl::StatusOr<std::vector<std::string>> rest = MakeParser(s).Parse(c.args, EnvFromList(c.env));
  ASSERT_FALSE(rest.ok());
  EXPECT_EQ(rest.status().code(), absl::StatusCode::kInvalidArgument);
  for (const std::string& part : c.message_has) {
    EXPECT_TRUE(absl::StrContains(rest.status().message(), part))
        << "missing \"" << part << "\" in: " << rest.status().message();
  }
  EXPECT_FALSE(absl::StrContains(rest.status().message(), '\n')) << rest.status().message();
  EXPECT_LT(rest.status().message().size(), 400u) << rest.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, FlagParserErrorTest,
    testing::Values(
        ErrorCase{"UnknownFlag", {"--nprocs=2"}, {}, {"unknown flag", "--nprocs", "prog --help"}},
        ErrorCase{"UnknownFlagAfterGoodOnes", {"--name=a", "--bogus", "x"}, {}, {"--bogus"}},
        ErrorCase{"MissingValue", {"--name"}, {}, {"--name", "needs a value", "NAME"}},
        ErrorCase{"MissingValueUnderscored", {"--nproc_per_node"}, {}, {"--nproc-per-node", "N"}},
        ErrorCase{"BadValue",
                  {"--nproc-per-node=four"},
                  {},
                  {"--nproc-per-node", "four", "whole number"}},
        ErrorCase{"BadValueSpaceForm", {"--nproc-per-node", "0"}, {}, {"--nproc-per-node", "0"}},
        ErrorCase{"BadSwitchValue", {"--verbose=maybe"}, {}, {"--verbose", "maybe"}},
        ErrorCase{"BadVariable",
                  {},
                  {{"T_NPROC_PER_NODE", "lots"}},
                  {"T_NPROC_PER_NODE", "lots", "whole number"}},
        // Newlines and other control characters are shown escaped, so the error stays one line.
        ErrorCase{"UnknownFlagWithNewline", {"--np\nroc=2"}, {}, {"unknown flag --np\\nroc=2"}},
        ErrorCase{"BadValueWithNewline",
                  {"--nproc-per-node=2\n4"},
                  {},
                  {"--nproc-per-node=\"2\\n4\"", "whole number"}},
        ErrorCase{"BadVariableWithNewline",
                  {},
                  {{"T_NPROC_PER_NODE", "2\n4"}},
                  {"T_NPROC_PER_NODE=\"2\\n4\"", "whole number"}},
        ErrorCase{"BadSwitchValueWithControlCharacters",
                  {"--verbose=on\r\noff\x1b"},
                  {},
                  {"--verbose=\"on\\r\\noff\\x1b\""}},
        ErrorCase{"HugeValueIsShortened",
                  {"--nproc-per-node=" + std::string(100000, '9')},
                  {},
                  {"--nproc-per-node=\"99999", "...\"", "whole number"}}),
    [](const testing::TestParamInfo<ErrorCase>& info) { return info.param.name; });

TEST(FlagParserHelpTest, ListsEveryFlagWithItsVariable) {
  Settings s;
  const std::string help = MakeParser(s).Help();
  EXPECT_TRUE(absl::StartsWith(help, "Usage: prog [flags] -- COMMAND")) << help;
  EXPECT_TRUE(absl::StrContains(help, "--nproc-per-node N  [T_NPROC_PER_NODE]")) << help;
  EXPECT_TRUE(absl::StrContains(help, "--verbose  [T_VERBOSE]")) << help;
  EXPECT_TRUE(absl::StrContains(help, "--quiet\n")) << help;
  EXPECT_TRUE(absl::StrContains(help, "workers per node")) << help;
}

struct BoolCase {
  std::string text;
  std::optional<bool> want;  // nullopt: an error
};

class ParseBoolTest : public testing::TestWithParam<BoolCase> {};

TEST_P(ParseBoolTest, ReadsSwitchValues) {
  const BoolCase& c = GetParam();
  absl::StatusOr<bool> got = ParseBool(c.text);
  if (!c.want) {
    ASSERT_FALSE(got.ok()) << "\"" << c.text << "\" parsed as " << *got;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(got.status().message(),
                                  absl::StrFormat("\"%s\"", absl::CHexEscape(c.text))))
        << got.status();
    EXPECT_FALSE(absl::StrContains(got.status().message(), '\n')) << got.status();
    return;
  }
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, *c.want) << c.text;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ParseBoolTest,
    testing::Values(BoolCase{"true", true}, BoolCase{"TRUE", true}, BoolCase{"1", true},
                    BoolCase{"yes", true}, BoolCase{"On", true}, BoolCase{"false", false},
                    BoolCase{"False", false}, BoolCase{"0", false}, BoolCase{"no", false},
                    BoolCase{"OFF", false}, BoolCase{"", std::nullopt}, BoolCase{"2", std::nullopt},
                    BoolCase{"y", std::nullopt}, BoolCase{" true", std::nullopt},
                    BoolCase{"enabled", std::nullopt}, BoolCase{"true\n", std::nullopt}));

// The setters store what they parse and leave the target alone on an error.
TEST(SetterTest, StringSetterStoresTheValueAsGiven) {
  std::string s = "before";
  ASSERT_TRUE(StringSetter(&s)("a b=c").ok());
  EXPECT_EQ(s, "a b=c");
  ASSERT_TRUE(StringSetter(&s)("").ok());
  EXPECT_EQ(s, "");
}

TEST(SetterTest, BoolSetter) {
  bool b = false;
  ASSERT_TRUE(BoolSetter(&b)("yes").ok());
  EXPECT_TRUE(b);
  ASSERT_TRUE(BoolSetter(&b)("off").ok());
  EXPECT_FALSE(b);
  b = true;
  absl::Status s = BoolSetter(&b)("maybe");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "\"maybe\" is not a switch value; expected true or false");
  EXPECT_TRUE(b);
}

struct IntCase {
  std::string text;
  int64_t min, max;
  std::string expected;  // ParseInt's `expected`
  std::optional<int64_t> want;
  std::string error;  // when want is nullopt
};

class ParseIntTest : public testing::TestWithParam<IntCase> {};

TEST_P(ParseIntTest, ReadsWholeNumbersInRange) {
  const IntCase& c = GetParam();
  absl::StatusOr<int64_t> got = ParseInt(c.text, c.min, c.max, c.expected);
  if (c.want) {
    ASSERT_TRUE(got.ok()) << c.text << ": " << got.status();
    EXPECT_EQ(*got, *c.want);
    return;
  }
  ASSERT_FALSE(got.ok()) << c.text << " parsed as " << *got;
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(got.status().message(), c.error);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ParseIntTest,
    testing::Values(IntCase{"1", 1, 10, "", 1, ""}, IntCase{"10", 1, 10, "", 10, ""},
                    IntCase{"+7", 1, 10, "", 7, ""}, IntCase{"-3", -5, 0, "", -3, ""},
                    IntCase{"9223372036854775807", 0, INT64_MAX, "", INT64_MAX, ""},
                    IntCase{"0", 1, 10, "", std::nullopt, "expected a whole number in 1..10"},
                    IntCase{"11", 1, 10, "", std::nullopt, "expected a whole number in 1..10"},
                    IntCase{"", 1, 10, "", std::nullopt, "expected a whole number in 1..10"},
                    IntCase{"2.5", 1, 10, "", std::nullopt, "expected a whole number in 1..10"},
                    IntCase{"4x", 1, 10, "", std::nullopt, "expected a whole number in 1..10"},
                    IntCase{"0x4", 1, 10, "", std::nullopt, "expected a whole number in 1..10"},
                    IntCase{"9223372036854775808", 0, INT64_MAX, "", std::nullopt,
                            "expected a whole number in 0..9223372036854775807"},
                    IntCase{"-1", 0, 5, "a count >= 0", std::nullopt, "expected a count >= 0"}));

TEST(SetterTest, IntSetterStoresInItsType) {
  int32_t i = 5;
  ASSERT_TRUE(IntSetter(&i, 1, 65535)("65535").ok());
  EXPECT_EQ(i, 65535);
  absl::Status s = IntSetter(&i, 1, 65535)("65536");
  EXPECT_EQ(s.message(), "expected a whole number in 1..65535");
  EXPECT_EQ(i, 65535);

  std::optional<int32_t> maybe;
  ASSERT_TRUE(IntSetter(&maybe, 0, 100)("0").ok());
  EXPECT_EQ(maybe, 0);
  std::optional<int32_t> untouched;
  EXPECT_FALSE(IntSetter(&untouched, 0, 100)("x").ok());
  EXPECT_EQ(untouched, std::nullopt);

  int count = 0;
  s = IntSetter(&count, 0, INT32_MAX, "a whole number >= 0")("-1");
  EXPECT_EQ(s.message(), "expected a whole number >= 0");
}

struct DurationCase {
  std::string text;
  std::optional<absl::Duration> want;
  std::string error;  // when want is nullopt
};

class DurationSetterTest : public testing::TestWithParam<DurationCase> {};

TEST_P(DurationSetterTest, ReadsSecondsOrDurations) {
  const DurationCase& c = GetParam();
  absl::Duration d = absl::Seconds(-1);
  absl::Status s = DurationSetter(&d)(c.text);
  if (c.want) {
    ASSERT_TRUE(s.ok()) << c.text << ": " << s;
    EXPECT_EQ(d, *c.want) << c.text;
    return;
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.text;
  EXPECT_EQ(s.message(), c.error) << c.text;
  EXPECT_EQ(d, absl::Seconds(-1)) << c.text;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DurationSetterTest,
    testing::Values(
        DurationCase{"30", absl::Seconds(30), ""}, DurationCase{"1.5", absl::Seconds(1.5), ""},
        DurationCase{"0", absl::ZeroDuration(), ""},
        DurationCase{"500ms", absl::Milliseconds(500), ""},
        DurationCase{"2m", absl::Minutes(2), ""}, DurationCase{"1h30m", absl::Minutes(90), ""},
        DurationCase{"8760h", kMaxFlagDuration, ""},
        DurationCase{"-1", std::nullopt, "expected a duration of 0 or more"},
        DurationCase{"-5s", std::nullopt, "expected a duration of 0 or more"},
        DurationCase{"nan", std::nullopt, "expected a duration of 0 or more"},
        DurationCase{"fast", std::nullopt, "expected a duration such as 30, 30s, 500ms or 2m"},
        DurationCase{"", std::nullopt, "expected a duration such as 30, 30s, 500ms or 2m"},
        DurationCase{"8761h", std::nullopt, "expected a duration of at most 365 days (8760h)"},
        DurationCase{"1e19", std::nullopt, "expected a duration of at most 365 days (8760h)"},
        DurationCase{"inf", std::nullopt, "expected a duration of at most 365 days (8760h)"}));

TEST(SetterTest, MillisSetter) {
  absl::Duration d = absl::Seconds(7);
  ASSERT_TRUE(MillisSetter(&d)("250").ok());
  EXPECT_EQ(d, absl::Milliseconds(250));
  ASSERT_TRUE(MillisSetter(&d)("0").ok());
  EXPECT_EQ(d, absl::ZeroDuration());
  d = absl::Seconds(7);
  for (const char* bad : {"-1", "1.5", "3s", "", "99999999999999999999"}) {
    absl::Status s = MillisSetter(&d)(bad);
    EXPECT_EQ(s.message(), "expected milliseconds, a whole number >= 0") << bad;
    EXPECT_EQ(d, absl::Seconds(7)) << bad;
  }
}

}  // namespace
}  // namespace rdzv
