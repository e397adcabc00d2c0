// What an MPI launcher (Open MPI's mpirun, PMIx, MPICH's Hydra) tells each process it starts
// through environment variables: its rank among the launched processes, their number, and a job
// id. Outside Slurm, an agent started once per node by `mpirun` takes its node rank and the node
// count from here.
//
// ParseLauncherEnv reads through an injected EnvLookup, so it is pure and thread-safe.
#ifndef RDZV_CLIENT_AGENT_CORE_LAUNCHER_ENV_H_
#define RDZV_CLIENT_AGENT_CORE_LAUNCHER_ENV_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/core/env.h"

namespace rdzv {

struct LauncherEnv {
  std::string launcher;  // "Open MPI", "PMIx" or "MPICH": names the variables read
  int rank = -1;         // OMPI_COMM_WORLD_RANK, else PMIX_RANK, else PMI_RANK
  int size = 0;          // OMPI_COMM_WORLD_SIZE, else PMI_SIZE; 0 when the launcher says none
  int local_rank = -1;   // OMPI_COMM_WORLD_LOCAL_RANK, else MPI_LOCALRANKID; -1 when not said
  std::string job_id;    // PMIX_NAMESPACE, else OMPI_MCA_ess_base_jobid; "" when not said
};

// Returns std::nullopt when no launcher's rank variable is set, and InvalidArgumentError (one
// line naming the variable) when a value is not a number or the rank is not below the size.
absl::StatusOr<std::optional<LauncherEnv>> ParseLauncherEnv(const EnvLookup& env);

// Whether `name` is one of the variables by which a launcher tells the process it started where
// that process sits among its processes and how to reach the launcher: PMI_* (Slurm's pmi2
// plugin, MPICH's Hydra), PMIX_* (PMIx, Slurm's pmix plugin), Open MPI's OMPI_COMM_WORLD_*,
// OMPI_UNIVERSE_SIZE and the MCA settings that select its runtime (OMPI_MCA_ess*,
// OMPI_MCA_orte_*, OMPI_MCA_pmix*), MPICH's MPI_LOCALRANKID/MPI_LOCALNRANKS and MVAPICH2's
// MV2_COMM_WORLD_*. Settings a user makes for MPI itself (OMPI_MCA_btl, I_MPI_*, ...) are not.
bool IsLauncherPlaceVariable(std::string_view name);

// The variables among those that name a descriptor the launcher left open for the process (the
// PMI socket): a process that is not the launcher's must not inherit it.
inline constexpr std::string_view kLauncherDescriptorVariables[] = {"PMI_FD"};

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_CORE_LAUNCHER_ENV_H_
