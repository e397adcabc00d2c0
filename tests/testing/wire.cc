#include "tests/testing/wire.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "gtest/gtest.h"

namespace rdzv::testing {

ServerOptions LoopbackServerOptions() {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.tick_interval = absl::Milliseconds(20);
  options.service.auth.mode = AuthMode::kNone;
  return options;
}

std::unique_ptr<Server> StartLoopbackServer(const ServerOptions& options) {
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

v1::JoinRequest JoinOf(const std::string& job, const std::string& agent, int nnodes,
                       int64_t node_index) {
  v1::JoinRequest r;
  r.set_job_id(job);
  r.set_agent_id(agent);
  r.set_host(agent);
  r.set_node_index(node_index);
  r.set_order(-1);
  r.set_nproc(1);
  r.set_min_agents(nnodes);
  r.set_max_agents(nnodes);
  r.add_addresses("127.0.0.1");
  r.set_master_port(29500);
  return r;
}

grpc::Status End(Joined& j) {
  v1::JoinEvent event;
  while (j.reader->Read(&event)) {
  }
  return j.reader->Finish();
}

bool ReadUntil(Joined& j, v1::JoinEvent::EventCase kind, v1::JoinEvent* event) {
  while (j.reader->Read(event)) {
    if (event->event_case() == kind) return true;
  }
  return false;
}

WireClient::WireClient(int port, grpc::ChannelArguments args)
    : target_(absl::StrCat("127.0.0.1:", port)), args_(std::move(args)) {
  args_.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
}

std::shared_ptr<grpc::Channel> WireClient::Channel() const {
  return grpc::CreateCustomChannel(target_, grpc::InsecureChannelCredentials(), args_);
}

std::unique_ptr<v1::Rendezvous::Stub> WireClient::Stub() const {
  return v1::Rendezvous::NewStub(Channel());
}

Joined WireClient::Join(const v1::JoinRequest& request, const std::string& token,
                        v1::Rendezvous::Stub* on) const {
  Joined j;
  if (on == nullptr) j.stub = Stub();
  j.context->set_deadline(std::chrono::system_clock::now() + kWireDeadline);
  if (!token.empty()) j.context->AddMetadata(kTokenMetadata, token);
  j.reader = (on != nullptr ? on : j.stub.get())->Join(j.context.get(), request);
  return j;
}

}  // namespace rdzv::testing
