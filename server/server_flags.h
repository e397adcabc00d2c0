// rdzvd's command line: its flags, their variables, its help text, and the checks that need
// nothing but the text. What needs the system (the group database for --admin-group, munged,
// the TLS files, the log sink) is left to rdzvd's main(), which gets it from here unread.
#ifndef RDZV_SERVER_SERVER_FLAGS_H_
#define RDZV_SERVER_SERVER_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/core/env.h"
#include "server/server.h"

namespace rdzv {

struct ServerFlags {
  // All of the server's options but service.auth.admin_gids and tls, which main() fills in from
  // admin_groups and tls_cert/tls_key.
  ServerOptions options;
  std::string log_level = "info";  // for SetUpLogging, which knows the levels
  std::string admin_groups;        // --admin-group as given: "wheel,1001"
  // Both or neither (checked); LoadTlsServerIdentity reads them.
  std::string tls_cert;
  std::string tls_key;
  // --peer-tls-ca: the CA of the peers' certificates (main() reads it into
  // options.service.peer_tls_ca_pem).
  std::string peer_tls_ca;
  bool help = false;  // nothing else is checked when set
  bool version = false;
};

// Parses `args` (without argv[0]) and the variables `env` finds; the command line wins.
// InvalidArgument, one line naming the flag and the fix, for an unknown flag, a bad value, a
// word after the flags, --keepalive-timeout-ms 0 with pings on, --auth none on an address that
// is not loopback, only one of --tls-cert and --tls-key, a --peers endpoint that does not
// parse, or --peers with --auth token.
absl::StatusOr<ServerFlags> ParseServerFlags(const std::vector<std::string>& args,
                                             const EnvLookup& env);

// The --help text.
std::string ServerHelp();

}  // namespace rdzv

#endif  // RDZV_SERVER_SERVER_FLAGS_H_
