// How librdzv's calls carry their credential (common/auth.h).
#include <grpcpp/client_context.h>
#include <unistd.h>

#include <algorithm>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
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
    if (!auth.token.empty()) {
      auth.mode = ClientAuth::Mode::kToken;
    } else if (std::string problem = MungeSocketProblem(auth.munge_socket); problem.empty()) {
      auth.mode = ClientAuth::Mode::kMunge;
    } else {
      auth.mode = ClientAuth::Mode::kNone;
      auth.none_because = absl::StrCat(problem, ", and no --rdzv-token-file");
    }
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

// The server keys this process has seen vouched for, by the credential that vouched: each
// credential is decoded once (by this host's munged) and its key kept until it expires.
class VouchedKeys {
 public:
  struct Key {
    std::string public_key;
    uid_t uid = 0;
  };

  // Checks `credential`, or waits for the check another thread has begun (the many clients of
  // one process that call at once ask munged once).
  absl::StatusOr<Key> Check(absl::string_view credential, const std::string& socket,
                            absl::Time retry_until) {
    if (credential.size() > kMaxCredentialBytes) {
      return absl::FailedPreconditionError("its key credential is too long");
    }
    std::shared_ptr<Pending> pending;
    bool mine = false;
    {
      absl::MutexLock lock(&mu_);
      auto it = keys_.find(credential);
      if (it != keys_.end() && absl::Now() < it->second.until) return it->second.key;
      auto [p, added] = pending_.try_emplace(std::string(credential));
      if (added) p->second = std::make_shared<Pending>();
      pending = p->second;
      mine = added;
    }
    if (!mine) {
      if (pending->done.WaitForNotificationWithDeadline(retry_until)) return pending->result;
      return absl::UnavailableError("munged did not check the server's key credential in time");
    }
    pending->result = Decode(credential, socket, retry_until);
    {
      absl::MutexLock lock(&mu_);
      pending_.erase(std::string(credential));
    }
    pending->done.Notify();
    return pending->result;
  }

 private:
  struct Pending {
    absl::Notification done;
    absl::StatusOr<Key> result;
  };

  absl::StatusOr<Key> Decode(absl::string_view credential, const std::string& socket,
                             absl::Time retry_until) {
    const absl::Time now = absl::Now();
    absl::StatusOr<MungeIdentity> id = MungeDecodeShared(credential, socket, retry_until);
    if (!id.ok()) {
      if (id.status().code() == absl::StatusCode::kUnavailable) return id.status();
      return absl::FailedPreconditionError(absl::StrCat(
          "its key credential is no valid MUNGE credential here: ", id.status().message()));
    }
    absl::StatusOr<std::string> public_key = ParseServerKeyPayload(id->payload);
    if (!public_key.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("its key credential is wrong: ", public_key.status().message()));
    }
    Entry entry{{*std::move(public_key), id->uid}, now + kKeepAtMost};
    // Kept no longer than munged would accept the credential (a clock a little off only shortens
    // that).
    if (id->encoded_at != absl::InfinitePast()) {
      entry.until = std::min(entry.until, id->encoded_at + id->ttl);
    }
    absl::MutexLock lock(&mu_);
    if (keys_.size() >= kMaxKeys) {
      absl::erase_if(keys_, [now](const auto& kv) { return now >= kv.second.until; });
      if (keys_.size() >= kMaxKeys) keys_.clear();
    }
    keys_[std::string(credential)] = entry;
    return entry.key;
  }

  static constexpr size_t kMaxCredentialBytes = 8192;
  static constexpr size_t kMaxKeys = 64;
  static constexpr absl::Duration kKeepAtMost = absl::Minutes(10);
  struct Entry {
    Key key;
    absl::Time until;
  };
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> keys_ ABSL_GUARDED_BY(mu_);
  // Checks in flight, by credential.
  absl::flat_hash_map<std::string, std::shared_ptr<Pending>> pending_ ABSL_GUARDED_BY(mu_);
};

VouchedKeys& Vouched() {
  static VouchedKeys* keys = new VouchedKeys();
  return *keys;
}

std::string FindMetadata(const grpc::ClientContext& ctx, const char* key) {
  for (const auto* md : {&ctx.GetServerInitialMetadata(), &ctx.GetServerTrailingMetadata()}) {
    auto it = md->find(key);
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
  // In the answer's initial metadata, or in its trailing metadata when the server ended the call
  // at once (gRPC then sends both in one block).
  const std::string proof = FindMetadata(ctx, kProofMetadata);
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
  const std::string credential = FindMetadata(ctx, kServerKeyMetadata);
  if (credential.empty()) return absl::FailedPreconditionError("it sent no key credential");
  const absl::Time retry_until =
      std::min(absl::FromChrono(ctx.deadline()), absl::Now() + absl::Minutes(1));
  absl::StatusOr<VouchedKeys::Key> key =
      Vouched().Check(credential, auth.munge_socket, retry_until);
  if (!key.ok()) return key.status();
  if (auth.server_uid && key->uid != *auth.server_uid) {
    return absl::FailedPreconditionError(
        absl::StrFormat("it runs as uid %d, and the server of this job runs as uid %d", key->uid,
                        *auth.server_uid));
  }
  if (!VerifySignature(key->public_key,
                       ServerProofPayload(method, job, nonce, absl::StrCat("uid:", geteuid())),
                       proof)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "its proof is not signed by the key uid %d vouched for, or was made for another call",
        key->uid));
  }
  return absl::OkStatus();
}

bool ProofRequiredAt(absl::string_view endpoint) {
  // A relay's socket sits in a directory only this user may enter: who listens there is this user.
  if (absl::StartsWith(endpoint, "unix:")) return false;
  absl::StatusOr<HostPort> hp = ParseHostPort(endpoint, 29400);
  return !hp.ok() || !IsLoopbackAddress(hp->host);
}

}  // namespace rdzv
