// How librdzv's calls carry their credential (common/auth.h).
#include <grpcpp/client_context.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/auth.h"
#include "common/net.h"

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

absl::StatusOr<ClientAuth> LoadClientAuth(ClientAuth auth, const std::string& token_file) {
  const bool may_use_token =
      auth.mode == ClientAuth::Mode::kAuto || auth.mode == ClientAuth::Mode::kToken;
  if (may_use_token && !token_file.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(token_file);
    if (!token.ok()) return token.status();
    auth.token = *std::move(token);
  }
  return ResolveClientAuth(std::move(auth));
}

absl::Status AttachCredential(grpc::ClientContext& ctx, const ClientAuth& auth,
                              absl::string_view method, absl::string_view job,
                              absl::string_view nonce) {
  if (!nonce.empty()) ctx.AddMetadata(kNonceMetadata, std::string(nonce));
  switch (auth.mode) {
    case ClientAuth::Mode::kToken:
      ctx.AddMetadata(kTokenMetadata, auth.token);
      return absl::OkStatus();
    case ClientAuth::Mode::kMunge: {
      // A busy munged is waited for within the call's deadline, up to a minute.
      const absl::Time retry_until =
          std::min(absl::FromChrono(ctx.deadline()), absl::Now() + absl::Minutes(1));
      absl::StatusOr<std::string> cred =
          MungeEncode(CallPayload(method, job), auth.munge_socket, retry_until);
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

namespace {

// The proof in the answer's initial metadata, or in its trailing metadata when the server ended
// the call at once (gRPC then sends both in one block).
std::string FindProof(const grpc::ClientContext& ctx) {
  for (const auto* md : {&ctx.GetServerInitialMetadata(), &ctx.GetServerTrailingMetadata()}) {
    auto it = md->find(kProofMetadata);
    if (it != md->end()) return std::string(it->second.data(), it->second.length());
  }
  return "";
}

}  // namespace

absl::Status CheckServerProof(const grpc::ClientContext& ctx, const ClientAuth& auth,
                              absl::string_view method, absl::string_view job,
                              absl::string_view nonce, bool required) {
  if (auth.mode != ClientAuth::Mode::kMunge && auth.mode != ClientAuth::Mode::kToken) {
    return absl::OkStatus();
  }
  const std::string proof = FindProof(ctx);
  if (proof.empty()) {
    if (!required) return absl::OkStatus();
    return absl::FailedPreconditionError("it sent no proof");
  }
  if (auth.mode == ClientAuth::Mode::kToken) {
    const std::string payload =
        ServerProofPayload(method, job, nonce, absl::StrCat("token:", TokenDigest(auth.token)));
    if (!ConstantTimeEquals(proof, TokenProof(auth.token, payload))) {
      return absl::FailedPreconditionError(
          "its proof does not come from a holder of the job's token");
    }
    return absl::OkStatus();
  }
  absl::StatusOr<MungeIdentity> id = MungeDecode(proof, auth.munge_socket);
  if (!id.ok()) {
    if (id.status().code() == absl::StatusCode::kUnavailable) return id.status();
    return absl::FailedPreconditionError(
        absl::StrCat("its proof is no valid MUNGE credential here: ", id.status().message()));
  }
  if (id->payload != ServerProofPayload(method, job, nonce, absl::StrCat("uid:", geteuid()))) {
    return absl::FailedPreconditionError("its proof was made for another call");
  }
  if (auth.server_uid && id->uid != *auth.server_uid) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "it runs as uid %d, and the server of this job runs as uid %d", id->uid, *auth.server_uid));
  }
  return absl::OkStatus();
}

bool ProofRequiredAt(absl::string_view endpoint) {
  absl::StatusOr<HostPort> hp = ParseHostPort(endpoint, 29400);
  return !hp.ok() || !IsLoopbackAddress(hp->host);
}

}  // namespace rdzv
