// Where rdzv-agent keeps the files of a job on a node (its run directory, its relay's socket, the
// GPU exchange of a node's tasks), and how a job id or a node name becomes part of a file name.
// One rule each, so that the tasks of one node, which each work the names out alone, agree.
//
// Pure; thread-safe.
#ifndef RDZV_COMMON_CORE_FILE_NAMES_H_
#define RDZV_COMMON_CORE_FILE_NAMES_H_

#include <string>

#include "absl/strings/string_view.h"
#include "common/core/env.h"

namespace rdzv {

// $TMPDIR when it names an absolute path (without the '/'s it may end in), else /tmp. Slurm sites
// may give each job a private TMPDIR, which every task of the job on a node shares.
std::string TempDirectory(const EnvLookup& env);

// `text` (a job id, a node name) as part of a file name: every character but ASCII letters,
// digits, '.', '_' and '-' becomes '_' (a job id may hold '/').
std::string FileNamePart(absl::string_view text);

}  // namespace rdzv

#endif  // RDZV_COMMON_CORE_FILE_NAMES_H_
