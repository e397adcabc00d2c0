#include "common/core/file_names.h"

#include <optional>

#include "absl/strings/ascii.h"

namespace rdzv {

std::string TempDirectory(const EnvLookup& env) {
  std::optional<std::string> tmp = env("TMPDIR");
  if (!tmp || tmp->empty() || tmp->front() != '/') return "/tmp";
  while (tmp->size() > 1 && tmp->back() == '/') tmp->pop_back();
  return *tmp;
}

std::string FileNamePart(absl::string_view text) {
  std::string name(text);
  for (char& c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      c = '_';
    }
  }
  return name;
}

}  // namespace rdzv
