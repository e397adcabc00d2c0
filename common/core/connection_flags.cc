#include "common/core/connection_flags.h"

#include "absl/strings/str_format.h"

namespace rdzv {

void AddConnectionFlags(FlagParser& parser, ConnectionFlags* flags) {
  parser.Add({"rdzv-token-file", "RDZV_TOKEN_FILE", "FILE",
              "a file (mode 0600, yours) holding the job's secret token, the same for every agent\n"
              "of the job and for rdzvctl; for clusters without MUNGE, and rdzvd --auth token\n"
              "(make one: openssl rand -hex 32 > FILE; default: MUNGE)",
              StringSetter(&flags->token_file)});
  parser.Add({"munge-socket", "RDZV_MUNGE_SOCKET", "PATH", "munged's socket (default: libmunge's)",
              StringSetter(&flags->munge_socket)});
  parser.Add(
      {"server-uid", "RDZV_SERVER_UID", "UID",
       "under MUNGE, the uid the rdzvd of --rdzv-endpoint runs as; one that cannot prove it\n"
       "runs as this uid is refused (default: any uid munged vouches for). A server hosted\n"
       "by the job's own agent must always run as this agent's user",
       UidSetter(&flags->server_uid)});
  parser.Add({"tls-ca", "RDZV_TLS_CA", "FILE",
              "talk TLS to the rdzvd of --rdzv-endpoint and verify its certificate with this CA\n"
              "(PEM); for an rdzvd started with --tls-cert (default: plaintext)",
              StringSetter(&flags->tls_ca)});
  parser.Add(
      {"tls-server-name", "RDZV_TLS_SERVER_NAME", "NAME",
       "with --tls-ca, the name rdzvd's certificate must hold (default: the endpoint's host)",
       StringSetter(&flags->tls_server_name)});
}

absl::Status CheckTlsServerName(absl::string_view ca_file, absl::string_view server_name,
                                absl::string_view ca_name, absl::string_view server_name_name) {
  if (!ca_file.empty() || server_name.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s needs %s, the CA that signed the server's certificate", server_name_name, ca_name));
}

}  // namespace rdzv
