#include "client/agent/core/launcher_env.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace rdzv {
namespace {

// The value of `name` as a number >= 0, std::nullopt when unset or empty.
absl::StatusOr<std::optional<int>> Number(const EnvLookup& env, const char* name) {
  const std::optional<std::string> v = env(name);
  if (!v || v->empty()) return std::nullopt;
  int n = 0;
  if (!absl::SimpleAtoi(*v, &n) || n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "=\"", *v, "\" is not a whole number; unset it or fix the launcher"));
  }
  return n;
}

}  // namespace

absl::StatusOr<std::optional<LauncherEnv>> ParseLauncherEnv(const EnvLookup& env) {
  struct Source {
    const char* launcher;
    const char* rank;
    const char* size;
    const char* local_rank;
  };
  static constexpr Source kSources[] = {
      {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
      {"PMIx", "PMIX_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
      {"MPICH", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
  };
  for (const Source& s : kSources) {
    absl::StatusOr<std::optional<int>> rank = Number(env, s.rank);
    if (!rank.ok()) return rank.status();
    if (!*rank) continue;
    absl::StatusOr<std::optional<int>> size = Number(env, s.size);
    if (!size.ok()) return size.status();
    absl::StatusOr<std::optional<int>> local = Number(env, s.local_rank);
    if (!local.ok()) return local.status();
    LauncherEnv out;
    out.launcher = s.launcher;
    out.rank = **rank;
    out.size = size->value_or(0);
    out.local_rank = local->value_or(-1);
    if (out.size > 0 && out.rank >= out.size) {
      return absl::InvalidArgumentError(absl::StrCat(s.rank, "=", out.rank, " is not below ",
                                                     s.size, "=", out.size,
                                                     "; a variable is left over from another job"));
    }
    out.job_id = env("PMIX_NAMESPACE").value_or("");
    if (out.job_id.empty()) out.job_id = env("OMPI_MCA_ess_base_jobid").value_or("");
    return out;
  }
  return std::nullopt;
}

bool IsLauncherPlaceVariable(std::string_view name) {
  static constexpr std::string_view kPrefixes[] = {
      "PMI_",           "PMIX_",         "OMPI_COMM_WORLD_", "OMPI_MCA_ess",
      "OMPI_MCA_orte_", "OMPI_MCA_pmix", "MV2_COMM_WORLD_",
  };
  static constexpr std::string_view kNames[] = {
      "OMPI_UNIVERSE_SIZE", "OMPI_FIRST_RANKS", "OMPI_APP_CTX_NUM_PROCS",
      "OMPI_NUM_APP_CTX",   "MPI_LOCALRANKID",  "MPI_LOCALNRANKS",
  };
  for (std::string_view prefix : kPrefixes) {
    if (name.starts_with(prefix)) return true;
  }
  for (std::string_view n : kNames) {
    if (name == n) return true;
  }
  return false;
}

}  // namespace rdzv
