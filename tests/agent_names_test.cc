// The agent's id and its run directory.
#include "client/agent/agent_names.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "tests/testing/subprocess.h"

namespace rdzv {
namespace {

TEST(AgentNamesTest, AgentIdNamesHostAndPidAndTellsTwoAgentsApart) {
  const std::string a = NewAgentId("n1.cluster", 4242);
  const std::string b = NewAgentId("n1.cluster", 4242);
  const std::vector<std::string> parts = absl::StrSplit(a, ':');
  ASSERT_EQ(parts.size(), 3u) << a;
  EXPECT_EQ(parts[0], "n1.cluster");
  EXPECT_EQ(parts[1], "4242");
  EXPECT_EQ(parts[2].size(), 8u);
  EXPECT_EQ(parts[2].find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_NE(a, b);
}

TEST(AgentNamesTest, RunDirIsPrivateAndNamedAfterTheJob) {
  testing::ScopedTempDir tmp;
  absl::StatusOr<std::string> dir = MakeRunDir(tmp.path(), "slurm-42.0/../x y");
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_TRUE(absl::StartsWith(*dir, tmp.path() + "/rdzv-slurm-42.0_.._x_y-")) << *dir;
  struct stat st;
  ASSERT_EQ(stat(dir->c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(st.st_uid, geteuid());
  std::filesystem::remove(*dir);
}

TEST(AgentNamesTest, RunDirThatCannotBeMadeSaysWhereAndWhatToDo) {
  absl::StatusOr<std::string> dir = MakeRunDir("/nonexistent/tmp", "j");
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(dir.status().message(), "in /nonexistent/tmp: No such file"))
      << dir.status();
  EXPECT_TRUE(absl::StrContains(dir.status().message(), "set TMPDIR")) << dir.status();
}

}  // namespace
}  // namespace rdzv
