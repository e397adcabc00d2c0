// rdzvd's service in this process, reached over loopback by real librdzv Clients: what an
// agent sees from the server (assignments, refusals, aborts), before any process is spawned.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <future>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/testing/long_wait.h"
#include "tests/testing/output.h"
#include "tests/testing/wire.h"

namespace rdzv {
namespace {

using testing::Contains;
using testing::kLongWait;

std::unique_ptr<Server> StartServer() {
  // Loopback, without authentication: that has its own tests.
  return testing::StartLoopbackServer(testing::LoopbackServerOptions());
}

std::string Endpoint(const Server& server) { return absl::StrCat("127.0.0.1:", server.port()); }

std::unique_ptr<Client> NewClient(const std::string& endpoint,
                                  absl::Duration join_timeout = kLongWait) {
  ClientOptions options;
  options.endpoint = endpoint;
  options.join_timeout = join_timeout;
  options.auth.mode = ClientAuth::Mode::kNone;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(*client) : nullptr;
}

JoinSpec Spec(const std::string& job, const std::string& agent_id, int64_t node_index,
              int32_t nproc, int32_t nnodes) {
  JoinSpec spec;
  spec.job_id = job;
  spec.agent.agent_id = agent_id;
  spec.agent.host = agent_id;
  spec.agent.node_index = node_index;
  spec.agent.nproc = nproc;
  spec.min_agents = nnodes;
  spec.max_agents = nnodes;
  spec.addresses = {absl::StrCat("addr-of-", agent_id)};
  spec.master_port = 20000 + static_cast<int32_t>(std::max<int64_t>(node_index, 0));
  return spec;
}

// A Join running on a thread of its own, as an agent's join thread does. Destroying it before
// Get() cancels the join (so that a failed assertion never leaves a test waiting); destroy it
// before its Client.
class PendingJoin {
 public:
  PendingJoin() = default;
  PendingJoin(Client& client, JoinSpec spec, Handlers handlers = {})
      : client_(&client),
        result_(std::async(std::launch::async,
                           [&client, spec = std::move(spec), handlers = std::move(handlers)] {
                             return client.Join(spec, handlers);
                           })) {}
  PendingJoin(PendingJoin&&) = default;
  PendingJoin& operator=(PendingJoin&&) = default;
  ~PendingJoin() {
    if (result_.valid()) client_->Cancel();
  }

  // The join's result; a join that does not return in time is cancelled and fails the test.
  absl::StatusOr<AssignmentEvent> Get() {
    if (result_.wait_for(absl::ToChronoSeconds(kLongWait)) != std::future_status::ready) {
      ADD_FAILURE() << "Join did not return within " << kLongWait;
      client_->Cancel();
    }
    return result_.get();
  }

