#include "common/auth.h"

#include <fcntl.h>
#include <munge.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <openssl/x509.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/core/backoff.h"

namespace rdzv {
namespace {

constexpr size_t kMaxTokenBytes = 4096;
constexpr size_t kMinTokenBytes = 16;
// libmunge's default socket as Debian's munge package builds it.
constexpr char kDefaultMungeSocket[] = "/run/munge/munge.socket.2";

// A munge context bound to `socket`; freed on scope exit.
class MungeContext {
 public:
  explicit MungeContext(const std::string& socket) : ctx_(munge_ctx_create()) {
    if (ctx_ != nullptr && !socket.empty()) {
      munge_ctx_set(ctx_, MUNGE_OPT_SOCKET, socket.c_str());
    }
  }
  ~MungeContext() {
    if (ctx_ != nullptr) munge_ctx_destroy(ctx_);
  }
  MungeContext(const MungeContext&) = delete;
  MungeContext& operator=(const MungeContext&) = delete;
  munge_ctx_t get() const { return ctx_; }

 private:
  munge_ctx_t ctx_;
};

// Where `text` holds its first byte that gRPC does not carry in a metadata value (printable
// ASCII, space included), or npos. gRPC aborts the process on any other.
size_t FirstNonPrintable(absl::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    const auto u = static_cast<unsigned char>(text[i]);
    if (u < 0x20 || u > 0x7e) return i;
  }
  return absl::string_view::npos;
}

std::string SocketName(const std::string& socket) {
  return socket.empty() ? std::string("munged's default socket") : socket;
}

absl::Status MungeError(munge_err_t err, munge_ctx_t ctx, const std::string& socket) {
  const char* detail = ctx != nullptr ? munge_ctx_strerror(ctx) : nullptr;
  const std::string what = detail != nullptr ? detail : munge_strerror(err);
  switch (err) {
    case EMUNGE_SOCKET:
    case EMUNGE_SNAFU:
    case EMUNGE_NO_MEMORY: {
      // No socket file at all: munged may well run, but not where this process looks.
      const std::string path = socket.empty() ? std::string(kDefaultMungeSocket) : socket;
      struct stat st;
      if (stat(path.c_str(), &st) != 0 && errno == ENOENT) {
        return absl::UnavailableError(
            absl::StrCat("cannot reach munged: ", MungeSocketProblem(socket)));
      }
      return absl::UnavailableError(absl::StrFormat(
          "cannot reach munged through %s (%s); is munged running (check: munge -n | unmunge)?",
          SocketName(socket), what));
    }
    case EMUNGE_CRED_REPLAYED:
      return absl::UnauthenticatedError("MUNGE credential replayed: each call needs a new one");
    case EMUNGE_CRED_EXPIRED:
    case EMUNGE_CRED_REWOUND:
      return absl::UnauthenticatedError(absl::StrFormat(
          "MUNGE credential %s: are the clocks of the client's and the server's hosts in step?",
          what));
    default:
      return absl::UnauthenticatedError(absl::StrFormat(
          "invalid MUNGE credential (%s): do the client's and the server's hosts share one "
          "munge key?",
          what));
  }
}

}  // namespace

std::string CallPayload(absl::string_view method, absl::string_view job_id) {
  return absl::StrCat("rdzv.v1 ", method, " ", job_id);
}

std::string NewNonce() {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    // Without OpenSSL's generator, the C++ library's, which also asks the kernel.
    std::random_device random;
    for (unsigned char& b : bytes) b = static_cast<unsigned char>(random());
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

bool IsNonce(absl::string_view nonce) {
  if (nonce.size() < 16 || nonce.size() > 64) return false;
  for (char ch : nonce) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(ch))) return false;
  }
  return true;
}

std::string ServerProofPayload(absl::string_view method, absl::string_view job_id,
                               absl::string_view nonce, absl::string_view caller) {
  return absl::StrCat("rdzv.v1 server ", method, " ", job_id, " ", nonce, " ", caller);
}

std::string HoldsProofPayload(absl::string_view nonce, absl::string_view job_id,
                              absl::string_view owner, bool holds) {
  return absl::StrCat("rdzv.v1 holds ", nonce, " ", job_id, " ", owner, " ", holds ? 1 : 0);
}

std::string TokenProof(absl::string_view token, absl::string_view payload) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
       reinterpret_cast<const unsigned char*>(payload.data()), payload.size(), mac, &len);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(mac), len));
}

