#include "common/site_config.h"

#include <fstream>
#include <sstream>
#include <string>

namespace rdzv {

absl::StatusOr<EnvLookup> WithSiteConfig(EnvLookup process) {
  const std::optional<std::string> named = process("RDZV_CONFIG");
  const std::string path = named.value_or(kDefaultSiteConfig);
  std::ifstream file(path);
  if (!file) {
    if (named) {
      return absl::NotFoundError("RDZV_CONFIG=" + path +
                                 " cannot be read; point it at a readable file or unset it");
    }
    return process;
  }
  std::stringstream text;
  text << file.rdbuf();
  absl::StatusOr<EnvList> vars = ParseConfigText(text.str());
  if (!vars.ok()) {
    return absl::InvalidArgumentError(path + ": " + std::string(vars.status().message()));
  }
  return EnvWithFallback(std::move(process), EnvFromList(std::move(*vars)));
}

}  // namespace rdzv
