// A minimal custom launcher on librdzv: joins a rendezvous, prints where this process sits in
// the job, and leaves. A real launcher would start its workers where the comment says.
//
//   rdzv-example-launcher HOST:PORT JOB_ID NNODES NODE_RANK NPROC
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "client/client.h"
#include "client/local_endpoint.h"
#include "common/net.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s HOST:PORT JOB_ID NNODES NODE_RANK NPROC\n", argv[0]);
    return 2;
  }
  rdzv::ClientOptions options;
  options.endpoint = argv[1];
  options.join_timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<rdzv::Client>> client = rdzv::Client::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", std::string(client.status().message()).c_str());
    return 2;
  }

  rdzv::JoinSpec spec;
  spec.job_id = argv[2];
  spec.min_agents = spec.max_agents = std::atoi(argv[3]);
  spec.agent.node_index = std::atoi(argv[4]);
  spec.agent.nproc = std::atoi(argv[5]);
  spec.agent.host = "launcher-" + std::string(argv[4]);
  spec.agent.agent_id = spec.agent.host + ":" + std::to_string(getpid());
  // This host's addresses as the other nodes see it (the route toward the server), and a free
  // port for rank 0's TCPStore, held until the workers start.
  absl::StatusOr<rdzv::HostPort> server = rdzv::ParseHostPort(options.endpoint, 29400);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", std::string(server.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<rdzv::ReservedPort> master_port = rdzv::PrepareLocalEndpoint(spec, server->host);
  if (!master_port.ok()) {
    std::fprintf(stderr, "%s\n", std::string(master_port.status().message()).c_str());
    return 1;
  }

  rdzv::Handlers handlers;
  handlers.on_abort = [](const rdzv::AbortEvent& abort) {
    std::fprintf(stderr, "job aborted: %s\n", abort.reason.c_str());
  };
  absl::StatusOr<rdzv::AssignmentEvent> a = (*client)->Join(spec, handlers);
  if (!a.ok()) {
    std::fprintf(stderr, "join failed: %s\n", std::string(a.status().message()).c_str());
    return 1;
  }
  master_port->Release();
  // Start workers here: worker i gets RANK a->slot.rank_offset + i and
  // LOCAL_RANK a->slot.local_rank_offset + i, WORLD_SIZE a->world_size, and the master endpoint.
  std::printf("node %d/%d ranks %d..%d of %d local_world_size %d master %s:%d\n",
              a->slot.group_rank, a->group_world_size, a->slot.rank_offset,
              a->slot.rank_offset + spec.agent.nproc - 1, a->world_size, a->slot.local_world_size,
              a->master_addr.c_str(), a->master_port);
  return (*client)->Leave().ok() ? 0 : 1;
}
