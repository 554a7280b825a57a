// The commands on whole modules: build, ls, describe, rm.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "client/cli.h"
#include "client/cli/command.h"
#include "client/cli/output.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "modelstate/v1/model_state_service.pb.h"

namespace modelstate::cli {
namespace {

// --------------------------------------------------------------------- build

struct BuildArgs {
  std::string spec_file;
  std::optional<std::string> name;
  std::optional<uint64_t> seed;
  std::optional<std::string> device;
  std::optional<std::string> dtype;
  bool all_or_nothing = false;
};

std::string FirstLine(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

// The request in the spec file: a BuildModuleRequest has a "spec" key; a
// bare ModuleSpec never does.
absl::StatusOr<v1::BuildModuleRequest> ParseSpecFile(const std::string& path,
                                                     const std::string& text) {
  // The parser's message continues with a snippet of the input over
  // several lines; its first line says what is wrong.
  auto parse_error = [&](const auto& status) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", FirstLine(std::string(status.message()))));
  };
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
  return request;
}

absl::Status RunBuild(Context& c, const BuildArgs& a) {
  MODELSTATE_ASSIGN_OR_RETURN(std::string text, ReadInputFile(a.spec_file));
  MODELSTATE_ASSIGN_OR_RETURN(v1::BuildModuleRequest request,
                              ParseSpecFile(a.spec_file, text));
  if (a.name.has_value()) {
    request.set_module(*a.name);
  } else if (request.module().empty()) {
    request.set_module(std::filesystem::path(a.spec_file).stem().string());
  }
  if (a.seed.has_value()) request.set_seed(*a.seed);
  if (a.device.has_value()) request.set_device(*a.device);
  if (a.dtype.has_value()) request.set_dtype(*a.dtype);
  if (a.all_or_nothing) request.set_all_or_nothing(true);
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  MODELSTATE_ASSIGN_OR_RETURN(v1::BuildModuleResponse response,
                              rpc->BuildModule(request));
  if (c.json()) return c.PrintJson(response);
  c.out() << FormatBuildResponse(response);
  return absl::OkStatus();
}

void AddBuild(CommandSet& commands) {
  auto args = std::make_shared<BuildArgs>();
  CLI::App* build = commands.Add(
      {"build", "build a module from a spec file",
       "Builds a module from SPEC.json and stores it on the server. Prints "
       "the parameter and buffer totals, and every registration that a hook "
       "blocked or replaced.",
       "modelstatectl build mlp.json --name team/mlp --seed 0"},
      [args](Context& c) { return RunBuild(c, *args); });
  build
      ->add_option("SPEC.json", args->spec_file,
                   "a BuildModuleRequest in protobuf JSON (with a \"spec\" "
                   "key; may also hold module, seed, device, dtype), or a bare "
                   "ModuleSpec")
      ->required();
  AddValue(build, "--name", args->name, "NAME",
           "module name (default: the request's module, else the file's "
           "stem)");
  AddValue(build, "--seed", args->seed, "N",
           "torch.manual_seed before construction")
      ->check(NonNegativeInteger());
  AddValue(build, "--device", args->device, "cpu|meta", "device to build on");
  AddValue(build, "--dtype", args->dtype, "DT",
           "floating dtype of the build, any spelling (float32, half, bf16, "
           "...)");
  AddFlag(build, "--all-or-nothing", args->all_or_nothing,
          "fail and store nothing if a hook blocks any registration");
}

struct Totals {
  uint64_t parameters = 0;
  uint64_t parameter_elements = 0;
  uint64_t parameter_bytes = 0;
  uint64_t buffers = 0;
  uint64_t buffer_bytes = 0;
};

uint64_t Numel(const google::protobuf::RepeatedField<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t extent : shape) n *= static_cast<uint64_t>(extent);
  return n;
}

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

// ------------------------------------------------------------------------ ls

// The largest ListModules page_size the server takes.
constexpr uint64_t kMaxPageSize = 1000;

struct ListArgs {
  std::optional<std::string> ns;
  std::optional<uint64_t> limit;
  std::optional<uint64_t> page_size;
};

// Follows the pages until all modules, or `limit` of them, are listed.
absl::StatusOr<v1::ListModulesResponse> ListAll(client::ModelStateClient& rpc,
                                                v1::ListModulesRequest request,
                                                uint64_t limit) {
  v1::ListModulesResponse all;
  while (limit == 0 || static_cast<uint64_t>(all.modules_size()) < limit) {
    MODELSTATE_ASSIGN_OR_RETURN(v1::ListModulesResponse page,
                                rpc.ListModules(request));
    for (v1::ModuleSummary& m : *page.mutable_modules()) {
      if (limit > 0 && static_cast<uint64_t>(all.modules_size()) >= limit) {
        break;
      }
      *all.add_modules() = std::move(m);
    }
    if (page.next_page_token().empty()) break;
    request.set_page_token(page.next_page_token());
  }
  return all;
}

absl::Status RunList(Context& c, const ListArgs& a) {
  uint64_t limit = a.limit.value_or(0);
  v1::ListModulesRequest request;
  request.set_namespace_(a.ns.value_or(""));
  uint64_t page_size = a.page_size.value_or(0);
  if (page_size == 0 && limit > 0) {
    page_size = std::min<uint64_t>(limit, kMaxPageSize);
  }
  request.set_page_size(static_cast<int32_t>(page_size));
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  MODELSTATE_ASSIGN_OR_RETURN(v1::ListModulesResponse all,
                              ListAll(*rpc, request, limit));
  if (c.json()) return c.PrintJson(all);
  if (all.modules().empty()) {
    c.out() << "no modules\n";
    return absl::OkStatus();
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
  return absl::OkStatus();
}

void AddList(CommandSet& commands) {
  auto args = std::make_shared<ListArgs>();
  CLI::App* ls = commands.Add(
      {"ls", "list modules",
       "Lists modules in name order with their type, parameter elements, "
       "bytes and devices, following pages until all (or --limit) are "
       "listed.",
       "modelstatectl ls --namespace team --limit 20"},
      [args](Context& c) { return RunList(c, *args); });
  AddValue(ls, "--namespace", args->ns, "NS", "only modules of this namespace");
  AddValue(ls, "--limit", args->limit, "N", "list at most N modules")
      ->check(PositiveInteger());
  // The server refuses a larger page (INVALID_ARGUMENT); a usage error
  // says so before any call instead of a silently smaller page.
  AddValue(ls, "--page-size", args->page_size, "N",
           "modules per request, 1 to 1000 (default: the server's, 100)")
      ->check(PositiveInteger(kMaxPageSize));
}

// ------------------------------------------------------------------ describe

struct DescribeArgs {
  std::string module;
  std::optional<std::string> path;
  bool hashes = false;
};

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

// One entry's row: name, type, device, size and flags.
std::vector<std::string> EntryRow(const std::string& indent,
                                  const v1::EntryInfo& e, bool buffer) {
  std::vector<std::string> row = {absl::StrCat(indent, "  ", e.name())};
  if (!e.has_tensor()) {
    row.push_back("None");
    return row;
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
  return row;
}

void DescribeTree(const v1::ModuleInfo& info, const std::string& label,
                  int depth, std::vector<std::string>* lines) {
  std::string indent(2 * depth, ' ');
  lines->push_back(indent + ModuleLine(label, info));
  std::vector<std::vector<std::string>> rows;
  for (const v1::EntryInfo& e : info.parameters()) {
    rows.push_back(EntryRow(indent, e, false));
  }
  for (const v1::EntryInfo& e : info.buffers()) {
    rows.push_back(EntryRow(indent, e, true));
  }
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

absl::Status RunDescribe(Context& c, const DescribeArgs& a) {
  v1::GetModuleRequest request;
  request.set_module(a.module);
  request.set_path(a.path.value_or(""));
  request.set_with_hashes(a.hashes);
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  MODELSTATE_ASSIGN_OR_RETURN(v1::GetModuleResponse response,
                              rpc->GetModule(request));
  if (c.json()) return c.PrintJson(response);
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
  return absl::OkStatus();
}

void AddDescribe(CommandSet& commands) {
  auto args = std::make_shared<DescribeArgs>();
  CLI::App* describe = commands.Add(
      {"describe", "show a module's tree, tensors and sizes",
       "Prints the module tree: each submodule with its attributes ([eval] "
       "when not training), each parameter and buffer with dtype, shape, "
       "device and size, then the total and the server's devices.",
       "modelstatectl describe team/mlp --path 0 --hashes"},
      [args](Context& c) { return RunDescribe(c, *args); });
  AddModuleArgument(describe, args->module);
  AddValue(describe, "--path", args->path, "P",
           "describe only the submodule at this dotted path");
  AddFlag(describe, "--hashes", args->hashes,
          "show each tensor's SHA-256 (the server reads every byte)");
}

// ------------------------------------------------------------------------ rm

absl::Status RunRemove(Context& c, const std::string& module) {
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  MODELSTATE_RETURN_IF_ERROR(rpc->DeleteModule(module));
  if (c.json()) return c.PrintJson(v1::DeleteModuleResponse());
  c.out() << "deleted " << FullName(module) << "\n";
  return absl::OkStatus();
}

void AddRemove(CommandSet& commands) {
  auto module = std::make_shared<std::string>();
  CLI::App* rm = commands.Add(
      {"rm", "delete a module", "Deletes a module from the server.",
       "modelstatectl rm team/mlp"},
      [module](Context& c) { return RunRemove(c, *module); });
  AddModuleArgument(rm, *module);
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

void AddModuleCommands(CommandSet& commands) {
  AddBuild(commands);
  AddList(commands);
  AddDescribe(commands);
  AddRemove(commands);
}

}  // namespace modelstate::cli
