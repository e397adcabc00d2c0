// How a Client's channels are made: the channel arguments (reconnect backoff, keepalive, one
// connection per client) and the credentials (TLS with ClientTls's CA, else plaintext).
// Stateless; reads the CA file. Thread-safe.
#ifndef RDZV_CLIENT_CLIENT_CHANNEL_H_
#define RDZV_CLIENT_CLIENT_CHANNEL_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <memory>

#include "absl/status/statusor.h"
#include "client/client.h"

namespace rdzv {

struct ClientChannelSetup {
  grpc::ChannelArguments args;
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

// The arguments and credentials for every channel of a Client with `options`. A one-line error
// naming the file when options.tls.ca_file cannot be read or holds no certificate.
absl::StatusOr<ClientChannelSetup> MakeClientChannelSetup(const ClientOptions& options);

}  // namespace rdzv

#endif  // RDZV_CLIENT_CLIENT_CHANNEL_H_
