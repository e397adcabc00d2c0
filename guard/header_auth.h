// HeaderAuth: checks every call's credential on the call's headers, before gRPC reads the call's
// message or runs its handler (Authenticator::CheckHeaders). A caller that has not proved who
// it is then holds no more than its headers and the small flow-control window gRPC opens for
// each stream: its call is failed as soon as its headers are checked. Calls of the standard
// health service (grpc.health.v1) need no credential.
//
// It installs itself as gRPC core's auth metadata processor on the credentials it makes
// (Credentials()), plaintext or TLS alike: gRPC's C++ InsecureServerCredentials() cannot take a
// processor, its C core can. MUNGE credentials are decoded on a few threads of its own, so that
// a slow munged holds none of gRPC's, and wait for them in shares (guard/core/
// credential_queue.h): the share of the user its connection proved with its first decoded call
// (kept on the connection's auth context), or the one of connections not yet proven; so one
// user's flood while munged is slow delays only that user's calls.
//
// Thread-safe. Must outlive the grpc::Server it serves: Stop() after that server has stopped,
// then destroy.
#ifndef RDZV_GUARD_HEADER_AUTH_H_
#define RDZV_GUARD_HEADER_AUTH_H_

#include <grpc/grpc_security.h>
#include <grpcpp/security/server_credentials.h>

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "guard/authenticator.h"
#include "guard/core/credential_queue.h"

namespace rdzv {

class HeaderAuth {
 public:
  // Checks with `auth` (not owned; must outlive this). `on_refused` is told the code of each
  // refusal (kPermissionDenied for a caller who may not, else why it proved nothing), from any
  // thread.
  HeaderAuth(const Authenticator* auth, std::function<void(absl::StatusCode)> on_refused);
  ~HeaderAuth();
  HeaderAuth(const HeaderAuth&) = delete;
  HeaderAuth& operator=(const HeaderAuth&) = delete;

  // Server credentials, plaintext or TLS with `tls`, whose calls this checks.
  std::shared_ptr<grpc::ServerCredentials> Credentials(const TlsServerIdentity& tls);

  // Waits for the checks in flight to end. Call once the grpc::Server has stopped.
  void Stop();

 private:
  static void Process(void* state, grpc_auth_context* context, const grpc_metadata* md,
                      size_t num_md, grpc_process_auth_metadata_done_cb cb, void* user_data);
  void Refused(absl::string_view path, const absl::Status& status) const;

  const Authenticator* const auth_;
  // Refusals are logged at most once a second, with a count of those not logged.
  mutable absl::Mutex log_mu_;
  mutable absl::Time last_log_ ABSL_GUARDED_BY(log_mu_) = absl::InfinitePast();
  mutable int64_t unlogged_ ABSL_GUARDED_BY(log_mu_) = 0;
  const std::function<void(absl::StatusCode)> on_refused_;
  // The decoders' loop: the queue's next credential, in turn, until Stop().
  void Decode();

  // Credentials waiting for a decoder, in shares: past a share's bound (or the queue's) new
  // ones are refused (UNAVAILABLE, which clients retry) rather than queued, while munged is slow.
  absl::Mutex mu_;
  CredentialQueue queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> decoders_;
};

}  // namespace rdzv

#endif  // RDZV_GUARD_HEADER_AUTH_H_
