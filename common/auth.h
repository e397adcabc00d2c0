// Who is calling: the credentials an rdzv call carries and how they are checked.
//
// Two kinds of credential, sent as gRPC metadata on every call:
//   - MUNGE (the default wherever munged runs, which is every Slurm cluster): a credential
//     encoded by the local munged for this one call. Its payload binds it to the call (the
//     method and the job id) and munged's replay cache makes it good for one decode only; the
//     server's munged decodes it and vouches for the caller's uid and gid.
//   - A shared job token (--rdzv-token-file): a secret the job's agents share. It identifies the
//     job's owner by the secret itself; it is compared in constant time.
//
// The server proves itself in turn (ServerProofPayload): a client that asks for it sends a fresh
// nonce with the call, and the server answers, in the call's initial metadata, with a proof bound
// to the method, the job id, that nonce and the caller it authenticated:
//   - under MUNGE, the payload's ECDSA P-256 signature under a key the server made when it started,
//     sent with a MUNGE credential over that key's public half (ServerKeyPayload) that the
//     server's munged made and renews every minute. The client's munged says which uid vouched
//     for the key; the client checks that once per vouching credential and keeps the key until
//     the credential expires, then checks each call's signature itself. So a call costs the
//     server's munged one decode (the caller's credential) and no encode.
//   - with a token, the payload's HMAC-SHA256 under the job's token.
// A process that merely listens on the server's port has neither the server's uid (so no
// credential of its own can vouch for a key as the server's), nor the server's private key (so a
// vouching credential it copied from the real server is worthless to it), nor, unless a client
// hands it over, the token.
//
// The functions here wrap libmunge and OpenSSL; they keep no state and are thread-safe. MUNGE
// calls talk to munged over its UNIX socket (about a tenth of a millisecond).
#ifndef RDZV_COMMON_AUTH_H_
#define RDZV_COMMON_AUTH_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

// OpenSSL's key type (EVP_PKEY), kept out of this header.
struct evp_pkey_st;

namespace rdzv {

// Metadata keys (lower case, as gRPC requires).
inline constexpr char kMungeMetadata[] = "x-rdzv-munge";
inline constexpr char kTokenMetadata[] = "x-rdzv-token";
// Sent by a client that wants the server's proof; answered under kProofMetadata.
inline constexpr char kNonceMetadata[] = "x-rdzv-nonce";
inline constexpr char kProofMetadata[] = "x-rdzv-server-proof";
// Under MUNGE, sent with every proof: the credential vouching for the key that signed it.
inline constexpr char kServerKeyMetadata[] = "x-rdzv-server-key";

// What a credential vouches for: "rdzv.v1 <method> <job id>". A credential made for one call
// is refused on any other.
std::string CallPayload(absl::string_view method, absl::string_view job_id);

// A fresh nonce for one call: 32 hex digits from OpenSSL's random generator.
std::string NewNonce();

// Whether `nonce` has a nonce's form (16 to 64 hex digits); a server proves nothing else.
bool IsNonce(absl::string_view nonce);

// What a server's proof vouches for: "rdzv.v1 server <method> <job id> <nonce> <caller>", where
// the caller is the owner key the server authenticated the call as ("uid:1000",
// "token:<digest>"). Bound to the caller, a proof that another user obtained from the real server
// for a nonce it relayed does not convince the client that sent the nonce.
std::string ServerProofPayload(absl::string_view method, absl::string_view job_id,
                               absl::string_view nonce, absl::string_view caller);

// What an rdzvd's MUNGE credential in its answer to a peer's HoldsJob (rdzv.proto) holds: the
// peer's nonce, the job, its owner and the answer.
std::string HoldsProofPayload(absl::string_view nonce, absl::string_view job_id,
                              absl::string_view owner, bool holds);

// HMAC-SHA256 of `payload` under `token`, in hex: a token holder's proof.
std::string TokenProof(absl::string_view token, absl::string_view payload);

// What a server's key credential vouches for: "rdzv.v1 server-key p256 <public key in hex>", the
// key as DER SubjectPublicKeyInfo.
std::string ServerKeyPayload(absl::string_view public_key);

// The public key (DER, 91 bytes) a ServerKeyPayload names; InvalidArgument for any other text.
absl::StatusOr<std::string> ParseServerKeyPayload(absl::string_view payload);

// An ECDSA P-256 key pair held in memory only: a server's signing key (OpenSSL 3.0 signs with
// P-256 in about half the wall time of a MUNGE encode, and faster than with Ed25519). Copies
// share the key.
class SigningKey {
 public:
  // A new random key (OpenSSL's generator). Internal when OpenSSL cannot make one.
  static absl::StatusOr<SigningKey> Generate();

