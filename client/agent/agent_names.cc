#include "client/agent/agent_names.h"

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/core/file_names.h"

namespace rdzv {

std::string NewAgentId(absl::string_view host, int64_t pid) {
  std::random_device rd;
  return absl::StrFormat("%s:%d:%08x", host, pid, rd());
}

absl::StatusOr<std::string> MakeRunDir(absl::string_view parent, absl::string_view job_id) {
  std::string pattern = absl::StrCat(parent, "/rdzv-", FileNamePart(job_id), "-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot make a run directory in %s: %s; set TMPDIR to a directory you can write", parent,
        std::strerror(errno)));
  }
  return pattern;
}

}  // namespace rdzv
