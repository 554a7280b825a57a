// File: cli.h
// modelstatectl, the command-line client of modelstate-server:
//
//   modelstatectl [global options] <command> [arguments] [options]
//
// Commands: build, ls, describe, rm, get-state, load-state, to, forward,
// train, eval, subscribe, audit, health, devices, hash-token. Every command
// prints human-readable text by default and the response proto in
// protobuf's JSON mapping with --json. Exit status: 0 on success, 1 when the
// server (or a local file) reports an error, 2 for a usage error.
//
// The commands are a library (modelstate_cli) rather than part of
// cli/main.cc so that they can be driven with any argument vector and any
// streams. The parsing, help and validation are CLI11's (cli/run_cli.cc,
// cli/help.cc, cli/options.cc); each group of commands has a file of its
// own in cli/ (modules, state, subscribe, audit, server).
//
// Example:
//   std::ostringstream out, err;
//   int rc = modelstate::cli::RunCli({"describe", "team/mlp"},
//                                    {&out, &err, false, "127.0.0.1:50051"});
#ifndef MODELSTATE_CLIENT_CLI_H_
#define MODELSTATE_CLIENT_CLI_H_

#include <ostream>
#include <string>
#include <vector>

#include "modelstate/v1/model_state_service.pb.h"

namespace modelstate::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;
// verify-attestation and verify-bundle only: the check could not be
// completed (the server unreachable, a permission missing, a file that
// cannot be read, a limit reached), so nothing is known either way; 1 is
// kept for "checked, and it does not hold".
inline constexpr int kExitNotChecked = 3;

// Where a run writes, and the defaults it inherits from the process.
struct Environment {
  std::ostream* out = nullptr;
  std::ostream* err = nullptr;
  // Whether `err` is a terminal: --progress auto draws only then.
  bool err_is_tty = false;
  // The server used when no --server is given.
  std::string default_server = "127.0.0.1:50051";
  // The bearer token sent when no --token-file is given ($MODELSTATE_TOKEN).
  std::string default_token;
};

// Runs one invocation; `args` excludes the program name. Returns the exit
// status.
int RunCli(const std::vector<std::string>& args, const Environment& env);

// What `build` prints: the totals line, then one line per registration that
// a hook blocked or replaced and a count of them. Exposed so that tests can
// check these lines without a remote hook to cause them.
std::string FormatBuildResponse(const v1::BuildModuleResponse& response);

}  // namespace modelstate::cli

#endif  // MODELSTATE_CLIENT_CLI_H_
