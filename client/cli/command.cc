#include "client/cli/command.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace modelstate::cli {
namespace {

// Status payloads that say how ReportStatus shows a status.
constexpr char kUsagePayload[] = "modelstate.cli/usage";
constexpr char kShownPayload[] = "modelstate.cli/shown";
constexpr char kNotCheckedPayload[] = "modelstate.cli/not-checked";

}  // namespace

bool Context::ProgressEnabled() const {
  if (globals_.progress == "always") return true;
  if (globals_.progress == "never") return false;
  return env_.err_is_tty;
}

absl::StatusOr<client::ModelStateClient*> Context::Client() {
  if (client_ == nullptr) {
    MODELSTATE_ASSIGN_OR_RETURN(
        client::ClientOptions options,
        ConnectionOptions(globals_, env_.default_token));
    MODELSTATE_ASSIGN_OR_RETURN(
        client_,
        client::ModelStateClient::Connect(globals_.server, std::move(options)));
  }
  return client_.get();
}

absl::StatusOr<std::unique_ptr<client::ModelStateClient>> Context::ConnectTo(
    const std::string& address) const {
  MODELSTATE_ASSIGN_OR_RETURN(client::ClientOptions options,
                              ConnectionOptions(globals_, env_.default_token));
  return client::ModelStateClient::Connect(address, std::move(options));
}

absl::Status Context::PrintJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string text;
  auto status =
      google::protobuf::util::MessageToJsonString(message, &text, options);
  if (!status.ok()) {
    return absl::InternalError(
        absl::StrCat("could not print the response as JSON: ",
                     std::string(status.message())));
  }
  out() << text << std::endl;
  return absl::OkStatus();
}

absl::Status UsageError(absl::string_view message) {
  absl::Status status = absl::InvalidArgumentError(message);
  status.SetPayload(kUsagePayload, absl::Cord());
  return status;
}

absl::Status AlreadyShown(absl::Status status) {
  status.SetPayload(kShownPayload, absl::Cord());
  return status;
}

absl::Status NotChecked(absl::Status status) {
  status.SetPayload(kNotCheckedPayload, absl::Cord());
  return status;
}

absl::Status ClusterCallError(absl::Status status) {
  if (status.code() != absl::StatusCode::kUnimplemented) return status;
  // The text of server/model_state_service.cc's NotAClusterMember().
  return absl::InvalidArgumentError(
      "cluster: this server is not a cluster member (--etcd_endpoints)");
}

int ReportStatus(const absl::Status& status, absl::string_view command,
                 const Environment& env) {
  if (status.ok()) return kExitOk;
  if (status.GetPayload(kUsagePayload).has_value()) {
    if (command.empty()) {
      *env.err << "error: " << status.message() << "\n"
               << "see " << kProgram << " --help\n";
    } else {
      *env.err << "error: " << command << ": " << status.message() << "\n"
               << "see " << kProgram << " " << command << " --help\n";
    }
    return kExitUsage;
  }
  if (!status.GetPayload(kShownPayload).has_value()) {
    *env.err << "error: " << absl::StatusCodeToString(status.code()) << ": "
             << status.message() << "\n";
  }
  return status.GetPayload(kNotCheckedPayload).has_value() ? kExitNotChecked
                                                           : kExitError;
}

CLI::App* CommandSet::Add(CommandDoc doc, Handler run) {
  CLI::App* app = root_.add_subcommand(doc.name, doc.description);
  commands_.push_back({std::move(doc), app, std::move(run)});
  return app;
}

const CommandSet::Command* CommandSet::Find(const CLI::App* app) const {
  for (const Command& command : commands_) {
    if (command.app == app) return &command;
  }
  return nullptr;
}

CLI::Option* AddModuleArgument(CLI::App* command, std::string& module) {
  return command
      ->add_option("MODULE", module,
                   "module name: namespace/name, or name (in \"default\")")
      ->required();
}

absl::StatusOr<std::string> ReadInputFile(const std::string& path) {
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

}  // namespace modelstate::cli
