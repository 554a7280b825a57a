// RunCli: builds modelstatectl's command line on CLI11, parses, runs the
// chosen command and reports how it went (see client/cli.h).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cli.h"
#include "client/cli/command.h"
#include "client/cli/help.h"
#include "client/cli/options.h"

namespace modelstate::cli {
namespace {

constexpr char kDescription[] =
    "The command-line client of modelstate-server, which hosts "
    "PyTorch-style\nmodule trees. Module names are namespace/name or name "
    "(namespace \"default\").";
constexpr char kFooter[] =
    "Exit status: 0 on success, 1 on an error reported by the server or a "
    "file,\n2 on a usage error.\nRun 'modelstatectl COMMAND --help' for a "
    "command's arguments and options.";

// "--limit=5" -> "--limit".
std::string OptionName(const std::string& arg) {
  return arg.substr(0, arg.find('='));
}

// The option that `arg` names, in `command` or among the global options.
const CLI::Option* FindOption(const CLI::App& root, const CLI::App* command,
                              const std::string& arg) {
  std::string name = OptionName(arg);
  for (const CLI::App* app : {command, &root}) {
    if (app == nullptr) continue;
    for (const CLI::Option* option : app->get_options()) {
      if (option->nonpositional() && option->check_name(name)) return option;
    }
  }
  return nullptr;
}

// CLI11's parse errors in modelstatectl's words. The exception says what
// kind of error it is; the parsed state says which argument caused it.
std::string UsageMessage(const CLI::ParseError& error, const CLI::App& root,
                         const CLI::App* command,
                         const std::vector<std::string>& args) {
  if (dynamic_cast<const CLI::ExtrasError*>(&error) != nullptr) {
    // Arguments no command claimed end up with the root (the commands fall
    // through to it).
    const std::vector<std::string> extras = root.remaining(true);
    if (!extras.empty()) {
      const std::string& first = extras.front();
      if (first.size() > 1 && first[0] == '-') {
        return absl::StrCat("unknown option '", OptionName(first), "'");
      }
      return command == nullptr
                 ? absl::StrCat("unknown command '", first, "'")
                 : absl::StrCat("unexpected argument '", first, "'");
    }
  }
  if (dynamic_cast<const CLI::RequiredError*>(&error) != nullptr &&
      command != nullptr) {
    for (const CLI::Option* option : command->get_options()) {
      if (!option->nonpositional() && option->get_required() &&
          option->count() == 0) {
        return absl::StrCat("missing argument ", option->get_name(true));
      }
    }
  }
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&error) != nullptr &&
      !args.empty()) {
    // An option is short of values only when the arguments ran out, so it
    // is the last one.
    const CLI::Option* option = FindOption(root, command, args.back());
    if (option != nullptr && option->get_items_expected_max() > 0) {
      return absl::StrCat("option ", option->get_name(), " needs a value (",
                          option->get_type_name(), ")");
    }
  }
  return error.what();
}

// The command CLI11 parsed, if any. (Its list of parsed subcommands misses
// one named after "--", as in "modelstatectl -- health".)
const CommandSet::Command* Chosen(const CLI::App& root,
                                  const CommandSet& commands) {
  for (const CLI::App* app : root.get_subcommands({})) {
    if (app->count() > 0) return commands.Find(app);
  }
  return nullptr;
}

}  // namespace

int RunCli(const std::vector<std::string>& args, const Environment& env) {
  GlobalOptions globals;
  globals.server = env.default_server;
  CLI::App root(kDescription, kProgram);
  root.footer(kFooter);
  CommandSet commands(root);
  // Set before the commands exist: they copy these from the root.
  root.formatter(std::make_shared<HelpFormatter>(&commands));
  root.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  AddGlobalOptions(root, globals);
  // One command at most, and global options after it: an option a command
  // does not know falls through to the root.
  root.require_subcommand(0, 1);
  root.fallthrough();
  AddModuleCommands(commands);
  AddStateCommands(commands);
  AddSubscribeCommand(commands);
  AddAuditCommand(commands);
  AddAttestCommands(commands);
  AddServerCommands(commands);

  // CLI11 takes the arguments last first.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    root.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    const CommandSet::Command* command = Chosen(root, commands);
    if (command == nullptr && !root.remaining().empty()) {
      return ReportStatus(
          UsageError(
              absl::StrCat("unknown command '", root.remaining().front(), "'")),
          "", env);
    }
    *env.out << root.help();
    return kExitOk;
  } catch (const CLI::ParseError& error) {
    const CommandSet::Command* command = Chosen(root, commands);
    return ReportStatus(
        UsageError(UsageMessage(
            error, root, command == nullptr ? nullptr : command->app, args)),
        command == nullptr ? "" : command->doc.name, env);
  }
  const CommandSet::Command* command = Chosen(root, commands);
  if (command == nullptr) {
    return ReportStatus(UsageError("no command given"), "", env);
  }
  Context context(env, globals);
  return ReportStatus(command->run(context), command->doc.name, env);
}

}  // namespace modelstate::cli
