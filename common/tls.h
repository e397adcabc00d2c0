// TLS for rdzv's gRPC traffic: reading and checking the PEM files (rdzvd's certificate and key,
// the clients' CA), the gRPC credentials made from them, and telling a failed TLS handshake apart
// from a server that is merely unreachable.
//
// rdzvd serves TLS with --tls-cert and --tls-key; agents, rdzvctl and librdzv verify it with
// --tls-ca (RDZV_TLS_CA). Without those everything stays plaintext, as before.
//
// The functions keep no state and are thread-safe. The loaders read files (bounded to
// kMaxTlsFileBytes); ServerSpeaksTls connects to a server.
#ifndef RDZV_COMMON_TLS_H_
#define RDZV_COMMON_TLS_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace rdzv {

// The largest PEM file read: a certificate chain is a few KiB.
inline constexpr size_t kMaxTlsFileBytes = size_t{1} << 20;

// A server's certificate chain and private key, PEM, both checked: the key parses and belongs to
// the chain's first certificate.
struct TlsServerIdentity {
  std::string cert_chain_pem;
  std::string private_key_pem;
};

// Reads and checks rdzvd's files. `cert_flag` and `key_flag` name them in errors ("--tls-cert").
// The key file must be a regular file, not a symbolic link, and readable by its owner only
// (mode 0600 or 0400; an ACL entry that lets this process's user read it, as systemd's
// LoadCredential= adds, is fine). Every error is one line that names the file and the fix.
absl::StatusOr<TlsServerIdentity> LoadTlsServerIdentity(const std::string& cert_file,
                                                        const std::string& key_file,
                                                        absl::string_view cert_flag,
                                                        absl::string_view key_flag);

// Reads and checks a CA bundle (one or more PEM certificates). `flag` names it in errors.
absl::StatusOr<std::string> LoadTlsCa(const std::string& ca_file, absl::string_view flag);

// TLS credentials for `identity`, or plaintext ones when it is empty.
// Call first thing in main(), before any OpenSSL use (gRPC's TLS, MUNGE-vouched keys). OpenSSL
// frees its state from an atexit handler by default; a thread of gRPC's that ends after that
// handler ran leaves its per-thread random generator behind, which LeakSanitizer reports. Without
// the handler each thread frees its own when it ends, and the rest goes with the process.
void InitOpenSslWithoutExitCleanup();

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const TlsServerIdentity& identity);

// Credentials that verify the server against `ca_pem`, or plaintext ones when it is empty.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const std::string& ca_pem);

// Whether a call to `endpoint` that failed with `status` failed in the TLS handshake: then the
// one-line error to give up with at once, as retrying cannot help. `tls` says whether the client
// used TLS. Without TLS, a connection the server closed before answering may mean that it serves
// TLS: then this asks it with ServerSpeaksTls (blocks up to 3 s). nullopt for any other failure.
std::optional<absl::Status> TlsConnectFailure(const absl::Status& status,
                                              const std::string& endpoint, bool tls);

// Whether the server at `endpoint` completes a TLS handshake (its certificate unchecked) within
// `timeout`. Blocks.
bool ServerSpeaksTls(const std::string& endpoint, absl::Duration timeout);

}  // namespace rdzv

#endif  // RDZV_COMMON_TLS_H_