namespace {

constexpr char kServerKeyPrefix[] = "rdzv.v1 server-key p256 ";
// A P-256 public key as DER SubjectPublicKeyInfo, the point uncompressed: always this long.
constexpr size_t kPublicKeyBytes = 91;
// An ECDSA P-256 signature in DER: at most this long.
constexpr size_t kMaxSignatureBytes = 72;

bool IsHex(absl::string_view text) {
  return absl::c_all_of(text,
                        [](char c) { return absl::ascii_isxdigit(static_cast<unsigned char>(c)); });
}

}  // namespace

std::string ServerKeyPayload(absl::string_view public_key) {
  return absl::StrCat(kServerKeyPrefix, absl::BytesToHexString(public_key));
}

absl::StatusOr<std::string> ParseServerKeyPayload(absl::string_view payload) {
  absl::string_view hex = payload;
  if (!absl::ConsumePrefix(&hex, kServerKeyPrefix) || hex.size() != 2 * kPublicKeyBytes ||
      !IsHex(hex)) {
    return absl::InvalidArgumentError("it vouches for no server key");
  }
  return absl::HexStringToBytes(hex);
}

absl::StatusOr<SigningKey> SigningKey::Generate() {
  EVP_PKEY* raw = EVP_EC_gen("P-256");
  if (raw == nullptr) return absl::InternalError("OpenSSL cannot make a P-256 key");
  std::shared_ptr<EVP_PKEY> key(raw, EVP_PKEY_free);
  unsigned char* der = nullptr;
  const int len = i2d_PUBKEY(raw, &der);
  if (len <= 0) return absl::InternalError("OpenSSL gives no public half of its P-256 key");
  std::string public_key(reinterpret_cast<const char*>(der), static_cast<size_t>(len));
  OPENSSL_free(der);
  if (public_key.size() != kPublicKeyBytes) {
    return absl::InternalError("OpenSSL encodes its P-256 public key in an unexpected form");
  }
  return SigningKey(std::move(key), std::move(public_key));
}

std::string SigningKey::Sign(absl::string_view message) const {
  unsigned char sig[kMaxSignatureBytes + 8];
  size_t len = sizeof(sig);
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  const bool signed_ok =
      md != nullptr && EVP_DigestSignInit(md, nullptr, EVP_sha256(), nullptr, key_.get()) == 1 &&
      EVP_DigestSign(md, sig, &len, reinterpret_cast<const unsigned char*>(message.data()),
                     message.size()) == 1;
  EVP_MD_CTX_free(md);
  if (!signed_ok) return "";
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(sig), len));
}

bool VerifySignature(absl::string_view public_key, absl::string_view message,
                     absl::string_view signature) {
  if (public_key.size() != kPublicKeyBytes || signature.empty() ||
      signature.size() > 2 * kMaxSignatureBytes || signature.size() % 2 != 0 || !IsHex(signature)) {
    return false;
  }
  const std::string sig = absl::HexStringToBytes(signature);
  const auto* der = reinterpret_cast<const unsigned char*>(public_key.data());
  EVP_PKEY* key = d2i_PUBKEY(nullptr, &der, static_cast<long>(public_key.size()));
  if (key == nullptr) return false;
  bool ok = EVP_PKEY_is_a(key, "EC") && EVP_PKEY_get_bits(key) == 256;
  if (ok) {
    EVP_MD_CTX* md = EVP_MD_CTX_new();
    ok = md != nullptr && EVP_DigestVerifyInit(md, nullptr, EVP_sha256(), nullptr, key) == 1 &&
         EVP_DigestVerify(md, reinterpret_cast<const unsigned char*>(sig.data()), sig.size(),
                          reinterpret_cast<const unsigned char*>(message.data()),
                          message.size()) == 1;
    EVP_MD_CTX_free(md);
  }
  EVP_PKEY_free(key);
  return ok;
}

namespace {

// Whether the socket error libmunge reported in `ctx` says that munged is not there at all: no
// socket file, or one that refuses connections (left behind by a munged that is gone). Told
// from the socket file and libmunge's message alone: a connect of our own to see would, while
// munged is busy, add a connection it must accept to its full queue.
bool MungedGone(munge_ctx_t ctx, const std::string& socket) {
  const std::string path = socket.empty() ? std::string(kDefaultMungeSocket) : socket;
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return true;
  const char* detail = munge_ctx_strerror(ctx);
  return detail != nullptr && absl::StrContains(detail, strerror(ECONNREFUSED));
}

// The munged calls this process has open at once (kMungeCallsInFlight at most): a thousand
// threads of one process that need a credential at the same moment (librdzv's clients in one
// launcher) queue here, asleep, instead of filling munged's listen queue and then trying again
// and again, which takes the CPU time munged needs to answer.
class MungeSlots {
 public:
  bool Acquire(absl::Time until) {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithDeadline(absl::Condition(&Free, &in_use_), until)) return false;
    ++in_use_;
    return true;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    --in_use_;
  }

