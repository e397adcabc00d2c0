// MetricsHttpServer over real loopback TCP connections: what a scraper gets, how binding
// problems are reported, that its resources stay bounded and that it stops promptly.
#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/process_metrics.h"

namespace rdzv {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

int64_t Threads() {
  const absl::StatusOr<ProcessStats> stats = ReadProcessStats();
  EXPECT_TRUE(stats.ok()) << stats.status();
  return stats.ok() ? stats->threads : 0;
}

// A TCP connection to the server from `source` (a loopback address), or -1.
int ConnectFrom(const char* source, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source, &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// A TCP connection to the server that sends nothing.
int ConnectIdle(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  return fd;
}

TEST(MetricsHttpTest, ServesMetricsAndHealth) {
  Metrics metrics("9.9.9");
  metrics.joins().Inc(3);
  metrics.SetAgentsAttachedSource([] { return int64_t{12}; });
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1:0", &metrics);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);

  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  httplib::Result response = client.Get("/metrics");
  ASSERT_TRUE(response) << httplib::to_string(response.error());
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_THAT(response->body, HasSubstr("\n# TYPE rdzv_joins_total counter\nrdzv_joins_total 3\n"));
  EXPECT_THAT(response->body, HasSubstr("\nrdzv_agents_attached 12\n"));
  EXPECT_THAT(response->body, HasSubstr("\nrdzv_build_info{version=\"9.9.9\"} 1\n"));
  EXPECT_THAT(response->body, HasSubstr("\nprocess_resident_memory_bytes "));

  // Every scrape renders afresh.
  metrics.joins().Inc();
  response = client.Get("/metrics");
  ASSERT_TRUE(response) << httplib::to_string(response.error());
  EXPECT_THAT(response->body, HasSubstr("\nrdzv_joins_total 4\n"));

  response = client.Get("/healthz");
  ASSERT_TRUE(response) << httplib::to_string(response.error());
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, "ok\n");

  response = client.Get("/");
  ASSERT_TRUE(response) << httplib::to_string(response.error());
  EXPECT_EQ(response->status, 404);
  EXPECT_THAT(response->body, HasSubstr("/metrics"));

  response = client.Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(response) << httplib::to_string(response.error());
  EXPECT_NE(response->status, 200);
}

TEST(MetricsHttpTest, ServesOnIpv6Loopback) {
  Metrics metrics("1");
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("[::1]:0", &metrics);
  if (!server.ok() && absl::StrContains(server.status().message(), "Cannot assign")) {
    GTEST_SKIP() << "this machine has no IPv6 loopback: " << server.status();
  }
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client client("::1", (*server)->port());
  httplib::Result response = client.Get("/healthz");
  ASSERT_TRUE(response) << httplib::to_string(response.error());
  EXPECT_EQ(response->status, 200);
}

TEST(MetricsHttpTest, ATakenPortIsAOneLineError) {
  Metrics metrics("1");
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> first =
      MetricsHttpServer::Start("127.0.0.1:0", &metrics);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = absl::StrCat("127.0.0.1:", (*first)->port());
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> second =
      MetricsHttpServer::Start(taken, &metrics);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(second.status().message(),
            absl::StrCat("cannot serve metrics on ", taken,
                         " (Address already in use); choose another --metrics-listen address"));
}

TEST(MetricsHttpTest, BadAddressesAreOneLineErrors) {
  Metrics metrics("1");
  struct Row {
    const char* listen;
    absl::StatusCode code;
    const char* says;
  };
  for (const Row& row : std::vector<Row>{
           {"127.0.0.1", absl::StatusCode::kInvalidArgument, "expected HOST:PORT"},
           {"", absl::StatusCode::kInvalidArgument, "expected HOST:PORT"},
           {"127.0.0.1:99999", absl::StatusCode::kInvalidArgument, "expected HOST:PORT"},
           {"127.0.0.1:http", absl::StatusCode::kInvalidArgument, "expected HOST:PORT"},
           {"::1:0", absl::StatusCode::kInvalidArgument, "expected HOST:PORT"},
           {"no-such-host.invalid:0", absl::StatusCode::kFailedPrecondition,
            "no-such-host.invalid"},
           // An address of no interface of this machine.
           {"192.0.2.1:0", absl::StatusCode::kFailedPrecondition, "Cannot assign requested"}}) {
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
        MetricsHttpServer::Start(row.listen, &metrics);
    ASSERT_FALSE(server.ok()) << row.listen;
    EXPECT_EQ(server.status().code(), row.code) << row.listen << ": " << server.status();
    EXPECT_THAT(server.status().message(), HasSubstr(row.says)) << row.listen;
    EXPECT_THAT(server.status().message(), HasSubstr(row.listen)) << row.listen;
    EXPECT_THAT(server.status().message(), Not(HasSubstr("\n"))) << row.listen;
  }
}

TEST(MetricsHttpTest, UsesAFewThreadsHoweverManyClients) {
  Metrics metrics("1");
  const int64_t threads_before = Threads();
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1:0", &metrics);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();

  constexpr int kClients = 16;
  std::vector<int> statuses(kClients, 0);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      httplib::Client client("127.0.0.1", port);
      client.set_read_timeout(10);
      for (int j = 0; j < 5; ++j) {
        httplib::Result response = client.Get("/metrics");
        statuses[i] = response ? response->status : -1;
        if (statuses[i] != 200) return;
      }
    });
  }
  for (std::thread& client : clients) client.join();
  for (int i = 0; i < kClients; ++i) EXPECT_EQ(statuses[i], 200) << "client " << i;
  EXPECT_EQ(Threads() - threads_before, 6)
      << "the listener, four workers and the one where silent connections wait";
}

