#include "client/client_channel.h"

#include <string>

#include "common/core/connection_flags.h"
#include "common/tls.h"

namespace rdzv {

absl::StatusOr<ClientChannelSetup> MakeClientChannelSetup(const ClientOptions& options) {
  ClientChannelSetup setup;
  std::string ca_pem;
  if (!options.tls.ca_file.empty()) {
    absl::StatusOr<std::string> ca = LoadTlsCa(options.tls.ca_file, "--tls-ca");
    if (!ca.ok()) return ca.status();
    ca_pem = *std::move(ca);
  } else if (absl::Status s = CheckTlsServerName(options.tls.ca_file, options.tls.server_name);
             !s.ok()) {
    return s;
  }
  setup.credentials = ChannelCredentials(ca_pem);
  grpc::ChannelArguments& args = setup.args;
  if (!options.tls.server_name.empty()) args.SetSslTargetNameOverride(options.tls.server_name);
  // Reconnect quickly once a server comes up: the default backoff can wait for minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC takes it as the time a connection attempt gets
  // to finish its handshake (default 20s). Short, a server busy accepting a thousand agents
  // completes no handshake in time and every agent keeps starting over.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_timeout)));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Each agent is its own client: never share a TCP connection with another Client object.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Bandwidth probing sizes flow-control windows for bulk transfers; our messages are tiny, and
  // its ping after each received message costs rdzvd a read and a write per agent.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  return setup;
}

}  // namespace rdzv