 private:
  static bool Free(int* in_use) { return *in_use < kMungeCallsInFlight; }
  absl::Mutex mu_;
  int in_use_ ABSL_GUARDED_BY(mu_) = 0;
};

MungeSlots& Slots() {
  static MungeSlots* slots = new MungeSlots();
  return *slots;
}

// One libmunge call, `call(ctx)`, again and again while munged is busy (see kMungeBusyRetry).
// `call` returns munged's error code and fills its own result.
template <typename Call>
absl::Status WhileMungedBusy(const std::string& socket, absl::Time retry_until, Call call) {
  static const BackoffPolicy kPolicy{absl::Milliseconds(5), absl::Milliseconds(200), 2.0, 0.5};
  thread_local std::mt19937 random(std::random_device{}());
  for (int attempt = 0;; ++attempt) {
    MungeContext ctx(socket);
    if (ctx.get() == nullptr) return absl::ResourceExhaustedError("munge_ctx_create failed");
    if (!Slots().Acquire(retry_until)) {
      return absl::UnavailableError(absl::StrFormat(
          "munged through %s is too busy: this process's calls to it waited too long",
          SocketName(socket)));
    }
    const munge_err_t err = call(ctx.get());
    Slots().Release();
    if (err == EMUNGE_SUCCESS) return absl::OkStatus();
    const absl::Duration delay =
        BackoffDelay(kPolicy, attempt, std::uniform_real_distribution<double>(0, 1)(random));
    if (err != EMUNGE_SOCKET || absl::Now() + delay > retry_until ||
        MungedGone(ctx.get(), socket)) {
      return MungeError(err, ctx.get(), socket);
    }
    absl::SleepFor(delay);
  }
}

}  // namespace

