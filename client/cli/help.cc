#include "client/cli/help.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace modelstate::cli {
namespace {

using Rows = std::vector<std::pair<std::string, std::string>>;

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
void PrintDefinitions(std::ostream& out, const Rows& rows) {
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

// Flags take no value (CLI11 expects none after them).
bool TakesValue(const CLI::Option& option) {
  return option.get_items_expected_max() > 0;
}

// "-o, --output FILE", "--json".
std::string OptionLabel(const CLI::Option& option) {
  std::vector<std::string> names;
  for (const std::string& name : option.get_snames())
    names.push_back("-" + name);
  for (const std::string& name : option.get_lnames()) {
    names.push_back("--" + name);
  }
  std::string label = absl::StrJoin(names, ", ");
  if (TakesValue(option)) absl::StrAppend(&label, " ", option.get_type_name());
  return label;
}

// The options of `app` (not its arguments), the help flag last or, with
// `with_help` false, left out.
Rows OptionRows(const CLI::App& app, bool with_help) {
  Rows rows;
  for (const CLI::Option* option : app.get_options()) {
    if (!option->nonpositional() || option == app.get_help_ptr()) continue;
    rows.emplace_back(OptionLabel(*option), option->get_description());
  }
  if (with_help && app.get_help_ptr() != nullptr) {
    rows.emplace_back(OptionLabel(*app.get_help_ptr()),
                      app.get_help_ptr()->get_description());
  }
  return rows;
}

Rows ArgumentRows(const CLI::App& app) {
  Rows rows;
  for (const CLI::Option* option : app.get_options()) {
    if (option->nonpositional()) continue;
    rows.emplace_back(option->get_name(true), option->get_description());
  }
  return rows;
}

}  // namespace

std::string HelpFormatter::make_help(const CLI::App* app, std::string,
                                     CLI::AppFormatMode) const {
  if (const CommandSet::Command* command = commands_->Find(app)) {
    return CommandHelp(*app, *command);
  }
  return RootHelp(*app);
}

std::string HelpFormatter::RootHelp(const CLI::App& root) const {
  std::ostringstream out;
  out << "Usage: " << kProgram
      << " [global options] <command> [arguments] [options]\n\n"
      << root.get_description() << "\n\nCommands:\n";
  Rows rows;
  for (const CLI::App* app : root.get_subcommands({})) {
    if (const CommandSet::Command* command = commands_->Find(app)) {
      rows.emplace_back(command->doc.name, command->doc.summary);
    }
  }
  PrintDefinitions(out, rows);
  out << "\nGlobal options:\n";
  PrintDefinitions(out, OptionRows(root, /*with_help=*/true));
  out << "\n" << root.get_footer() << "\n";
  return out.str();
}

std::string HelpFormatter::CommandHelp(
    const CLI::App& app, const CommandSet::Command& command) const {
  std::ostringstream out;
  const Rows arguments = ArgumentRows(app);
  const Rows options = OptionRows(app, /*with_help=*/false);
  out << "Usage: " << kProgram << " [global options] " << command.doc.name;
  for (const auto& [name, text] : arguments) out << " " << name;
  if (!options.empty()) out << " [options]";
  out << "\n\n";
  for (const std::string& line : Wrap(command.doc.description, 78)) {
    out << line << "\n";
  }
  if (!arguments.empty()) {
    out << "\nArguments:\n";
    PrintDefinitions(out, arguments);
  }
  if (!options.empty()) {
    out << "\nOptions:\n";
    PrintDefinitions(out, options);
  }
  out << "\nGlobal options (before or after the command):\n";
  PrintDefinitions(out, OptionRows(*app.get_parent(), /*with_help=*/true));
  out << "\nExample:\n  " << command.doc.example << "\n";
  return out.str();
}

}  // namespace modelstate::cli
