// Authenticator: decides who is calling rdzvd, from the credential the call carries (see
// common/auth.h), and what the caller may see. Every call of the rendezvous service goes
// through Authenticate before it touches any job.
//
// The caller's identity is its owner key: jobs are kept per owner, so jobs of different users
// never meet even with the same id. Under MUNGE the owner is the caller's uid; with a token it
// is the token's digest (agents sharing the token share the job); without authentication
// (loopback only) everyone is one owner.
//
// It also proves the server to a caller that asks (Prove, common/auth.h): only to a caller it has
// authenticated, so that the real server is no oracle that proves anything for anyone. Under
// MUNGE the proof is a signature under the server's own key, made when the Authenticator is; the
// credential vouching for that key is made by munged once a minute (RefreshServerKey, on the
// server's timer thread), so answering a call costs munged nothing.
//
// Under MUNGE a credential is decoded once, on the call's headers (CheckHeaders, before gRPC reads
// the call's message: guard/header_auth.h), and what it proved is kept until the call's handler
// takes it (Authenticate), a short while at most.
//
// Thread-safe.
#ifndef RDZV_GUARD_AUTHENTICATOR_H_
#define RDZV_GUARD_AUTHENTICATOR_H_

#include <grpcpp/server_context.h>
#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/auth.h"

namespace rdzv {

enum class AuthMode { kMunge, kToken, kNone };

// "munge", "token", "none" (and back).
absl::StatusOr<AuthMode> ParseAuthMode(absl::string_view text);
const char* AuthModeName(AuthMode mode);

struct AuthPolicy {
  AuthMode mode = AuthMode::kMunge;
  std::string munge_socket;  // "" for munged's default
  // Only this uid may call (an agent's embedded server: the agent's own uid).
  std::optional<uid_t> only_uid;
  // Token mode: only this token is accepted (an embedded server knows its job's token). Unset
  // on a shared rdzvd, where each job's token is its own.
  std::optional<std::string> only_token;
  // Members of these groups (and root) see and may act on every job.
  std::vector<gid_t> admin_gids;
  // How many calls one uid may have checked on their headers and not yet handled
  // (Authenticator::CheckHeaders); zero: Authenticator::kMaxPendingPerUid.
  size_t max_pending_per_uid = 0;
};

// The credentials one call carries (empty when absent), and the nonce of a caller that asks the
// server to prove itself.
struct CallCredentials {
  absl::string_view munge;
  absl::string_view token;
  absl::string_view nonce;
};

// The credentials in `context`'s client metadata; they live as long as the call.
CallCredentials CredentialsOf(const grpc::ServerContextBase& context);

// A server's proof for one call: the proof itself and, under MUNGE, the credential vouching for
// the key that signed it (common/auth.h).
struct ServerProof {
  std::string proof;
  std::string server_key;
};

struct Caller {
  std::string owner;   // the key the caller's jobs are kept under
  std::string name;    // for logs: "uid 1000", "a token holder", "anyone"
  bool admin = false;  // sees every owner's jobs
};

// Parses "wheel,1001" into gids (names looked up in the group database).
absl::Status ResolveGroups(absl::string_view list, std::vector<gid_t>* gids);

// Whether a server may start with `policy` listening on `listen` ("HOST:PORT"): no
// authentication only on a loopback address, MUNGE only with munged answering. One line naming
// the fix otherwise.
absl::Status CheckServerAuth(const AuthPolicy& policy, absl::string_view listen);

class Authenticator {
 public:
  // Credentials checked on headers wait at most this long for their handler, and one uid may
  // have at most AuthPolicy::max_pending_per_uid of them waiting at once (past that its calls are
  // refused with UNAVAILABLE, which clients retry, until some reach their handler or expire).
  // This also bounds the messages one uid has in flight: at most this many, of at most 256 KiB
  // each. kMaxPendingPerUid unless the policy says otherwise.
  static constexpr absl::Duration kPendingFor = absl::Seconds(30);
  static constexpr size_t kMaxPendingPerUid = 1024;

  explicit Authenticator(AuthPolicy policy);
  Authenticator(const Authenticator&) = delete;
  Authenticator& operator=(const Authenticator&) = delete;

