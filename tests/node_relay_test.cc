// NodeRelay (client/agent/node_relay.h) between librdzv clients and rdzvd's service in this
// process: each "node" hosts a relay on a UNIX socket, its agents join through it with ordinary
// rdzv::Client calls, and the server sees one group stream per node. What the agents see: their
// ranks, a failure or a lost peer anywhere in the job, their departure, and the server's end.
#include "client/agent/node_relay.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "common/core/file_names.h"
#include "common/process_env.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/testing/tcp_proxy.h"
#include "tests/testing/wire.h"

namespace rdzv {
namespace {

// What any one wait of a test may take: long enough for a loaded machine, short enough that a
// failing test ends.
constexpr absl::Duration kWait = absl::Seconds(15);

// Where this process's relays put their sockets now (a test may set TMPDIR).
std::string TempDir() { return TempDirectory(ProcessEnv()); }

// What a client's handlers saw, written on gRPC threads.
struct Seen {
  absl::Mutex mu;
  std::optional<AbortEvent> abort ABSL_GUARDED_BY(mu);
  std::optional<absl::Status> lost ABSL_GUARDED_BY(mu);

  bool Aborted() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return abort.has_value(); }
  bool Lost() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return lost.has_value(); }
};

// One task of a node: its client, what it saw, and its Join running on a thread of its own.
struct Task {
  std::string host;
  std::unique_ptr<Client> client;
  std::shared_ptr<Seen> seen = std::make_shared<Seen>();
  // Declared last: it refers to the client, so it goes (waiting for the Join) before it.
  std::future<absl::StatusOr<AssignmentEvent>> joined;

  absl::StatusOr<AssignmentEvent> Assignment() {
    if (joined.wait_for(absl::ToChronoMilliseconds(kWait)) != std::future_status::ready) {
      return absl::DeadlineExceededError(
          absl::StrCat("Join did not return within ", absl::FormatDuration(kWait)));
    }
    return joined.get();
  }
  std::optional<AbortEvent> AwaitAbort() {
    absl::MutexLock lock(&seen->mu);
    seen->mu.AwaitWithTimeout(absl::Condition(seen.get(), &Seen::Aborted), kWait);
    return seen->abort;
  }
  std::optional<absl::Status> AwaitLost() {
    absl::MutexLock lock(&seen->mu);
    seen->mu.AwaitWithTimeout(absl::Condition(seen.get(), &Seen::Lost), kWait);
    return seen->lost;
  }
};

class NodeRelayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = testing::StartLoopbackServer(testing::LoopbackServerOptions());
    ASSERT_NE(server_, nullptr);
    // Sockets of runs side by side, and of the cases of one run, never meet.
    job_ = absl::StrCat(::testing::UnitTest::GetInstance()->current_test_info()->name(), "-",
                        getpid());
  }

  // Clients first (their streams end), then the relays, then the server.
  void TearDown() override {
    tasks_.clear();
    relays_.clear();
    if (server_ != nullptr) server_->Shutdown();
  }

  std::string Socket(const std::string& node) const {
    return RelaySocketPath(TempDir(), getuid(), job_, node);
  }

  NodeRelayOptions RelayOptions(const std::string& node, int expected) const {
    NodeRelayOptions options;
    options.socket_path = Socket(node);
    options.job_id = job_;
    options.expected = expected;
    options.upstream.endpoint = absl::StrCat("127.0.0.1:", server_->port());
    options.upstream.auth.mode = ClientAuth::Mode::kNone;
    options.upstream.join_timeout = kWait;
    options.upstream.rpc_timeout = absl::Seconds(10);
    return options;
  }

  NodeRelay* StartRelay(NodeRelayOptions options) {
    absl::StatusOr<std::unique_ptr<NodeRelay>> relay = NodeRelay::Start(std::move(options));
    EXPECT_TRUE(relay.ok()) << relay.status();
    if (!relay.ok()) return nullptr;
    relays_.push_back(std::move(*relay));
    return relays_.back().get();
  }

  // Task `order` of the job joins through node `node_index`'s relay, as agent a<order> on host
  // n<node_index>, one worker, in a job of exactly `agents` agents.
  void StartTask(int node_index, int order, int agents) {
    auto task = std::make_unique<Task>();
    task->host = absl::StrCat("n", node_index);
    ClientOptions options;
    options.endpoint = absl::StrCat("unix:", Socket(task->host));
    options.auth.mode = ClientAuth::Mode::kNone;
    options.join_timeout = kWait;
    options.rpc_timeout = absl::Seconds(10);
    options.keepalive_time = keepalive_;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    task->client = std::move(*client);
    tasks_.push_back(std::move(task));
    JoinAgain(order, node_index, agents, 0);
  }

  // Task `order` joins again, as its agent does for round `restart_count` of a restart.
  void JoinAgain(int order, int node_index, int agents, int restart_count) {
    Task& task = *tasks_[order];
    JoinSpec spec;
    spec.job_id = job_;
    spec.agent = {.agent_id = absl::StrCat("a", order),
                  .host = task.host,
                  .node_index = node_index,
                  .order = order,
                  .nproc = 1};
    spec.min_agents = spec.max_agents = agents;
    spec.restart_count = restart_count;
    spec.addresses = {"127.0.0.1"};
    spec.master_port = 29500;
    Handlers handlers;
    handlers.on_abort = [seen = task.seen](const AbortEvent& abort) {
      absl::MutexLock lock(&seen->mu);
      if (!seen->abort) seen->abort = abort;
    };
    handlers.on_lost = [seen = task.seen](const absl::Status& status) {
      absl::MutexLock lock(&seen->mu);
      if (!seen->lost) seen->lost = status;
    };
    task.joined = std::async(std::launch::async, [client = task.client.get(), spec, handlers] {
      return client->Join(spec, handlers);
    });
  }

  // `nodes` nodes of `per_node` tasks each, every node with its relay; all assigned.
  void RunJob(int nodes, int per_node) {
    for (int n = 0; n < nodes; ++n) {
      ASSERT_NE(StartRelay(RelayOptions(absl::StrCat("n", n), per_node)), nullptr);
    }
    for (int n = 0; n < nodes; ++n) {
      for (int i = 0; i < per_node; ++i) StartTask(n, n * per_node + i, nodes * per_node);
    }
    for (auto& task : tasks_) {
      absl::StatusOr<AssignmentEvent> a = task->Assignment();
      ASSERT_TRUE(a.ok()) << task->host << ": " << a.status();
      assignments_.push_back(*a);
    }
  }

  // Waits until the server holds `n` streams.
  bool AwaitOpenStreams(size_t n) {
    const absl::Time deadline = absl::Now() + kWait;
    while (server_->open_streams() != n && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    return server_->open_streams() == n;
  }

  std::string job_;
  std::unique_ptr<Server> server_;
  std::vector<std::unique_ptr<NodeRelay>> relays_;
  std::vector<std::unique_ptr<Task>> tasks_;
  std::vector<AssignmentEvent> assignments_;
  // How often each task's client pings its quiet stream.
  absl::Duration keepalive_ = ClientOptions().keepalive_time;
};

TEST_F(NodeRelayTest, EachNodeIsOneStreamAndEveryTaskGetsItsRank) {
  ASSERT_NO_FATAL_FAILURE(RunJob(2, 3));
  for (int order = 0; order < 6; ++order) {
    SCOPED_TRACE(absl::StrCat("task ", order));
    const AssignmentEvent& a = assignments_[order];
    EXPECT_EQ(a.slot.rank_offset, order);
    EXPECT_EQ(a.slot.local_rank_offset, order % 3);
    EXPECT_EQ(a.slot.local_world_size, 3);
    EXPECT_EQ(a.slot.group_rank, order / 3);
    EXPECT_EQ(a.world_size, 6);
  }
  EXPECT_EQ(server_->open_streams(), 2u);
  for (const auto& relay : relays_) EXPECT_EQ(relay->upstream_streams(), 1);
}

