#include "client/cli.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "base/signal_pipe.h"
#include "base/status_macros.h"
#include "base/sync.h"
#include "client/model_state_client.h"
#include "client/policy.h"
#include "client/safetensors_stream.h"
#include "client/subscriber.h"
#include "core/dtype.h"
#include "core/state_stream.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.pb.h"
#include "modelstate/v1/model_state_service.pb.h"
#include "proto/convert.h"
#include "service/audit_log.h"

namespace modelstate::cli {
namespace {

constexpr char kProgram[] = "modelstatectl";

// ---------------------------------------------------------------------------
// Formatting

// 203530 -> "203,530": element and byte counts are read by people.
std::string WithCommas(uint64_t n) {
  std::string digits = absl::StrCat(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

// Binary units, as sizes of tensors are powers of two more often than not:
// "8 B", "784.0 KiB", "3.1 MiB".
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

// Rates in decimal units, as network and disk throughput usually are.
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

// Attribute values as PyTorch's module repr shows them: True, None, 0.1,
// 'gelu', (3, 3).
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

// "float32[256, 784]"; a 0-dim tensor is "int64[]".
std::string TensorType(const v1::TensorInfo& t) {
  return absl::StrCat(DTypeText(t.dtype()), "[", absl::StrJoin(t.shape(), ", "),
                      "]");
}

uint64_t Numel(const google::protobuf::RepeatedField<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t extent : shape) n *= static_cast<uint64_t>(extent);
  return n;
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

// Names without a namespace live in "default" (the service's rule); human
// output always shows the full name so that it can be pasted back.
std::string FullName(const std::string& module) {
  return module.find('/') == std::string::npos ? "default/" + module : module;
}

// Left-aligned columns separated by two spaces; columns listed in
// `right_aligned` (numbers) are right-aligned. The last column is never
// padded, so lines carry no trailing blanks.
std::vector<std::string> AlignRows(
    const std::vector<std::vector<std::string>>& rows,
    const std::vector<bool>& right_aligned = {}) {
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

// ---------------------------------------------------------------------------
// Progress

enum class ProgressMode { kAuto, kAlways, kNever };

// A one-line bar on stderr for transfers that last more than a second, so
// quick transfers stay quiet and long ones show they are alive.
class ProgressBar {
 public:
  ProgressBar(std::ostream* err, bool enabled)
      : err_(err), enabled_(enabled), start_(absl::Now()) {}
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  ~ProgressBar() { Finish(); }

  void Update(uint64_t done, uint64_t total) {
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
    double fraction = total == 0
                          ? 1.0
                          : std::min(1.0, static_cast<double>(done) /
                                              static_cast<double>(total));
    int filled = static_cast<int>(fraction * kWidth);
    std::string bar;
    if (filled >= kWidth) {
      bar = std::string(kWidth, '=');
    } else {
      bar = std::string(filled, '=') + ">" +
            std::string(kWidth - filled - 1, ' ');
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

  // Ends the bar's line, if one was drawn.
  void Finish() {
    if (drawn_ && !finished_) *err_ << "\n" << std::flush;
    finished_ = true;
  }

 private:
  std::ostream* err_;
  bool enabled_;
  absl::Time start_;
  absl::Time last_draw_;
  bool drawn_ = false;
  bool finished_ = false;
  size_t last_length_ = 0;
};

// ---------------------------------------------------------------------------
// Commands and options

// What an option's value must look like; checked while parsing, so that
// handlers can convert without failing and bad values are usage errors.
enum class ValueKind { kFlag, kText, kUint, kPositive, kSeconds };

struct OptionDef {
  absl::string_view name;        // "--name"
  absl::string_view short_name;  // "-o", or empty
  ValueKind kind;
  absl::string_view value_name;  // "NAME" in the help
  absl::string_view help;
};

struct ArgDef {
  absl::string_view name;
  absl::string_view help;
};

struct Context;
using Handler = int (*)(Context&);

struct CommandDef {
  absl::string_view name;
  absl::string_view summary;
  absl::string_view description;
  std::vector<ArgDef> args;
  std::vector<OptionDef> options;
  absl::string_view example;
  Handler run;
};

const std::vector<OptionDef>& GlobalOptions() {
  static const auto* options = new std::vector<OptionDef>{
      {"--server", "", ValueKind::kText, "ADDR",
       "server address, host:port (default: $MODELSTATE_SERVER, else "
       "127.0.0.1:50051)"},
      {"--json", "", ValueKind::kFlag, "",
       "print the response as one JSON document (protobuf's JSON mapping, "
       "proto field names)"},
      {"--timeout", "", ValueKind::kSeconds, "SECONDS",
       "deadline of each unary call (default 30)"},
      {"--transfer-timeout", "", ValueKind::kSeconds, "SECONDS",
       "deadline of each state_dict transfer, get-state and load-state "
       "(default 1800)"},
      {"--progress", "", ValueKind::kText, "auto|always|never",
       "progress bar on stderr for transfers that take over 1 s (auto: only "
       "when stderr is a terminal)"},
      {"--tls-ca", "", ValueKind::kText, "FILE",
       "connect with TLS, trusting the CA certificates in FILE (PEM)"},
      {"--tls-cert", "", ValueKind::kText, "FILE",
       "client certificate (PEM) for mutual TLS; needs --tls-ca"},
      {"--tls-key", "", ValueKind::kText, "FILE",
       "the client certificate's private key (PEM)"},
      {"--token-file", "", ValueKind::kText, "FILE",
       "send the bearer token in FILE (default: $MODELSTATE_TOKEN)"},
      {"--help", "-h", ValueKind::kFlag, "", "print help and exit"},
  };
  return *options;
}

const OptionDef* FindOption(const std::vector<OptionDef>& options,
                            absl::string_view name) {
  for (const OptionDef& o : options) {
    if (o.name == name || (!o.short_name.empty() && o.short_name == name)) {
      return &o;
    }
  }
  return nullptr;
}

const std::vector<CommandDef>& Commands();

const CommandDef* FindCommand(absl::string_view name) {
  for (const CommandDef& c : Commands()) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

// The outcome of parsing a command line.
struct Parsed {
  const CommandDef* command = nullptr;
  // Long option name -> value ("" for flags); the last occurrence wins.
  std::map<std::string, std::string, std::less<>> options;
  std::vector<std::string> positionals;
  bool help = false;
  std::string error;  // The first usage error, if any.
};

absl::Status CheckValue(const OptionDef& def, const std::string& value) {
  switch (def.kind) {
    case ValueKind::kFlag:
    case ValueKind::kText:
      return absl::OkStatus();
    case ValueKind::kUint: {
      uint64_t n;
      if (absl::SimpleAtoi(value, &n) && value[0] != '-' && value[0] != '+') {
        return absl::OkStatus();
      }
      return absl::InvalidArgumentError(absl::StrCat(
          def.name, ": expected a non-negative integer, got '", value, "'"));
    }
    case ValueKind::kPositive: {
      uint64_t n;
      if (absl::SimpleAtoi(value, &n) && n > 0 && value[0] != '+') {
        return absl::OkStatus();
      }
      return absl::InvalidArgumentError(absl::StrCat(
          def.name, ": expected a positive integer, got '", value, "'"));
    }
    case ValueKind::kSeconds: {
      double s;
      if (absl::SimpleAtod(value, &s) && std::isfinite(s) && s > 0) {
        return absl::OkStatus();
      }
      return absl::InvalidArgumentError(absl::StrCat(
          def.name, ": expected a positive number of seconds, got '", value,
          "'"));
    }
  }
  return absl::OkStatus();
}

Parsed Parse(const std::vector<std::string>& args) {
  Parsed p;
  auto fail = [&p](std::string message) {
    if (p.error.empty()) p.error = std::move(message);
  };
  bool options_done = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (!options_done && a == "--") {
      options_done = true;
      continue;
    }
    if (!options_done && a.size() > 1 && a[0] == '-') {
      std::string name = a;
      std::optional<std::string> inline_value;
      if (absl::StartsWith(a, "--")) {
        size_t eq = a.find('=');
        if (eq != std::string::npos) {
          name = a.substr(0, eq);
          inline_value = a.substr(eq + 1);
        }
      }
      const OptionDef* def = FindOption(GlobalOptions(), name);
      if (def == nullptr && p.command != nullptr) {
        def = FindOption(p.command->options, name);
      }
      if (def == nullptr) {
        fail(absl::StrCat("unknown option '", name, "'"));
        continue;
      }
      std::string value;
      if (def->kind != ValueKind::kFlag) {
        if (inline_value.has_value()) {
          value = *inline_value;
        } else if (i + 1 < args.size()) {
          value = args[++i];
        } else {
          fail(absl::StrCat("option ", def->name, " needs a value (",
                            def->value_name, ")"));
          continue;
        }
        if (absl::Status s = CheckValue(*def, value); !s.ok()) {
          fail(std::string(s.message()));
          continue;
        }
      } else if (inline_value.has_value()) {
        fail(absl::StrCat("option ", def->name, " takes no value"));
        continue;
      }
      if (def->name == "--help") p.help = true;
      p.options[std::string(def->name)] = std::move(value);
      continue;
    }
    if (p.command == nullptr) {
      p.command = FindCommand(a);
      if (p.command == nullptr) {
        // Later arguments would only add confusing errors.
        fail(absl::StrCat("unknown command '", a, "'"));
        return p;
      }
      continue;
    }
    p.positionals.push_back(a);
  }
  return p;
}

// ---------------------------------------------------------------------------
// Help

std::string OptionLabel(const OptionDef& o) {
  std::string label = o.short_name.empty()
                          ? std::string(o.name)
                          : absl::StrCat(o.short_name, ", ", o.name);
  if (o.kind != ValueKind::kFlag) absl::StrAppend(&label, " ", o.value_name);
  return label;
}

// Words of `text` in lines of at most `width` characters (a longer word
// gets a line of its own).
std::vector<std::string> Wrap(absl::string_view text, size_t width) {
  std::vector<std::string> lines(1);
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!lines.back().empty() &&
        lines.back().size() + 1 + word.size() > width) {
      lines.emplace_back();
    }
    if (!lines.back().empty()) lines.back() += ' ';
    absl::StrAppend(&lines.back(), word);
  }
  return lines;
}

// Help entries: an indented label, then its text wrapped to fit 80 columns.
void PrintDefinitions(
    std::ostream& out,
    const std::vector<std::pair<std::string, std::string>>& rows) {
  size_t width = 0;
  for (const auto& [label, text] : rows) width = std::max(width, label.size());
  const size_t column = 2 + width + 2;
  const size_t room = column + 30 < 80 ? 80 - column : 30;
  for (const auto& [label, text] : rows) {
    std::vector<std::string> lines = Wrap(text, room);
    out << "  " << absl::StrFormat("%-*s", static_cast<int>(width), label)
        << "  " << lines[0] << "\n";
    for (size_t i = 1; i < lines.size(); ++i) {
      out << std::string(column, ' ') << lines[i] << "\n";
    }
  }
}

void PrintOptionTable(std::ostream& out,
                      const std::vector<OptionDef>& options) {
  std::vector<std::pair<std::string, std::string>> rows;
  for (const OptionDef& o : options) {
    rows.emplace_back(OptionLabel(o), std::string(o.help));
  }
  PrintDefinitions(out, rows);
}

std::string UsageLine(const CommandDef& c) {
  std::string line =
      absl::StrCat("Usage: ", kProgram, " [global options] ", c.name);
  for (const ArgDef& a : c.args) absl::StrAppend(&line, " ", a.name);
  if (!c.options.empty()) absl::StrAppend(&line, " [options]");
  return line;
}

void PrintCommandHelp(std::ostream& out, const CommandDef& c) {
  out << UsageLine(c) << "\n\n";
  for (const std::string& line : Wrap(c.description, 78)) out << line << "\n";
  if (!c.args.empty()) {
    out << "\nArguments:\n";
    std::vector<std::pair<std::string, std::string>> rows;
    for (const ArgDef& a : c.args) {
      rows.emplace_back(std::string(a.name), std::string(a.help));
    }
    PrintDefinitions(out, rows);
  }
  if (!c.options.empty()) {
    out << "\nOptions:\n";
    PrintOptionTable(out, c.options);
  }
  out << "\nGlobal options (before or after the command):\n";
  PrintOptionTable(out, GlobalOptions());
  out << "\nExample:\n  " << c.example << "\n";
}

void PrintGlobalHelp(std::ostream& out) {
  out << "Usage: " << kProgram
      << " [global options] <command> [arguments] [options]\n\n"
      << "The command-line client of modelstate-server, which hosts "
         "PyTorch-style\nmodule trees. Module names are namespace/name or "
         "name (namespace \"default\").\n\nCommands:\n";
  std::vector<std::pair<std::string, std::string>> rows;
  for (const CommandDef& c : Commands()) {
    rows.emplace_back(std::string(c.name), std::string(c.summary));
  }
  PrintDefinitions(out, rows);
  out << "\nGlobal options:\n";
  PrintOptionTable(out, GlobalOptions());
  out << "\nExit status: 0 on success, 1 on an error reported by the server "
         "or a file,\n2 on a usage error.\n"
      << "Run '" << kProgram
      << " COMMAND --help' for a command's arguments "
         "and options.\n";
}

// ---------------------------------------------------------------------------
// Running a command

struct Context {
  Context(const Environment& env, const CommandDef& command,
          const Parsed& parsed)
      : env(env), command(command), parsed(parsed) {}

  const Environment& env;
  const CommandDef& command;
  const Parsed& parsed;
  std::string server;
  bool json = false;
  absl::Duration timeout = absl::Seconds(30);
  // Streams take as long as their bytes need, so they get their own.
  absl::Duration transfer_timeout = absl::Minutes(30);
  ProgressMode progress = ProgressMode::kAuto;
  std::unique_ptr<client::ModelStateClient> client;

  std::ostream& out() { return *env.out; }
  std::ostream& err() { return *env.err; }

  bool Has(absl::string_view option) const {
    return parsed.options.find(option) != parsed.options.end();
  }
  std::string Get(absl::string_view option, std::string fallback = "") const {
    auto it = parsed.options.find(option);
    return it == parsed.options.end() ? fallback : it->second;
  }
  // Options of kind kUint / kPositive were checked by the parser.
  uint64_t GetUint(absl::string_view option, uint64_t fallback) const {
    uint64_t n = fallback;
    if (Has(option)) (void)absl::SimpleAtoi(Get(option), &n);
    return n;
  }
  const std::string& Arg(size_t i) const { return parsed.positionals[i]; }

  bool ProgressEnabled() const {
    switch (progress) {
      case ProgressMode::kAlways:
        return true;
      case ProgressMode::kNever:
        return false;
      case ProgressMode::kAuto:
        return env.err_is_tty;
    }
    return false;
  }

  // TLS and bearer token from the global options.
  absl::StatusOr<client::ClientOptions> ConnectionOptions() const {
    client::ClientOptions options;
    options.timeout = timeout;
    options.transfer_timeout = transfer_timeout;
    auto read = [&](absl::string_view option) -> absl::StatusOr<std::string> {
      absl::StatusOr<std::string> text = ReadFile(Get(option));
      if (!text.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(option, ": ", text.status().message()));
      }
      return text;
    };
    if (Has("--tls-cert") != Has("--tls-key")) {
      return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
    }
    if (Has("--tls-ca")) {
      grpc::SslCredentialsOptions ssl;
      MODELSTATE_ASSIGN_OR_RETURN(ssl.pem_root_certs, read("--tls-ca"));
      if (Has("--tls-cert")) {
        MODELSTATE_ASSIGN_OR_RETURN(ssl.pem_cert_chain, read("--tls-cert"));
        MODELSTATE_ASSIGN_OR_RETURN(ssl.pem_private_key, read("--tls-key"));
      }
      options.credentials = grpc::SslCredentials(ssl);
    } else if (Has("--tls-cert")) {
      return absl::InvalidArgumentError("--tls-cert needs --tls-ca");
    }
    if (Has("--token-file")) {
      MODELSTATE_ASSIGN_OR_RETURN(std::string token, read("--token-file"));
      options.bearer_token = std::string(absl::StripAsciiWhitespace(token));
    } else {
      options.bearer_token = env.default_token;
    }
    return options;
  }

  absl::StatusOr<client::ModelStateClient*> Client() {
    if (client == nullptr) {
      MODELSTATE_ASSIGN_OR_RETURN(client::ClientOptions options,
                                  ConnectionOptions());
      absl::StatusOr<std::unique_ptr<client::ModelStateClient>> c =
          client::ModelStateClient::Connect(server, std::move(options));
      if (!c.ok()) return c.status();
      client = std::move(*c);
    }
    return client.get();
  }

  int UsageError(absl::string_view message) {
    err() << "error: " << command.name << ": " << message << "\n"
          << "see " << kProgram << " " << command.name << " --help\n";
    return kExitUsage;
  }

  int Fail(const absl::Status& status) {
    err() << "error: " << absl::StatusCodeToString(status.code()) << ": "
          << status.message() << "\n";
    return kExitError;
  }

  int PrintJson(const google::protobuf::Message& message) {
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    std::string text;
    auto status =
        google::protobuf::util::MessageToJsonString(message, &text, options);
    if (!status.ok()) {
      return Fail(absl::InternalError(
          absl::StrCat("could not print the response as JSON: ",
                       std::string(status.message()))));
    }
    out() << text << "\n";
    return kExitOk;
  }
};

// Like MODELSTATE_ASSIGN_OR_RETURN, for handlers: an error is printed and
// becomes the exit status.
#define MODELSTATE_CLI_ASSIGN_OR_FAIL(lhs, ctx, expr)       \
  auto lhs##_or = (expr);                                   \
  if (!lhs##_or.ok()) return (ctx).Fail(lhs##_or.status()); \
  auto lhs = std::move(*lhs##_or)

std::string FirstLine(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  // A directory opens as a stream but reads as nothing.
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    int error = errno;
    return absl::Status(absl::ErrnoToStatusCode(error),
                        absl::StrCat(path, ": ", std::strerror(error)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat(path, ": could not read the file"));
  }
  return text.str();
}

// Lines for the registrations that hooks blocked or replaced (the kept ones
// are the normal case and would drown them), and a count line.
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

struct Totals {
  uint64_t parameters = 0;
  uint64_t parameter_elements = 0;
  uint64_t parameter_bytes = 0;
  uint64_t buffers = 0;
  uint64_t buffer_bytes = 0;
};

// Shared submodules (same_as) are the same tensors: counted once.
void Accumulate(const v1::ModuleInfo& info, Totals* totals) {
  for (const v1::EntryInfo& e : info.parameters()) {
    if (!e.has_tensor()) continue;
    ++totals->parameters;
    totals->parameter_elements += Numel(e.tensor().shape());
    totals->parameter_bytes += e.tensor().nbytes();
  }
  for (const v1::EntryInfo& e : info.buffers()) {
    if (!e.has_tensor()) continue;
    ++totals->buffers;
    totals->buffer_bytes += e.tensor().nbytes();
  }
  for (const v1::ChildInfo& c : info.children()) {
    if (c.has_module()) Accumulate(c.module(), totals);
  }
}

// --------------------------------------------------------------------- build

int RunBuild(Context& c) {
  const std::string& path = c.Arg(0);
  MODELSTATE_CLI_ASSIGN_OR_FAIL(text, c, ReadFile(path));
  // The parser's message continues with a snippet of the input over
  // several lines; its first line says what is wrong.
  auto parse_error = [&](const auto& status) {
    return c.Fail(absl::InvalidArgumentError(
        absl::StrCat(path, ": ", FirstLine(std::string(status.message())))));
  };
  // A BuildModuleRequest has a "spec" key; a bare ModuleSpec never does.
  google::protobuf::Struct probe;
  if (auto s = google::protobuf::util::JsonStringToMessage(text, &probe);
      !s.ok()) {
    return parse_error(s);
  }
  v1::BuildModuleRequest request;
  google::protobuf::Message* target =
      probe.fields().count("spec") > 0
          ? static_cast<google::protobuf::Message*>(&request)
          : request.mutable_spec();
  if (auto s = google::protobuf::util::JsonStringToMessage(text, target);
      !s.ok()) {
    return parse_error(s);
  }
  if (c.Has("--name")) {
    request.set_module(c.Get("--name"));
  } else if (request.module().empty()) {
    request.set_module(std::filesystem::path(path).stem().string());
  }
  if (c.Has("--seed")) request.set_seed(c.GetUint("--seed", 0));
  if (c.Has("--device")) request.set_device(c.Get("--device"));
  if (c.Has("--dtype")) request.set_dtype(c.Get("--dtype"));
  if (c.Has("--all-or-nothing")) request.set_all_or_nothing(true);

  MODELSTATE_CLI_ASSIGN_OR_FAIL(rpc, c, c.Client());
  MODELSTATE_CLI_ASSIGN_OR_FAIL(response, c, rpc->BuildModule(request));
  if (c.json) return c.PrintJson(response);
  c.out() << FormatBuildResponse(response);
  return kExitOk;
}

// ------------------------------------------------------------------------ ls

int RunList(Context& c) {
  uint64_t limit = c.GetUint("--limit", 0);
  v1::ListModulesRequest request;
  request.set_namespace_(c.Get("--namespace"));
  uint64_t page_size = c.GetUint("--page-size", 0);
  if (page_size == 0 && limit > 0) page_size = std::min<uint64_t>(limit, 1000);
  request.set_page_size(
      static_cast<int32_t>(std::min<uint64_t>(page_size, 1000)));
  MODELSTATE_CLI_ASSIGN_OR_FAIL(rpc, c, c.Client());
  v1::ListModulesResponse all;
  while (limit == 0 || static_cast<uint64_t>(all.modules_size()) < limit) {
    MODELSTATE_CLI_ASSIGN_OR_FAIL(page, c, rpc->ListModules(request));
    for (v1::ModuleSummary& m : *page.mutable_modules()) {
      if (limit > 0 && static_cast<uint64_t>(all.modules_size()) >= limit)
        break;
      *all.add_modules() = std::move(m);
    }
    if (page.next_page_token().empty()) break;
    request.set_page_token(page.next_page_token());
  }
  if (c.json) return c.PrintJson(all);
  if (all.modules().empty()) {
    c.out() << "no modules\n";
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {
      {"MODULE", "TYPE", "PARAMETERS", "BYTES", "DEVICES"}};
  for (const v1::ModuleSummary& m : all.modules()) {
    rows.push_back({m.module(), m.type(), WithCommas(m.num_parameters()),
                    HumanBytes(m.total_bytes()),
                    absl::StrJoin(m.devices(), ",")});
  }
  for (const std::string& line : AlignRows(rows, {false, false, true, true})) {
    c.out() << line << "\n";
  }
  return kExitOk;
}

// ------------------------------------------------------------------ describe

std::string ModuleLine(const std::string& label, const v1::ModuleInfo& info) {
  // A protobuf map has no order; sorted names keep the output stable.
  std::map<std::string, std::string> attributes;
  for (const auto& [key, value] : info.attributes()) {
    attributes[key] = PyValue(value);
  }
  std::vector<std::string> items;
  for (const auto& [key, value] : attributes) {
    items.push_back(absl::StrCat(key, "=", value));
  }
  return absl::StrCat(label, ": ", info.type(), "(", absl::StrJoin(items, ", "),
                      ")", info.training() ? "" : " [eval]");
}

void DescribeTree(const v1::ModuleInfo& info, const std::string& label,
                  int depth, std::vector<std::string>* lines) {
  std::string indent(2 * depth, ' ');
  lines->push_back(indent + ModuleLine(label, info));
  std::vector<std::vector<std::string>> rows;
  auto add_entry = [&](const v1::EntryInfo& e, bool buffer) {
    std::vector<std::string> row = {absl::StrCat(indent, "  ", e.name())};
    if (!e.has_tensor()) {
      row.push_back("None");
      rows.push_back(std::move(row));
      return;
    }
    const v1::TensorInfo& t = e.tensor();
    row.push_back(TensorType(t));
    row.push_back(t.device());
    row.push_back(HumanBytes(t.nbytes()));
    std::vector<std::string> flags;
    if (buffer) {
      flags.push_back("buffer");
      if (!t.persistent()) flags.push_back("non-persistent");
    } else if (t.requires_grad()) {
      flags.push_back("requires_grad");
    }
    if (!t.sha256().empty()) flags.push_back("sha256:" + t.sha256());
    row.push_back(absl::StrJoin(flags, "  "));
    rows.push_back(std::move(row));
  };
  for (const v1::EntryInfo& e : info.parameters()) add_entry(e, false);
  for (const v1::EntryInfo& e : info.buffers()) add_entry(e, true);
  for (std::string& line : AlignRows(rows)) lines->push_back(std::move(line));
  for (const v1::ChildInfo& child : info.children()) {
    if (!child.same_as().empty()) {
      lines->push_back(absl::StrCat(indent, "  ", child.name(),
                                    ": -> same module as ", child.same_as()));
    } else if (child.is_none() || !child.has_module()) {
      lines->push_back(absl::StrCat(indent, "  ", child.name(), ": None"));
    } else {
      DescribeTree(child.module(), child.name(), depth + 1, lines);
    }
  }
}

int RunDescribe(Context& c) {
  v1::GetModuleRequest request;
  request.set_module(c.Arg(0));
  request.set_path(c.Get("--path"));
  request.set_with_hashes(c.Has("--hashes"));
  MODELSTATE_CLI_ASSIGN_OR_FAIL(rpc, c, c.Client());
  MODELSTATE_CLI_ASSIGN_OR_FAIL(response, c, rpc->GetModule(request));
  if (c.json) return c.PrintJson(response);
  std::string label =
      request.path().empty()
          ? response.module()
          : absl::StrCat(response.module(), " ", request.path());
  std::vector<std::string> lines;
  DescribeTree(response.info(), label, 0, &lines);
  for (const std::string& line : lines) c.out() << line << "\n";
  c.out() << "total: " << HumanBytes(response.total_bytes()) << " ("
          << WithCommas(response.total_bytes()) << " bytes)\n"
          << "server devices: "
          << absl::StrJoin(response.server_devices(), ", ") << "\n";
  return kExitOk;
}

// ------------------------------------------------------------------------ rm

int RunRemove(Context& c) {
  MODELSTATE_CLI_ASSIGN_OR_FAIL(rpc, c, c.Client());
  if (absl::Status s = rpc->DeleteModule(c.Arg(0)); !s.ok()) {
    return c.Fail(s);
  }
  if (c.json) return c.PrintJson(v1::DeleteModuleResponse());
  c.out() << "deleted " << FullName(c.Arg(0)) << "\n";
  return kExitOk;
}

// ----------------------------------------------------------------- get-state

// Remembers what went through, for the summary line.
class CountingSink : public client::StateDictSink {
 public:
  explicit CountingSink(client::StateDictSink* inner) : inner_(inner) {}
  absl::Status Begin(const StateDictLayout& layout) override {
    layout_ = layout;
    return inner_->Begin(layout);
  }
  absl::Status Append(absl::string_view bytes) override {
    bytes_ += bytes.size();
    return inner_->Append(bytes);
  }
  absl::Status Finish() override { return inner_->Finish(); }
  const StateDictLayout& layout() const { return layout_; }
  uint64_t bytes() const { return bytes_; }

 private:
  client::StateDictSink* inner_;
  StateDictLayout layout_;
  uint64_t bytes_ = 0;
};

std::string TransferSummary(uint64_t bytes, absl::Duration elapsed) {
  double seconds = std::max(absl::ToDoubleSeconds(elapsed), 1e-6);
  return absl::StrFormat("in %.3f s (%.1f MB/s)", seconds,
                         static_cast<double>(bytes) / seconds / 1e6);
}

// Chunk sizes are given in KiB; beyond 4 GiB they would not fit the wire's
// uint32.
absl::StatusOr<uint32_t> ChunkBytes(const Context& c, uint32_t fallback) {
  if (!c.Has("--chunk-kib")) return fallback;
  uint64_t kib = c.GetUint("--chunk-kib", 0);
  if (kib > (uint64_t{UINT32_MAX} >> 10)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chunk-kib: ", kib, " is too large"));
  }
  return static_cast<uint32_t>(kib << 10);
}

int RunGetState(Context& c) {
  if (!c.Has("--output")) return c.UsageError("missing option -o FILE");
  std::string file = c.Get("--output");
  client::GetStateDictOptions options;
  options.key_prefix = c.Get("--prefix");
  options.key_glob = c.Get("--glob");
  if (c.Has("--dtype")) {
    MODELSTATE_CLI_ASSIGN_OR_FAIL(
        dtype, c,
        convert::ParseDTypeField(c.Get("--dtype"), "dtype", std::nullopt));
    options.target_dtype = dtype;
  }
  MODELSTATE_CLI_ASSIGN_OR_FAIL(chunk, c, ChunkBytes(c, 0));
  options.chunk_bytes = chunk;
  ProgressBar bar(&c.err(), c.ProgressEnabled());
  options.progress = [&bar](uint64_t done, uint64_t total) {
    bar.Update(done, total);
  };
  MODELSTATE_CLI_ASSIGN_OR_FAIL(rpc, c, c.Client());
  client::SafetensorsSink file_sink(file);
  CountingSink sink(&file_sink);
  absl::Time start = absl::Now();
  absl::Status status = rpc->GetStateDict(c.Arg(0), options, sink);
  absl::Duration elapsed = absl::Now() - start;
  bar.Finish();
  if (!status.ok()) return c.Fail(status);
  if (c.json) {
    v1::StateDictHeader header;
    convert::LayoutToHeader(sink.layout(), &header);
    return c.PrintJson(header);
  }
  c.out() << absl::StrFormat("wrote %s, %s bytes to %s %s\n",
                             Plural(sink.layout().entries.size(), "tensor"),
                             WithCommas(sink.bytes()), file,
                             TransferSummary(sink.bytes(), elapsed));
  return kExitOk;
}

// ---------------------------------------------------------------- load-state

int RunLoadState(Context& c) {
  if (c.Has("--strict") && c.Has("--no-strict")) {
    return c.UsageError("--strict and --no-strict exclude each other");
  }
  const std::string& file = c.Arg(1);
  client::LoadStateDictOptions options;
  options.load.strict = !c.Has("--no-strict");
  options.load.atomic = !c.Has("--no-atomic");
  options.load.assign = c.Has("--assign");
  MODELSTATE_CLI_ASSIGN_OR_FAIL(chunk, c, ChunkBytes(c, options.chunk_bytes));
  if (chunk == 0) return c.UsageError("--chunk-kib must be positive");
  options.chunk_bytes = chunk;
  MODELSTATE_CLI_ASSIGN_OR_FAIL(source, c,
                                client::SafetensorsSource::Open(file));
  ProgressBar bar(&c.err(), c.ProgressEnabled());
  options.progress = [&bar](uint64_t done, uint64_t total) {
    bar.Update(done, total);
  };
  MODELSTATE_CLI_ASSIGN_OR_FAIL(rpc, c, c.Client());
  absl::Time start = absl::Now();
  absl::StatusOr<v1::LoadStateDictResponse> response =
      rpc->LoadStateDict(c.Arg(0), *source, options);
  absl::Duration elapsed = absl::Now() - start;
  bar.Finish();
  if (!response.ok()) return c.Fail(response.status());
  if (c.json) return c.PrintJson(*response);
  const StateDictLayout& layout = source->layout();
  c.out() << response->repr() << "\n";
  PrintNotableRegistrations(c.out(), response->registrations());
  c.out() << absl::StrFormat("streamed %s, %s bytes from %s %s\n",
                             Plural(layout.entries.size(), "tensor"),
                             WithCommas(layout.total_bytes), file,
                             TransferSummary(layout.total_bytes, elapsed));
  return kExitOk;
}

// ------------------------------------------------------------------------ to

void CountTensors(const v1::ModuleInfo& info,
                  std::map<std::string, int>* dtypes,
                  std::map<std::string, int>* devices) {
  auto count = [&](const v1::EntryInfo& e) {
    if (!e.has_tensor()) return;
    ++(*dtypes)[DTypeText(e.tensor().dtype())];
    ++(*devices)[e.tensor().device()];
  };
  for (const v1::EntryInfo& e : info.parameters()) count(e);
  for (const v1::EntryInfo& e : info.buffers()) count(e);
  for (const v1::ChildInfo& child : info.children()) {
    if (child.has_module()) CountTensors(child.module(), dtypes, devices);
  }
}

std::string CountList(const std::map<std::string, int>& counts) {
  std::vector<std::string> items;
  for (const auto& [name, n] : counts) {
    items.push_back(absl::StrCat(name, " (", Plural(n, "tensor"), ")"));
  }
  return items.empty() ? "none" : absl::StrJoin(items, ", ");
}

int RunTo(Context& c) {
  if (!c.Has("--device") && !c.Has("--dtype")) {
    return c.UsageError("give --device, --dtype or both");
  }
  v1::MoveModuleRequest request;
  request.set_module(c.Arg(0));
  request.set_device(c.Get("--device"));
  request.set_dtype(c.Get("--dtype"));
  MODELSTATE_CLI_ASSIGN_OR_FAIL(rpc, c, c.Client());
  MODELSTATE_CLI_ASSIGN_OR_FAIL(response, c, rpc->MoveModule(request));
  if (c.json) return c.PrintJson(response);
  std::map<std::string, int> dtypes;
  std::map<std::string, int> devices;
  CountTensors(response.info(), &dtypes, &devices);
  c.out() << "moved " << FullName(c.Arg(0)) << "\n"
          << "dtypes: " << CountList(dtypes) << "\n"
          << "devices: " << CountList(devices) << "\n";
  return kExitOk;
}

// ------------------------------------------------------------------ forward

// Runs the module on the tensors input0, input1, ... of --input (a gap is
// None) and writes output0, output1, ... to --output.
int RunForward(Context& c) {
  if (c.Has("--train") && c.Has("--eval")) {
    return c.UsageError("give --train or --eval, not both");
  }
  if (!c.Has("--input") || !c.Has("--output")) {
    return c.UsageError("--input and --output are required");
  }
  v1::ForwardRequest request;
  request.set_module(c.Arg(0));
  request.set_path(c.Get("--path"));
  request.set_seed(c.GetUint("--seed", 0));
  if (c.Has("--train")) request.set_training(true);
  if (c.Has("--eval")) request.set_training(false);
  MODELSTATE_CLI_ASSIGN_OR_FAIL(inputs, c,
                                ReadSafetensorsFile(c.Get("--input")));
  int count = 0;
  for (const auto& item : inputs.tensors) {
    int index = -1;
    absl::string_view key = item.key;
    if (!absl::ConsumePrefix(&key, "input") || !absl::SimpleAtoi(key, &index) ||
        index < 0 || index > 64) {
      return c.UsageError(absl::StrCat("--input: tensor '", item.key,
                                       "' is not named input0 .. input64"));
    }
    count = std::max(count, index + 1);
  }
  for (int i = 0; i < count; ++i) {
    v1::TensorProto* proto = request.add_inputs();
    const Tensor* t = inputs.tensors.Find(absl::StrCat("input", i));
    if (t == nullptr) continue;  // None
    if (absl::Status s = convert::TensorToProto(*t, proto); !s.ok()) {
      return c.Fail(s);
    }
  }
  MODELSTATE_CLI_ASSIGN_OR_FAIL(rpc, c, c.Client());
  MODELSTATE_CLI_ASSIGN_OR_FAIL(response, c, rpc->Forward(request));
  StateDict outputs;
  for (int i = 0; i < response.outputs_size(); ++i) {
    v1::TensorProto proto = response.outputs(i);
    if (proto.dtype() == v1::DTYPE_UNSPECIFIED) continue;  // None
    MODELSTATE_CLI_ASSIGN_OR_FAIL(
        t, c,
        convert::TensorFromProto(&proto, absl::StrCat("outputs[", i, "]"),
                                 std::numeric_limits<uint64_t>::max()));
    outputs.tensors.Set(absl::StrCat("output", i), std::move(t));
  }
  if (absl::Status s = WriteSafetensorsFile(c.Get("--output"), outputs);
      !s.ok()) {
    return c.Fail(s);
  }
  if (c.json) return c.PrintJson(response);
  c.out() << "wrote " << outputs.tensors.size() << " outputs to "
          << c.Get("--output") << "\n";
  for (const auto& item : outputs.tensors) {
    c.out() << "  " << item.key << ": " << item.value.DebugString() << "\n";
  }
  return kExitOk;
}

// --------------------------------------------------------------- train, eval

int SetTraining(Context& c, bool training) {
  MODELSTATE_CLI_ASSIGN_OR_FAIL(rpc, c, c.Client());
  if (absl::Status s = rpc->SetTraining(c.Arg(0), training); !s.ok()) {
    return c.Fail(s);
  }
  if (c.json) return c.PrintJson(v1::SetTrainingResponse());
  c.out() << FullName(c.Arg(0)) << ": " << (training ? "training" : "eval")
          << " mode\n";
  return kExitOk;
}

int RunTrain(Context& c) { return SetTraining(c, true); }
int RunEval(Context& c) { return SetTraining(c, false); }

// -------------------------------------------------------------------- health

int RunHashToken(Context& c) {
  absl::StatusOr<std::string> token = ReadFile(c.Arg(0));
  if (!token.ok()) return c.Fail(token.status());
  absl::string_view stripped = absl::StripAsciiWhitespace(*token);
  if (stripped.empty()) {
    return c.Fail(absl::InvalidArgumentError(
        absl::StrCat(c.Arg(0), ": the token is empty")));
  }
  c.out() << Sha256Hex(stripped) << "\n";
  return kExitOk;
}

int RunHealth(Context& c) {
  MODELSTATE_CLI_ASSIGN_OR_FAIL(rpc, c, c.Client());
  if (absl::Status s = rpc->Health(); !s.ok()) return c.Fail(s);
  if (c.json) {
    grpc::health::v1::HealthCheckResponse response;
    response.set_status(grpc::health::v1::HealthCheckResponse::SERVING);
    return c.PrintJson(response);
  }
  c.out() << "SERVING\n";
  return kExitOk;
}

int RunDevices(Context& c) {
  MODELSTATE_CLI_ASSIGN_OR_FAIL(rpc, c, c.Client());
  MODELSTATE_CLI_ASSIGN_OR_FAIL(response, c, rpc->ListDevices());
  if (c.json) return c.PrintJson(response);
  std::vector<std::vector<std::string>> rows = {
      {"DEVICE", "TOTAL", "FREE", "DESCRIPTION"}};
  for (const v1::DeviceInfo& d : response.devices()) {
    const bool has_memory = d.total_bytes() > 0;
    rows.push_back({d.device(), has_memory ? HumanBytes(d.total_bytes()) : "-",
                    has_memory ? HumanBytes(d.free_bytes()) : "-",
                    d.description()});
  }
  for (const std::string& line : AlignRows(rows, {false, true, true, false})) {
    c.out() << line << "\n";
  }
  return kExitOk;
}

// ----------------------------------------------------------------- subscribe

// The subscription from --policy's file, then the command's options.
absl::StatusOr<v1::Subscription> SubscriptionFromOptions(
    Context& c, const client::Policy* policy) {
  v1::Subscription s;
  if (policy != nullptr) s = policy->subscription();
  if (c.Has("--name")) s.set_name(c.Get("--name"));
  if (s.name().empty()) {
    return absl::InvalidArgumentError("--name: a subscriber name is required");
  }
  if (c.Has("--mode")) {
    std::string mode = c.Get("--mode");
    if (mode == "intercept") {
      s.set_mode(v1::Subscription::MODE_INTERCEPT);
    } else if (mode == "observe") {
      s.set_mode(v1::Subscription::MODE_OBSERVE);
    } else if (mode == "dry-run") {
      s.set_mode(v1::Subscription::MODE_DRY_RUN);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--mode: expected intercept, observe or dry-run, got '", mode, "'"));
    }
  }
  if (c.Has("--priority")) {
    int priority = 0;
    if (!absl::SimpleAtoi(c.Get("--priority"), &priority)) {
      return absl::InvalidArgumentError("--priority: expected an integer");
    }
    s.set_priority(priority);
  }
  if (c.Has("--timeout-ms")) {
    s.set_timeout_ms(static_cast<uint32_t>(c.GetUint("--timeout-ms", 10000)));
  }
  if (c.Has("--fail-open")) s.set_failure_policy(v1::Subscription::FAIL_OPEN);
  if (c.Has("--kinds")) {
    s.clear_kinds();
    for (absl::string_view k : absl::StrSplit(c.Get("--kinds"), ',')) {
      if (k == "parameter") {
        s.add_kinds(v1::ENTRY_KIND_PARAMETER);
      } else if (k == "buffer") {
        s.add_kinds(v1::ENTRY_KIND_BUFFER);
      } else if (k == "module") {
        s.add_kinds(v1::ENTRY_KIND_MODULE);
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "--kinds: '", k, "' is not parameter, buffer or module"));
      }
    }
  }
  if (c.Has("--namespace")) s.add_namespaces(c.Get("--namespace"));
  if (c.Has("--type")) s.set_module_type_glob(c.Get("--type"));
  if (c.Has("--name-glob")) s.set_name_glob(c.Get("--name-glob"));
  if (c.Has("--include-data")) s.set_include_data(true);
  return s;
}

// Asks a person at the terminal. Empty line or "a": approve; "r [reason]":
// reject; "cast DTYPE": modify to DTYPE; "freeze": requires_grad false.
v1::HookAnswer AskPerson(Context& c, std::istream& in,
                         const v1::HookEventProto& event) {
  v1::HookAnswer answer;
  answer.set_event_id(event.event_id());
  answer.set_verdict(v1::HookAnswer::APPROVE);
  while (true) {
    c.out() << client::DescribeEvent(event)
            << "\n  [a]pprove, [r]eject [reason], cast DTYPE, freeze? "
            << std::flush;
    std::string line;
    if (!std::getline(in, line)) return answer;  // no more input: approve
    std::vector<std::string> words =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (words.empty() || words[0] == "a" || words[0] == "approve")
      return answer;
    if (words[0] == "r" || words[0] == "reject") {
      answer.set_verdict(v1::HookAnswer::REJECT);
      size_t space = line.find(' ');
      answer.set_reason(space == std::string::npos
                            ? "rejected at the terminal"
                            : std::string(absl::StripAsciiWhitespace(
                                  line.substr(space + 1))));
      return answer;
    }
    if (words[0] == "cast" && words.size() == 2) {
      absl::StatusOr<DType> d = ParseDType(words[1]);
      if (d.ok()) {
        answer.set_verdict(v1::HookAnswer::MODIFY);
        answer.mutable_transform()->set_cast(convert::DTypeToProto(*d));
        answer.set_reason("cast at the terminal");
        return answer;
      }
    }
    if (words[0] == "freeze") {
      answer.set_verdict(v1::HookAnswer::MODIFY);
      answer.mutable_transform()->set_requires_grad(false);
      answer.set_reason("frozen at the terminal");
      return answer;
    }
    c.out() << "  ? not understood\n";
  }
}

int RunSubscribe(Context& c) {
  if (c.Has("--policy") == c.Has("--interactive")) {
    return c.UsageError("give exactly one of --policy FILE and --interactive");
  }
  std::optional<client::Policy> policy;
  if (c.Has("--policy")) {
    MODELSTATE_CLI_ASSIGN_OR_FAIL(text, c, ReadFile(c.Get("--policy")));
    absl::StatusOr<client::Policy> parsed = client::Policy::FromJson(text);
    if (!parsed.ok()) {
      return c.Fail(absl::InvalidArgumentError(
          absl::StrCat(c.Get("--policy"), ": ", parsed.status().message())));
    }
    policy = *std::move(parsed);
  }
  MODELSTATE_CLI_ASSIGN_OR_FAIL(
      subscription, c, SubscriptionFromOptions(c, policy ? &*policy : nullptr));
  if (!policy.has_value() && subscription.timeout_ms() == 0) {
    subscription.set_timeout_ms(60000);  // a person needs time
  }
  // SIGINT / SIGTERM end the subscription cleanly.
  if (absl::Status s = InstallSignalPipe({SIGINT, SIGTERM}); !s.ok()) {
    return c.Fail(s);
  }
  MODELSTATE_CLI_ASSIGN_OR_FAIL(rpc, c, c.Client());
  Mutex out_mu;
  auto handler = [&](const v1::HookEventProto& event) {
    if (policy.has_value()) {
      std::string line;
      v1::HookAnswer answer = policy->Decide(event, &line);
      if (!line.empty()) {
        MutexLock lock(&out_mu);
        c.out() << (event.is_outcome()
                        ? absl::StrCat(line, " [outcome ",
                                       v1::Outcome_Name(event.outcome()), "]")
                        : line)
                << std::endl;
      }
      return answer;
    }
    MutexLock lock(&out_mu);
    if (event.is_outcome()) {
      c.out() << client::DescribeEvent(event) << " -> "
              << v1::Outcome_Name(event.outcome()) << std::endl;
      return v1::HookAnswer();
    }
    return AskPerson(c, std::cin, event);
  };
  MODELSTATE_CLI_ASSIGN_OR_FAIL(
      subscriber, c, client::Subscriber::Start(*rpc, subscription, handler));
  {
    MutexLock lock(&out_mu);
    c.out() << "subscribed as " << subscription.name() << " (id "
            << subscriber->id() << ")" << std::endl;
  }
  std::thread waiter([&] {
    WaitForSignal();
    subscriber->Stop();
  });
  absl::Status end = subscriber->Wait();
  // The stream ended on its own (server shutdown, replaced): wake the
  // waiter thread so it can be joined.
  NotifySignalWaiter(SIGTERM);
  waiter.join();
  if (!end.ok() && end.code() != absl::StatusCode::kCancelled)
    return c.Fail(end);
  return kExitOk;
}

// --------------------------------------------------------------------- audit

absl::StatusOr<v1::AuditFilter> AuditFilterFromOptions(Context& c) {
  v1::AuditFilter f;
  f.set_since(c.Get("--since"));
  f.set_until(c.Get("--until"));
  f.set_namespace_(c.Get("--namespace"));
  f.set_module(c.Get("--module"));
  f.set_identity(c.Get("--identity"));
  f.set_outcome(c.Get("--outcome"));
  f.set_type(c.Get("--type"));
  return f;
}

void PrintAuditRecord(Context& c, const v1::AuditRecordProto& r) {
  if (c.json) {
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    std::string text;
    (void)google::protobuf::util::MessageToJsonString(r, &text, options);
    c.out() << text << std::endl;
    return;
  }
  std::string module =
      r.module().empty() ? "" : absl::StrCat(r.namespace_(), "/", r.module());
  c.out() << absl::StrFormat(
                 "%6d  %s  %-15s %-8s %-20s %s  %s", r.seq(), r.time(),
                 r.type(), r.outcome().empty() ? "-" : r.outcome(), module,
                 r.identity().empty() ? "-" : r.identity(), r.details_json())
          << std::endl;
}

int RunAudit(Context& c) {
  const std::string& what = c.Arg(0);
  if (what == "verify") {
    if (c.Has("--file")) {
      MODELSTATE_CLI_ASSIGN_OR_FAIL(v, c, AuditLog::Verify(c.Get("--file")));
      if (c.json) {
        v1::VerifyAuditResponse r;
        r.set_records(v.records);
        r.set_ok(v.ok);
        r.set_broken_seq(v.broken_seq);
        r.set_broken_line(v.broken_line);
        r.set_problem(v.problem);
        c.PrintJson(r);
      } else if (v.ok) {
        c.out() << "ok: " << v.records << " records, the chain is intact\n";
      } else {
        c.out() << "BROKEN at record " << v.broken_seq << " (line "
                << v.broken_line << "): " << v.problem << "\n";
      }
      return v.ok ? kExitOk : kExitError;
    }
    MODELSTATE_CLI_ASSIGN_OR_FAIL(rpc, c, c.Client());
    std::unique_ptr<grpc::ClientContext> context = rpc->NewContext(c.timeout);
    v1::VerifyAuditRequest request;
    v1::VerifyAuditResponse response;
    absl::Status status = convert::FromGrpcStatus(
        rpc->stub().VerifyAudit(context.get(), request, &response));
    if (!status.ok()) return c.Fail(status);
    if (c.json) {
      c.PrintJson(response);
    } else if (response.ok()) {
      c.out() << "ok: " << response.records()
              << " records, the chain is intact\n";
    } else {
      c.out() << "BROKEN at record " << response.broken_seq() << " (line "
              << response.broken_line() << "): " << response.problem() << "\n";
    }
    return response.ok() ? kExitOk : kExitError;
  }
  MODELSTATE_CLI_ASSIGN_OR_FAIL(filter, c, AuditFilterFromOptions(c));
  // tail ends on SIGINT / SIGTERM.
  if (what == "tail") {
    if (absl::Status s = InstallSignalPipe({SIGINT, SIGTERM}); !s.ok()) {
      return c.Fail(s);
    }
  }
  MODELSTATE_CLI_ASSIGN_OR_FAIL(rpc, c, c.Client());
  if (what == "query") {
    uint64_t limit = c.GetUint("--limit", UINT64_MAX);
    v1::QueryAuditRequest request;
    *request.mutable_filter() = filter;
    request.set_after_seq(c.GetUint("--after", 0));
    uint64_t printed = 0;
    while (printed < limit) {
      request.set_limit(
          static_cast<int32_t>(std::min<uint64_t>(limit - printed, 1000)));
      std::unique_ptr<grpc::ClientContext> context = rpc->NewContext(c.timeout);
      v1::QueryAuditResponse response;
      absl::Status status = convert::FromGrpcStatus(
          rpc->stub().QueryAudit(context.get(), request, &response));
      if (!status.ok()) return c.Fail(status);
      for (const v1::AuditRecordProto& r : response.records()) {
        PrintAuditRecord(c, r);
        ++printed;
      }
      if (response.next_after_seq() == 0) break;
      request.set_after_seq(response.next_after_seq());
    }
    return kExitOk;
  }
  if (what == "tail") {
    v1::WatchAuditRequest request;
    *request.mutable_filter() = filter;
    request.set_after_seq(c.GetUint("--after", 0));
    std::unique_ptr<grpc::ClientContext> context =
        rpc->NewContext(absl::InfiniteDuration());
    context->set_deadline(std::chrono::system_clock::time_point::max());
    grpc::ClientContext* raw = context.get();
    std::thread waiter([&] {
      WaitForSignal();
      raw->TryCancel();
    });
    auto reader = rpc->stub().WatchAudit(context.get(), request);
    v1::AuditRecordProto record;
    uint64_t limit = c.GetUint("--limit", UINT64_MAX);
    uint64_t printed = 0;
    while (printed < limit && reader->Read(&record)) {
      PrintAuditRecord(c, record);
      ++printed;
    }
    context->TryCancel();
    absl::Status status = convert::FromGrpcStatus(reader->Finish());
    NotifySignalWaiter(SIGTERM);
    waiter.join();
    if (!status.ok() && status.code() != absl::StatusCode::kCancelled)
      return c.Fail(status);
    return kExitOk;
  }
  return c.UsageError(
      absl::StrCat("expected query, tail or verify, got '", what, "'"));
}

// ------------------------------------------------------------------ the table

constexpr char kModuleHelp[] =
    "module name: namespace/name, or name (in \"default\")";

const std::vector<CommandDef>& Commands() {
  static const auto* commands = new std::vector<CommandDef>{
      {"build",
       "build a module from a spec file",
       "Builds a module from SPEC.json and stores it on the server. Prints "
       "the "
       "parameter and buffer totals, and every registration that a hook "
       "blocked or replaced.",
       {{"SPEC.json",
         "a BuildModuleRequest in protobuf JSON (with a \"spec\" key; may also "
         "hold module, seed, device, dtype), or a bare ModuleSpec"}},
       {{"--name", "", ValueKind::kText, "NAME",
         "module name (default: the request's module, else the file's stem)"},
        {"--seed", "", ValueKind::kUint, "N",
         "torch.manual_seed before construction"},
        {"--device", "", ValueKind::kText, "cpu|meta", "device to build on"},
        {"--dtype", "", ValueKind::kText, "DT",
         "floating dtype of the build, any spelling (float32, half, bf16, "
         "...)"},
        {"--all-or-nothing", "", ValueKind::kFlag, "",
         "fail and store nothing if a hook blocks any registration"}},
       "modelstatectl build mlp.json --name team/mlp --seed 0",
       RunBuild},
      {"ls",
       "list modules",
       "Lists modules in name order with their type, parameter elements, bytes "
       "and devices, following pages until all (or --limit) are listed.",
       {},
       {{"--namespace", "", ValueKind::kText, "NS",
         "only modules of this namespace"},
        {"--limit", "", ValueKind::kPositive, "N", "list at most N modules"},
        {"--page-size", "", ValueKind::kPositive, "N",
         "modules per request (default: the server's, 100; at most 1000)"}},
       "modelstatectl ls --namespace team --limit 20",
       RunList},
      {"describe",
       "show a module's tree, tensors and sizes",
       "Prints the module tree: each submodule with its attributes ([eval] "
       "when not training), each parameter and buffer with dtype, shape, "
       "device and size, then the total and the server's devices.",
       {{"MODULE", kModuleHelp}},
       {{"--path", "", ValueKind::kText, "P",
         "describe only the submodule at this dotted path"},
        {"--hashes", "", ValueKind::kFlag, "",
         "show each tensor's SHA-256 (the server reads every byte)"}},
       "modelstatectl describe team/mlp --path 0 --hashes",
       RunDescribe},
      {"rm",
       "delete a module",
       "Deletes a module from the server.",
       {{"MODULE", kModuleHelp}},
       {},
       "modelstatectl rm team/mlp",
       RunRemove},
      {"get-state",
       "save a module's state_dict to a safetensors file",
       "Streams the module's state_dict into a safetensors file, chunk by "
       "chunk. The file appears complete or not at all.",
       {{"MODULE", kModuleHelp}},
       {{"--output", "-o", ValueKind::kText, "FILE",
         "the safetensors file to write (required)"},
        {"--prefix", "", ValueKind::kText, "P", "only keys starting with P"},
        {"--glob", "", ValueKind::kText, "G", "only keys matching G (* and ?)"},
        {"--dtype", "", ValueKind::kText, "DT",
         "convert floating-point entries to DT on the fly"},
        {"--chunk-kib", "", ValueKind::kUint, "N",
         "bytes per message, in KiB (default: the server's, 1024)"}},
       "modelstatectl get-state team/mlp -o mlp.safetensors --dtype float16",
       RunGetState},
      {"load-state",
       "load a safetensors file into a module (load_state_dict)",
       "Streams a safetensors file into the module's load_state_dict and "
       "prints PyTorch's repr of the result. By default the load is strict "
       "and atomic: a failure (PyTorch's error text) changes nothing.",
       {{"MODULE", kModuleHelp},
        {"FILE.safetensors", "the safetensors file to read"}},
       {{"--strict", "", ValueKind::kFlag, "",
         "missing or unexpected keys are errors (the default)"},
        {"--no-strict", "", ValueKind::kFlag, "",
         "report missing and unexpected keys instead of failing"},
        {"--no-atomic", "", ValueKind::kFlag, "",
         "PyTorch's partial loads: entries before a failure stay loaded"},
        {"--assign", "", ValueKind::kFlag, "",
         "install the file's tensors instead of copying into the module's"},
        {"--chunk-kib", "", ValueKind::kPositive, "N",
         "bytes per message, in KiB (default 1024)"}},
       "modelstatectl load-state team/mlp mlp.safetensors --no-strict",
       RunLoadState},
      {"to",
       "convert a module's dtype or move it to a device",
       "PyTorch's module.to(device, dtype): floating-point tensors change "
       "dtype, all tensors move. At least one of --device and --dtype is "
       "needed.",
       {{"MODULE", kModuleHelp}},
       {{"--device", "", ValueKind::kText, "D", "cpu, meta or cuda:N"},
        {"--dtype", "", ValueKind::kText, "DT",
         "a floating dtype, any spelling (float16, bfloat16, double, ...)"}},
       "modelstatectl to team/mlp --dtype float16",
       RunTo},
      {"forward",
       "run a module on tensors from a safetensors file",
       "module(*inputs) on the server, as PyTorch computes it. The inputs "
       "are the tensors input0, input1, ... of --input (a missing index is "
       "None); the outputs go to --output as output0, output1, ... In "
       "training mode BatchNorm's running statistics change (saved and "
       "audited). Without --train or --eval the module's own mode applies.",
       {{"MODULE", kModuleHelp}},
       {{"--input", "-i", ValueKind::kText, "FILE",
         "safetensors file with input0, input1, ..."},
        {"--output", "-o", ValueKind::kText, "FILE", "where the outputs go"},
        {"--path", "", ValueKind::kText, "P",
         "run the submodule at this dotted path"},
        {"--train", "", ValueKind::kFlag, "", "training mode for this call"},
        {"--eval", "", ValueKind::kFlag, "", "eval mode for this call"},
        {"--seed", "", ValueKind::kUint, "N",
         "seed of Dropout masks in training mode"}},
       "modelstatectl forward team/mlp --eval -i x.safetensors -o "
       "y.safetensors",
       RunForward},
      {"train",
       "put a module in training mode",
       "module.train(): sets training on the module and all its submodules.",
       {{"MODULE", kModuleHelp}},
       {},
       "modelstatectl train team/mlp",
       RunTrain},
      {"eval",
       "put a module in eval mode",
       "module.eval(): clears training on the module and all its submodules.",
       {{"MODULE", kModuleHelp}},
       {},
       "modelstatectl eval team/mlp",
       RunEval},
      {"subscribe",
       "run a registration hook: a policy file or a person",
       "Subscribes to registration events and answers them until interrupted "
       "(Ctrl-C) or the server ends the stream. With --policy, a rules file "
       "decides (see deploy/policies/); with --interactive, each event is "
       "asked at the terminal: Enter or a to approve, r [reason] to reject, "
       "cast DTYPE or freeze to modify. Options override the policy's "
       "subscription.",
       {},
       {{"--policy", "", ValueKind::kText, "FILE", "rules file (JSON)"},
        {"--interactive", "", ValueKind::kFlag, "",
         "ask a person for each event"},
        {"--name", "", ValueKind::kText, "NAME", "subscriber name"},
        {"--mode", "", ValueKind::kText, "intercept|observe|dry-run",
         "how answers count (default intercept)"},
        {"--priority", "", ValueKind::kText, "N",
         "lower runs first (default 0)"},
        {"--timeout-ms", "", ValueKind::kPositive, "MS",
         "per-event timeout (default 10000; 60000 with --interactive)"},
        {"--fail-open", "", ValueKind::kFlag, "",
         "approve when this subscriber times out or fails (default: block)"},
        {"--kinds", "", ValueKind::kText, "LIST",
         "parameter,buffer,module (default all)"},
        {"--namespace", "", ValueKind::kText, "NS", "only this namespace"},
        {"--type", "", ValueKind::kText, "GLOB", "only modules of these types"},
        {"--name-glob", "", ValueKind::kText, "GLOB",
         "only entries with these names"},
        {"--include-data", "", ValueKind::kFlag, "",
         "receive tensor values too"}},
       "modelstatectl subscribe --policy "
       "deploy/policies/block_temp_buffer.json",
       RunSubscribe},
      {"audit",
       "query, follow or verify the audit log",
       "query prints the records that match; tail prints them as they are "
       "written, until interrupted; verify walks the hash chain and names the "
       "first broken record (exit 1 if any), on the server or, with --file, "
       "in a local copy of the log.",
       {{"query|tail|verify", "what to do"}},
       {{"--since", "", ValueKind::kText, "TIME", "RFC 3339, inclusive"},
        {"--until", "", ValueKind::kText, "TIME", "RFC 3339, exclusive"},
        {"--namespace", "", ValueKind::kText, "NS", "only this namespace"},
        {"--module", "", ValueKind::kText, "NAME",
         "only this module (without namespace)"},
        {"--identity", "", ValueKind::kText, "ID", "only this caller"},
        {"--outcome", "", ValueKind::kText, "OUTCOME",
         "keep, replace, block, approve, reject, ok, error, ..."},
        {"--type", "", ValueKind::kText, "TYPE",
         "registration, answer, outcome, build, load_state_dict, ..."},
        {"--after", "", ValueKind::kUint, "SEQ",
         "only records after this sequence number"},
        {"--limit", "", ValueKind::kPositive, "N", "print at most N records"},
        {"--file", "", ValueKind::kText, "FILE",
         "verify: a local audit.log instead"}},
       "modelstatectl audit query --module mlp --outcome block",
       RunAudit},
      {"health",
       "check that the server is serving",
       "Asks the server's grpc.health.v1 service; prints SERVING and exits 0, "
       "or prints the error and exits 1.",
       {},
       {},
       "modelstatectl --server 10.0.0.5:50051 health",
       RunHealth},
      {"devices",
       "list the server's devices and their memory",
       "Lists the devices the server can place tensors on (cpu, meta and "
       "every cuda:N) with total and free memory; `to MODULE --device "
       "cuda:N` accepts these names.",
       {},
       {},
       "modelstatectl devices --json",
       RunDevices},
      {"hash-token",
       "print the SHA-256 a token file's entry holds for a token",
       "Reads the token from FILE (surrounding whitespace ignored) and "
       "prints its SHA-256 in hex: the token_sha256 of the server's "
       "--token_file. The token itself never goes into that file.",
       {{"FILE", "file holding the token"}},
       {},
       "head -c 32 /dev/urandom | base64 > alice.token && modelstatectl "
       "hash-token alice.token",
       RunHashToken},
  };
  return *commands;
}

int GlobalUsageError(const Environment& env, absl::string_view message) {
  *env.err << "error: " << message << "\n"
           << "see " << kProgram << " --help\n";
  return kExitUsage;
}

}  // namespace

std::string FormatBuildResponse(const v1::BuildModuleResponse& response) {
  Totals t;
  Accumulate(response.info(), &t);
  std::string buffers = Plural(t.buffers, "buffer");
  if (t.buffers > 0) {
    absl::StrAppend(&buffers, " (", WithCommas(t.buffer_bytes), " bytes)");
  }
  std::ostringstream out;
  out << absl::StrFormat(
      "built %s (%s): %s (%s elements, %s bytes), %s\n", response.module(),
      response.info().type(), Plural(t.parameters, "parameter"),
      WithCommas(t.parameter_elements), WithCommas(t.parameter_bytes), buffers);
  PrintNotableRegistrations(out, response.registrations());
  return out.str();
}

int RunCli(const std::vector<std::string>& args, const Environment& env) {
  Parsed parsed = Parse(args);
  if (parsed.help && parsed.command != nullptr) {
    PrintCommandHelp(*env.out, *parsed.command);
    return kExitOk;
  }
  if (parsed.help && parsed.error.empty()) {
    PrintGlobalHelp(*env.out);
    return kExitOk;
  }
  if (parsed.command == nullptr) {
    return GlobalUsageError(
        env, parsed.error.empty() ? "no command given" : parsed.error);
  }
  Context context(env, *parsed.command, parsed);
  if (!parsed.error.empty()) return context.UsageError(parsed.error);
  const std::vector<ArgDef>& wanted = parsed.command->args;
  if (parsed.positionals.size() < wanted.size()) {
    return context.UsageError(absl::StrCat(
        "missing argument ", wanted[parsed.positionals.size()].name));
  }
  if (parsed.positionals.size() > wanted.size()) {
    return context.UsageError(absl::StrCat(
        "unexpected argument '", parsed.positionals[wanted.size()], "'"));
  }
  context.server = context.Get("--server", env.default_server);
  context.json = context.Has("--json");
  if (context.Has("--timeout")) {
    double seconds = 30;
    (void)absl::SimpleAtod(context.Get("--timeout"), &seconds);
    context.timeout = absl::Seconds(seconds);
  }
  if (context.Has("--transfer-timeout")) {
    double seconds = 1800;
    (void)absl::SimpleAtod(context.Get("--transfer-timeout"), &seconds);
    context.transfer_timeout = absl::Seconds(seconds);
  }
  std::string progress = context.Get("--progress", "auto");
  if (progress == "auto") {
    context.progress = ProgressMode::kAuto;
  } else if (progress == "always") {
    context.progress = ProgressMode::kAlways;
  } else if (progress == "never") {
    context.progress = ProgressMode::kNever;
  } else {
    return context.UsageError(absl::StrCat(
        "--progress: expected auto, always or never, got '", progress, "'"));
  }
  return parsed.command->run(context);
}

}  // namespace modelstate::cli
