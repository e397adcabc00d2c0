// The site configuration (/etc/rdzv.conf, or the file $RDZV_CONFIG names) under the process
// environment, as rdzv-agent and rdzvctl read it: admins set RDZV_ENDPOINT for everyone there,
// and a user's environment still overrides it.
#ifndef RDZV_COMMON_SITE_CONFIG_H_
#define RDZV_COMMON_SITE_CONFIG_H_

#include "absl/status/statusor.h"
#include "common/core/env.h"

namespace rdzv {

inline constexpr char kDefaultSiteConfig[] = "/etc/rdzv.conf";

// `process` with the site configuration file as its fallback. A missing default file is no
// error (the site has none); a file that RDZV_CONFIG names and that cannot be read is NotFound,
// a malformed one InvalidArgument naming the file and line. Reads the file once, now.
absl::StatusOr<EnvLookup> WithSiteConfig(EnvLookup process);

}  // namespace rdzv

#endif  // RDZV_COMMON_SITE_CONFIG_H_
