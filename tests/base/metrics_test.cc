#include "base/metrics.h"

#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace modelstate::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(MetricsTest, CounterRendersHelpTypeAndOneLinePerChild) {
  Registry registry;
  Family<Counter>& calls =
      registry.AddCounter("x_calls_total", "Calls made.", {"method", "code"});
  calls.Labels({"Build", "OK"}).Increment(3);
  calls.Labels({"Build", "NOT_FOUND"}).Increment();
  EXPECT_EQ(registry.Render(),
            "# HELP x_calls_total Calls made.\n"
            "# TYPE x_calls_total counter\n"
            "x_calls_total{method=\"Build\",code=\"NOT_FOUND\"} 1\n"
            "x_calls_total{method=\"Build\",code=\"OK\"} 3\n");
}

TEST(MetricsTest, LabelsReturnTheSameChild) {
  Registry registry;
  Family<Counter>& f = registry.AddCounter("x_total", "X.", {"a"});
  Counter& first = f.Labels({"v"});
  first.Increment();
  EXPECT_EQ(&f.Labels({"v"}), &first);
  EXPECT_EQ(f.Labels({"v"}).value(), 1u);
  f.Remove({"v"});
  EXPECT_EQ(f.Labels({"v"}).value(), 0u);
}

TEST(MetricsTest, HistogramBucketsAreCumulativeAndInclusive) {
  Registry registry;
  Histogram& h =
      registry.AddHistogram("x_seconds", "Time.", {}, {0.1, 1}).Labels({});
  h.Observe(0.05);
  h.Observe(0.1);  // "le": a value on a bound counts in that bucket
  h.Observe(0.5);
  h.Observe(7);
  EXPECT_EQ(registry.Render(),
            "# HELP x_seconds Time.\n"
            "# TYPE x_seconds histogram\n"
            "x_seconds_bucket{le=\"0.1\"} 2\n"
            "x_seconds_bucket{le=\"1\"} 3\n"
            "x_seconds_bucket{le=\"+Inf\"} 4\n"
            "x_seconds_sum 7.65\n"
            "x_seconds_count 4\n");
}

TEST(MetricsTest, HistogramLabelsComeBeforeLe) {
  Registry registry;
  registry.AddHistogram("x_seconds", "T.", {"method"}, {1})
      .Labels({"Get"})
      .Observe(2);
  EXPECT_THAT(registry.Render(),
              HasSubstr("x_seconds_bucket{method=\"Get\",le=\"+Inf\"} 1\n"
                        "x_seconds_sum{method=\"Get\"} 2\n"));
}

TEST(MetricsTest, EscapesLabelValuesAndHelp) {
  Registry registry;
  registry.AddGauge("x", "Back\\slash and\nnewline.", {"name"})
      .Labels({"a\"b\\c\nd"})
      .Set(1.5);
  EXPECT_EQ(registry.Render(),
            "# HELP x Back\\\\slash and\\nnewline.\n"
            "# TYPE x gauge\n"
            "x{name=\"a\\\"b\\\\c\\nd\"} 1.5\n");
}

TEST(MetricsTest, GaugeGoesUpAndDown) {
  Gauge g;
  g.Add(2);
  g.Add(-0.5);
  EXPECT_EQ(g.value(), 1.5);
  g.Set(-3);
  EXPECT_EQ(g.value(), -3);
}

TEST(MetricsTest, CallbacksRunAtRenderTimeSortedByLabels) {
  Registry registry;
  double depth = 1;
  registry.AddCallback("x_depth", "Depth.", {"who"},
                       [&depth]() -> CallbackFamily::Samples {
                         return {{{"b"}, depth}, {{"a"}, 2 * depth}};
                       });
  depth = 4;
  EXPECT_THAT(registry.Render(), HasSubstr("x_depth{who=\"a\"} 8\n"
                                           "x_depth{who=\"b\"} 4\n"));
}

TEST(MetricsTest, EmptyFamiliesStillDeclareThemselves) {
  Registry registry;
  registry.AddCallback("x_age_seconds", "Age.", {},
                       [] { return CallbackFamily::Samples{}; });
  EXPECT_EQ(registry.Render(),
            "# HELP x_age_seconds Age.\n# TYPE x_age_seconds gauge\n");
}

TEST(MetricsTest, FormatValue) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(1e21), "1e+21");
  EXPECT_EQ(FormatValue(123456789), "123456789");
  EXPECT_EQ(FormatValue(INFINITY), "+Inf");
  EXPECT_EQ(FormatValue(-INFINITY), "-Inf");
  EXPECT_EQ(FormatValue(NAN), "NaN");
}

TEST(MetricsTest, TimestampIsUnsetUntilSet) {
  Timestamp t;
  EXPECT_FALSE(t.has_value());
  const absl::Time when = absl::FromUnixSeconds(1700000000);
  t.Set(when);
  EXPECT_TRUE(t.has_value());
  EXPECT_EQ(t.value(), when);
}

TEST(MetricsTest, ConcurrentUpdatesAreNotLost) {
  Registry registry;
  Counter& c = registry.AddCounter("x_total", "X.", {}).Labels({});
  Histogram& h = registry.AddHistogram("x_seconds", "X.", {}, {1}).Labels({});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c.Increment();
        h.Observe(0.5);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(c.value(), 40000u);
  Histogram::Snapshot s = h.Take();
  EXPECT_EQ(s.count, 40000u);
  EXPECT_EQ(s.sum, 20000);
  EXPECT_THAT(registry.Render(), Not(HasSubstr("NaN")));
}

}  // namespace
}  // namespace modelstate::metrics