// A relay whose first server does not answer goes on to the next of its list: its tasks hear
// which one it reached, for their messages and their workers' RDZV_ENDPOINT.
TEST_F(NodeRelayTest, TasksHearWhichServerOfTheListTheRelayReached) {
  NodeRelayOptions options = RelayOptions("n0", 2);
  const std::string backup = options.upstream.endpoint;
  // Nothing listens on the first: a port bound but never listened on.
  const int unused = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(unused, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  socklen_t length = sizeof(address);
  getsockname(unused, reinterpret_cast<sockaddr*>(&address), &length);
  options.upstream.endpoint = absl::StrCat("127.0.0.1:", ntohs(address.sin_port));
  options.upstream.alternate_endpoints = {backup};
  ASSERT_NE(StartRelay(options), nullptr);
  StartTask(0, 0, 2);
  StartTask(0, 1, 2);
  for (auto& task : tasks_) {
    absl::StatusOr<AssignmentEvent> a = task->Assignment();
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(task->client->relayed_server(), backup);
    EXPECT_NE(task->client->endpoint(), backup);  // the relay's socket
  }
  close(unused);
}

TEST_F(NodeRelayTest, AWorkerFailureAbortsEveryOtherTask) {
  ASSERT_NO_FATAL_FAILURE(RunJob(2, 3));
  FailureInfo failure;
  failure.cause = AbortCause::kWorkerFailed;
  failure.host = "n1";
  failure.group_rank = 1;
  failure.rank = 4;
  failure.local_rank = 1;
  failure.exit_code = 3;
  absl::StatusOr<AbortEvent> first = tasks_[4]->client->ReportFailure(failure);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->cause, AbortCause::kWorkerFailed);
  for (int order = 0; order < 6; ++order) {
    if (order == 4) continue;
    SCOPED_TRACE(absl::StrCat("task ", order));
    std::optional<AbortEvent> abort = tasks_[order]->AwaitAbort();
    ASSERT_TRUE(abort.has_value()) << "no abort within " << kWait;
    EXPECT_EQ(abort->cause, AbortCause::kWorkerFailed);
    EXPECT_EQ(abort->exit_code, 3);
    ASSERT_TRUE(abort->first_failure.has_value());
    EXPECT_EQ(abort->first_failure->rank, 4);
    EXPECT_EQ(abort->first_failure->host, "n1");
  }
}

TEST_F(NodeRelayTest, ATaskThatVanishesIsReportedLost) {
  ASSERT_NO_FATAL_FAILURE(RunJob(2, 3));
  // Its process ends without a word: its stream to the relay drops.
  tasks_[4]->client.reset();
  for (int order = 0; order < 6; ++order) {
    if (order == 4) continue;
    SCOPED_TRACE(absl::StrCat("task ", order));
    std::optional<AbortEvent> abort = tasks_[order]->AwaitAbort();
    ASSERT_TRUE(abort.has_value()) << "no abort within " << kWait;
    EXPECT_EQ(abort->cause, AbortCause::kAgentLost);
    EXPECT_TRUE(absl::StrContains(abort->reason, "n1")) << abort->reason;
  }
}

TEST_F(NodeRelayTest, TasksThatLeaveCloseTheNodesStream) {
  ASSERT_NO_FATAL_FAILURE(RunJob(2, 3));
  for (auto& task : tasks_) EXPECT_TRUE(task->client->Leave().ok()) << task->host;
  EXPECT_TRUE(AwaitOpenStreams(0)) << server_->open_streams() << " streams still open";
  for (const auto& relay : relays_) EXPECT_TRUE(relay->WaitIdle(absl::Seconds(5)));
  for (auto& task : tasks_) {
    absl::MutexLock lock(&task->seen->mu);
    EXPECT_FALSE(task->seen->abort.has_value()) << task->seen->abort->reason;
    EXPECT_FALSE(task->seen->lost.has_value()) << *task->seen->lost;
  }
}