  // The public key, DER SubjectPublicKeyInfo (91 bytes).
  const std::string& public_key() const { return public_key_; }
  // The signature of `message` (SHA-256, DER), in hex; empty if OpenSSL fails.
  std::string Sign(absl::string_view message) const;

 private:
  SigningKey(std::shared_ptr<evp_pkey_st> key, std::string public_key)
      : key_(std::move(key)), public_key_(std::move(public_key)) {}
  std::shared_ptr<evp_pkey_st> key_;
  std::string public_key_;
};

// Whether `signature` (hex, as Sign makes it) is the signature of `message` by the P-256 key
// whose public half is `public_key` (DER). False for anything malformed or of another kind.
bool VerifySignature(absl::string_view public_key, absl::string_view message,
                     absl::string_view signature);

// What a decoded credential says: the uid and gid that made it, its payload, and when it was made
// and for how long munged accepts it.
struct MungeIdentity {
  uid_t uid = 0;
  gid_t gid = 0;
  std::string payload;
  absl::Time encoded_at = absl::InfinitePast();
  absl::Duration ttl = absl::ZeroDuration();
};

// A munged that is momentarily saturated (its listen backlog full in a burst of calls, or the
// daemon stopped for a moment) refuses or drops connections; such a call is tried again with
// backoff (5 ms doubling to 200 ms, jittered) until `retry_until`, for as long as munged is there
// (its socket file there, not refusing connections). A credential munged has judged (invalid,
// replayed, expired, another key) is never tried again. By default a call is retried for
// kMungeBusyRetry. (libmunge itself gives up on a munged that does not answer after about 10 s.)
inline constexpr absl::Duration kMungeBusyRetry = absl::Seconds(30);
// At most this many calls of one process talk to munged at once; the others wait their turn
// (within their `retry_until`) rather than crowd munged's listen queue (256 by default).
inline constexpr int kMungeCallsInFlight = 8;

// Encodes a credential for `payload` through the munged at `socket` ("" for the default).
// Unavailable, naming the socket and what to check, when munged cannot be reached by
// `retry_until`.
absl::StatusOr<std::string> MungeEncode(absl::string_view payload, const std::string& socket,
                                        absl::Time retry_until);
absl::StatusOr<std::string> MungeEncode(absl::string_view payload, const std::string& socket);

// Decodes `credential` through the munged at `socket`. Unauthenticated when it is invalid,
// expired, replayed or made with another key; Unavailable when munged cannot be reached by
// `retry_until`.
absl::StatusOr<MungeIdentity> MungeDecode(absl::string_view credential, const std::string& socket,
                                          absl::Time retry_until);
absl::StatusOr<MungeIdentity> MungeDecode(absl::string_view credential, const std::string& socket);

// Decodes like MungeDecode, but accepts a credential this host's munged has decoded before: for a
// statement made once and shown to many (a server's key credential), never for a call's.
absl::StatusOr<MungeIdentity> MungeDecodeShared(absl::string_view credential,
                                                const std::string& socket, absl::Time retry_until);

// A credential made for `ttl` (munged caps it at its --max-ttl) rather than munged's default.
absl::StatusOr<std::string> MungeEncodeFor(absl::string_view payload, const std::string& socket,
                                           absl::Duration ttl, absl::Time retry_until);

// Whether munged answers at `socket` (one encode and decode of an empty payload).
bool MungeWorks(const std::string& socket);

// Whether munged listens at `socket` ("" for the default, /run/munge/munge.socket.2): MUNGE is
// set up on this host. Only a connect is tried, no credential: a socket file whose munged is gone
// (connection refused) counts as absent, a busy munged (full backlog) as present.
bool MungeSocketPresent(const std::string& socket);

// Why MungeSocketPresent(socket) is false, in words for a one-line error ("no MUNGE socket at
// /run/munge/munge.socket.2 ..."), naming the fix; "" when it is true. A socket that is not
// there at all, as in a container that does not mount it, names the mount to add.
std::string MungeSocketProblem(const std::string& socket);

// Reads a job token from `path`: a regular file (not a link) owned by the caller, readable
// and writable by the owner only (0600 or 0400), 16 to 4096 bytes of printable ASCII text;
// surrounding whitespace is dropped. Does not block on a FIFO. One-line errors name the file and
// the fix; a NUL, control or non-ASCII byte is InvalidArgument (gRPC could not send it).
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// The token's SHA-256, in hex: how a server keys and compares tokens without keeping them.
std::string TokenDigest(absl::string_view token);

// Equality of two strings in time that depends only on their lengths.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace rdzv

#endif  // RDZV_COMMON_AUTH_H_
