#include "guard/authenticator.h"

#include <arpa/inet.h>
#include <grp.h>
#include <pwd.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/auth.h"
#include "common/net.h"

namespace rdzv {
namespace {

// A credential longer than this is not one (a MUNGE credential is a few hundred bytes).
constexpr size_t kMaxCredentialBytes = 8192;

// A MUNGE credential is there and of a size munged could have made, before it is decoded.
absl::Status CheckMungeCredentialSize(absl::string_view cred) {
  if (cred.empty()) {
    return absl::UnauthenticatedError(
        "this rendezvous server needs a MUNGE credential on every call: is munged running on "
        "the agent's host (check: munge -n | unmunge)?");
  }
  if (cred.size() > kMaxCredentialBytes) {
    return absl::UnauthenticatedError("the MUNGE credential is too long");
  }
  return absl::OkStatus();
}

}  // namespace

CallCredentials CredentialsOf(const grpc::ServerContextBase& context) {
  const auto& md = context.client_metadata();
  const auto value = [&md](const char* key) {
    auto it = md.find(key);
    if (it == md.end()) return absl::string_view();
    return absl::string_view(it->second.data(), it->second.length());
  };
  return {value(kMungeMetadata), value(kTokenMetadata), value(kNonceMetadata)};
}

absl::StatusOr<AuthMode> ParseAuthMode(absl::string_view text) {
  if (text == "munge") return AuthMode::kMunge;
  if (text == "token") return AuthMode::kToken;
  if (text == "none") return AuthMode::kNone;
  return absl::InvalidArgumentError(
      absl::StrFormat("--auth must be munge, token or none, not '%s'", absl::CHexEscape(text)));
}

const char* AuthModeName(AuthMode mode) {
  switch (mode) {
    case AuthMode::kMunge:
      return "munge";
    case AuthMode::kToken:
      return "token";
    case AuthMode::kNone:
      return "none";
  }
  return "?";
}

absl::Status ResolveGroups(absl::string_view list, std::vector<gid_t>* gids) {
  for (absl::string_view name : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    name = absl::StripAsciiWhitespace(name);
    uint32_t id = 0;
    if (absl::SimpleAtoi(name, &id)) {
      gids->push_back(static_cast<gid_t>(id));
      continue;
    }
    const std::string n(name);
    struct group gr;
    struct group* found = nullptr;
    char buf[8192];
    if (getgrnam_r(n.c_str(), &gr, buf, sizeof(buf), &found) != 0 || found == nullptr) {
      return absl::NotFoundError(
          absl::StrFormat("no group named '%s'; give a group name or gid", absl::CHexEscape(n)));
    }
    gids->push_back(found->gr_gid);
  }
  return absl::OkStatus();
}

absl::Status CheckServerAuth(const AuthPolicy& policy, absl::string_view listen) {
  switch (policy.mode) {
    case AuthMode::kNone: {
      const size_t colon = listen.rfind(':');
      const absl::string_view host =
          colon == absl::string_view::npos ? listen : listen.substr(0, colon);
      if (!IsLoopbackAddress(host)) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "--auth none lets anyone who can reach %s stop or redirect any job; it is allowed "
            "only on a loopback address (--listen 127.0.0.1:PORT). Use --auth munge or token",
            absl::CHexEscape(listen)));
      }
      return absl::OkStatus();
    }
    case AuthMode::kMunge:
      if (!MungeWorks(policy.munge_socket)) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "--auth munge: munged does not answer at %s; start munged (check: munge -n | "
            "unmunge) or use --auth token",
            policy.munge_socket.empty() ? "its default socket" : policy.munge_socket));
      }
      return absl::OkStatus();
    case AuthMode::kToken:
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

namespace {

std::optional<SigningKey> KeyFor(AuthMode mode) {
  if (mode != AuthMode::kMunge) return std::nullopt;
  absl::StatusOr<SigningKey> key = SigningKey::Generate();
  if (!key.ok()) {
    spdlog::error("{}; this server cannot prove itself to its clients",
                  std::string(key.status().message()));
    return std::nullopt;
  }
  return *std::move(key);
}

}  // namespace

Authenticator::Authenticator(AuthPolicy policy)
    : policy_(std::move(policy)), key_(KeyFor(policy_.mode)) {}

