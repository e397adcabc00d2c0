// The metrics registry: the text Prometheus reads (names, HELP and TYPE, label escaping,
// histogram buckets), counting from many threads, and the process figures from /proc.
#include "server/metrics.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics_text.h"
#include "server/process_metrics.h"

namespace rdzv {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Checks `text` the way Prometheus's parser would: every line is a HELP, a TYPE or a sample;
// each family has one HELP and one TYPE, before its samples; sample names belong to the family
// (with _bucket/_sum/_count for histograms); no sample repeats. Returns the problems found.
std::vector<std::string> ExpositionProblems(const std::string& text) {
  static const std::regex kHelp(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .*)");
  static const std::regex kType(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram))");
  static const std::regex kSample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\["\\n])*"\})? )"
      R"((NaN|[+-]Inf|-?[0-9]+(\.[0-9]+)?(e[+-]?[0-9]+)?))");
  std::vector<std::string> problems;
  if (text.empty() || text.back() != '\n') problems.push_back("does not end with a line feed");
  std::set<std::string> helped, typed, samples;
  std::string family, type;
  for (const absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const std::string l(line);
    std::smatch m;
    if (std::regex_match(l, m, kHelp)) {
      if (!helped.insert(m[1]).second) problems.push_back("second HELP: " + l);
      family = m[1];
      type.clear();
    } else if (std::regex_match(l, m, kType)) {
      if (m[1] != family) problems.push_back("TYPE without its HELP first: " + l);
      if (!typed.insert(m[1]).second) problems.push_back("second TYPE: " + l);
      type = m[2];
    } else if (std::regex_match(l, m, kSample)) {
      const std::string name = m[1];
      const bool ok = type == "histogram" ? (name == family + "_bucket" ||
                                             name == family + "_sum" || name == family + "_count")
                                          : name == family;
      if (!ok || type.empty()) problems.push_back("sample outside its family: " + l);
      const std::string key = absl::StrCat(name, m[2].str());
      if (!samples.insert(key).second) problems.push_back("repeated sample: " + l);
    } else {
      problems.push_back("not HELP, TYPE or a sample: " + l);
    }
  }
  return problems;
}

TEST(MetricsTest, RendersEveryRdzvMetricWithHelpAndType) {
  Metrics metrics("1.2.3");
  const std::string text = metrics.Render();
  EXPECT_THAT(ExpositionProblems(text), ::testing::IsEmpty()) << text;
  struct Row {
    const char* name;
    const char* type;
  };
  for (const Row& row : std::vector<Row>{{"rdzv_jobs", "gauge"},
                                         {"rdzv_agents_attached", "gauge"},
                                         {"rdzv_join_streams", "gauge"},
                                         {"rdzv_joins_total", "counter"},
                                         {"rdzv_rounds_completed_total", "counter"},
                                         {"rdzv_rendezvous_duration_seconds", "histogram"},
                                         {"rdzv_aborts_total", "counter"},
                                         {"rdzv_refused_calls_total", "counter"},
                                         {"rdzv_restarts_total", "counter"},
                                         {"rdzv_build_info", "gauge"},
                                         {"process_resident_memory_bytes", "gauge"},
                                         {"process_open_fds", "gauge"},
                                         {"process_cpu_seconds_total", "counter"},
                                         {"process_start_time_seconds", "gauge"},
                                         {"process_threads", "gauge"}}) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("\n# TYPE ", row.name, " ", row.type, "\n")))
        << row.name;
    EXPECT_THAT(text, HasSubstr(absl::StrCat("# HELP ", row.name, " "))) << row.name;
  }
  // Counters read 0 before their first event, the known label values included.
  for (const char* sample :
       {"\nrdzv_joins_total 0\n", "\nrdzv_rounds_completed_total 0\n", "\nrdzv_restarts_total 0\n",
        "\nrdzv_aborts_total{cause=\"worker_failed\"} 0\n",
        "\nrdzv_aborts_total{cause=\"agent_lost\"} 0\n",
        "\nrdzv_aborts_total{cause=\"resume_timed_out\"} 0\n",
        "\nrdzv_aborts_total{cause=\"agent_signalled\"} 0\n",
        "\nrdzv_refused_calls_total{reason=\"unauthenticated\"} 0\n",
        "\nrdzv_refused_calls_total{reason=\"permission_denied\"} 0\n",
        "\nrdzv_refused_calls_total{reason=\"limit\"} 0\n",
        "\nrdzv_refused_calls_total{reason=\"invalid\"} 0\n",
        "\nrdzv_build_info{version=\"1.2.3\"} 1\n",
        "\nrdzv_rendezvous_duration_seconds_count 0\n"}) {
    EXPECT_THAT(text, HasSubstr(sample));
  }
  // Without a source there is nothing to report (rather than a made-up 0).
  EXPECT_THAT(text, Not(HasSubstr("\nrdzv_jobs{")));
  EXPECT_THAT(text, Not(HasSubstr("\nrdzv_agents_attached ")));
}

