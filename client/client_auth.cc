// How librdzv's calls carry their credential (common/auth.h).
#include <grpcpp/client_context.h>

#include "client/client.h"
#include "common/auth.h"

namespace rdzv {

absl::StatusOr<ClientAuth> ResolveClientAuth(ClientAuth auth) {
  if (auth.mode == ClientAuth::Mode::kToken && auth.token.empty()) {
    return absl::InvalidArgumentError("token authentication needs a token (--rdzv-token-file)");
  }
  if (auth.mode == ClientAuth::Mode::kAuto) {
    auth.mode = !auth.token.empty()                     ? ClientAuth::Mode::kToken
                : MungeSocketPresent(auth.munge_socket) ? ClientAuth::Mode::kMunge
                                                        : ClientAuth::Mode::kNone;
  }
  return auth;
}

absl::Status AttachCredential(grpc::ClientContext& ctx, const ClientAuth& auth,
                              absl::string_view method, absl::string_view job) {
  switch (auth.mode) {
    case ClientAuth::Mode::kToken:
      ctx.AddMetadata(kTokenMetadata, auth.token);
      return absl::OkStatus();
    case ClientAuth::Mode::kMunge: {
      absl::StatusOr<std::string> cred = MungeEncode(CallPayload(method, job), auth.munge_socket);
      if (!cred.ok()) return cred.status();
      ctx.AddMetadata(kMungeMetadata, *cred);
      return absl::OkStatus();
    }
    case ClientAuth::Mode::kAuto:
    case ClientAuth::Mode::kNone:
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

}  // namespace rdzv
