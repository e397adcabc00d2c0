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

}  // namespace rdzv

#endif  // RDZV_CLIENT_AGENT_CORE_LAUNCHER_ENV_H_
