#include "common/core/flags.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
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

TEST_P(FlagParserErrorTest, RefusesWithAMessageNamingTheFlag) {
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

}  // namespace
}  // namespace rdzv