TEST(MetricsTest, CountsShowInTheText) {
  Metrics metrics("1");
  metrics.joins().Inc();
  metrics.joins().Inc(4);
  metrics.rounds_completed().Inc();
  metrics.restarts().Inc(2);
  metrics.aborts(AbortCause::kWorkerFailed).Inc();
  metrics.aborts("a_new_cause").Inc(3);
  metrics.refused_calls(Metrics::kRefusedLimit).Inc(7);
  const std::string text = metrics.Render();
  EXPECT_THAT(ExpositionProblems(text), ::testing::IsEmpty()) << text;
  EXPECT_THAT(text, HasSubstr("\nrdzv_joins_total 5\n"));
  EXPECT_THAT(text, HasSubstr("\nrdzv_rounds_completed_total 1\n"));
  EXPECT_THAT(text, HasSubstr("\nrdzv_restarts_total 2\n"));
  EXPECT_THAT(text, HasSubstr("\nrdzv_aborts_total{cause=\"worker_failed\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("\nrdzv_aborts_total{cause=\"a_new_cause\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("\nrdzv_refused_calls_total{reason=\"limit\"} 7\n"));
  EXPECT_THAT(text, HasSubstr("\nrdzv_refused_calls_total{reason=\"invalid\"} 0\n"));
  // Label values are sorted, so the text is stable from scrape to scrape.
  EXPECT_LT(text.find("cause=\"a_new_cause\""), text.find("cause=\"agent_lost\""));
  EXPECT_LT(text.find("cause=\"agent_lost\""), text.find("cause=\"worker_failed\""));
}

TEST(MetricsTest, ScrapeTimeSourcesAreCalledAtEachRenderAndCanBeRemoved) {
  Metrics metrics("1");
  int64_t running = 2;
  metrics.SetJobsSource([&] { return Metrics::JobCounts{.filling = 1, .running = running}; });
  metrics.SetAgentsAttachedSource([] { return int64_t{17}; });
  std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("\nrdzv_jobs{state=\"filling\"} 1\n"
                              "rdzv_jobs{state=\"running\"} 2\n"
                              "rdzv_jobs{state=\"ended\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("\nrdzv_agents_attached 17\n"));
  running = 5;
  EXPECT_THAT(metrics.Render(), HasSubstr("\nrdzv_jobs{state=\"running\"} 5\n"));

  metrics.SetJobsSource(nullptr);
  metrics.SetAgentsAttachedSource(nullptr);
  text = metrics.Render();
  EXPECT_THAT(text, Not(HasSubstr("\nrdzv_jobs{")));
  EXPECT_THAT(text, Not(HasSubstr("\nrdzv_agents_attached ")));
  EXPECT_THAT(ExpositionProblems(text), ::testing::IsEmpty()) << text;
}

TEST(MetricsTest, EscapesLabelValuesAndHelp) {
  struct Row {
    std::string value;
    std::string escaped;
  };
  for (const Row& row : std::vector<Row>{{"plain", "plain"},
                                         {"", ""},
                                         {"a\"b", "a\\\"b"},
                                         {"back\\slash", "back\\\\slash"},
                                         {"two\nlines", "two\\nlines"},
                                         {"\\\"\n", "\\\\\\\"\\n"},
                                         {"tab\tstays", "tab\tstays"},
                                         {"utf-8 \xc3\xa9t\xc3\xa9", "utf-8 \xc3\xa9t\xc3\xa9"}}) {
    EXPECT_EQ(EscapeLabelValue(row.value), row.escaped) << row.value;
    Metrics metrics("1");
    metrics.aborts(row.value).Inc();
    const std::string text = metrics.Render();
    EXPECT_THAT(text,
                HasSubstr(absl::StrCat("\nrdzv_aborts_total{cause=\"", row.escaped, "\"} 1\n")));
    EXPECT_THAT(ExpositionProblems(text), ::testing::IsEmpty()) << text;
  }
  EXPECT_EQ(EscapeHelp("a \"quoted\" \\ and\nmore"), "a \"quoted\" \\\\ and\\nmore");

  Metrics metrics("build \"7\"\n");
  EXPECT_THAT(metrics.Render(), HasSubstr("\nrdzv_build_info{version=\"build \\\"7\\\"\\n\"} 1\n"));
  metrics.AddGauge("odd_help", "line one\nline two \\ end").Set(1);
  EXPECT_THAT(metrics.Render(), HasSubstr("\n# HELP odd_help line one\\nline two \\\\ end\n"));
}

TEST(MetricsTest, HistogramCountsEachObservationInItsBucket) {
  struct Row {
    double value;
    const char* first_le;  // the smallest bucket that counts it
  };
  const std::vector<Row> rows = {
      {0, "0.005"}, {0.005, "0.005"}, {0.0051, "0.01"}, {0.3, "0.5"},  {1, "1"},
      {1.5, "2.5"}, {600, "600"},     {600.5, "+Inf"},  {-1, "0.005"}, {INFINITY, "+Inf"}};
  const std::vector<std::string> les = {"0.005", "0.01", "0.025", "0.05", "0.1", "0.25",
                                        "0.5",   "1",    "2.5",   "5",    "10",  "30",
                                        "60",    "120",  "300",   "600",  "+Inf"};
  for (const Row& row : rows) {
    Metrics metrics("1");
    metrics.rendezvous_duration().Observe(row.value);
    const std::string text = metrics.Render();
    bool counted = false;
    for (const std::string& le : les) {
      counted = counted || le == row.first_le;
      EXPECT_THAT(text, HasSubstr(absl::StrCat("\nrdzv_rendezvous_duration_seconds_bucket{le=\"",
                                               le, "\"} ", counted ? 1 : 0, "\n")))
          << "value " << row.value << " le " << le;
    }
    EXPECT_TRUE(counted) << row.first_le;
    EXPECT_THAT(text, HasSubstr("\nrdzv_rendezvous_duration_seconds_count 1\n"));
  }
}

TEST(MetricsTest, HistogramIsCumulativeWithSumAndCount) {
  Metrics metrics("1");
  Histogram& h = metrics.rendezvous_duration();
  for (const double v : {0.002, 0.02, 0.02, 3.0, 1000.0}) h.Observe(v);
  h.Observe(NAN);  // ignored
  const Histogram::Snapshot s = h.Read();
  ASSERT_EQ(s.cumulative.size(), 17u);
  EXPECT_EQ(s.cumulative[0], 1u);   // 0.005
  EXPECT_EQ(s.cumulative[2], 3u);   // 0.025
  EXPECT_EQ(s.cumulative[9], 4u);   // 5
  EXPECT_EQ(s.cumulative[15], 4u);  // 600
  EXPECT_EQ(s.cumulative[16], 5u);  // +Inf
  EXPECT_EQ(s.count, 5u);
  EXPECT_DOUBLE_EQ(s.sum, 1003.042);
  const std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("rdzv_rendezvous_duration_seconds_bucket{le=\"0.025\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("rdzv_rendezvous_duration_seconds_bucket{le=\"+Inf\"} 5\n"
                              "rdzv_rendezvous_duration_seconds_sum 1003.042\n"
                              "rdzv_rendezvous_duration_seconds_count 5\n"));
  EXPECT_THAT(ExpositionProblems(text), ::testing::IsEmpty()) << text;
}

TEST(MetricsTest, CountsFromManyThreadsAddUpWhileScraped) {
  Metrics metrics("1");
  Gauge& gauge = metrics.AddGauge("test_gauge", "A gauge added to from many threads.");
  constexpr int kThreads = 8;
  constexpr int kPerThread = 50'000;
  std::atomic<bool> done{false};
  std::thread scraper([&] {
    while (!done.load()) {
      const std::string text = metrics.Render();
      ASSERT_THAT(ExpositionProblems(text), ::testing::IsEmpty());
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Counter& cause = metrics.aborts(absl::StrCat("cause_", t % 3));
      for (int i = 0; i < kPerThread; ++i) {
        metrics.joins().Inc();
        cause.Inc();
        metrics.refused_calls(Metrics::kRefusedInvalid).Inc();
        metrics.rendezvous_duration().Observe(0.5);
        gauge.Add(1);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  done = true;
  scraper.join();

  constexpr uint64_t kTotal = uint64_t{kThreads} * kPerThread;
  EXPECT_EQ(metrics.joins().value(), kTotal);
  EXPECT_EQ(metrics.refused_calls(Metrics::kRefusedInvalid).value(), kTotal);
  EXPECT_EQ(metrics.aborts("cause_0").value() + metrics.aborts("cause_1").value() +
                metrics.aborts("cause_2").value(),
            kTotal);
  EXPECT_EQ(metrics.rendezvous_duration().Read().count, kTotal);
  EXPECT_DOUBLE_EQ(metrics.rendezvous_duration().Read().sum, 0.5 * kTotal);
  EXPECT_EQ(gauge.value(), static_cast<double>(kTotal));
  EXPECT_THAT(metrics.Render(), HasSubstr(absl::StrCat("\nrdzv_joins_total ", kTotal, "\n")));
}

TEST(MetricsTest, GaugesSetAndAdd) {
  Metrics metrics("1");
  Gauge& g = metrics.AddGauge("test_queue_depth", "Items waiting.");
  g.Set(10);
  g.Add(-2.5);
  EXPECT_THAT(metrics.Render(), HasSubstr("\ntest_queue_depth 7.5\n"));
  Family<Gauge>& f = metrics.AddGaugeFamily("test_temperature", "Degrees by room.", "room");
  f.WithLabel("b").Set(-1);
  f.WithLabel("a").Set(1e-9);
  EXPECT_THAT(metrics.Render(), HasSubstr("\ntest_temperature{room=\"a\"} 1e-09\n"
                                          "test_temperature{room=\"b\"} -1\n"));
  CallbackGauge& c = metrics.AddCallbackGauge("test_ratio", "A computed value.", "");
  c.SetSource([] { return CallbackGauge::Samples{{"", NAN}}; });
  EXPECT_THAT(metrics.Render(), HasSubstr("\ntest_ratio NaN\n"));
}

TEST(MetricsTest, NewLabelValuesBeyondTheLimitCountAsOther) {
  Metrics metrics("1");
  Family<Counter>& f = metrics.AddCounterFamily("test_by_peer_total", "Calls by peer.", "peer");
  for (size_t i = 0; i < Family<Counter>::kMaxLabelValues; ++i) {
    f.WithLabel(absl::StrCat("peer", i)).Inc();
  }
  f.WithLabel("one_too_many").Inc();
  f.WithLabel("and_another").Inc();
  f.WithLabel("peer3").Inc();  // an old value still counts as itself
  const std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("\ntest_by_peer_total{peer=\"other\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("\ntest_by_peer_total{peer=\"peer3\"} 2\n"));
  EXPECT_THAT(text, Not(HasSubstr("one_too_many")));
}

TEST(MetricsDeathTest, BadOrRepeatedNamesAreProgrammingErrors) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Metrics metrics("1");
  EXPECT_DEATH(metrics.AddCounter("rdzv_joins_total", "again"), "added twice");
  EXPECT_DEATH(metrics.AddGauge("process_open_fds", "again"), "added twice");
  EXPECT_DEATH(metrics.AddCounter("9lives", ""), "not a valid metric name");
  EXPECT_DEATH(metrics.AddCounter("has space", ""), "not a valid metric name");
  EXPECT_DEATH(metrics.AddCounterFamily("ok_name", "", "le"), "not a valid label name");
  EXPECT_DEATH(metrics.AddCounterFamily("ok_name", "", "a:b"), "not a valid label name");
  EXPECT_DEATH(metrics.AddHistogram("ok_name", "", {1, 1}), "strictly increasing");
}

// ---- Process figures

TEST(ProcessMetricsTest, ParsesProcStat) {
  // The command name is what the process chose: anything, parentheses and spaces included.
  for (const std::string comm : {"rdzvd", "a b", "x) (y", ")", "with ) 1 2 3"}) {
    // Fields 3.. of a real line: state ppid pgrp session tty tpgid flags minflt cminflt majflt
    // cmajflt utime stime cutime cstime priority nice num_threads itrealvalue starttime vsize
    // rss ...
    const std::string text = absl::StrCat(
        "4242 (", comm,
        ") S 1 4242 4242 0 -1 4194560 1200 0 3 0 250 75 0 0 20 0 9 0 123456 987654321 2048 "
        "18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0\n");
    const absl::StatusOr<ProcStat> stat = ParseProcStat(text);
    ASSERT_TRUE(stat.ok()) << comm << ": " << stat.status();
    EXPECT_EQ(stat->utime_ticks, 250) << comm;
    EXPECT_EQ(stat->stime_ticks, 75) << comm;
    EXPECT_EQ(stat->num_threads, 9) << comm;
    EXPECT_EQ(stat->start_ticks, 123456) << comm;
    EXPECT_EQ(stat->vsize_bytes, 987654321) << comm;
    EXPECT_EQ(stat->rss_pages, 2048) << comm;
  }
  for (const char* bad : {"", "4242 rdzvd S 1", "4242 (rdzvd) S 1 2 3",
                          "4242 (rdzvd) S 1 4242 4242 0 -1 4194560 1200 0 3 0 x 75 0 0 20 0 9 0 "
                          "123456 987654321 2048"}) {
    EXPECT_FALSE(ParseProcStat(bad).ok()) << bad;
  }
}

TEST(ProcessMetricsTest, ParsesBootTime) {
  EXPECT_EQ(ParseBootTime("cpu  1 2 3\nintr 5\nbtime 1700000000\nprocesses 9\n").value(),
            1700000000);
  EXPECT_FALSE(ParseBootTime("cpu  1 2 3\n").ok());
  EXPECT_FALSE(ParseBootTime("btime soon\n").ok());
}

TEST(ProcessMetricsTest, ReadsThisProcess) {
  const absl::StatusOr<ProcessStats> before = ReadProcessStats();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_GT(before->resident_memory_bytes, 1 << 20);
  EXPECT_GE(before->virtual_memory_bytes, before->resident_memory_bytes);
  EXPECT_GE(before->threads, 1);
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  EXPECT_LE(before->start_time_seconds, now + 5);     // btime is whole seconds, and clocks drift
  EXPECT_GT(before->start_time_seconds, now - 3600);  // a test binary started minutes ago
  EXPECT_GE(before->open_fds, 3);
  EXPECT_GT(before->max_fds, before->open_fds);

  // An extra descriptor, an extra thread and some CPU time all show.
  const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  // The spinner burns 250 ms of CPU by its own clock, however busy the machine is, and stays
  // alive until the second read. The check below asks for less than half of that: /proc
  // counts in 10 ms ticks, and a thread running on another core is charged only at that
  // core's next scheduler tick.
  std::atomic<bool> stop{false};
  std::atomic<bool> spun{false};
  std::thread spinner([&] {
    timespec cpu{};
    while (!stop.load()) {
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
      if (cpu.tv_sec > 0 || cpu.tv_nsec >= 250'000'000) spun = true;
    }
  });
  for (int i = 0; i < 3000 && !spun.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const absl::StatusOr<ProcessStats> after = ReadProcessStats();
  stop = true;
  spinner.join();
  close(fd);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->open_fds, before->open_fds + 1);
  EXPECT_EQ(after->threads, before->threads + 1);
  EXPECT_GE(after->cpu_seconds - before->cpu_seconds, 0.1);
  EXPECT_EQ(after->start_time_seconds, before->start_time_seconds);

  Metrics metrics("1");
  const std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr(absl::StrCat("\nprocess_open_fds ", before->open_fds, "\n")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("\nprocess_threads ", before->threads, "\n")));
}

}  // namespace
}  // namespace rdzv