  // Checks a call's credential on its headers alone, before its message is read: under MUNGE
  // decodes it (blocking on munged for about a tenth of a millisecond) and keeps what it proved
  // for Authenticate; with a token checks that there is one (and that it is the one, when the
  // server has one). The refusals are Authenticate's; Unavailable also when the caller's uid
  // has kMaxPendingPerUid calls checked and not yet handled. Under MUNGE, `proven` (when given)
  // gets the uid a decoded credential proved, whatever the outcome after the decode.
  absl::Status CheckHeaders(const CallCredentials& credentials,
                            std::optional<uid_t>* proven = nullptr) const;

  // Checks the credentials of a call of `method` on `job_id`. Unauthenticated (no or a bad
  // credential: the message says what to check), PermissionDenied (a valid caller this server
  // does not serve) or Unavailable (munged is down on the server).
  absl::StatusOr<Caller> Authenticate(const CallCredentials& credentials, absl::string_view method,
                                      absl::string_view job_id) const;

  // How long the credential vouching for the server's key is made for, and how old it may get
  // before RefreshServerKey makes a new one: a client that received it just before then still
  // has four minutes to check it in.
  static constexpr absl::Duration kServerKeyTtl = absl::Minutes(5);
  static constexpr absl::Duration kServerKeyRenewal = absl::Minutes(1);

  // Under MUNGE, makes the credential that vouches for the server's key when there is none yet
  // or the last is kServerKeyRenewal old. Blocks on munged (a busy one is waited for 5 s); keeps
  // the last credential when munged does not answer. Nothing to do in other modes.
  absl::Status RefreshServerKey(absl::Time now) const;

  // The proof of this server for `caller`'s call of `method` on `job_id`, which carried
  // `credentials` (common/auth.h ServerProofPayload): the payload's signature under the server's
  // key with the credential vouching for that key, or the payload's HMAC under the caller's
  // token. Empty when the call asks for none (no nonce, or one of another form) or without
  // authentication. Unavailable when the server has no vouched key (munged has never answered).
  // Costs a signature (some tens of microseconds), no munged trip once RefreshServerKey has run.
  absl::StatusOr<ServerProof> Prove(const CallCredentials& credentials, absl::string_view method,
                                    absl::string_view job_id, const Caller& caller) const;

  // Puts Prove's proof into `context`'s initial metadata (nothing when it is empty; a warning in
  // the log when munged does not answer). Call before the answer's metadata goes out.
  void AddProof(grpc::ServerContextBase& context, const CallCredentials& credentials,
                absl::string_view method, absl::string_view job_id, const Caller& caller) const;

  const AuthPolicy& policy() const { return policy_; }

 private:
  bool IsAdmin(uid_t uid, gid_t gid) const;
  absl::StatusOr<Caller> CheckToken(absl::string_view token) const;
  absl::StatusOr<Caller> CallerOf(const MungeIdentity& id) const;
  // The identity CheckHeaders decoded from `credential`, taken once; nullopt when there is none.
  std::optional<MungeIdentity> TakeDecoded(absl::string_view credential) const;
  void ExpireLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const AuthPolicy policy_;
  // Under MUNGE: the server's key, and the credential vouching for it with when it was made.
  const std::optional<SigningKey> key_;
  mutable absl::Mutex key_mu_;
  mutable std::string server_key_ ABSL_GUARDED_BY(key_mu_);
  mutable absl::Time server_key_at_ ABSL_GUARDED_BY(key_mu_) = absl::InfinitePast();
  mutable absl::Mutex mu_;
  struct Decoded {
    MungeIdentity id;
    absl::Time at;
  };
  mutable absl::flat_hash_map<std::string, Decoded> decoded_ ABSL_GUARDED_BY(mu_);
  // The credentials of decoded_ in the order they came, for expiry.
  mutable std::deque<std::pair<absl::Time, std::string>> decoded_order_ ABSL_GUARDED_BY(mu_);
  mutable absl::flat_hash_map<uid_t, size_t> pending_per_uid_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rdzv

#endif  // RDZV_GUARD_AUTHENTICATOR_H_
