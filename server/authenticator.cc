#include "server/authenticator.h"

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

Authenticator::Authenticator(AuthPolicy policy) : policy_(std::move(policy)) {}

absl::StatusOr<Caller> Authenticator::Authenticate(const CallCredentials& credentials,
                                                   absl::string_view method,
                                                   absl::string_view job_id) const {
  switch (policy_.mode) {
    case AuthMode::kNone:
      return Caller{"anyone", "anyone", true};
    case AuthMode::kToken: {
      const absl::string_view token = credentials.token;
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
    case AuthMode::kMunge: {
      const absl::string_view cred = credentials.munge;
      if (cred.empty()) {
        return absl::UnauthenticatedError(
            "this rendezvous server needs a MUNGE credential on every call: is munged running on "
            "the agent's host (check: munge -n | unmunge)?");
      }
      if (cred.size() > kMaxCredentialBytes) {
        return absl::UnauthenticatedError("the MUNGE credential is too long");
      }
      absl::StatusOr<MungeIdentity> id = MungeDecode(cred, policy_.munge_socket);
      if (!id.ok()) return id.status();
      if (id->payload != CallPayload(method, job_id)) {
        return absl::UnauthenticatedError(
            "the MUNGE credential was made for another call; each call needs its own");
      }
      if (policy_.only_uid && id->uid != *policy_.only_uid) {
        return absl::PermissionDeniedError(
            absl::StrFormat("this rendezvous server belongs to uid %d's job; uid %d may not use it",
                            *policy_.only_uid, id->uid));
      }
      return Caller{absl::StrCat("uid:", id->uid), absl::StrCat("uid ", id->uid),
                    IsAdmin(id->uid, id->gid)};
    }
  }
  return absl::InternalError("unknown authentication mode");
}

absl::StatusOr<std::string> Authenticator::Prove(const CallCredentials& credentials,
                                                 absl::string_view method, absl::string_view job_id,
                                                 const Caller& caller) const {
  if (!IsNonce(credentials.nonce)) return std::string();
  const std::string payload = ServerProofPayload(method, job_id, credentials.nonce, caller.owner);
  switch (policy_.mode) {
    case AuthMode::kNone:
      return std::string();
    case AuthMode::kToken:
      return TokenProof(credentials.token, payload);
    case AuthMode::kMunge:
      return MungeEncode(payload, policy_.munge_socket);
  }
  return std::string();
}

void Authenticator::AddProof(grpc::ServerContextBase& context, const CallCredentials& credentials,
                             absl::string_view method, absl::string_view job_id,
                             const Caller& caller) const {
  absl::StatusOr<std::string> proof = Prove(credentials, method, job_id, caller);
  if (!proof.ok()) {
    spdlog::warn("cannot prove this server to {}: {}", caller.name,
                 std::string(proof.status().message()));
  } else if (!proof->empty()) {
    context.AddInitialMetadata(kProofMetadata, *proof);
  }
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