absl::Status Authenticator::RefreshServerKey(absl::Time now) const {
  if (!key_.has_value()) return absl::OkStatus();
  {
    absl::MutexLock lock(&key_mu_);
    if (now - server_key_at_ < kServerKeyRenewal) return absl::OkStatus();
  }
  absl::StatusOr<std::string> cred =
      MungeEncodeFor(ServerKeyPayload(key_->public_key()), policy_.munge_socket, kServerKeyTtl,
                     now + absl::Seconds(5));
  if (!cred.ok()) return cred.status();
  absl::MutexLock lock(&key_mu_);
  server_key_ = *std::move(cred);
  server_key_at_ = now;
  return absl::OkStatus();
}

absl::StatusOr<Caller> Authenticator::Authenticate(const CallCredentials& credentials,
                                                   absl::string_view method,
                                                   absl::string_view job_id) const {
  switch (policy_.mode) {
    case AuthMode::kNone:
      return Caller{"anyone", "anyone", true};
    case AuthMode::kToken:
      return CheckToken(credentials.token);
    case AuthMode::kMunge: {
      const absl::string_view cred = credentials.munge;
      if (absl::Status s = CheckMungeCredentialSize(cred); !s.ok()) return s;
      // Decoded already when the headers were checked; decoding again would be a replay.
      std::optional<MungeIdentity> decoded = TakeDecoded(cred);
      absl::StatusOr<MungeIdentity> id =
          decoded ? *std::move(decoded) : MungeDecode(cred, policy_.munge_socket);
      if (!id.ok()) return id.status();
      if (id->payload != CallPayload(method, job_id)) {
        return absl::UnauthenticatedError(
            "the MUNGE credential was made for another call; each call needs its own");
      }
      return CallerOf(*id);
    }
  }
  return absl::InternalError("unknown authentication mode");
}

absl::StatusOr<Caller> Authenticator::CheckToken(absl::string_view token) const {
  if (token.empty()) {
    return absl::UnauthenticatedError(
        "this rendezvous server needs a job token: give every agent of the job the same "
        "--rdzv-token-file");
  }
  if (token.size() > kMaxCredentialBytes) {
    return absl::UnauthenticatedError("the job token is too long");
  }
  const std::string digest = TokenDigest(token);
  if (policy_.only_token && !ConstantTimeEquals(digest, TokenDigest(*policy_.only_token))) {
    return absl::PermissionDeniedError(
        "wrong job token: this rendezvous server belongs to a job with another token; give "
        "every agent of the job the same --rdzv-token-file");
  }
  return Caller{absl::StrCat("token:", digest), "a token holder", false};
}

absl::StatusOr<Caller> Authenticator::CallerOf(const MungeIdentity& id) const {
  if (policy_.only_uid && id.uid != *policy_.only_uid) {
    return absl::PermissionDeniedError(
        absl::StrFormat("this rendezvous server belongs to uid %d's job; uid %d may not use it",
                        *policy_.only_uid, id.uid));
  }
  return Caller{absl::StrCat("uid:", id.uid), absl::StrCat("uid ", id.uid),
                IsAdmin(id.uid, id.gid)};
}

absl::Status Authenticator::CheckHeaders(const CallCredentials& credentials,
                                         std::optional<uid_t>* proven) const {
  switch (policy_.mode) {
    case AuthMode::kNone:
      return absl::OkStatus();
    case AuthMode::kToken:
      return CheckToken(credentials.token).status();
    case AuthMode::kMunge:
      break;
  }
  const absl::string_view cred = credentials.munge;
  if (absl::Status s = CheckMungeCredentialSize(cred); !s.ok()) return s;
  absl::StatusOr<MungeIdentity> id = MungeDecode(cred, policy_.munge_socket);
  if (!id.ok()) return id.status();
  if (proven != nullptr) *proven = id->uid;
  if (absl::Status s = CallerOf(*id).status(); !s.ok()) return s;
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  size_t& pending = pending_per_uid_[id->uid];
  if (pending >=
      (policy_.max_pending_per_uid > 0 ? policy_.max_pending_per_uid : kMaxPendingPerUid)) {
    return absl::UnavailableError(absl::StrFormat(
        "uid %d has %d calls waiting to start on this rendezvous server; try again shortly",
        id->uid, pending));
  }
  ++pending;
  std::string key(cred);
  decoded_order_.emplace_back(now, key);
  decoded_[std::move(key)] = Decoded{*std::move(id), now};
  return absl::OkStatus();
}

