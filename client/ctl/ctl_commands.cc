#include "client/ctl/ctl_commands.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/ctl/status_format.h"
#include "common/auth.h"
#include "common/grpc_status.h"
#include "common/tls.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "rdzv/v1/rdzv.grpc.pb.h"

namespace rdzv {
namespace {

void SetDeadline(grpc::ClientContext& context, const CtlOptions& options) {
  context.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(options.timeout));
}

// How rdzvctl proves who it is, as an agent would: rdzvd authenticates every call, and shows or
// lets abort only the caller's own jobs (every job for root and its admin groups).
absl::StatusOr<ClientAuth> CtlAuth(const CtlOptions& options) {
  ClientAuth auth;
  auth.munge_socket = options.munge_socket;
  auth.server_uid = options.server_uid;
  return LoadClientAuth(std::move(auth), options.token_file);
}

// One call of `method` on `job`, with the caller's credential and a nonce for rdzvd's proof,
// which an answer must carry to be shown: rdzvctl does not print, nor take for done, what a
// process that merely took rdzvd's port says.
template <typename Request, typename Response, typename Method>
grpc::Status ProvenCall(const CtlOptions& options, absl::string_view method, const std::string& job,
                        Method call, const Request& request, Response* response,
                        absl::Status* refused) {
  absl::StatusOr<ClientAuth> auth = CtlAuth(options);
  if (!auth.ok()) {
    *refused = auth.status();
    return grpc::Status::OK;
  }
  grpc::ClientContext context;
  SetDeadline(context, options);
  const std::string nonce = NewNonce();
  *refused = AttachCredential(context, *auth, method, job, nonce);
  if (!refused->ok()) return grpc::Status::OK;
  grpc::Status status = call(&context, request, response);
  if (!status.ok()) return status;
  if (absl::Status proof =
          CheckServerProof(context, *auth, method, job, nonce, ProofRequiredAt(options.endpoint));
      !proof.ok()) {
    *refused = absl::FailedPreconditionError(absl::StrFormat(
        "the server at %s did not prove that it is rdzvd: %s; check --rdzv-endpoint "
        "(RDZV_ENDPOINT) and --server-uid (RDZV_SERVER_UID)",
        options.endpoint, proof.message()));
  }
  return status;
}

int Refused(std::ostream& err, const absl::Status& status) {
  err << "rdzvctl: " << status.message() << "\n";
  return 1;
}

int Failed(std::ostream& err, const CtlOptions& options, const grpc::Status& status) {
  if (std::optional<absl::Status> tls =
          TlsConnectFailure(FromGrpcStatus(status), options.endpoint, !options.tls_ca.empty())) {
    err << "rdzvctl: " << tls->message() << "\n";
  } else if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
             status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    err << absl::StrFormat(
        "rdzvctl: rdzvd at %s did not answer (%s); check that it runs and that "
        "--rdzv-endpoint/RDZV_ENDPOINT names it\n",
        options.endpoint, status.error_message());
  } else {
    err << "rdzvctl: " << status.error_message() << "\n";
  }
  return 1;
}

int Status(v1::Rendezvous::Stub& stub, const CtlOptions& options, std::ostream& out,
           std::ostream& err) {
  v1::StatusRequest request;
  request.set_job_id(options.job);
  v1::StatusResponse response;
  absl::Status refused;
  const grpc::Status status = ProvenCall(
      options, "GetStatus", options.job,
      [&stub](grpc::ClientContext* c, const v1::StatusRequest& r, v1::StatusResponse* a) {
        return stub.GetStatus(c, r, a);
      },
      request, &response, &refused);
  if (!refused.ok()) return Refused(err, refused);
  if (!status.ok()) return Failed(err, options, status);
  if (options.json) {
    out << ToJson(response) << "\n";
  } else if (!options.job.empty() && response.jobs().empty()) {
    err << absl::StrFormat("rdzvctl: rdzvd knows no job %s; rdzvctl status lists the jobs\n",
                           options.job);
    return 1;
  } else {
    out << FormatStatusTable(response, options.nodelist);
  }
  return 0;
}

int Watch(v1::Rendezvous::Stub& stub, const CtlOptions& options, std::ostream& out,
          std::ostream& err) {
  const bool terminal = !options.json && isatty(STDOUT_FILENO);
  for (int i = 0; options.count == 0 || i < options.count; ++i) {
    if (i > 0) std::this_thread::sleep_for(absl::ToChronoMilliseconds(options.interval));
    // Home and clear on a terminal; elsewhere (a pipe, a log) one block per refresh.
    if (terminal) out << "\x1b[H\x1b[2J";
    if (!options.json)
      out << absl::FormatTime("%H:%M:%S", absl::Now(), absl::LocalTimeZone()) << "  "
          << options.endpoint << "\n";
    // A refresh that fails is shown, and the next one tries again.
    Status(stub, options, out, err);
    out.flush();
  }
  return 0;
}

int Abort(v1::Rendezvous::Stub& stub, const CtlOptions& options, std::ostream& out,
          std::ostream& err) {
  v1::AbortJobRequest request;
  request.set_job_id(options.job);
  request.set_reason(options.reason);
  v1::AbortJobResponse response;
  absl::Status refused;
  const grpc::Status status = ProvenCall(
      options, "AbortJob", options.job,
      [&stub](grpc::ClientContext* c, const v1::AbortJobRequest& r, v1::AbortJobResponse* a) {
        return stub.AbortJob(c, r, a);
      },
      request, &response, &refused);
  if (!refused.ok()) return Refused(err, refused);
  if (!status.ok()) return Failed(err, options, status);
  if (options.json) {
    out << ToJson(response) << "\n";
  } else {
    out << absl::StrFormat("job %s ended: %s\n", options.job, response.abort().reason());
  }
  return 0;
}

int Health(const std::shared_ptr<grpc::Channel>& channel, const CtlOptions& options,
           std::ostream& out, std::ostream& err) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  grpc::ClientContext context;
  SetDeadline(context, options);
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) return Failed(err, options, status);
  const std::string name =
      grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
  if (options.json) {
    out << ToJson(response) << "\n";
  } else {
    out << absl::StrFormat("%s %s\n", options.endpoint, name);
  }
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 3;
}

}  // namespace

int RunCtlCommand(const CtlOptions& options, std::ostream& out, std::ostream& err) {
  // A token file that cannot be used is bad input, as a bad flag is: said once, before any call.
  if (options.command != CtlCommand::kHealth) {
    if (absl::StatusOr<ClientAuth> auth = CtlAuth(options); !auth.ok()) {
      err << "rdzvctl: " << auth.status().message() << "\n";
      return 2;
    }
  }
  std::string ca_pem;
  if (!options.tls_ca.empty()) {
    absl::StatusOr<std::string> ca = LoadTlsCa(options.tls_ca, "--tls-ca");
    if (!ca.ok()) return Refused(err, ca.status());
    ca_pem = *std::move(ca);
  }
  grpc::ChannelArguments args;
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(options.endpoint, ChannelCredentials(ca_pem), args);
  auto stub = v1::Rendezvous::NewStub(channel);
  switch (options.command) {
    case CtlCommand::kStatus:
      return Status(*stub, options, out, err);
    case CtlCommand::kWatch:
      return Watch(*stub, options, out, err);
    case CtlCommand::kAbort:
      return Abort(*stub, options, out, err);
    case CtlCommand::kHealth:
      return Health(channel, options, out, err);
  }
  return 2;
}

}  // namespace rdzv
