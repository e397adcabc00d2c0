#include "common/tls.h"

#include <errno.h>
#include <fcntl.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace rdzv {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

// Whether the POSIX access ACL `acl` (system.posix_acl_access as the kernel stores it: a version,
// then {tag, permissions, id} entries) lets any group, or a user other than the owner and
// `self`, read the file. systemd hands a service its credentials (LoadCredential=) as files of
// mode 0400 with an ACL entry for the service's user: stat then shows the ACL's mask in the
// group bits (0440), although no group may read the file.
bool AclLetsOthersRead(absl::string_view acl, uid_t self) {
  constexpr uint32_t kUser = 0x02, kGroupObj = 0x04, kGroup = 0x08, kMask = 0x10, kOther = 0x20;
  constexpr uint32_t kRead = 4;
  // Little-endian, as the kernel stores it.
  const auto number = [acl](size_t at, int bytes) {
    uint32_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = v << 8 | static_cast<uint8_t>(acl[at + i]);
    return v;
  };
  if (acl.size() < 4 || (acl.size() - 4) % 8 != 0 || number(0, 4) != 2) return true;  // unknown
  uint32_t mask = 7;
  for (size_t at = 4; at < acl.size(); at += 8) {
    if (number(at, 2) == kMask) mask = number(at + 2, 2);
  }
  for (size_t at = 4; at < acl.size(); at += 8) {
    const uint32_t tag = number(at, 2), perm = number(at + 2, 2), id = number(at + 4, 4);
    const bool reads = (perm & mask & kRead) != 0;
    if ((tag == kUser && id != self && reads) || ((tag == kGroupObj || tag == kGroup) && reads) ||
        (tag == kOther && (perm & kRead) != 0)) {
      return true;
    }
  }
  return false;
}

// Whether someone besides the owner (and this process's user) may read the open file `fd`.
bool ReadableByOthers(int fd, const struct stat& st) {
  if ((st.st_mode & 077) == 0) return false;
  if ((st.st_mode & 007) != 0) return true;
  char acl[1024];
  const ssize_t n = fgetxattr(fd, "system.posix_acl_access", acl, sizeof(acl));
  if (n < 0) return true;  // no ACL (or none readable): the group bits are the group's
  return AclLetsOthersRead(absl::string_view(acl, static_cast<size_t>(n)), geteuid());
}

// Reads a whole PEM file of at most kMaxTlsFileBytes. A private key is not read through a
// symbolic link and must be readable by its owner only.
absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view flag,
                                        bool private_key) {
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s names no file", flag));
  }
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
  const int fd =
      open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | (private_key ? O_NOFOLLOW : 0));
  if (fd < 0) {
    const int err = errno;
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s %s cannot be read: %s%s", flag, path, strerror(err),
        err == ELOOP && private_key ? " (it is a symbolic link; give the file itself)" : ""));
  }
  struct stat st;
  absl::Status status;
  std::string text;
  if (fstat(fd, &st) != 0) {
    status = absl::FailedPreconditionError(
        absl::StrFormat("%s %s cannot be read: %s", flag, path, strerror(errno)));
  } else if (!S_ISREG(st.st_mode)) {
    status = absl::FailedPreconditionError(
        absl::StrFormat("%s %s is not a regular file; give a PEM file", flag, path));
  } else if (private_key && ReadableByOthers(fd, st)) {
    status = absl::PermissionDeniedError(
        absl::StrFormat("%s %s is readable by group or others (mode %04o); chmod 600 %s", flag,
                        path, st.st_mode & 07777, path));
  } else {
    text.resize(kMaxTlsFileBytes + 1);
    size_t have = 0;
    while (have < text.size()) {
      const ssize_t n = read(fd, text.data() + have, text.size() - have);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        status = absl::FailedPreconditionError(
            absl::StrFormat("%s %s cannot be read: %s", flag, path, strerror(errno)));
      }
      if (n <= 0) break;
      have += static_cast<size_t>(n);
    }
    text.resize(have);
    if (status.ok() && have > kMaxTlsFileBytes) {
      status = absl::InvalidArgumentError(absl::StrFormat(
          "%s %s is larger than %d bytes; give a PEM file", flag, path, kMaxTlsFileBytes));
    }
  }
  close(fd);
  if (!status.ok()) return status;
  return text;
}

