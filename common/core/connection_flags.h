// How a client program (rdzv-agent, rdzvctl) reaches rdzvd and proves who it is: the flags both
// take, each also an RDZV_* variable, declared once so that they read and behave the same in both,
// and the rule that ties the TLS ones together.
//
// Pure; thread-safe.
#ifndef RDZV_COMMON_CORE_CONNECTION_FLAGS_H_
#define RDZV_COMMON_CORE_CONNECTION_FLAGS_H_

#include <sys/types.h>

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/core/flags.h"

namespace rdzv {

struct ConnectionFlags {
  std::string token_file;           // --rdzv-token-file: the job's token
  std::string munge_socket;         // --munge-socket; "" for libmunge's
  std::optional<uid_t> server_uid;  // --server-uid: the uid an rdzvd must prove it runs as
  std::string tls_ca;               // --tls-ca: verify rdzvd's TLS certificate with this CA
  std::string tls_server_name;      // --tls-server-name; "" for the endpoint's host
};

// Adds --rdzv-token-file, --munge-socket, --server-uid, --tls-ca and --tls-server-name to
// `parser`, each setting its member of `*flags`, which must outlive the parser.
void AddConnectionFlags(FlagParser& parser, ConnectionFlags* flags);

// That a TLS server name comes with the CA that checks it. InvalidArgument "SERVER_NAME needs CA,
// the CA that signed the server's certificate" otherwise, naming the two as the caller knows them
// (flags by default, or a function's parameters).
absl::Status CheckTlsServerName(absl::string_view ca_file, absl::string_view server_name,
                                absl::string_view ca_name = "--tls-ca",
                                absl::string_view server_name_name = "--tls-server-name");

}  // namespace rdzv

#endif  // RDZV_COMMON_CORE_CONNECTION_FLAGS_H_
