#include "base/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace modelstate::metrics {
namespace {

// Label values escape backslash, double quote and newline; HELP text
// escapes backslash and newline.
void AppendEscaped(absl::string_view text, bool quotes, std::string* out) {
  for (char c : text) {
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '\n') {
      out->append("\\n");
    } else if (c == '"' && quotes) {
      out->append("\\\"");
    } else {
      out->push_back(c);
    }
  }
}

}  // namespace

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, end);
}

std::vector<double> LatencyBuckets() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
          0.25,   0.5,   1,      2.5,   5,    10,    30,   60};
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double value) {
  // The first bound >= value: Prometheus buckets are "less or equal".
  const size_t i = static_cast<size_t>(
      std::lower_bound(bounds_.begin(), bounds_.end(), value) -
      bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Take() const {
  Snapshot s;
  s.bounds = bounds_;
  s.cumulative.reserve(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(total);
  }
  s.count = total;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

FamilyBase::FamilyBase(std::string name, std::string help, Type type,
                       std::vector<std::string> label_names)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)) {}

void FamilyBase::Render(std::string* out) const {
  absl::StrAppend(out, "# HELP ", name_, " ");
  AppendEscaped(help_, /*quotes=*/false, out);
  const char* type = type_ == Type::kCounter ? "counter"
                     : type_ == Type::kGauge ? "gauge"
                                             : "histogram";
  absl::StrAppend(out, "\n# TYPE ", name_, " ", type, "\n");
  RenderSamples(out);
}

void FamilyBase::AppendSample(std::string* out, absl::string_view suffix,
                              const std::vector<std::string>& values,
                              double value, absl::string_view extra_name,
                              absl::string_view extra_value) const {
  absl::StrAppend(out, name_, suffix);
  const size_t n = std::min(values.size(), label_names_.size());
  if (n > 0 || !extra_name.empty()) {
    out->push_back('{');
    for (size_t i = 0; i < n; ++i) {
      absl::StrAppend(out, i == 0 ? "" : ",", label_names_[i], "=\"");
      AppendEscaped(values[i], /*quotes=*/true, out);
      out->push_back('"');
    }
    if (!extra_name.empty()) {
      absl::StrAppend(out, n == 0 ? "" : ",", extra_name, "=\"", extra_value,
                      "\"");
    }
    out->push_back('}');
  }
  absl::StrAppend(out, " ", FormatValue(value), "\n");
}

template <>
void Family<Counter>::RenderSamples(std::string* out) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [values, counter] : children_) {
    AppendSample(out, "", values, static_cast<double>(counter->value()));
  }
}

template <>
void Family<Gauge>::RenderSamples(std::string* out) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [values, gauge] : children_) {
    AppendSample(out, "", values, gauge->value());
  }
}

template <>
void Family<Histogram>::RenderSamples(std::string* out) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [values, histogram] : children_) {
    const Histogram::Snapshot s = histogram->Take();
    for (size_t i = 0; i <= s.bounds.size(); ++i) {
      const std::string le =
          i < s.bounds.size() ? FormatValue(s.bounds[i]) : "+Inf";
      AppendSample(out, "_bucket", values, static_cast<double>(s.cumulative[i]),
                   "le", le);
    }
    AppendSample(out, "_sum", values, s.sum);
    AppendSample(out, "_count", values, static_cast<double>(s.count));
  }
}

void CallbackFamily::RenderSamples(std::string* out) const {
  Samples samples = collect_();
  std::sort(samples.begin(), samples.end());
  for (const auto& [values, value] : samples) {
    AppendSample(out, "", values, value);
  }
}

template <typename F>
F& Registry::Add(std::unique_ptr<F> family) {
  F& ref = *family;
  absl::MutexLock lock(&mu_);
  families_.push_back(std::move(family));
  return ref;
}

Family<Counter>& Registry::AddCounter(std::string name, std::string help,
                                      std::vector<std::string> label_names) {
  return Add(std::make_unique<Family<Counter>>(
      std::move(name), std::move(help), Type::kCounter, std::move(label_names),
      [] { return std::make_unique<Counter>(); }));
}

Family<Gauge>& Registry::AddGauge(std::string name, std::string help,
                                  std::vector<std::string> label_names) {
  return Add(std::make_unique<Family<Gauge>>(
      std::move(name), std::move(help), Type::kGauge, std::move(label_names),
      [] { return std::make_unique<Gauge>(); }));
}

Family<Histogram>& Registry::AddHistogram(std::string name, std::string help,
                                          std::vector<std::string> label_names,
                                          std::vector<double> bounds) {
  return Add(std::make_unique<Family<Histogram>>(
      std::move(name), std::move(help), Type::kHistogram,
      std::move(label_names),
      [bounds] { return std::make_unique<Histogram>(bounds); }));
}

void Registry::AddCallback(std::string name, std::string help,
                           std::vector<std::string> label_names,
                           std::function<CallbackFamily::Samples()> collect) {
  Add(std::make_unique<CallbackFamily>(std::move(name), std::move(help),
                                       std::move(label_names),
                                       std::move(collect)));
}

std::string Registry::Render() const {
  // Families are never removed, so rendering outside the lock is safe;
  // callbacks may take other locks and must not run under this one.
  std::vector<const FamilyBase*> families;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& f : families_) families.push_back(f.get());
  }
  std::string out;
  for (const FamilyBase* f : families) f->Render(&out);
  return out;
}

}  // namespace modelstate::metrics