 private:
  Client* client_ = nullptr;
  std::future<absl::StatusOr<AssignmentEvent>> result_;
};

// Polls the server until `job` has `joined` agents in its round.
bool WaitForJoined(Client& observer, const std::string& job, int32_t joined) {
  const absl::Time deadline = absl::Now() + kLongWait;
  while (absl::Now() < deadline) {
    absl::StatusOr<std::vector<JobStatusView>> jobs = observer.Status(job);
    if (jobs.ok() && jobs->size() == 1 && jobs->front().joined == joined) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

// Records the Abort one client hears after its assignment.
struct AbortSink {
  absl::Notification fired;
  absl::Mutex mu;
  AbortEvent abort ABSL_GUARDED_BY(mu);

  Handlers MakeHandlers() {
    Handlers h;
    h.on_abort = [this](const AbortEvent& a) {
      absl::MutexLock lock(&mu);
      if (fired.HasBeenNotified()) return;
      abort = a;
      fired.Notify();
    };
    return h;
  }
  AbortEvent Get() {
    absl::MutexLock lock(&mu);
    return abort;
  }
};

TEST(ServiceTest, ThousandAgentsGetAConsistentRankTable) {
  constexpr int kAgents = 1000;
  // No pings: a thousand clients and the server in one process (under ASan, too) are busy
  // enough that a ping's answer can be late, and this test is about the rank table.
  // A thousand clients of one process come from one host: lift the bound per host.
  ServerOptions options = testing::LoopbackServerOptions();
  options.ping_interval = absl::ZeroDuration();
  options.max_connections_per_host = 0;
  std::unique_ptr<Server> server = testing::StartLoopbackServer(options);
  ASSERT_NE(server, nullptr);

  // Node ranks in a shuffled order, so that arrival order and node order differ; worker counts
  // vary so that ranks are real prefix sums.
  std::vector<int64_t> node_of(kAgents);
  std::iota(node_of.begin(), node_of.end(), 0);
  std::shuffle(node_of.begin(), node_of.end(), std::mt19937(42));
  const auto nproc_of_node = [](int64_t node) { return static_cast<int32_t>(1 + node % 3); };

  std::vector<std::unique_ptr<Client>> clients;
  std::vector<JoinSpec> specs;
  for (int i = 0; i < kAgents; ++i) {
    clients.push_back(NewClient(Endpoint(*server)));
    ASSERT_NE(clients.back(), nullptr);
    specs.push_back(
        Spec("big", absl::StrCat("agent-", i), node_of[i], nproc_of_node(node_of[i]), kAgents));
  }
  std::vector<PendingJoin> joins;
  for (int i = 0; i < kAgents; ++i) joins.push_back(PendingJoin(*clients[i], specs[i]));
  std::vector<absl::StatusOr<AssignmentEvent>> results;
  for (int i = 0; i < kAgents; ++i) results.push_back(joins[i].Get());
  std::map<std::string, int> outcomes;
  for (const auto& r : results) ++outcomes[r.ok() ? "OK" : r.status().ToString()];
  if (outcomes.size() != 1) {
    absl::StatusOr<std::vector<JobStatusView>> job = clients[0]->Status("big");
    ADD_FAILURE() << "join outcomes: " << absl::StrJoin(outcomes, "; ", absl::PairFormatter(" x"))
                  << "; the job has " << (job.ok() && !job->empty() ? job->front().joined : -1)
                  << " agents";
  }

  // What the ranks must be: prefix sums of the worker counts in node order.
  std::vector<int32_t> offset_of_node(kAgents + 1, 0);
  for (int64_t n = 0; n < kAgents; ++n)
    offset_of_node[n + 1] = offset_of_node[n] + nproc_of_node(n);
  const int32_t world_size = offset_of_node[kAgents];
  const int master =
      static_cast<int>(std::find(node_of.begin(), node_of.end(), 0) - node_of.begin());

  std::vector<int> rank_seen(world_size, 0);
  for (int i = 0; i < kAgents; ++i) {
    ASSERT_TRUE(results[i].ok()) << "agent " << i << ": " << results[i].status();
    const AssignmentEvent& a = *results[i];
    const int64_t node = node_of[i];
    EXPECT_EQ(a.world_size, world_size) << "agent " << i;
    EXPECT_EQ(a.group_world_size, kAgents) << "agent " << i;
    EXPECT_EQ(a.agents, kAgents) << "agent " << i;
    EXPECT_EQ(a.round, 1) << "agent " << i;
    EXPECT_EQ(a.restart_count, 0) << "agent " << i;
    EXPECT_EQ(a.slot.group_rank, node) << "agent " << i;
    EXPECT_EQ(a.slot.rank_offset, offset_of_node[node]) << "agent " << i;
    EXPECT_EQ(a.slot.local_rank_offset, 0) << "agent " << i;
    EXPECT_EQ(a.slot.local_world_size, nproc_of_node(node)) << "agent " << i;
    EXPECT_EQ(a.master_addr, specs[master].addresses.front()) << "agent " << i;
    EXPECT_EQ(a.master_port, specs[master].master_port) << "agent " << i;
    for (int32_t r = a.slot.rank_offset; r < a.slot.rank_offset + specs[i].agent.nproc; ++r) {
      ASSERT_GE(r, 0);
      ASSERT_LT(r, world_size);
      ++rank_seen[r];
    }
  }
  EXPECT_TRUE(std::all_of(rank_seen.begin(), rank_seen.end(), [](int n) { return n == 1; }))
      << "every rank must belong to exactly one worker";

  for (auto& c : clients) {
    const absl::Status left = c->Leave();
    EXPECT_TRUE(left.ok()) << left;
  }
  clients.clear();
  const absl::Time deadline = absl::Now() + kLongWait;
  while (server->open_streams() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(server->open_streams(), 0u);
}

TEST(ServiceTest, TwoJobsOnOneServerNeverMix) {
  std::unique_ptr<Server> server = StartServer();
  ASSERT_NE(server, nullptr);
  // Both jobs use node ranks 0.. and join interleaved.
  struct Agent {
    std::string job;
    JoinSpec spec;
    AbortSink sink;  // outlives the client, whose handlers call it
    std::unique_ptr<Client> client;
    PendingJoin join;
    absl::StatusOr<AssignmentEvent> result = absl::UnknownError("not joined");
  };
  std::vector<std::unique_ptr<Agent>> agents;
  const auto add = [&](const std::string& job, int64_t node, int32_t nproc, int32_t nnodes) {
    auto a = std::make_unique<Agent>();
    a->job = job;
    a->spec = Spec(job, absl::StrCat(job, "-", node), node, nproc, nnodes);
    a->client = NewClient(Endpoint(*server));
    agents.push_back(std::move(a));
  };
  add("alpha", 2, 2, 3);
  add("beta", 1, 1, 2);
  add("alpha", 0, 2, 3);
  add("beta", 0, 1, 2);
  add("alpha", 1, 2, 3);
  for (auto& a : agents) {
    ASSERT_NE(a->client, nullptr);
    a->join = PendingJoin(*a->client, a->spec, a->sink.MakeHandlers());
  }
  for (auto& a : agents) a->result = a->join.Get();

  for (auto& a : agents) {
    ASSERT_TRUE(a->result.ok()) << a->spec.agent.agent_id << ": " << a->result.status();
    const AssignmentEvent& r = *a->result;
    const int64_t node = a->spec.agent.node_index;
    if (a->job == "alpha") {
      EXPECT_EQ(r.world_size, 6);
      EXPECT_EQ(r.group_world_size, 3);
      EXPECT_EQ(r.slot.rank_offset, 2 * node);
      EXPECT_EQ(r.master_addr, "addr-of-alpha-0");
    } else {
      EXPECT_EQ(r.world_size, 2);
      EXPECT_EQ(r.group_world_size, 2);
      EXPECT_EQ(r.slot.rank_offset, node);
      EXPECT_EQ(r.master_addr, "addr-of-beta-0");
    }
    EXPECT_EQ(r.slot.group_rank, node);
    EXPECT_EQ(r.master_port, 20000);
  }

  // A failure in alpha ends alpha only.
  FailureInfo failure;
  failure.host = "alpha-1";
  failure.rank = 2;
  failure.exit_code = 5;
  ASSERT_TRUE(agents[4]->client->ReportFailure(failure).ok());
  for (auto& a : agents) {
    if (a->job != "alpha") continue;
    ASSERT_TRUE(a->sink.fired.WaitForNotificationWithTimeout(kLongWait)) << a->spec.agent.agent_id;
    EXPECT_EQ(a->sink.Get().exit_code, 5);
  }
  absl::StatusOr<std::vector<JobStatusView>> beta = agents[0]->client->Status("beta");
  ASSERT_TRUE(beta.ok()) << beta.status();
  ASSERT_EQ(beta->size(), 1u);
  EXPECT_EQ(beta->front().state, "running");
  EXPECT_EQ(beta->front().world_size, 2);
  for (auto& a : agents) {
    if (a->job == "beta") {
      EXPECT_FALSE(a->sink.fired.HasBeenNotified());
    }
  }
  for (auto& a : agents) EXPECT_TRUE(a->client->Leave().ok());
}

TEST(ServiceTest, NnodesDisagreementIsRefused) {
  std::unique_ptr<Server> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> first = NewClient(Endpoint(*server));
  std::unique_ptr<Client> second = NewClient(Endpoint(*server));
  ASSERT_TRUE(first && second);
  PendingJoin waiting = PendingJoin(*first, Spec("job", "a", 0, 1, 2));
  ASSERT_TRUE(WaitForJoined(*second, "job", 1));

  absl::StatusOr<AssignmentEvent> refused = second->Join(Spec("job", "b", 1, 1, 3), {});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_TRUE(Contains(refused.status().message(), "--nnodes 3"));
  EXPECT_TRUE(Contains(refused.status().message(), "--nnodes 2"));
  EXPECT_TRUE(Contains(refused.status().message(), "job"));

  // The first agent keeps waiting until it gives up.
  first->Cancel();
  absl::StatusOr<AssignmentEvent> cancelled = waiting.Get();
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled) << cancelled.status();
}

TEST(ServiceTest, DuplicateNodeRankIsRefused) {
  std::unique_ptr<Server> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> first = NewClient(Endpoint(*server));
  std::unique_ptr<Client> second = NewClient(Endpoint(*server));
  ASSERT_TRUE(first && second);
  PendingJoin waiting = PendingJoin(*first, Spec("job", "host-a", 0, 1, 2));
  ASSERT_TRUE(WaitForJoined(*second, "job", 1));

  absl::StatusOr<AssignmentEvent> refused = second->Join(Spec("job", "host-b", 0, 1, 2), {});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_TRUE(Contains(refused.status().message(), "node rank 0"));
  EXPECT_TRUE(Contains(refused.status().message(), "already taken"));
  EXPECT_TRUE(Contains(refused.status().message(), "host-a"));

  first->Cancel();
  EXPECT_EQ(waiting.Get().status().code(), absl::StatusCode::kCancelled);
}

TEST(ServiceTest, NodeRankOutOfRangeIsRefused) {
  std::unique_ptr<Server> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> client = NewClient(Endpoint(*server));
  ASSERT_NE(client, nullptr);
  absl::StatusOr<AssignmentEvent> refused = client->Join(Spec("job", "a", 5, 1, 2), {});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_TRUE(Contains(refused.status().message(), "--node-rank 5"));
}

TEST(ServiceTest, LateJoinerIsRefused) {
  std::unique_ptr<Server> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> a = NewClient(Endpoint(*server));
  std::unique_ptr<Client> b = NewClient(Endpoint(*server));
  std::unique_ptr<Client> late = NewClient(Endpoint(*server));
  ASSERT_TRUE(a && b && late);
  JoinSpec spec_a = Spec("job", "a", -1, 1, 2);
  JoinSpec spec_b = Spec("job", "b", -1, 1, 2);
  PendingJoin join_a = PendingJoin(*a, spec_a);
  PendingJoin join_b = PendingJoin(*b, spec_b);
  ASSERT_TRUE(join_a.Get().ok());
  ASSERT_TRUE(join_b.Get().ok());

  absl::StatusOr<AssignmentEvent> refused = late->Join(Spec("job", "c", -1, 1, 2), {});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_TRUE(Contains(refused.status().message(), "already started"));
  EXPECT_TRUE(Contains(refused.status().message(), "too late"));
  EXPECT_TRUE(Contains(refused.status().message(), "on c"));
  EXPECT_TRUE(a->Leave().ok());
  EXPECT_TRUE(b->Leave().ok());
}

TEST(ServiceTest, ReportedFailureAbortsTheOtherAgents) {
  constexpr int kAgents = 3;
  std::unique_ptr<Server> server = StartServer();
  ASSERT_NE(server, nullptr);
  AbortSink sinks[kAgents];
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<PendingJoin> joins;
  for (int i = 0; i < kAgents; ++i) {
    clients.push_back(NewClient(Endpoint(*server)));
    ASSERT_NE(clients.back(), nullptr);
    joins.push_back(PendingJoin(*clients[i], Spec("job", absl::StrCat("node", i), i, 2, kAgents),
                                sinks[i].MakeHandlers()));
  }
  for (int i = 0; i < kAgents; ++i) ASSERT_TRUE(joins[i].Get().ok());

  FailureInfo failure;
  failure.host = "node1";
  failure.group_rank = 1;
  failure.rank = 3;
  failure.local_rank = 1;
  failure.exit_code = 139;
  failure.signal = 11;
  failure.stderr_tail = "Segmentation fault";
  absl::StatusOr<AbortEvent> first = clients[1]->ReportFailure(failure);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(first->first_failure.has_value());
  EXPECT_EQ(first->first_failure->rank, 3);
  EXPECT_EQ(first->exit_code, 139);

  for (int i : {0, 2}) {
    ASSERT_TRUE(sinks[i].fired.WaitForNotificationWithTimeout(kLongWait)) << "agent " << i;
    const AbortEvent abort = sinks[i].Get();
    EXPECT_EQ(abort.exit_code, 139);
    ASSERT_TRUE(abort.first_failure.has_value());
    EXPECT_EQ(abort.first_failure->host, "node1");
    EXPECT_EQ(abort.first_failure->rank, 3);
    EXPECT_EQ(abort.first_failure->local_rank, 1);
    EXPECT_EQ(abort.first_failure->signal, 11);
    EXPECT_EQ(abort.first_failure->stderr_tail, "Segmentation fault");
    EXPECT_TRUE(Contains(abort.reason, "rank 3"));
    EXPECT_TRUE(Contains(abort.reason, "node1"));
  }

  // A later failure elsewhere learns the job's first one.
  FailureInfo second = failure;
  second.host = "node2";
  second.rank = 4;
  second.exit_code = 143;
  absl::StatusOr<AbortEvent> answer = clients[2]->ReportFailure(second);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_TRUE(answer->first_failure.has_value());
  EXPECT_EQ(answer->first_failure->host, "node1");
  EXPECT_EQ(answer->exit_code, 139);
  for (auto& c : clients) EXPECT_TRUE(c->Leave().ok());
}

TEST(ServiceTest, MissingServerIsUnavailableAfterTheJoinTimeout) {
  // A bound but not listening socket: connections to it are refused, and no one else can take
  // the port while the test runs.
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string endpoint = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));

  std::unique_ptr<Client> client = NewClient(endpoint, absl::Seconds(1));
  ASSERT_NE(client, nullptr);
  const absl::Time start = absl::Now();
  absl::StatusOr<AssignmentEvent> result = client->Join(Spec("job", "a", 0, 1, 1), {});
  const absl::Duration took = absl::Now() - start;
  close(fd);

  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
  EXPECT_TRUE(Contains(result.status().message(), endpoint));
  // The client stops retrying once its next backoff delay would pass the deadline, so it may
  // give up before the full second: the earliest is after four delays, at least 375ms.
  EXPECT_GE(took, absl::Milliseconds(300)) << "it should retry, not give up at once";
  EXPECT_LE(took, absl::Seconds(3)) << "it should give up at about the join timeout";
}

TEST(ServiceTest, StatusShowsTheJob) {
  std::unique_ptr<Server> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> a = NewClient(Endpoint(*server));
  std::unique_ptr<Client> b = NewClient(Endpoint(*server));
  ASSERT_TRUE(a && b);

  PendingJoin join_a = PendingJoin(*a, Spec("shown", "host-a", 1, 4, 2));
  ASSERT_TRUE(WaitForJoined(*b, "shown", 1));
  absl::StatusOr<std::vector<JobStatusView>> filling = b->Status("shown");
  ASSERT_TRUE(filling.ok()) << filling.status();
  ASSERT_EQ(filling->size(), 1u);
  EXPECT_EQ(filling->front().job_id, "shown");
  EXPECT_EQ(filling->front().state, "filling");
  EXPECT_EQ(filling->front().joined, 1);
  EXPECT_EQ(filling->front().min_agents, 2);
  EXPECT_EQ(filling->front().max_agents, 2);
  ASSERT_EQ(filling->front().agents.size(), 1u);
  EXPECT_EQ(filling->front().agents[0].host, "host-a");
  EXPECT_EQ(filling->front().agents[0].node_index, 1);
  EXPECT_EQ(filling->front().agents[0].nproc, 4);

  PendingJoin join_b = PendingJoin(*b, Spec("shown", "host-b", 0, 2, 2));
  ASSERT_TRUE(join_a.Get().ok());
  ASSERT_TRUE(join_b.Get().ok());
  absl::StatusOr<std::vector<JobStatusView>> running = b->Status("");
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->size(), 1u);
  EXPECT_EQ(running->front().state, "running");
  EXPECT_EQ(running->front().joined, 2);
  EXPECT_EQ(running->front().world_size, 6);
  ASSERT_EQ(running->front().agents.size(), 2u);
  for (const AgentStatusView& agent : running->front().agents) {
    EXPECT_EQ(agent.rank_offset, agent.host == "host-b" ? 0 : 2) << agent.host;
  }

  absl::StatusOr<std::vector<JobStatusView>> other = b->Status("no-such-job");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(other->empty());
  EXPECT_TRUE(a->Leave().ok());
  EXPECT_TRUE(b->Leave().ok());
}

}  // namespace
}  // namespace rdzv
