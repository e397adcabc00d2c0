#include "client/agent/agent_names.h"

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace rdzv {

std::string NewAgentId(absl::string_view host, int64_t pid) {
  std::random_device rd;
  return absl::StrFormat("%s:%d:%08x", host, pid, rd());
}

absl::StatusOr<std::string> MakeRunDir(absl::string_view tmp_dir, absl::string_view job_id) {
  std::string safe(job_id);
  for (char& ch : safe) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '.') ch = '_';
  }
  const absl::string_view parent = tmp_dir.empty() ? "/tmp" : tmp_dir;
  std::string pattern = absl::StrCat(parent, "/rdzv-", safe, "-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot make a run directory in %s: %s; set TMPDIR to a directory you can write", parent,
        std::strerror(errno)));
  }
  return pattern;
}

}  // namespace rdzv
