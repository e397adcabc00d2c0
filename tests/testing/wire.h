// Raw rdzv.v1 calls to an rdzvd service on loopback, as a careless or hostile client can make
// them (not what librdzv sends), and an in-process server to make them to.
//
//   std::unique_ptr<Server> server = StartLoopbackServer(LoopbackServerOptions());
//   WireClient wire(server->port());
//   Joined j = wire.Join(JoinOf("job", "a0", 2));
//   grpc::Status s = End(j);
#ifndef RDZV_TESTS_TESTING_WIRE_H_
#define RDZV_TESTS_TESTING_WIRE_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "rdzv/v1/rdzv.grpc.pb.h"
#include "server/server.h"

namespace rdzv::testing {

// How long any raw call may take.
inline constexpr auto kWireDeadline = std::chrono::seconds(30);

// Listening on a free port of 127.0.0.1, ticking every 20 ms, without authentication.
ServerOptions LoopbackServerOptions();

// Starts the server in this process; null after a gtest failure when it cannot start.
std::unique_ptr<Server> StartLoopbackServer(const ServerOptions& options);

// An open Join stream (its context, the reader, and the stub it was opened on, if its own).
struct Joined {
  std::unique_ptr<grpc::ClientContext> context = std::make_unique<grpc::ClientContext>();
  std::unique_ptr<grpc::ClientReader<v1::JoinEvent>> reader;
  std::unique_ptr<v1::Rendezvous::Stub> stub;
};

// A join of agent `agent` (also its host) with one worker to a job of exactly `nnodes` agents.
v1::JoinRequest JoinOf(const std::string& job, const std::string& agent, int nnodes,
                       int64_t node_index = -1);

// How a stream ends (after any events).
grpc::Status End(Joined& j);

// Reads events until one of `kind` arrives; false when the stream ends first.
bool ReadUntil(Joined& j, v1::JoinEvent::EventCase kind, v1::JoinEvent* event);

// Calls to a server on 127.0.0.1:`port`, each stub on a connection of its own, as each agent
// has. Thread-safe.
class WireClient {
 public:
  // `args` are added to every channel's arguments.
  explicit WireClient(int port, grpc::ChannelArguments args = {});

  std::shared_ptr<grpc::Channel> Channel() const;
  std::unique_ptr<v1::Rendezvous::Stub> Stub() const;

  // Opens a Join stream with kWireDeadline, on `on` or else on a stub of its own; `token`
  // (when not empty) goes in the call's metadata.
  Joined Join(const v1::JoinRequest& request, const std::string& token = "",
              v1::Rendezvous::Stub* on = nullptr) const;

 private:
  std::string target_;
  grpc::ChannelArguments args_;
};

}  // namespace rdzv::testing

#endif  // RDZV_TESTS_TESTING_WIRE_H_