// A job runs for hours with nothing on its streams but the clients' pings, which the relay must
// take as rdzvd does.
TEST_F(NodeRelayTest, AQuietJobOutlivesItsTasksPings) {
  keepalive_ = absl::Milliseconds(500);
  ASSERT_NO_FATAL_FAILURE(RunJob(2, 3));
  absl::SleepFor(absl::Seconds(5));
  for (auto& task : tasks_) {
    absl::MutexLock lock(&task->seen->mu);
    EXPECT_FALSE(task->seen->lost.has_value()) << task->host << ": " << *task->seen->lost;
    EXPECT_FALSE(task->seen->abort.has_value()) << task->host << ": " << task->seen->abort->reason;
  }
  EXPECT_EQ(server_->open_streams(), 2u);
}

TEST_F(NodeRelayTest, EveryTaskHearsThatTheServerIsLost) {
  ASSERT_NO_FATAL_FAILURE(RunJob(2, 3));
  server_->Shutdown();
  for (auto& task : tasks_) {
    std::optional<absl::Status> lost = task->AwaitLost();
    ASSERT_TRUE(lost.has_value()) << task->host << ": on_lost did not fire within " << kWait;
    EXPECT_TRUE(absl::IsUnavailable(*lost)) << *lost;
  }
}

// In a $TMPDIR of its own, so that no other relay shares the directory it opens up.
TEST_F(NodeRelayTest, ARelayRefusesADirectoryOthersMayEnter) {
  char base[] = "/tmp/relay-dir-test-XXXXXX";
  ASSERT_NE(mkdtemp(base), nullptr);
  ASSERT_EQ(setenv("TMPDIR", base, 1), 0);
  absl::StatusOr<std::string> dir = RelayDirectory(TempDir(), getuid());
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, absl::StrCat(base, "/rdzv-", getuid()));
  ASSERT_EQ(chmod(dir->c_str(), 0755), 0);
  absl::StatusOr<std::unique_ptr<NodeRelay>> relay = NodeRelay::Start(RelayOptions("n0", 1));
  const bool listening = RelayListening(Socket("n0"));
  unsetenv("TMPDIR");
  rmdir(dir->c_str());
  rmdir(base);
  ASSERT_FALSE(relay.ok());
  EXPECT_TRUE(absl::StrContains(relay.status().message(), *dir)) << relay.status();
  EXPECT_FALSE(listening);
}

// A relay killed with SIGKILL leaves its socket behind. The next relay this user starts on the
// node removes such sockets, and nothing else: not a young one (a relay may be starting), not one
// a relay listens on, not a file that is no socket. In a $TMPDIR of its own.
TEST_F(NodeRelayTest, ARelayRemovesTheSocketsKilledRelaysLeft) {
  char base[] = "/tmp/relay-sweep-test-XXXXXX";
  ASSERT_NE(mkdtemp(base), nullptr);
  ASSERT_EQ(setenv("TMPDIR", base, 1), 0);
  struct Restore {
    std::string base;
    ~Restore() {
      unsetenv("TMPDIR");
      std::error_code ec;
      std::filesystem::remove_all(base, ec);
    }
  } restore{base};
  ASSERT_TRUE(RelayDirectory(TempDir(), getuid()).ok());
  const auto age = [](const std::string& path, absl::Duration by) {
    const timespec when = absl::ToTimespec(absl::Now() - by);
    const timespec times[2] = {when, when};
    return utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW) == 0;
  };
  // What a killed relay leaves: a socket bound, then nothing listening.
  const auto leave_socket = [&](const std::string& path, absl::Duration by) {
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    return bound && age(path, by);
  };
  const std::string killed = RelaySocketPath(TempDir(), getuid(), "killed-job", "n0");
  const std::string young = RelaySocketPath(TempDir(), getuid(), "young-job", "n0");
  const std::string not_a_socket = RelaySocketPath(TempDir(), getuid(), "file-job", "n0");
  ASSERT_TRUE(leave_socket(killed, absl::Minutes(2)));
  ASSERT_TRUE(leave_socket(young, absl::Seconds(5)));
  std::ofstream(not_a_socket) << "x";
  ASSERT_TRUE(age(not_a_socket, absl::Minutes(2)));
  NodeRelayOptions other = RelayOptions("n0", 1);
  other.job_id = "live-job";
  other.socket_path = RelaySocketPath(TempDir(), getuid(), "live-job", "n0");
  ASSERT_NE(StartRelay(other), nullptr);
  ASSERT_TRUE(age(other.socket_path, absl::Minutes(2)));
  EXPECT_FALSE(std::filesystem::exists(killed)) << "the first relay already removed it";
  ASSERT_TRUE(leave_socket(killed, absl::Minutes(2)));

  ASSERT_NE(StartRelay(RelayOptions("n0", 1)), nullptr);
  EXPECT_FALSE(std::filesystem::exists(killed));
  EXPECT_TRUE(std::filesystem::exists(young));
  EXPECT_TRUE(std::filesystem::exists(not_a_socket));
  EXPECT_TRUE(RelayListening(other.socket_path));
  EXPECT_TRUE(RelayListening(Socket("n0")));
  relays_.clear();
}

