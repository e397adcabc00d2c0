// auth_probe: one rdzv call made the way another user on the cluster could make it, for the
// authentication tests. It speaks the protocol directly (the generated stub), so it can send
// what no agent would: no credential, a credential made for another call, one credential twice.
//
// Usage: auth_probe ENDPOINT CREDENTIAL ACTION JOB [AGENT]
//   CREDENTIAL  none | munge:SOCKET | token:FILE
//   ACTION      status | report | leave | join | replay (the same MUNGE credential twice) |
//               crossmethod (a MUNGE credential made for GetStatus, sent with ReportExit) |
//               crossjob (one made for ReportExit on another job)
// Prints "OK ..." and exits 0 when the server accepted the call, or "CODE: message" and exits 1.
//
// auth_probe LISTEN CREDENTIAL serve JOB [EXIT_CODE]: a fake rendezvous server on LISTEN
// (HOST:PORT) that claims JOB. It answers every Join with a proof made with CREDENTIAL (a
// signature under a key of its own that its own uid's MUNGE credential vouches for, or the HMAC
// under that token; none: no proof) and an assignment, rank 0 of the agent's own worker count;
// with EXIT_CODE, one second later, an abort with that exit code. Its GetStatus lists JOB, with
// the same kind of proof. Prints "serving" once it listens, "assigned" for each assignment it
// hands out, and runs until killed.
//
// auth_probe LISTEN munge:SOCKET serve-copied-key JOB REAL: the same fake, but the credential it
// sends for its key is the one the real server at REAL sends for the real server's key (asked for
// with a GetStatus call, as any user may): what someone who copied it would try.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/auth.h"
#include "rdzv/v1/rdzv.grpc.pb.h"

namespace {

using rdzv::v1::Rendezvous;

struct Credential {
  std::string munge_socket;  // set for munge:
  std::string token;         // set for token:
  bool munge = false;
};

int Fail(const grpc::Status& s) {
  std::printf("%d: %s\n", static_cast<int>(s.error_code()), s.error_message().c_str());
  return 1;
}

int Fail(const absl::Status& s) {
  std::printf("%s\n", s.ToString().c_str());
  return 1;
}

absl::Status Attach(const Credential& c, grpc::ClientContext& ctx, const std::string& method,
                    const std::string& job, std::string* used = nullptr) {
  if (!c.token.empty()) ctx.AddMetadata(rdzv::kTokenMetadata, c.token);
  if (c.munge) {
    absl::StatusOr<std::string> cred =
        rdzv::MungeEncode(rdzv::CallPayload(method, job), c.munge_socket);
    if (!cred.ok()) return cred.status();
    ctx.AddMetadata(rdzv::kMungeMetadata, *cred);
    if (used != nullptr) *used = *cred;
  }
  return absl::OkStatus();
}

absl::string_view Md(const grpc::ServerContext& ctx, const char* key) {
  auto it = ctx.client_metadata().find(key);
  if (it == ctx.client_metadata().end()) return {};
  return absl::string_view(it->second.data(), it->second.length());
}

class FakeServer final : public Rendezvous::Service {
 public:
  FakeServer(Credential cred, std::string job, std::optional<int> exit_code, rdzv::SigningKey key,
             std::string key_credential)
      : cred_(std::move(cred)),
        job_(std::move(job)),
        exit_code_(exit_code),
        key_(std::move(key)),
        key_credential_(std::move(key_credential)) {}

  // Lists one job, JOB, as the caller's.
  grpc::Status GetStatus(grpc::ServerContext* ctx, const rdzv::v1::StatusRequest* req,
                         rdzv::v1::StatusResponse* resp) override {
    Prove(*ctx, "GetStatus", req->job_id());
    resp->add_jobs()->set_job_id(job_);
    resp->mutable_jobs(0)->set_state("running");
    return grpc::Status::OK;
  }

  grpc::Status Join(grpc::ServerContext* ctx, const rdzv::v1::JoinRequest* req,
                    grpc::ServerWriter<rdzv::v1::JoinEvent>* writer) override {
    Prove(*ctx, "Join", req->job_id());
    writer->SendInitialMetadata();
    rdzv::v1::JoinEvent event;
    rdzv::v1::Assignment* a = event.mutable_assignment();
    a->set_round(1);
    a->set_world_size(req->nproc());
    a->set_group_world_size(1);
    a->set_local_world_size(req->nproc());
    a->set_agents(1);
    a->set_master_addr("127.0.0.1");
    a->set_master_port(req->master_port() > 0 ? req->master_port() : 29500);
    if (!writer->Write(event)) return grpc::Status::CANCELLED;
    std::printf("assigned\n");
    std::fflush(stdout);
    if (exit_code_) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      rdzv::v1::JoinEvent abort;
      abort.mutable_abort()->set_cause(rdzv::v1::ABORT_CAUSE_UNSPECIFIED);
      abort.mutable_abort()->set_reason("the fake server ended the job");
      abort.mutable_abort()->set_exit_code(*exit_code_);
      writer->Write(abort);
    }
    while (!ctx->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return grpc::Status::CANCELLED;
  }

