#include "client/cli/options.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "grpcpp/security/credentials.h"

namespace modelstate::cli {
namespace {

// A CLI11 check: `check` returns an error message, or "" when the value
// is good. No description, so the help shows only the value's name.
CLI::Validator Check(std::function<std::string(std::string&)> check) {
  return CLI::Validator(std::move(check), "");
}

// The contents of the file an option names, or INVALID_ARGUMENT naming the
// option.
absl::StatusOr<std::string> ReadOptionFile(const std::string& option,
                                           const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(option, ": ", text.status().message()));
  }
  return text;
}

// A decimal integer from `minimum` to `maximum`, without a sign.
CLI::Validator UnsignedInteger(uint64_t minimum, uint64_t maximum,
                               std::string expected) {
  if (maximum != UINT64_MAX) absl::StrAppend(&expected, " up to ", maximum);
  return Check([minimum, maximum, expected](std::string& value) -> std::string {
    uint64_t n;
    if (absl::SimpleAtoi(value, &n) && n >= minimum && n <= maximum &&
        value[0] != '-' && value[0] != '+') {
      value = absl::StrCat(n);
      return "";
    }
    return absl::StrCat("expected ", expected, ", got '", value, "'");
  });
}

// The value of a bare flag, as its name's default ("--json{...}"): CLI11
// gives "true" both for a bare "--json" and for "--json=true", which is
// how "--json=true" got through when "--json=yes" did not.
constexpr char kBareFlag[] = "(bare)";

constexpr char kCertificate[] = "-----BEGIN CERTIFICATE-----";

// A PEM file holds "-----BEGIN <label>-----" lines. gRPC reports a file
// without them only in its log and, later, as "empty address list", which
// names neither the option nor the file.
absl::Status CheckPem(const std::string& option, const std::string& path,
                      const std::string& text, absl::string_view marker,
                      absl::string_view line) {
  if (absl::StrContains(text, marker)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(option, ": ", path, ": not PEM (no '", line, "' line)"));
}

}  // namespace

void AddGlobalOptions(CLI::App& app, GlobalOptions& options) {
  app.add_option("--server", options.server,
                 "server address, host:port (default: $MODELSTATE_SERVER, "
                 "else 127.0.0.1:50051)")
      ->type_name("ADDR");
  AddFlag(&app, "--json", options.json,
          "print the response as one JSON document (protobuf's JSON "
          "mapping, proto field names)");
  app.add_option("--timeout", options.timeout_seconds,
                 "deadline of each unary call (default 30)")
      ->type_name("SECONDS")
      ->check(PositiveSeconds());
  app.add_option("--transfer-timeout", options.transfer_timeout_seconds,
                 "deadline of each state_dict transfer, get-state and "
                 "load-state (default 1800)")
      ->type_name("SECONDS")
      ->check(PositiveSeconds());
  app.add_option("--progress", options.progress,
                 "progress bar on stderr for transfers that take over 1 s "
                 "(auto: only when stderr is a terminal)")
      ->type_name("auto|always|never")
      ->check(OneOf({"auto", "always", "never"}));
  CLI::Option* ca =
      AddValue(&app, "--tls-ca", options.tls_ca, "FILE",
               "connect with TLS, trusting the CA certificates in FILE (PEM)");
  CLI::Option* cert =
      AddValue(&app, "--tls-cert", options.tls_cert, "FILE",
               "client certificate (PEM) for mutual TLS; needs --tls-ca");
  CLI::Option* key = AddValue(&app, "--tls-key", options.tls_key, "FILE",
                              "the client certificate's private key (PEM)");
  // Checked when parsing, so that they are usage errors (exit 2).
  cert->needs(ca);
  cert->needs(key);
  key->needs(cert);
  AddValue(&app, "--token-file", options.token_file, "FILE",
           "send the bearer token in FILE (default: $MODELSTATE_TOKEN, "
           "which holds the token itself, not a file name)");
  AddFlag(&app, "--no-shared-memory", options.no_shared_memory,
          "send and receive state_dicts as gRPC messages even when the "
          "server is on this host (also: MODELSTATE_SHARED_MEMORY=0)");
  // Last in the help, as in most tools; the commands made after this copy
  // it.
  app.set_help_flag("-h,--help", "print help and exit");
}