TEST(MetricsHttpTest, OversizedRequestsAreRefusedAndServingGoesOn) {
  Metrics metrics("1");
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1:0", &metrics);
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client client("127.0.0.1", (*server)->port());
  client.set_read_timeout(5);

  httplib::Result response =
      client.Get("/metrics", httplib::Headers{{"X-Big", std::string(64 * 1024, 'a')}});
  EXPECT_TRUE(!response || response->status >= 400)
      << "a 64 KiB header was served: " << response->status;

  response = client.Get(absl::StrCat("/metrics?", std::string(64 * 1024, 'q')));
  EXPECT_TRUE(!response || response->status >= 400)
      << "a 64 KiB URI was served: " << response->status;

  // A body is read (up to the limit) only for methods that carry one; a GET's is never read.
  response = client.Post("/metrics", std::string(64 * 1024, 'b'), "text/plain");
  EXPECT_TRUE(!response || response->status == 413) << "a 64 KiB body got " << response->status;

  response = client.Get("/metrics");
  ASSERT_TRUE(response) << httplib::to_string(response.error());
  EXPECT_EQ(response->status, 200);
}

TEST(MetricsHttpTest, ShutdownIsPromptAndClosesThePort) {
  Metrics metrics("1");
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1:0", &metrics);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  httplib::Client client("127.0.0.1", port);
  ASSERT_TRUE(client.Get("/healthz"));

  // A client that connected and sends nothing does not hold the server up for long.
  const int idle = ConnectIdle(port);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const absl::Time start = absl::Now();
  (*server)->Shutdown();
  const absl::Duration took = absl::Now() - start;
  close(idle);
  EXPECT_LT(took, absl::Seconds(3));
  std::printf("Shutdown with an idle connection open took %s\n",
              absl::FormatDuration(took).c_str());

  (*server)->Shutdown();  // again: nothing happens
  httplib::Result response = client.Get("/healthz");
  EXPECT_FALSE(response) << "still serving after Shutdown: " << response->status;

  // The port is free again at once.
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> again =
      MetricsHttpServer::Start(absl::StrCat("127.0.0.1:", port), &metrics);
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST(MetricsHttpTest, ShutdownRightAfterStartReturns) {
  Metrics metrics("1");
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
        MetricsHttpServer::Start("127.0.0.1:0", &metrics);
    ASSERT_TRUE(server.ok()) << server.status();
    server->reset();  // the destructor shuts down
  }
}

// A flood from one host (127.0.0.1): connections that send part of a request and stop, and
// connections that send a whole request and never read the answer (an answer of ~1 MiB, more
// than the socket's buffers hold). A scrape from another host (127.0.0.2) is answered at once.
TEST(MetricsHttpTest, PartialRequestsAndSlowReadersFromOneHostDelayNoOtherHost) {
  Metrics metrics("1");
  Family<Counter>& many = metrics.AddCounterFamily("padding_total", "Makes the answer long.", "n");
  for (int i = 0; i < 12000; ++i) many.WithLabel(absl::StrCat("label-value-", i)).Inc();
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1:0", &metrics);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  // The flood's ends and the server's share this process: room for both.
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = std::max<rlim_t>(files.rlim_cur, std::min<rlim_t>(files.rlim_max, 8192));
  setrlimit(RLIMIT_NOFILE, &files);

  std::vector<int> flood;
  for (int i = 0; i < 1000; ++i) {
    const int fd = ConnectFrom("127.0.0.1", port);
    ASSERT_GE(fd, 0);
    const std::string partial = "GET /metrics HTTP/1.1\r\n";
    ASSERT_EQ(send(fd, partial.data(), partial.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(partial.size()));
    flood.push_back(fd);
  }
  for (int i = 0; i < 64; ++i) {
    const int fd = ConnectFrom("127.0.0.1", port);
    ASSERT_GE(fd, 0);
    const int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    const std::string whole = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    send(fd, whole.data(), whole.size(), MSG_NOSIGNAL);
    flood.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));

  const absl::Time start = absl::Now();
  const int scraper = ConnectFrom("127.0.0.2", port);
  ASSERT_GE(scraper, 0) << "127.0.0.2 is not a loopback address here";
  const std::string request = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(send(scraper, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  timeval limit{5, 0};
  setsockopt(scraper, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  std::string answer;
  char buf[4096];
  for (ssize_t n; (n = recv(scraper, buf, sizeof(buf), 0)) > 0;) answer.append(buf, n);
  const absl::Duration took = absl::Now() - start;
  close(scraper);
  for (int fd : flood) close(fd);
  EXPECT_THAT(answer, HasSubstr("200 OK"));
  EXPECT_THAT(answer, HasSubstr("ok"));
  std::printf("a scrape from 127.0.0.2 beside 1,000 partial requests and 64 slow readers: %s\n",
              absl::FormatDuration(took).c_str());
  EXPECT_LT(took, absl::Seconds(1));
}

}  // namespace
}  // namespace rdzv
