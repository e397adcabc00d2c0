// auth_probe: one rdzv call made the way another user on the cluster could make it, for the
// authentication tests. It speaks the protocol directly (the generated stub), so it can send
// what no agent would: no credential, a credential made for another call, one credential twice.
//
// Usage: auth_probe ENDPOINT CREDENTIAL ACTION JOB [AGENT]
//   CREDENTIAL  none | munge:SOCKET | token:FILE
//   ACTION      status | report | leave | join | replay (the same MUNGE credential twice)
// Prints "OK ..." and exits 0 when the server accepted the call, or "CODE: message" and exits 1.
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <string>

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
