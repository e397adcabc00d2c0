#include "guard/header_auth.h"

#include <grpc/grpc_security.h>
#include <spdlog/spdlog.h>

#include <optional>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/auth.h"
#include "common/logging.h"

namespace rdzv {
namespace {

// munged answers one decode at a time per connection; a few threads keep a burst of joins
// moving without letting a flood of bad credentials take more.
constexpr size_t kDecodeThreads = 4;
// The auth context property that holds the uid a connection proved (gRPC keeps one auth context
// per connection and hands it to every call's check).
constexpr char kProvenUidProperty[] = "rdzv_proven_uid";
// Guards the properties this code reads and adds: the checks of one connection's calls run at
// once on several threads.
absl::Mutex proven_mu;

// The queue share of a call on the connection of `context`: "uid:N" once a call on it proved N,
// else CredentialQueue::kUnproven.
std::string ProvenShare(grpc_auth_context* context) {
  if (context == nullptr) return std::string(CredentialQueue::kUnproven);
  absl::MutexLock lock(&proven_mu);
  grpc_auth_property_iterator it =
      grpc_auth_context_find_properties_by_name(context, kProvenUidProperty);
  if (const grpc_auth_property* p = grpc_auth_property_iterator_next(&it); p != nullptr) {
    return absl::StrCat("uid:", absl::string_view(p->value, p->value_length));
  }
  return std::string(CredentialQueue::kUnproven);
}

// Keeps `uid` on the connection of `context` as the user it proved, unless one is kept already.
void NoteProven(grpc_auth_context* context, uid_t uid) {
  if (context == nullptr) return;
  absl::MutexLock lock(&proven_mu);
  grpc_auth_property_iterator it =
      grpc_auth_context_find_properties_by_name(context, kProvenUidProperty);
  if (grpc_auth_property_iterator_next(&it) != nullptr) return;
  grpc_auth_context_add_cstring_property(context, kProvenUidProperty, absl::StrCat(uid).c_str());
}
constexpr char kHealthPrefix[] = "/grpc.health.v1.Health/";

absl::string_view View(const grpc_slice& slice) {
  return absl::string_view(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(slice)),
                           GRPC_SLICE_LENGTH(slice));
}

// Server credentials made with gRPC's C core, so that they can carry an auth metadata
// processor; gRPC's C++ server adds its listening port through AddPortToServer.
class CoreServerCredentials final : public grpc::ServerCredentials {
 public:
  explicit CoreServerCredentials(grpc_server_credentials* creds) : creds_(creds) {}
  ~CoreServerCredentials() override { grpc_server_credentials_release(creds_); }

  // The processor is set on the core credentials when they are made.
  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {}

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), creds_);
  }

  grpc_server_credentials* const creds_;
};

grpc_status_code CoreCode(const absl::Status& status) {
  return static_cast<grpc_status_code>(status.code());
}

}  // namespace

HeaderAuth::HeaderAuth(const Authenticator* auth, std::function<void(absl::StatusCode)> on_refused)
    : auth_(auth), on_refused_(std::move(on_refused)), queue_(CredentialQueue::Limits{}) {
  for (size_t i = 0; i < kDecodeThreads; ++i) decoders_.emplace_back([this] { Decode(); });
}

HeaderAuth::~HeaderAuth() { Stop(); }

void HeaderAuth::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  // The decoders finish what is queued (each check's callback must run), then end.
  for (std::thread& t : decoders_) t.join();
  decoders_.clear();
}

void HeaderAuth::Decode() {
  for (;;) {
    std::optional<CredentialQueue::Item> item;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](HeaderAuth* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return self->stopping_ || self->queue_.size() > 0;
          },
          this));
      item = queue_.Pop();
      if (!item) return;  // stopping, nothing left
    }
    (*item)();
  }
}

std::shared_ptr<grpc::ServerCredentials> HeaderAuth::Credentials(const TlsServerIdentity& tls) {
  grpc_server_credentials* creds;
  if (tls.cert_chain_pem.empty()) {
    creds = grpc_insecure_server_credentials_create();
  } else {
    grpc_ssl_pem_key_cert_pair pair = {tls.private_key_pem.c_str(), tls.cert_chain_pem.c_str()};
    creds = grpc_ssl_server_credentials_create_ex(
        nullptr, &pair, 1, GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE, nullptr);
  }
  grpc_auth_metadata_processor processor = {&HeaderAuth::Process, nullptr, this};
  grpc_server_credentials_set_auth_metadata_processor(creds, processor);
  return std::make_shared<CoreServerCredentials>(creds);
}