TEST_F(NodeRelayTest, RelayListeningOnlyWhileARelayRuns) {
  EXPECT_FALSE(RelayListening(Socket("n0")));
  NodeRelay* relay = StartRelay(RelayOptions("n0", 1));
  ASSERT_NE(relay, nullptr);
  EXPECT_TRUE(RelayListening(Socket("n0")));
  EXPECT_FALSE(RelayListening(Socket("n1")));
  relays_.clear();
  EXPECT_FALSE(RelayListening(Socket("n0")));
}

TEST_F(NodeRelayTest, JoinsGoUpAfterTheGatherDelayWhenTasksAreMissing) {
  NodeRelayOptions options = RelayOptions("n0", 3);
  options.gather = absl::Milliseconds(200);
  ASSERT_NE(StartRelay(options), nullptr);
  StartTask(0, 0, 2);
  StartTask(0, 1, 2);
  for (int order = 0; order < 2; ++order) {
    absl::StatusOr<AssignmentEvent> a = tasks_[order]->Assignment();
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->slot.rank_offset, order);
    EXPECT_EQ(a->world_size, 2);
  }
  EXPECT_EQ(relays_[0]->upstream_streams(), 1);
  EXPECT_EQ(server_->open_streams(), 1u);
}

// In a restart the node's agents come back as each has stopped its workers, which may take
// seconds; the relay waits for them all, so the new round is again one stream per node.
TEST_F(NodeRelayTest, ARestartsJoinsGoUpTogetherThoughOneTaskStopsLate) {
  NodeRelayOptions options = RelayOptions("n0", 2);
  options.gather = absl::Milliseconds(100);
  options.rejoin_gather = kWait;
  ASSERT_NE(StartRelay(options), nullptr);
  StartTask(0, 0, 2);
  StartTask(0, 1, 2);
  for (int order = 0; order < 2; ++order) ASSERT_TRUE(tasks_[order]->Assignment().ok());
  ASSERT_EQ(relays_[0]->upstream_streams(), 1);
  FailureInfo failure;
  failure.cause = AbortCause::kWorkerFailed;
  failure.host = "n0";
  failure.rank = 1;
  failure.local_rank = 1;
  failure.exit_code = 3;
  ASSERT_TRUE(tasks_[1]->client->ReportFailure(failure).ok());
  ASSERT_TRUE(tasks_[0]->AwaitAbort().has_value());
  JoinAgain(0, 0, 2, 1);
  absl::SleepFor(absl::Seconds(1));  // ten gathers of a first round
  JoinAgain(1, 0, 2, 1);
  for (int order = 0; order < 2; ++order) {
    absl::StatusOr<AssignmentEvent> a = tasks_[order]->Assignment();
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->slot.rank_offset, order);
    EXPECT_EQ(a->restart_count, 1);
  }
  EXPECT_EQ(relays_[0]->upstream_streams(), 2);
  EXPECT_TRUE(AwaitOpenStreams(1)) << server_->open_streams() << " streams open";
}

