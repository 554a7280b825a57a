// File: cli/help.h
// modelstatectl's help texts, as a CLI11 formatter: the usage line, the
// command's description, its arguments and options, the global options and
// an example, in 80 columns. CLI11 supplies the arguments and options (names,
// value names, descriptions); the CommandSet supplies each command's summary
// and example.
//
// Example:
//   CLI::App app(kDescription, "modelstatectl");
//   CommandSet commands(app);
//   app.formatter(std::make_shared<HelpFormatter>(&commands));
//   ... add the commands ...
//   std::cout << app.help();  // or a command's: command->help()
#ifndef MODELSTATE_CLIENT_CLI_HELP_H_
#define MODELSTATE_CLIENT_CLI_HELP_H_

#include <string>

#include "CLI/CLI.hpp"
#include "client/cli/command.h"

namespace modelstate::cli {

// Thread-compatible; `commands` must outlive it.
class HelpFormatter : public CLI::FormatterBase {
 public:
  explicit HelpFormatter(const CommandSet* commands) : commands_(commands) {}

  // The root's help lists the commands; a command's help its arguments and
  // options.
  std::string make_help(const CLI::App* app, std::string name,
                        CLI::AppFormatMode mode) const override;

 private:
  std::string RootHelp(const CLI::App& root) const;
  std::string CommandHelp(const CLI::App& app,
                          const CommandSet::Command& command) const;

  const CommandSet* commands_;
};

}  // namespace modelstate::cli

#endif  // MODELSTATE_CLIENT_CLI_HELP_H_