// The PEM certificates in `pem`, in order.
std::vector<X509Ptr> ParseCertificates(const std::string& pem) {
  std::vector<X509Ptr> certs;
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (bio == nullptr) return certs;
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    certs.emplace_back(cert);
  }
  ERR_clear_error();  // the end of the input reads as an error
  return certs;
}

absl::Status NoCertificate(absl::string_view flag, const std::string& path) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s %s holds no PEM certificate (-----BEGIN CERTIFICATE-----); give a PEM file", flag, path));
}

}  // namespace

absl::StatusOr<TlsServerIdentity> LoadTlsServerIdentity(const std::string& cert_file,
                                                        const std::string& key_file,
                                                        absl::string_view cert_flag,
                                                        absl::string_view key_flag) {
  TlsServerIdentity identity;
  absl::StatusOr<std::string> cert = ReadPemFile(cert_file, cert_flag, false);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPemFile(key_file, key_flag, true);
  if (!key.ok()) return key.status();
  const std::vector<X509Ptr> chain = ParseCertificates(*cert);
  if (chain.empty()) return NoCertificate(cert_flag, cert_file);
  BioPtr bio(BIO_new_mem_buf(key->data(), static_cast<int>(key->size())));
  PkeyPtr pkey(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  ERR_clear_error();
  if (pkey == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s %s holds no PEM private key (unencrypted, -----BEGIN PRIVATE KEY-----); give the "
        "key of the certificate in %s",
        key_flag, key_file, cert_flag));
  }
  if (X509_check_private_key(chain.front().get(), pkey.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrFormat("%s %s is not the key of the certificate in %s %s; give the matching pair",
                        key_flag, key_file, cert_flag, cert_file));
  }
  identity.cert_chain_pem = *std::move(cert);
  identity.private_key_pem = *std::move(key);
  return identity;
}

absl::StatusOr<std::string> LoadTlsCa(const std::string& ca_file, absl::string_view flag) {
  absl::StatusOr<std::string> ca = ReadPemFile(ca_file, flag, false);
  if (!ca.ok()) return ca.status();
  if (ParseCertificates(*ca).empty()) return NoCertificate(flag, ca_file);
  return ca;
}

void InitOpenSslWithoutExitCleanup() { OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr); }

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const TlsServerIdentity& identity) {
  if (identity.cert_chain_pem.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back({identity.private_key_pem, identity.cert_chain_pem});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const std::string& ca_pem) {
  if (ca_pem.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ca_pem;
  return grpc::SslCredentials(options);
}

bool ServerSpeaksTls(const std::string& endpoint, absl::Duration timeout) {
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_verify_server_certs(false);
  options.set_check_call_host(false);
  options.set_certificate_verifier(std::make_shared<grpc::experimental::NoOpCertificateVerifier>());
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(endpoint, grpc::experimental::TlsCredentials(options), args);
  const auto deadline = absl::ToChronoTime(absl::Now() + timeout);
  for (grpc_connectivity_state state = channel->GetState(true);; state = channel->GetState(false)) {
    if (state == GRPC_CHANNEL_READY) return true;
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN) return false;
    if (!channel->WaitForStateChange(state, deadline)) return false;
  }
}

std::optional<absl::Status> TlsConnectFailure(const absl::Status& status,
                                              const std::string& endpoint, bool tls) {
  if (status.code() != absl::StatusCode::kUnavailable) return std::nullopt;
  const absl::string_view m = status.message();
  const std::string lower = absl::AsciiStrToLower(m);
  // gRPC says "Ssl handshake failed: ... certificate verify failed" (or "wrong version number"
  // from a plaintext server), and "Peer name X is not in peer certificate". Not "Handshake timed
  // out": a busy server is retried.
  if (tls && (absl::StrContains(lower, "handshake failed") ||
              absl::StrContains(lower, "peer certificate") ||
              absl::StrContains(lower, "certificate verify failed"))) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "TLS verification failed for the rendezvous server at %s (%s); check --tls-ca "
        "(RDZV_TLS_CA): it must name the CA that signed the server's certificate, the "
        "certificate must name the host you connect to, and the server must serve TLS",
        endpoint, m));
  }
  // A TLS server closes a plaintext connection in its handshake, before any HTTP/2 frame.
  if (!tls && absl::StrContains(lower, "socket closed") &&
      ServerSpeaksTls(endpoint, absl::Seconds(3))) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the rendezvous server at %s serves TLS, and this client does not: pass --tls-ca FILE "
        "(RDZV_TLS_CA) with the CA that signed its certificate",
        endpoint));
  }
  return std::nullopt;
}

}  // namespace rdzv
