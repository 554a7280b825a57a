// File: cli/options.h
// modelstatectl's options on CLI11: the global options (server, output,
// deadlines, TLS and token) and the connection they describe, and the value
// checks that the commands' options share. A check's message says what was
// expected and what was given; CLI11 puts the option's name in front
// ("--limit: expected a positive integer, got '0'").
//
// Example:
//   GlobalOptions globals;
//   AddGlobalOptions(app, globals);
//   std::optional<uint64_t> limit;
//   AddValue(ls, "--limit", limit, "N", "list at most N modules")
//       ->check(PositiveInteger());
#ifndef MODELSTATE_CLIENT_CLI_OPTIONS_H_
#define MODELSTATE_CLIENT_CLI_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "client/model_state_client.h"

namespace modelstate::cli {

// What the global options say; the fields hold the defaults until CLI11
// stores what the command line gives.
struct GlobalOptions {
  // host:port of the server.
  std::string server;
  // Print the response proto as JSON instead of text.
  bool json = false;
  // Deadline of each unary call, and of each state_dict transfer (streams
  // take as long as their bytes need, so they get their own).
  double timeout_seconds = 30;
  double transfer_timeout_seconds = 1800;
  // auto, always or never.
  std::string progress = "auto";
  std::optional<std::string> tls_ca;
  std::optional<std::string> tls_cert;
  std::optional<std::string> tls_key;
  std::optional<std::string> token_file;
  // Transfers through shared memory when the server is on this host.
  bool no_shared_memory = false;
};

// Adds the global options to `app` (the root; commands reach them by
// CLI11's fallthrough, so they may come before or after the command).
void AddGlobalOptions(CLI::App& app, GlobalOptions& options);

// The client's options: deadlines, TLS credentials from the PEM files, and
// the bearer token from --token-file, else `default_token`.
// INVALID_ARGUMENT naming the option for a file that cannot be read or
// options that do not go together.
absl::StatusOr<client::ClientOptions> ConnectionOptions(
    const GlobalOptions& options, const std::string& default_token);

// Checks (and writes back in canonical form, for CLI11's conversion) a
// decimal integer >= 0, an integer > 0 (both at most `maximum`), a signed
// 32-bit integer, and a finite number of seconds > 0.
CLI::Validator NonNegativeInteger(uint64_t maximum = UINT64_MAX);
CLI::Validator PositiveInteger(uint64_t maximum = UINT64_MAX);
CLI::Validator Int32();
CLI::Validator PositiveSeconds();
// A value that is not empty: "expected a file name, got ''".
CLI::Validator NonEmpty(std::string expected);
// One of `choices`: "expected auto, always or never, got 'sometimes'".
CLI::Validator OneOf(std::vector<std::string> choices);
// A comma-separated list of `choices`: "expected parameter, buffer or
// module, got 'bogus' in 'parameter,bogus'".
CLI::Validator CommaListOf(std::vector<std::string> choices);

// An option with a value, shown as "--name VALUE_NAME" in the help. The
// value stays empty unless the option is given; the last one given counts.
template <typename T>
CLI::Option* AddValue(CLI::App* app, const std::string& names,
                      std::optional<T>& value, const std::string& value_name,
                      const std::string& help) {
  return app->add_option(names, value, help)->type_name(value_name);
}

// A flag. It takes no value: "--json=yes" is a usage error.
CLI::Option* AddFlag(CLI::App* app, const std::string& names, bool& value,
                     const std::string& help);

}  // namespace modelstate::cli

#endif  // MODELSTATE_CLIENT_CLI_OPTIONS_H_
