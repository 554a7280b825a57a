// File: cli/command.h
// What modelstatectl's commands are made of. A command is a CLI11
// subcommand with a CommandDoc (what its help shows) and a handler that
// returns absl::Status. ReportStatus() is the one place that turns a status
// into what stderr shows and the exit status: OK is 0, a UsageError() is 2
// with a pointer to the command's help, a NotChecked() one 3, anything
// else is 1 with "error: <CODE>: <message>".
//
// Each command group (modules.cc, state.cc, subscribe.cc, audit.cc,
// server.cc) adds its commands through a CommandSet; their options live in
// a struct the handler shares with the CLI11 options that fill it.
//
// Example:
//   auto args = std::make_shared<std::string>();
//   CLI::App* rm = commands.Add(
//       {"rm", "delete a module", "Deletes a module from the server.",
//        "modelstatectl rm team/mlp"},
//       [args](Context& c) -> absl::Status {
//         MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
//         return rpc->DeleteModule(*args);
//       });
//   AddModuleArgument(rm, *args);
#ifndef MODELSTATE_CLIENT_CLI_COMMAND_H_
#define MODELSTATE_CLIENT_CLI_COMMAND_H_

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/cli.h"
#include "client/cli/options.h"
#include "client/model_state_client.h"
#include "google/protobuf/message.h"

namespace modelstate::cli {

inline constexpr char kProgram[] = "modelstatectl";

// What a command's handler works with: the streams, the global options and
// the connection. Thread-compatible (subscribe's handler thread shares it
// under its own lock).
class Context {
 public:
  Context(const Environment& env, const GlobalOptions& globals)
      : env_(env), globals_(globals) {}

  std::ostream& out() const { return *env_.out; }
  std::ostream& err() const { return *env_.err; }
  // --json: print response protos instead of text.
  bool json() const { return globals_.json; }
  // Whether transfers draw a progress bar (--progress; auto: only when
  // stderr is a terminal).
  bool ProgressEnabled() const;
  // The client, connected on first use with the global options.
  absl::StatusOr<client::ModelStateClient*> Client();
  // A client of another server (a cluster's replica at `address`) with the
  // same global options.
  absl::StatusOr<std::unique_ptr<client::ModelStateClient>> ConnectTo(
      const std::string& address) const;
  // Prints `message` on one line in protobuf's JSON mapping, with proto
  // field names; flushes, as tail and subscribe print as things happen.
  absl::Status PrintJson(const google::protobuf::Message& message);

 private:
  const Environment& env_;
  const GlobalOptions& globals_;
  std::unique_ptr<client::ModelStateClient> client_;
};

// A usage error: the command line asks for something the command cannot
// do. Exit status 2.
absl::Status UsageError(absl::string_view message);
// A failure the command has already shown on stdout (audit verify's BROKEN
// line): exit status 1 and nothing more on stderr.
absl::Status AlreadyShown(absl::Status status);
// A verifying command's check that could not be completed: exit status 3
// (kExitNotChecked), with stderr as for any error unless AlreadyShown too.
absl::Status NotChecked(absl::Status status);

// What a ClusterService call's failure says. A server that is not a
// cluster member does not serve that service, and gRPC's UNIMPLEMENTED
// for it has no message: that becomes the error the server gives for
// `audit query --cluster` there (INVALID_ARGUMENT "cluster: this server
// is not a cluster member (--etcd_endpoints)"), so that every cluster
// command says the same. Any other status is returned as it is.
absl::Status ClusterCallError(absl::Status status);

// Prints what `status` says on env.err and returns the exit status.
// `command` names the command in usage errors; empty before one is known.
int ReportStatus(const absl::Status& status, absl::string_view command,
                 const Environment& env);

// What a command's help shows besides its arguments and options.
struct CommandDoc {
  std::string name;
  // One line, in the list of commands.
  std::string summary;
  // The paragraph of the command's own help.
  std::string description;
  // One command line.
  std::string example;
};

using Handler = std::function<absl::Status(Context&)>;

// The commands of one modelstatectl run, in the order the help lists them.
// Thread-compatible.
class CommandSet {
 public:
  struct Command {
    CommandDoc doc;
    CLI::App* app;
    Handler run;
  };

  explicit CommandSet(CLI::App& root) : root_(root) {}

  // Adds a subcommand to the root; `run` runs when it is the one chosen.
  // Returns the subcommand, to add its arguments and options to.
  CLI::App* Add(CommandDoc doc, Handler run);
  // The command whose subcommand is `app`, or nullptr.
  const Command* Find(const CLI::App* app) const;

 private:
  CLI::App& root_;
  std::vector<Command> commands_;
};

// The positional MODULE argument most commands take.
CLI::Option* AddModuleArgument(CLI::App* command, std::string& module);

// The text of a file named on the command line. NOT_FOUND (and the like)
// with the path and strerror; INVALID_ARGUMENT for a directory.
absl::StatusOr<std::string> ReadInputFile(const std::string& path);

// The command groups.
void AddModuleCommands(CommandSet& commands);    // build ls describe rm
void AddStateCommands(CommandSet& commands);     // get-state ... eval
void AddSubscribeCommand(CommandSet& commands);  // subscribe subscribers
void AddAuditCommand(CommandSet& commands);      // audit
void AddServerCommands(CommandSet& commands);    // health devices ...
void AddAttestCommands(CommandSet& commands);    // attest verify-attestation

// get-state --sign (in attest.cc): the server signs the state file `file`
// was written as (SignStateFile); the bundle goes to `<file>.sig` once the
// file's SHA-256 is the one signed (ABORTED when the module changed in
// between).
absl::Status SignWrittenStateFile(Context& c, const std::string& module,
                                  const client::GetStateDictOptions& options,
                                  const std::string& file);

}  // namespace modelstate::cli

#endif  // MODELSTATE_CLIENT_CLI_COMMAND_H_