// Raw joins through a node's relay socket, each stream on a channel of its own.
class RawRelayJoins {
 public:
  explicit RawRelayJoins(std::string socket) : socket_(std::move(socket)) {}
  ~RawRelayJoins() {
    for (testing::Joined& j : joins_) {
      if (j.reader == nullptr) continue;
      j.context->TryCancel();
      testing::End(j);
    }
  }
  // How a stream ends; the stream is done with then.
  grpc::Status End(testing::Joined& j) {
    const grpc::Status status = testing::End(j);
    j.reader.reset();
    return status;
  }
  testing::Joined& Open(const v1::JoinRequest& request) {
    testing::Joined j;
    j.stub = v1::Rendezvous::NewStub(
        grpc::CreateChannel(absl::StrCat("unix:", socket_), grpc::InsecureChannelCredentials()));
    j.context->set_deadline(std::chrono::system_clock::now() + testing::kWireDeadline);
    j.reader = j.stub->Join(j.context.get(), request);
    joins_.push_back(std::move(j));
    return joins_.back();
  }

 private:
  std::string socket_;
  std::deque<testing::Joined> joins_;
};

TEST_F(NodeRelayTest, AnOversizedJoinIsRefusedAloneAndTheOthersGetTheirRanks) {
  // Three expected: the bad join would go up with the two good ones, and the server would
  // refuse the whole batch.
  NodeRelayOptions options = RelayOptions("n0", 3);
  options.gather = absl::Seconds(2);
  ASSERT_NE(StartRelay(options), nullptr);
  RawRelayJoins raw(Socket("n0"));
  testing::Joined& bad = raw.Open(testing::JoinOf(job_, std::string(300, 'x'), 2));
  bad.reader->WaitForInitialMetadata();
  StartTask(0, 0, 2);
  StartTask(0, 1, 2);
  for (int order = 0; order < 2; ++order) {
    absl::StatusOr<AssignmentEvent> a = tasks_[order]->Assignment();
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->world_size, 2);
  }
  const grpc::Status refused = raw.End(bad);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << refused.error_message();
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "agent id")) << refused.error_message();
}

TEST_F(NodeRelayTest, ARelayHoldsAFewMoreJoinsThanItsTasksAndRefusesTheRest) {
  // Two tasks: room for each twice, and 16 more.
  ASSERT_NE(StartRelay(RelayOptions("n0", 2)), nullptr);
  RawRelayJoins raw(Socket("n0"));
  std::vector<testing::Joined*> held;
  for (int i = 0; i < 20; ++i) {
    held.push_back(&raw.Open(testing::JoinOf(job_, absl::StrCat("a", i), 100)));
  }
  // Each of them in the relay's hands: it answers a join's headers once it has taken it.
  for (testing::Joined* j : held) j->reader->WaitForInitialMetadata();
  testing::Joined& extra = raw.Open(testing::JoinOf(job_, "a20", 100));
  const grpc::Status refused = raw.End(extra);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "start each agent once"))
      << refused.error_message();
}

TEST_F(NodeRelayTest, MoreJoinsThanOneGroupTakesGoUpInSeveral) {
  constexpr int kAgents = 520;
  NodeRelayOptions options = RelayOptions("n0", kAgents);
  options.gather = kWait;
  ASSERT_NE(StartRelay(options), nullptr);
  RawRelayJoins raw(Socket("n0"));
  std::vector<testing::Joined*> joins;
  for (int i = 0; i < kAgents; ++i) {
    joins.push_back(&raw.Open(testing::JoinOf(job_, absl::StrCat("a", i), kAgents, i)));
  }
  for (testing::Joined* j : joins) {
    v1::JoinEvent event;
    ASSERT_TRUE(testing::ReadUntil(*j, v1::JoinEvent::kAssignment, &event));
    EXPECT_EQ(event.assignment().world_size(), kAgents);
  }
  EXPECT_EQ(relays_[0]->upstream_streams(), 2);
  EXPECT_EQ(server_->open_streams(), 2u);
}

