#include "client/agent/core/launcher_env.h"

#include <gtest/gtest.h>

#include <string>

#include "common/core/env.h"

namespace rdzv {
namespace {

struct Case {
  const char* name;
  EnvList env;
  bool found;
  std::string launcher;
  int rank, size, local_rank;
  std::string job_id;
};

const Case kCases[] = {
    {"nothing", {{"PATH", "/bin"}}, false, "", -1, 0, -1, ""},
    {"Open MPI 4 (mpirun -np 2)",
     {{"OMPI_COMM_WORLD_RANK", "1"},
      {"OMPI_COMM_WORLD_SIZE", "2"},
      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
      {"PMIX_RANK", "1"},
      {"PMIX_NAMESPACE", "1525088257"},
      {"OMPI_MCA_ess_base_jobid", "1525088257"}},
     true,
     "Open MPI",
     1,
     2,
     1,
     "1525088257"},
    {"Open MPI without PMIx",
     {{"OMPI_COMM_WORLD_RANK", "0"},
      {"OMPI_COMM_WORLD_SIZE", "3"},
      {"OMPI_MCA_ess_base_jobid", "77"}},
     true,
     "Open MPI",
     0,
     3,
     -1,
     "77"},
    {"PMIx alone", {{"PMIX_RANK", "2"}, {"PMIX_NAMESPACE", "ns"}}, true, "PMIx", 2, 0, -1, "ns"},
    {"MPICH Hydra",
     {{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "0"}},
     true,
     "MPICH",
     3,
     4,
     0,
     ""},
    {"empty values count as unset",
     {{"OMPI_COMM_WORLD_RANK", ""}, {"PMI_RANK", "0"}},
     true,
     "MPICH",
     0,
     0,
     -1,
     ""},
};

TEST(ParseLauncherEnvTest, ReadsEachLaunchersVariables) {
  for (const Case& c : kCases) {
    absl::StatusOr<std::optional<LauncherEnv>> got = ParseLauncherEnv(EnvFromList(c.env));
    ASSERT_TRUE(got.ok()) << c.name << ": " << got.status();
    ASSERT_EQ(got->has_value(), c.found) << c.name;
    if (!c.found) continue;
    EXPECT_EQ((*got)->launcher, c.launcher) << c.name;
    EXPECT_EQ((*got)->rank, c.rank) << c.name;
    EXPECT_EQ((*got)->size, c.size) << c.name;
    EXPECT_EQ((*got)->local_rank, c.local_rank) << c.name;
    EXPECT_EQ((*got)->job_id, c.job_id) << c.name;
  }
}

TEST(ParseLauncherEnvTest, BadValuesNameTheVariable) {
  const struct {
    EnvList env;
    std::string message;
  } cases[] = {
      {{{"OMPI_COMM_WORLD_RANK", "x"}},
       "OMPI_COMM_WORLD_RANK=\"x\" is not a whole number; unset it or fix the launcher"},
      {{{"PMI_RANK", "4"}, {"PMI_SIZE", "4"}},
       "PMI_RANK=4 is not below PMI_SIZE=4; a variable is left over from another job"},
      {{{"PMI_RANK", "1"}, {"PMI_SIZE", "-2"}},
       "PMI_SIZE=\"-2\" is not a whole number; unset it or fix the launcher"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(ParseLauncherEnv(EnvFromList(c.env)).status().message(), c.message);
  }
}

}  // namespace
}  // namespace rdzv