void HeaderAuth::Process(void* state, grpc_auth_context* context, const grpc_metadata* md,
                         size_t num_md, grpc_process_auth_metadata_done_cb cb, void* user_data) {
  auto* self = static_cast<HeaderAuth*>(state);
  absl::string_view path, munge, token;
  for (size_t i = 0; i < num_md; ++i) {
    const absl::string_view key = View(md[i].key);
    if (key == ":path") {
      path = View(md[i].value);
    } else if (key == kMungeMetadata) {
      munge = View(md[i].value);
    } else if (key == kTokenMetadata) {
      token = View(md[i].value);
    }
  }
  if (absl::StartsWith(path, kHealthPrefix) || self->auth_->policy().mode != AuthMode::kMunge ||
      munge.empty()) {
    // Nothing to ask munged: answered here, at once.
    absl::Status status = absl::StartsWith(path, kHealthPrefix)
                              ? absl::OkStatus()
                              : self->auth_->CheckHeaders({munge, token, {}});
    if (!status.ok()) self->Refused(path, status);
    const std::string message(status.message());
    cb(user_data, nullptr, 0, nullptr, 0, CoreCode(status), message.c_str());
    return;
  }
  // The user this connection proved with an earlier call, if any: its share of the queue.
  const std::string share = ProvenShare(context);
  auto check = [self, context, path = std::string(path), munge = std::string(munge), cb,
                user_data] {
    std::optional<uid_t> proven;
    const absl::Status status = self->auth_->CheckHeaders({munge, {}, {}}, &proven);
    if (proven) NoteProven(context, *proven);
    if (!status.ok()) self->Refused(path, status);
    const std::string message(status.message());
    cb(user_data, nullptr, 0, nullptr, 0, CoreCode(status), message.c_str());
  };
  CredentialQueue::Pushed pushed;
  {
    absl::MutexLock lock(&self->mu_);
    pushed = self->stopping_ ? CredentialQueue::Pushed::kFull
                             : self->queue_.Push(share, std::move(check));
  }
  if (pushed != CredentialQueue::Pushed::kQueued) {
    const absl::Status busy = absl::UnavailableError(
        pushed == CredentialQueue::Pushed::kShareFull
            ? absl::StrFormat("%s has %d credentials waiting for munged on this rendezvous server; "
                              "try again shortly",
                              share.empty() ? std::string("this connection's host")
                                            : absl::StrCat("uid ", share.substr(4)),
                              share.empty() ? CredentialQueue::Limits{}.unproven
                                            : CredentialQueue::Limits{}.per_user)
            : absl::StrFormat(
                  "the rendezvous server has %d credentials waiting for munged; try again shortly",
                  CredentialQueue::Limits{}.total));
    self->Refused(path, busy);
    cb(user_data, nullptr, 0, nullptr, 0, CoreCode(busy), std::string(busy.message()).c_str());
  }
}

void HeaderAuth::Refused(absl::string_view path, const absl::Status& status) const {
  // A flood of refused calls must not become a flood of log lines.
  int64_t unlogged = -1;
  {
    absl::MutexLock lock(&log_mu_);
    const absl::Time now = absl::Now();
    if (now - last_log_ >= absl::Seconds(1)) {
      last_log_ = now;
      unlogged = unlogged_;
      unlogged_ = 0;
    } else {
      ++unlogged_;
    }
  }
  if (unlogged == 0) {
    spdlog::warn("refused a call of {}: {}", absl::CHexEscape(path),
                 EscapeControl(status.message()));
  } else if (unlogged > 0) {
    spdlog::warn("refused a call of {}: {} ({} more refused in the last second, not logged)",
                 absl::CHexEscape(path), EscapeControl(status.message()), unlogged);
  }
  if (on_refused_) on_refused_(status.code());
}

}  // namespace rdzv
