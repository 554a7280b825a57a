#include "client/cli/output.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/dtype.h"
#include "proto/convert.h"

namespace modelstate::cli {
namespace {

// Python's repr of a float, closely enough: the shortest text that reads
// back as the same double ("0.1", "1e-05"), integers without a fraction
// (the wire form of attributes does not tell ints from floats).
std::string PyNumber(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == std::trunc(d) && std::fabs(d) < 1e15) {
    return absl::StrCat(static_cast<int64_t>(d));
  }
  for (int precision = 1; precision < 17; ++precision) {
    std::string text = absl::StrFormat("%.*g", precision, d);
    if (std::strtod(text.c_str(), nullptr) == d) return text;
  }
  return absl::StrFormat("%.17g", d);
}

std::string PyString(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out.push_back('\'');
  return out;
}

}  // namespace

std::string WithCommas(uint64_t n) {
  std::string digits = absl::StrCat(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

std::string HumanBytes(uint64_t n) {
  if (n < 1024) return absl::StrCat(n, " B");
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(n) / 1024;
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string HumanRate(double bytes_per_second) {
  static constexpr const char* kUnits[] = {"B/s", "kB/s", "MB/s", "GB/s",
                                           "TB/s"};
  size_t unit = 0;
  while (bytes_per_second >= 1000 && unit + 1 < std::size(kUnits)) {
    bytes_per_second /= 1000;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", bytes_per_second, kUnits[unit]);
}

std::string KindText(v1::EntryKind kind) {
  switch (kind) {
    case v1::ENTRY_KIND_PARAMETER:
      return "parameter";
    case v1::ENTRY_KIND_BUFFER:
      return "buffer";
    case v1::ENTRY_KIND_MODULE:
      return "module";
    default:
      return "entry";
  }
}

std::string Plural(uint64_t n, absl::string_view singular) {
  return absl::StrCat(WithCommas(n), " ", singular, n == 1 ? "" : "s");
}

std::string FullName(const std::string& module) {
  return module.find('/') == std::string::npos ? "default/" + module : module;
}

std::string TransferSummary(uint64_t bytes, absl::Duration elapsed) {
  double seconds = std::max(absl::ToDoubleSeconds(elapsed), 1e-6);
  return absl::StrFormat("in %.3f s (%.1f MB/s)", seconds,
                         static_cast<double>(bytes) / seconds / 1e6);
}

std::string PyValue(const google::protobuf::Value& v) {
  switch (v.kind_case()) {
    case google::protobuf::Value::kNullValue:
      return "None";
    case google::protobuf::Value::kBoolValue:
      return v.bool_value() ? "True" : "False";
    case google::protobuf::Value::kNumberValue:
      return PyNumber(v.number_value());
    case google::protobuf::Value::kStringValue:
      return PyString(v.string_value());
    case google::protobuf::Value::kListValue: {
      std::vector<std::string> items;
      for (const auto& item : v.list_value().values()) {
        items.push_back(PyValue(item));
      }
      if (items.size() == 1) return absl::StrCat("(", items[0], ",)");
      return absl::StrCat("(", absl::StrJoin(items, ", "), ")");
    }
    case google::protobuf::Value::kStructValue: {
      std::map<std::string, std::string> sorted;
      for (const auto& [key, value] : v.struct_value().fields()) {
        sorted[key] = PyValue(value);
      }
      std::vector<std::string> items;
      for (const auto& [key, value] : sorted) {
        items.push_back(absl::StrCat(PyString(key), ": ", value));
      }
      return absl::StrCat("{", absl::StrJoin(items, ", "), "}");
    }
    case google::protobuf::Value::KIND_NOT_SET:
      break;
  }
  return "None";
}

std::string DTypeText(v1::DType dtype) {
  absl::StatusOr<DType> d = convert::DTypeFromProto(dtype, "dtype");
  if (!d.ok()) return v1::DType_Name(dtype);
  return std::string(DTypeName(*d));
}

std::string TensorType(const v1::TensorInfo& t) {
  return absl::StrCat(DTypeText(t.dtype()), "[", absl::StrJoin(t.shape(), ", "),
                      "]");
}

std::vector<std::string> AlignRows(
    const std::vector<std::vector<std::string>>& rows,
    const std::vector<bool>& right_aligned) {
  std::vector<int> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) {
      widths[i] = std::max(widths[i], static_cast<int>(row[i].size()));
    }
  }
  std::vector<std::string> lines;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      if (i > 0) line += "  ";
      bool right = i < right_aligned.size() && right_aligned[i];
      if (right) {
        absl::StrAppend(&line, absl::StrFormat("%*s", widths[i], row[i]));
      } else if (i + 1 == row.size()) {
        line += row[i];
      } else {
        absl::StrAppend(&line, absl::StrFormat("%-*s", widths[i], row[i]));
      }
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    lines.push_back(std::move(line));
  }
  return lines;
}

void PrintNotableRegistrations(
    std::ostream& out,
    const google::protobuf::RepeatedPtrField<v1::RegistrationReport>& reports) {
  std::vector<std::vector<std::string>> rows;
  int blocked = 0;
  int replaced = 0;
  for (const v1::RegistrationReport& r : reports) {
    std::string outcome;
    if (r.outcome() == v1::OUTCOME_BLOCK) {
      outcome = "blocked";
      ++blocked;
    } else if (r.outcome() == v1::OUTCOME_REPLACE) {
      outcome = "replaced";
      ++replaced;
    } else {
      continue;
    }
    std::string path = r.path().empty() ? r.name() : r.path() + "." + r.name();
    if (r.action() == v1::REGISTRATION_ACTION_UNREGISTER) {
      path += " (unregister)";
    }
    rows.push_back({outcome, KindText(r.kind()), path, r.reason()});
  }
  for (const std::string& line : AlignRows(rows)) out << line << "\n";
  if (blocked + replaced > 0) {
    out << absl::StrFormat("%d of %s blocked, %d replaced by hooks\n", blocked,
                           Plural(reports.size(), "registration"), replaced);
  }
}

void ProgressBar::Update(uint64_t done, uint64_t total) {
  if (!enabled_) return;
  absl::Time now = absl::Now();
  absl::Duration elapsed = now - start_;
  if (elapsed <= absl::Seconds(1)) return;
  // At most ten redraws a second, but always the final state.
  if (drawn_ && now - last_draw_ < absl::Milliseconds(100) && done < total) {
    return;
  }
  last_draw_ = now;
  drawn_ = true;
  constexpr int kWidth = 30;
  double fraction = total == 0 ? 1.0
                               : std::min(1.0, static_cast<double>(done) /
                                                   static_cast<double>(total));
  int filled = static_cast<int>(fraction * kWidth);
  std::string bar;
  if (filled >= kWidth) {
    bar = std::string(kWidth, '=');
  } else {
    bar =
        std::string(filled, '=') + ">" + std::string(kWidth - filled - 1, ' ');
  }
  double rate = static_cast<double>(done) / absl::ToDoubleSeconds(elapsed);
  std::string line = absl::StrFormat(
      "[%s] %3d%%  %s/%s  %s", bar, static_cast<int>(fraction * 100),
      HumanBytes(done), HumanBytes(total), HumanRate(rate));
  // Blank out what a longer previous line left behind.
  size_t length = line.size();
  if (line.size() < last_length_) {
    line.append(last_length_ - line.size(), ' ');
  }
  last_length_ = length;
  *err_ << "\r" << line << std::flush;
}

void ProgressBar::Finish() {
  if (drawn_ && !finished_) *err_ << "\n" << std::flush;
  finished_ = true;
}

}  // namespace modelstate::cli