absl::StatusOr<client::ClientOptions> ConnectionOptions(
    const GlobalOptions& options, const std::string& default_token) {
  client::ClientOptions client;
  client.timeout = absl::Seconds(options.timeout_seconds);
  client.transfer_timeout = absl::Seconds(options.transfer_timeout_seconds);
  client.shared_memory = !options.no_shared_memory;
  if (options.tls_cert.has_value() != options.tls_key.has_value()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (options.tls_ca.has_value()) {
    grpc::SslCredentialsOptions ssl;
    MODELSTATE_ASSIGN_OR_RETURN(ssl.pem_root_certs,
                                ReadOptionFile("--tls-ca", *options.tls_ca));
    MODELSTATE_RETURN_IF_ERROR(CheckPem("--tls-ca", *options.tls_ca,
                                        ssl.pem_root_certs, kCertificate,
                                        kCertificate));
    if (options.tls_cert.has_value()) {
      MODELSTATE_ASSIGN_OR_RETURN(
          ssl.pem_cert_chain, ReadOptionFile("--tls-cert", *options.tls_cert));
      MODELSTATE_RETURN_IF_ERROR(CheckPem("--tls-cert", *options.tls_cert,
                                          ssl.pem_cert_chain, kCertificate,
                                          kCertificate));
      MODELSTATE_ASSIGN_OR_RETURN(
          ssl.pem_private_key, ReadOptionFile("--tls-key", *options.tls_key));
      // "PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY", ...
      MODELSTATE_RETURN_IF_ERROR(
          CheckPem("--tls-key", *options.tls_key, ssl.pem_private_key,
                   "PRIVATE KEY-----", "-----BEGIN ... PRIVATE KEY-----"));
    }
    client.credentials = grpc::SslCredentials(ssl);
  } else if (options.tls_cert.has_value()) {
    return absl::InvalidArgumentError("--tls-cert needs --tls-ca");
  }
  if (options.token_file.has_value()) {
    MODELSTATE_ASSIGN_OR_RETURN(
        std::string token, ReadOptionFile("--token-file", *options.token_file));
    client.bearer_token = std::string(absl::StripAsciiWhitespace(token));
  } else {
    client.bearer_token = default_token;
  }
  return client;
}

CLI::Validator NonNegativeInteger(uint64_t maximum) {
  return UnsignedInteger(0, maximum, "a non-negative integer");
}

CLI::Validator PositiveInteger(uint64_t maximum) {
  return UnsignedInteger(1, maximum, "a positive integer");
}

CLI::Validator Int32() {
  return Check([](std::string& value) -> std::string {
    int32_t n;
    if (absl::SimpleAtoi(value, &n)) {
      value = absl::StrCat(n);
      return "";
    }
    return absl::StrCat("expected an integer from ", INT32_MIN, " to ",
                        INT32_MAX, ", got '", value, "'");
  });
}

CLI::Validator NonEmpty(std::string expected) {
  return Check([expected = std::move(expected)](std::string& value) {
    return value.empty() ? absl::StrCat("expected ", expected, ", got ''")
                         : std::string();
  });
}

CLI::Validator PositiveSeconds() {
  return Check([](std::string& value) -> std::string {
    double s;
    if (absl::SimpleAtod(value, &s) && std::isfinite(s) && s > 0) {
      value = absl::StrFormat("%.17g", s);
      return "";
    }
    return absl::StrCat("expected a positive number of seconds, got '", value,
                        "'");
  });
}

CLI::Validator OneOf(std::vector<std::string> choices) {
  return Check([choices = std::move(choices)](std::string& value) {
    for (const std::string& choice : choices) {
      if (value == choice) return std::string();
    }
    std::string expected = choices.back();
    if (choices.size() > 1) {
      expected =
          absl::StrCat(absl::StrJoin(choices.begin(), choices.end() - 1, ", "),
                       " or ", choices.back());
    }
    return absl::StrCat("expected ", expected, ", got '", value, "'");
  });
}

CLI::Validator CommaListOf(std::vector<std::string> choices) {
  CLI::Validator one = OneOf(choices);
  return Check([one](std::string& value) -> std::string {
    for (absl::string_view item : absl::StrSplit(value, ',')) {
      std::string copy(item);
      std::string error = one(copy);
      if (error.empty()) continue;
      return item.size() == value.size()
                 ? error
                 : absl::StrCat(error, " in '", value, "'");
    }
    return "";
  });
}

CLI::Option* AddFlag(CLI::App* app, const std::string& names, bool& value,
                     const std::string& help) {
  // Each name's default value is kBareFlag, which only a bare flag gives;
  // any value after "=" is refused, "true" included.
  std::vector<std::string> named;
  for (absl::string_view name : absl::StrSplit(names, ',')) {
    named.push_back(absl::StrCat(name, "{", kBareFlag, "}"));
  }
  return app->add_flag(absl::StrJoin(named, ","), value, help)
      ->transform(Check([](std::string& given) -> std::string {
        if (given != kBareFlag) return "takes no value";
        given = "true";
        return "";
      }));
}

}  // namespace modelstate::cli
