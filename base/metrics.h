// File: metrics.h
// A small Prometheus metrics registry: counters, gauges and histograms,
// grouped in families that share a name and label names, rendered in the
// Prometheus text exposition format (version 0.0.4). Any layer may
// increment; the server renders (server/metrics.h serves it over HTTP).
//
// Updates are lock-free (relaxed atomics). Looking up a labelled child
// takes the family's mutex, so hot paths look a child up once and keep the
// reference: children live as long as their family and never move.
//
// Example:
//   metrics::Registry registry;
//   metrics::Family<metrics::Counter>& requests = registry.AddCounter(
//       "modelstate_example_requests_total", "Requests served.", {"code"});
//   metrics::Counter& ok = requests.Labels({"OK"});
//   ok.Increment();
//   metrics::Family<metrics::Histogram>& latency = registry.AddHistogram(
//       "modelstate_example_seconds", "Latency.", {}, {0.01, 0.1, 1});
//   latency.Labels({}).Observe(0.02);
//   std::string text = registry.Render();
#ifndef MODELSTATE_BASE_METRICS_H_
#define MODELSTATE_BASE_METRICS_H_

#include <atomic>
#include <climits>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace modelstate::metrics {

// A value that only goes up. Thread-safe.
class Counter {
 public:
  void Increment(uint64_t n = 1) {
    value_.fetch_add(n, std::memory_order_relaxed);
  }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A value that goes up and down. Thread-safe.
class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double d) { value_.fetch_add(d, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted in buckets with fixed upper bounds (Prometheus'
// cumulative "le" buckets are summed at render time). Thread-safe.
class Histogram {
 public:
  // `bounds`: increasing upper bounds; +Inf is implied.
  explicit Histogram(std::vector<double> bounds);

  void Observe(double value);
  void ObserveDuration(absl::Duration d) { Observe(absl::ToDoubleSeconds(d)); }

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Take() const;

 private:
  const std::vector<double> bounds_;
  // Non-cumulative: buckets_[i] counts values in (bounds_[i-1], bounds_[i]];
  // the last one counts values above every bound.
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<double> sum_{0};
};

// Latency buckets in seconds, 0.5 ms to 60 s.
std::vector<double> LatencyBuckets();

// Observes the time from construction to destruction into `histogram`
// (nothing if null).
class ScopedTimer {
 public:
  explicit ScopedTimer(Histogram* histogram)
      : histogram_(histogram), start_(absl::Now()) {}
  ~ScopedTimer() {
    if (histogram_ != nullptr)
      histogram_->ObserveDuration(absl::Now() - start_);
  }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  Histogram* const histogram_;
  const absl::Time start_;
};

// When something last happened (the latest signed audit checkpoint), for a
// gauge of its age computed when scraped. Thread-safe.
class Timestamp {
 public:
  void Set(absl::Time t) {
    nanos_.store(absl::ToUnixNanos(t), std::memory_order_relaxed);
  }
  // Unset until the first Set.
  bool has_value() const { return nanos_.load() != kUnset; }
  absl::Time value() const { return absl::FromUnixNanos(nanos_.load()); }

 private:
  static constexpr int64_t kUnset = INT64_MIN;
  std::atomic<int64_t> nanos_{kUnset};
};

enum class Type { kCounter, kGauge, kHistogram };

// What every family renders through.
class FamilyBase {
 public:
  FamilyBase(std::string name, std::string help, Type type,
             std::vector<std::string> label_names);
  virtual ~FamilyBase() = default;
  const std::string& name() const { return name_; }
  // Appends "# HELP", "# TYPE" and every sample.
  void Render(std::string* out) const;

 protected:
  // Appends the samples.
  virtual void RenderSamples(std::string* out) const = 0;
  // `name`{labels} `value`\n; `extra` is one more label ("le").
  void AppendSample(std::string* out, absl::string_view suffix,
                    const std::vector<std::string>& values, double value,
                    absl::string_view extra_name = "",
                    absl::string_view extra_value = "") const;

  const std::string name_;
  const std::string help_;
  const Type type_;
  const std::vector<std::string> label_names_;
};

// Children of one metric, one per combination of label values. Thread-safe.
template <typename Metric>
class Family final : public FamilyBase {
 public:
  Family(std::string name, std::string help, Type type,
         std::vector<std::string> label_names,
         std::function<std::unique_ptr<Metric>()> make)
      : FamilyBase(std::move(name), std::move(help), type,
                   std::move(label_names)),
        make_(std::move(make)) {}

  // The child with these label values (as many as the family has label
  // names), created at 0 on first use. The reference stays valid as long as
  // the family.
  Metric& Labels(const std::vector<std::string>& values) {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<Metric>& child = children_[values];
    if (child == nullptr) child = make_();
    return *child;
  }
  // Forgets a child (a subscriber that went away).
  void Remove(const std::vector<std::string>& values) {
    absl::MutexLock lock(&mu_);
    children_.erase(values);
  }

 protected:
  void RenderSamples(std::string* out) const override;

 private:
  const std::function<std::unique_ptr<Metric>()> make_;
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<Metric>> children_
      ABSL_GUARDED_BY(mu_);
};

template <>
void Family<Counter>::RenderSamples(std::string* out) const;
template <>
void Family<Gauge>::RenderSamples(std::string* out) const;
template <>
void Family<Histogram>::RenderSamples(std::string* out) const;

// Gauges computed when scraped (hosted bytes, queue depths): `collect`
// returns (label values, value) pairs.
class CallbackFamily final : public FamilyBase {
 public:
  using Samples = std::vector<std::pair<std::vector<std::string>, double>>;
  CallbackFamily(std::string name, std::string help,
                 std::vector<std::string> label_names,
                 std::function<Samples()> collect)
      : FamilyBase(std::move(name), std::move(help), Type::kGauge,
                   std::move(label_names)),
        collect_(std::move(collect)) {}

 protected:
  void RenderSamples(std::string* out) const override;

 private:
  const std::function<Samples()> collect_;
};

// The families of one server. Thread-safe; families are added at start-up
// and live as long as the registry.
class Registry {
 public:
  Family<Counter>& AddCounter(std::string name, std::string help,
                              std::vector<std::string> label_names);
  Family<Gauge>& AddGauge(std::string name, std::string help,
                          std::vector<std::string> label_names);
  Family<Histogram>& AddHistogram(std::string name, std::string help,
                                  std::vector<std::string> label_names,
                                  std::vector<double> bounds);
  // `collect` runs on the scraping thread, without the registry's lock.
  void AddCallback(std::string name, std::string help,
                   std::vector<std::string> label_names,
                   std::function<CallbackFamily::Samples()> collect);

  // Every family, in the order added, in the text exposition format.
  std::string Render() const;

 private:
  template <typename F>
  F& Add(std::unique_ptr<F> family);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<FamilyBase>> families_ ABSL_GUARDED_BY(mu_);
};

// A sample value as Prometheus reads it: shortest round-trip decimal,
// "+Inf", "-Inf" or "NaN".
std::string FormatValue(double value);

}  // namespace modelstate::metrics

#endif  // MODELSTATE_BASE_METRICS_H_