namespace {

// ttl: zero for munged's default.
absl::StatusOr<std::string> Encode(absl::string_view payload, const std::string& socket,
                                   absl::Duration ttl, absl::Time retry_until) {
  std::string out;
  absl::Status status = WhileMungedBusy(socket, retry_until, [&](munge_ctx_t ctx) {
    if (ttl > absl::ZeroDuration()) {
      munge_ctx_set(ctx, MUNGE_OPT_TTL, static_cast<int>(absl::ToInt64Seconds(ttl)));
    }
    char* cred = nullptr;
    const munge_err_t err =
        munge_encode(&cred, ctx, payload.data(), static_cast<int>(payload.size()));
    if (err == EMUNGE_SUCCESS) out = cred;
    std::free(cred);
    return err;
  });
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<MungeIdentity> Decode(absl::string_view credential, const std::string& socket,
                                     absl::Time retry_until, bool accept_replayed) {
  const std::string cred(credential);  // libmunge wants it NUL-terminated
  MungeIdentity id;
  absl::Status status = WhileMungedBusy(socket, retry_until, [&](munge_ctx_t ctx) {
    void* payload = nullptr;
    int len = 0;
    munge_err_t err = munge_decode(cred.c_str(), ctx, &payload, &len, &id.uid, &id.gid);
    // A replayed credential is otherwise sound: munged checked it and says who made it.
    if (err == EMUNGE_CRED_REPLAYED && accept_replayed) err = EMUNGE_SUCCESS;
    if (payload != nullptr) {
      if (err == EMUNGE_SUCCESS && len > 0) {
        id.payload.assign(static_cast<const char*>(payload), len);
      }
      std::free(payload);
    }
    if (err == EMUNGE_SUCCESS) {
      time_t encoded = 0;
      int ttl = 0;
      if (munge_ctx_get(ctx, MUNGE_OPT_ENCODE_TIME, &encoded) == EMUNGE_SUCCESS &&
          munge_ctx_get(ctx, MUNGE_OPT_TTL, &ttl) == EMUNGE_SUCCESS) {
        id.encoded_at = absl::FromTimeT(encoded);
        id.ttl = absl::Seconds(ttl);
      }
    }
    return err;
  });
  if (!status.ok()) return status;
  return id;
}

}  // namespace

absl::StatusOr<std::string> MungeEncode(absl::string_view payload, const std::string& socket,
                                        absl::Time retry_until) {
  return Encode(payload, socket, absl::ZeroDuration(), retry_until);
}

absl::StatusOr<std::string> MungeEncode(absl::string_view payload, const std::string& socket) {
  return MungeEncode(payload, socket, absl::Now() + kMungeBusyRetry);
}

absl::StatusOr<std::string> MungeEncodeFor(absl::string_view payload, const std::string& socket,
                                           absl::Duration ttl, absl::Time retry_until) {
  return Encode(payload, socket, ttl, retry_until);
}

absl::StatusOr<MungeIdentity> MungeDecode(absl::string_view credential, const std::string& socket,
                                          absl::Time retry_until) {
  return Decode(credential, socket, retry_until, /*accept_replayed=*/false);
}

absl::StatusOr<MungeIdentity> MungeDecode(absl::string_view credential, const std::string& socket) {
  return MungeDecode(credential, socket, absl::Now() + kMungeBusyRetry);
}

absl::StatusOr<MungeIdentity> MungeDecodeShared(absl::string_view credential,
                                                const std::string& socket, absl::Time retry_until) {
  return Decode(credential, socket, retry_until, /*accept_replayed=*/true);
}

bool MungeWorks(const std::string& socket) {
  absl::StatusOr<std::string> cred = MungeEncode("", socket);
  return cred.ok() && MungeDecode(*cred, socket).ok();
}

bool MungeSocketPresent(const std::string& socket) { return MungeSocketProblem(socket).empty(); }

std::string MungeSocketProblem(const std::string& socket) {
  const std::string path = socket.empty() ? std::string(kDefaultMungeSocket) : socket;
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    const std::string dir = path.substr(0, path.rfind('/'));
    return absl::StrFormat(
        "no MUNGE socket at %s (inside a container, mount the host's %s: pyxis "
        "--container-mounts=%s:%s, enroot --mount %s:%s, Apptainer --bind %s)",
        path, dir, dir, dir, dir, dir, dir);
  }
  if (!S_ISSOCK(st.st_mode))
    return absl::StrFormat("%s is not a socket: check --munge-socket", path);
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::StrFormat("the MUNGE socket path %s is too long: check --munge-socket", path);
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";  // cannot tell: let the call itself report
  const int rc = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  close(fd);
  // Refused: a socket file left behind by a munged that is gone. A full backlog (EAGAIN) is a
  // busy munged, which is present.
  if (rc == 0 || (err != ECONNREFUSED && err != ENOENT)) return "";
  return absl::StrFormat("munged does not answer at %s (check: munge -n | unmunge)", path);
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot read the token file %s: %s%s", path, strerror(errno),
                        errno == ELOOP ? " (it is a symbolic link; give the file itself)" : ""));
  }
  struct stat st;
  std::string token;
  absl::Status status;
  if (fstat(fd, &st) != 0) {
    status = absl::FailedPreconditionError(
        absl::StrFormat("cannot stat the token file %s: %s", path, strerror(errno)));
  } else if (!S_ISREG(st.st_mode)) {
    status = absl::FailedPreconditionError(
        absl::StrFormat("the token file %s is not a regular file", path));
  } else if (st.st_uid != geteuid()) {
    status = absl::PermissionDeniedError(
        absl::StrFormat("the token file %s belongs to uid %d, not to you (uid %d); make your own",
                        path, st.st_uid, geteuid()));
  } else if ((st.st_mode & 077) != 0) {
    status = absl::PermissionDeniedError(
        absl::StrFormat("the token file %s is readable by others (mode %04o); chmod 600 %s", path,
                        st.st_mode & 07777, path));
  } else if (st.st_size > static_cast<off_t>(kMaxTokenBytes)) {
    status = absl::InvalidArgumentError(
        absl::StrFormat("the token file %s holds %d bytes; a token is at most %d", path, st.st_size,
                        kMaxTokenBytes));
  } else {
    char buf[kMaxTokenBytes + 1];
    size_t have = 0;
    while (have < sizeof(buf)) {
      const ssize_t n = read(fd, buf + have, sizeof(buf) - have);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      have += static_cast<size_t>(n);
    }
    const absl::string_view text = absl::StripAsciiWhitespace(absl::string_view(buf, have));
    token = std::string(text);
    const size_t bad = FirstNonPrintable(text);
    if (have > kMaxTokenBytes) {
      status = absl::InvalidArgumentError(
          absl::StrFormat("the token file %s is longer than %d bytes", path, kMaxTokenBytes));
    } else if (bad != absl::string_view::npos) {
      status = absl::InvalidArgumentError(absl::StrFormat(
          "the token file %s holds byte 0x%02x at offset %d, and a token is printable ASCII "
          "text; write a new one (for example: openssl rand -hex 32 > %s)",
          path, static_cast<unsigned char>(text[bad]), (text.data() - buf) + bad, path));
    } else if (token.size() < kMinTokenBytes) {
      status = absl::InvalidArgumentError(absl::StrFormat(
          "the token in %s is %d characters; use at least %d random ones (for example: "
          "openssl rand -hex 32 > %s)",
          path, token.size(), kMinTokenBytes, path));
    }
  }
  close(fd);
  if (!status.ok()) return status;
  return token;
}

std::string TokenDigest(absl::string_view token) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace rdzv
