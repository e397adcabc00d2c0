// A scrape target for tests with a real Prometheus: serves a Metrics registry through
// MetricsHttpServer and counts a join every 100 ms (and a rendezvous duration of 0.25 s every
// tenth one), so that a scraper sees rdzv_joins_total grow.
//
//   metrics_demo_server [--listen 127.0.0.1:0] [--timeout-s 120]
//
// Prints "listening on PORT" on stdout once serving. Exits 0 when its stdin closes (so it
// cannot outlive the test that holds the other end of the pipe), 1 after the timeout, 2 on
// bad arguments or when it cannot listen.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "server/metrics.h"
#include "server/metrics_http.h"

int main(int argc, char** argv) {
  std::string listen = "127.0.0.1:0";
  int timeout_s = 120;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (arg == "--listen" && value != nullptr) {
      listen = value;
      ++i;
    } else if (arg == "--timeout-s" && value != nullptr && absl::SimpleAtoi(value, &timeout_s) &&
               timeout_s > 0) {
      ++i;
    } else {
      std::fprintf(stderr,
                   "metrics_demo_server: bad argument %s; usage: metrics_demo_server "
                   "[--listen HOST:PORT] [--timeout-s N>0]\n",
                   arg.c_str());
      return 2;
    }
  }

  rdzv::Metrics metrics("demo");
  auto server = rdzv::MetricsHttpServer::Start(listen, &metrics);
  if (!server.ok()) {
    std::fprintf(stderr, "metrics_demo_server: %s\n",
                 std::string(server.status().message()).c_str());
    return 2;
  }
  std::printf("listening on %d\n", (*server)->port());
  std::fflush(stdout);

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  auto next_tick = std::chrono::steady_clock::now();
  for (int ticks = 0;;) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      std::fprintf(stderr, "metrics_demo_server: no EOF on stdin within %d s; exiting\n",
                   timeout_s);
      return 1;
    }
    if (now >= next_tick) {
      metrics.joins().Inc();
      if (++ticks % 10 == 0) {
        metrics.rounds_completed().Inc();
        metrics.rendezvous_duration().Observe(0.25);
      }
      next_tick += std::chrono::milliseconds(100);
    }
    pollfd input{.fd = STDIN_FILENO, .events = POLLIN, .revents = 0};
    const auto wait =
        std::chrono::duration_cast<std::chrono::milliseconds>(next_tick - now).count();
    if (poll(&input, 1, static_cast<int>(std::max<int64_t>(wait, 0))) > 0) {
      char buffer[256];
      if (read(STDIN_FILENO, buffer, sizeof(buffer)) <= 0) return 0;  // EOF: the test is done
    }
  }
}