std::optional<MungeIdentity> Authenticator::TakeDecoded(absl::string_view credential) const {
  absl::MutexLock lock(&mu_);
  auto it = decoded_.find(credential);
  if (it == decoded_.end()) return std::nullopt;
  MungeIdentity id = std::move(it->second.id);
  decoded_.erase(it);
  if (auto p = pending_per_uid_.find(id.uid); p != pending_per_uid_.end() && --p->second == 0) {
    pending_per_uid_.erase(p);
  }
  return id;
}

void Authenticator::ExpireLocked(absl::Time now) const {
  while (!decoded_order_.empty() && now - decoded_order_.front().first > kPendingFor) {
    auto it = decoded_.find(decoded_order_.front().second);
    if (it != decoded_.end() && it->second.at == decoded_order_.front().first) {
      const uid_t uid = it->second.id.uid;
      decoded_.erase(it);
      if (auto p = pending_per_uid_.find(uid); p != pending_per_uid_.end() && --p->second == 0) {
        pending_per_uid_.erase(p);
      }
    }
    decoded_order_.pop_front();
  }
}

absl::StatusOr<ServerProof> Authenticator::Prove(const CallCredentials& credentials,
                                                 absl::string_view method, absl::string_view job_id,
                                                 const Caller& caller) const {
  if (!IsNonce(credentials.nonce)) return ServerProof{};
  const std::string payload = ServerProofPayload(method, job_id, credentials.nonce, caller.owner);
  switch (policy_.mode) {
    case AuthMode::kNone:
      return ServerProof{};
    case AuthMode::kToken:
      return ServerProof{TokenProof(credentials.token, payload), ""};
    case AuthMode::kMunge:
      break;
  }
  if (!key_.has_value()) return absl::UnavailableError("this server has no key to sign with");
  ServerProof proof;
  {
    absl::MutexLock lock(&key_mu_);
    proof.server_key = server_key_;
  }
  if (proof.server_key.empty()) {
    // munged did not answer when the server started; try once more, here.
    if (absl::Status s = RefreshServerKey(absl::Now()); !s.ok()) return s;
    absl::MutexLock lock(&key_mu_);
    proof.server_key = server_key_;
  }
  proof.proof = key_->Sign(payload);
  if (proof.proof.empty()) return absl::InternalError("OpenSSL cannot sign");
  return proof;
}

void Authenticator::AddProof(grpc::ServerContextBase& context, const CallCredentials& credentials,
                             absl::string_view method, absl::string_view job_id,
                             const Caller& caller) const {
  absl::StatusOr<ServerProof> proof = Prove(credentials, method, job_id, caller);
  if (!proof.ok()) {
    spdlog::warn("cannot prove this server to {}: {}", caller.name,
                 std::string(proof.status().message()));
    return;
  }
  if (!proof->proof.empty()) context.AddInitialMetadata(kProofMetadata, proof->proof);
  if (!proof->server_key.empty()) context.AddInitialMetadata(kServerKeyMetadata, proof->server_key);
}

bool Authenticator::IsAdmin(uid_t uid, gid_t gid) const {
  if (uid == 0) return true;
  if (policy_.admin_gids.empty()) return false;
  if (absl::c_linear_search(policy_.admin_gids, gid)) return true;
  // Supplementary groups: looked up only when admin groups are configured.
  struct passwd pw;
  struct passwd* found = nullptr;
  char buf[4096];
  if (getpwuid_r(uid, &pw, buf, sizeof(buf), &found) != 0 || found == nullptr) return false;
  gid_t groups[256];
  int n = 256;
  if (getgrouplist(pw.pw_name, gid, groups, &n) < 0) return false;
  for (int i = 0; i < n; ++i) {
    if (absl::c_linear_search(policy_.admin_gids, groups[i])) return true;
  }
  return false;
}

}  // namespace rdzv