// Over TCP, one connection opens at most as many calls at once as one on rdzvd: a caller cannot
// make a group's relay hold streams without bound through a single connection.
TEST_F(NodeRelayTest, ATcpRelayLetsOneConnectionOpenAFewCallsAtOnce) {
  // Seventeen expected: once the relay holds that many joins, they go up to the server.
  NodeRelayOptions options = RelayOptions("n0", 17);
  options.listen = {"127.0.0.1:0"};
  options.first_node = 0;
  options.last_node = 100;
  options.gather = kWait;
  options.callers.mode = AuthMode::kNone;
  ASSERT_NE(StartRelay(options), nullptr);
  // Each stub on a connection of its own (gRPC would share one between like channels).
  const auto connect = [&] {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return v1::Rendezvous::NewStub(grpc::CreateCustomChannel(
        relays_[0]->endpoint(), grpc::InsecureChannelCredentials(), args));
  };
  auto one = connect();
  auto another = connect();
  std::deque<testing::Joined> joins;
  const auto open = [&](int i, v1::Rendezvous::Stub* on) -> testing::Joined& {
    testing::Joined& j = joins.emplace_back();
    j.context->set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    j.reader = on->Join(j.context.get(), testing::JoinOf(job_, absl::StrCat("a", i), 100, i));
    return j;
  };
  for (int i = 0; i < 16; ++i) open(i, one.get()).reader->WaitForInitialMetadata();
  // The 17th on the same connection waits on the caller's side for a free stream (the blocking
  // call does not return until it has one, or its deadline passes): the relay does not see it.
  testing::Joined over;
  over.context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(3)));
  std::future<void> opened = std::async(std::launch::async, [&] {
    over.reader = one->Join(over.context.get(), testing::JoinOf(job_, "a16", 100, 16));
  });
  EXPECT_EQ(opened.wait_for(std::chrono::seconds(1)), std::future_status::timeout);
  EXPECT_EQ(server_->open_streams(), 0u);
  opened.wait();
  EXPECT_EQ(testing::End(over).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // Another connection's is taken, and with it the relay holds the 17 joins it sends up.
  open(17, another.get()).reader->WaitForInitialMetadata();
  EXPECT_TRUE(AwaitOpenStreams(1)) << server_->open_streams() << " streams open";
  for (testing::Joined& j : joins) {
    j.context->TryCancel();
    testing::End(j);
  }
}

// A server that takes connections and never answers (a frozen rdzvd): the relay's join waits for
// it until the join timeout, unless the agents it joins for are gone.
TEST_F(NodeRelayTest, ARelayStopsWaitingForAFrozenServerOnceItsAgentsAreGone) {
  testing::SilentListener frozen;
  ASSERT_NE(frozen.port(), 0);
  NodeRelayOptions options = RelayOptions("n0", 1);
  options.upstream.endpoint = absl::StrCat("127.0.0.1:", frozen.port());
  options.upstream.join_timeout = absl::Minutes(1);
  ASSERT_NE(StartRelay(options), nullptr);
  {
    RawRelayJoins raw(Socket("n0"));
    raw.Open(testing::JoinOf(job_, "a0", 1)).reader->WaitForInitialMetadata();
    absl::SleepFor(absl::Milliseconds(300));  // its join is on its way up
    EXPECT_FALSE(relays_[0]->WaitIdle(absl::Milliseconds(100)));
  }  // the agent goes
  EXPECT_TRUE(relays_[0]->WaitIdle(absl::Seconds(5)));
  relays_.clear();
}

}  // namespace
}  // namespace rdzv