 private:
  // Puts the fake's proof for the call into its initial metadata.
  void Prove(grpc::ServerContext& ctx, const std::string& method, const std::string& job) {
    // The caller as a server sees it: the uid in its MUNGE credential (decoded here, which uses it
    // up), or its token.
    std::string caller = "anyone";
    if (absl::string_view m = Md(ctx, rdzv::kMungeMetadata); !m.empty()) {
      absl::StatusOr<rdzv::MungeIdentity> id = rdzv::MungeDecode(m, cred_.munge_socket);
      if (id.ok()) caller = absl::StrCat("uid:", id->uid);
    } else if (absl::string_view t = Md(ctx, rdzv::kTokenMetadata); !t.empty()) {
      caller = absl::StrCat("token:", rdzv::TokenDigest(t));
    }
    const std::string payload =
        rdzv::ServerProofPayload(method, job, Md(ctx, rdzv::kNonceMetadata), caller);
    if (cred_.munge) {
      ctx.AddInitialMetadata(rdzv::kProofMetadata, key_.Sign(payload));
      ctx.AddInitialMetadata(rdzv::kServerKeyMetadata, key_credential_);
    } else if (!cred_.token.empty()) {
      ctx.AddInitialMetadata(rdzv::kProofMetadata, rdzv::TokenProof(cred_.token, payload));
    }
  }

  const Credential cred_;
  const std::string job_;
  const std::optional<int> exit_code_;
  const rdzv::SigningKey key_;
  const std::string key_credential_;
};

// The credential the server at `endpoint` sends for its key, to an authenticated caller.
absl::StatusOr<std::string> CopyKeyCredential(const std::string& endpoint, const Credential& cred) {
  auto stub =
      Rendezvous::NewStub(grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ctx.AddMetadata(rdzv::kNonceMetadata, rdzv::NewNonce());
  if (absl::Status s = Attach(cred, ctx, "GetStatus", ""); !s.ok()) return s;
  rdzv::v1::StatusRequest req;
  rdzv::v1::StatusResponse resp;
  grpc::Status s = stub->GetStatus(&ctx, req, &resp);
  if (!s.ok()) return absl::UnavailableError(s.error_message());
  auto it = ctx.GetServerInitialMetadata().find(rdzv::kServerKeyMetadata);
  if (it == ctx.GetServerInitialMetadata().end()) {
    return absl::NotFoundError("the real server sent no key credential");
  }
  return std::string(it->second.data(), it->second.length());
}

int Serve(const std::string& listen, const Credential& cred, const std::string& job,
          std::optional<int> exit_code, const std::string& copy_key_from) {
  absl::StatusOr<rdzv::SigningKey> key = rdzv::SigningKey::Generate();
  if (!key.ok()) return Fail(key.status());
  std::string key_credential;
  if (cred.munge) {
    absl::StatusOr<std::string> made =
        copy_key_from.empty()
            ? rdzv::MungeEncode(rdzv::ServerKeyPayload(key->public_key()), cred.munge_socket)
            : CopyKeyCredential(copy_key_from, cred);
    if (!made.ok()) return Fail(made.status());
    key_credential = *std::move(made);
  }
  FakeServer service(cred, job, exit_code, *std::move(key), std::move(key_credential));
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    std::printf("cannot listen on %s\n", listen.c_str());
    return 1;
  }
  std::printf("serving\n");
  std::fflush(stdout);
  server->Wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: auth_probe ENDPOINT CREDENTIAL ACTION JOB [AGENT]\n");
    return 2;
  }
  const std::string endpoint = argv[1];
  absl::string_view cred_arg = argv[2];
  const std::string action = argv[3];
  const std::string job = argv[4];
  const std::string agent = argc > 5 ? argv[5] : "intruder/agent";
  Credential cred;
  if (absl::ConsumePrefix(&cred_arg, "munge:")) {
    cred.munge = true;
    cred.munge_socket = std::string(cred_arg);
  } else if (absl::ConsumePrefix(&cred_arg, "token:")) {
    absl::StatusOr<std::string> token = rdzv::ReadTokenFile(std::string(cred_arg));
    if (!token.ok()) return Fail(token.status());
    cred.token = *token;
  }
  if (action == "serve") {
    std::optional<int> exit_code;
    if (argc > 5) exit_code = std::atoi(argv[5]);
    return Serve(endpoint, cred, job, exit_code, "");
  }
  if (action == "serve-copied-key") {
    if (argc < 6) {
      std::fprintf(stderr, "usage: auth_probe LISTEN munge:SOCKET serve-copied-key JOB REAL\n");
      return 2;
    }
    return Serve(endpoint, cred, job, std::nullopt, argv[5]);
  }
  auto stub =
      Rendezvous::NewStub(grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials()));
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(10);

  if (action == "status") {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    if (absl::Status s = Attach(cred, ctx, "GetStatus", ""); !s.ok()) return Fail(s);
    rdzv::v1::StatusRequest req;
    rdzv::v1::StatusResponse resp;
    grpc::Status s = stub->GetStatus(&ctx, req, &resp);
    if (!s.ok()) return Fail(s);
    std::vector<std::string> jobs;
    for (const auto& j : resp.jobs()) jobs.push_back(j.job_id());
    std::printf("OK jobs: [%s]\n", absl::StrJoin(jobs, ",").c_str());
    return 0;
  }
  if (action == "report" || action == "replay") {
    rdzv::v1::ReportExitRequest req;
    req.set_job_id(job);
    req.set_agent_id(agent);
    req.mutable_failure()->set_rank(0);
    req.mutable_failure()->set_exit_code(0);
    req.mutable_failure()->set_host("intruder");
    rdzv::v1::ReportExitResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    std::string used;
    if (absl::Status s = Attach(cred, ctx, "ReportExit", job, &used); !s.ok()) return Fail(s);
    grpc::Status s = stub->ReportExit(&ctx, req, &resp);
    if (action == "report") {
      if (!s.ok()) return Fail(s);
      std::printf("OK reported\n");
      return 0;
    }
    // The same credential again, as someone who captured it would send it.
    grpc::ClientContext again;
    again.set_deadline(deadline);
    again.AddMetadata(rdzv::kMungeMetadata, used);
    s = stub->ReportExit(&again, req, &resp);
    if (!s.ok()) return Fail(s);
    std::printf("OK replayed\n");
    return 0;
  }
  if (action == "crossmethod" || action == "crossjob") {
    rdzv::v1::ReportExitRequest req;
    req.set_job_id(job);
    req.set_agent_id(agent);
    req.mutable_failure()->set_host("intruder");
    rdzv::v1::ReportExitResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    // Made for something else: what a credential captured from another call would be.
    absl::StatusOr<std::string> other =
        rdzv::MungeEncode(action == "crossmethod" ? rdzv::CallPayload("GetStatus", job)
                                                  : rdzv::CallPayload("ReportExit", job + "-other"),
                          cred.munge_socket);
    if (!other.ok()) return Fail(other.status());
    ctx.AddMetadata(rdzv::kMungeMetadata, *other);
    grpc::Status s = stub->ReportExit(&ctx, req, &resp);
    if (!s.ok()) return Fail(s);
    std::printf("OK reported\n");
    return 0;
  }
  if (action == "leave") {
    rdzv::v1::LeaveRequest req;
    req.set_job_id(job);
    req.set_agent_id(agent);
    rdzv::v1::LeaveResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    if (absl::Status s = Attach(cred, ctx, "Leave", job); !s.ok()) return Fail(s);
    grpc::Status s = stub->Leave(&ctx, req, &resp);
    if (!s.ok()) return Fail(s);
    std::printf("OK left\n");
    return 0;
  }
  if (action == "holds") {
    // A peer's question (rdzvd --peers): whether the server serves root's job `job`.
    const std::string nonce = rdzv::NewNonce();
    rdzv::v1::HoldsJobRequest req;
    req.set_job_id(job);
    req.set_owner("uid:0");
    req.set_asker(~uint64_t{0});
    req.set_nonce(nonce);
    rdzv::v1::HoldsJobResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    if (absl::Status s = Attach(cred, ctx, "HoldsJob", job); !s.ok()) return Fail(s);
    grpc::Status s = stub->HoldsJob(&ctx, req, &resp);
    if (!s.ok()) return Fail(s);
    bool proven = false;
    if (cred.munge) {
      absl::StatusOr<rdzv::MungeIdentity> id = rdzv::MungeDecode(resp.proof(), cred.munge_socket);
      proven = id.ok() && id->payload == rdzv::HoldsProofPayload(nonce, job, "uid:0", resp.holds());
      if (id.ok()) std::printf("proof by uid %d\n", static_cast<int>(id->uid));
    }
    std::printf("OK holds=%d proven=%d\n", resp.holds() ? 1 : 0, proven ? 1 : 0);
    return 0;
  }
  if (action == "join") {
    rdzv::v1::JoinRequest req;
    req.set_job_id(job);
    req.set_agent_id(agent);
    req.set_host("intruder");
    req.set_nproc(1);
    req.set_min_agents(1);
    req.set_max_agents(1);
    req.set_protocol_version(1);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
    if (absl::Status s = Attach(cred, ctx, "Join", job); !s.ok()) return Fail(s);
    auto reader = stub->Join(&ctx, req);
    rdzv::v1::JoinEvent ev;
    while (reader->Read(&ev)) {
      if (ev.has_assignment()) {
        std::printf("OK assigned rank %d of %d\n", ev.assignment().rank_offset(),
                    ev.assignment().world_size());
        ctx.TryCancel();
        reader->Finish();
        return 0;
      }
    }
    return Fail(reader->Finish());
  }
  std::fprintf(stderr, "auth_probe: unknown action %s\n", action.c_str());
  return 2;
}
