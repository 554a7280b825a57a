// The container family: Sequential, ModuleList and ModuleDict. Built from a
// spec's children (positional or named; a child may be a ref to an earlier
// sibling, as in Sequential(l, l)), each child constructed before the
// container registers them, as in PyTorch. Only Sequential has a forward:
// each child gets the previous child's outputs.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "nn/build_context.h"
#include "nn/layer_registry.h"

namespace modelstate::internal {
namespace {

// Splits "a.b.c" into ("a", "b.c").
std::pair<std::string, std::string> SplitFirst(absl::string_view path) {
  size_t dot = path.find('.');
  if (dot == absl::string_view::npos) return {std::string(path), ""};
  return {std::string(path.substr(0, dot)), std::string(path.substr(dot + 1))};
}

absl::StatusOr<std::shared_ptr<Module>> BuildContainer(
    const ModuleSpec& spec, const std::string& path,
    const std::string& spec_path, BuildContext& ctx) {
  if (!spec.args.empty() || !spec.kwargs.empty() || !spec.members.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec_path, " (", spec.type, "): a ", spec.type,
                     " takes its modules from 'children' only"));
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < spec.children.size(); ++i) {
    const std::string& given = spec.children[i].name;
    if (spec.type == "ModuleDict") {
      if (given.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            spec_path, ".children[", i, "]: a ModuleDict child needs a name"));
      }
      names.push_back(given);
    } else if (spec.type == "ModuleList" && !given.empty() &&
               given != absl::StrCat(i)) {
      return absl::InvalidArgumentError(
          absl::StrCat(spec_path, ".children[", i,
                       "]: ModuleList children are named by "
                       "position; got '",
                       given, "'"));
    } else {
      names.push_back(given.empty() ? absl::StrCat(i) : given);
    }
  }
  // PyTorch constructs every child (the call's arguments) before the
  // container registers them one by one.
  std::vector<std::shared_ptr<Module>> built;
  for (size_t i = 0; i < spec.children.size(); ++i) {
    const ModuleSpec& child_spec = spec.children[i].spec;
    std::string child_spec_path = absl::StrCat(spec_path, ".children[", i, "]");
    if (!child_spec.ref.empty()) {
      // A sibling built earlier (Sequential(l, l)), or a path below it.
      auto [head, rest] = SplitFirst(child_spec.ref);
      std::shared_ptr<Module> found;
      for (size_t j = 0; j < i; ++j) {
        if (names[j] == head) found = built[j];
      }
      if (found != nullptr && !rest.empty()) {
        ModuleSpec below = child_spec;
        below.ref = rest;
        absl::StatusOr<std::shared_ptr<Module>> sub = ResolveRef(below, *found);
        found = sub.ok() ? *sub : nullptr;
      }
      if (found == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(child_spec_path, ": ref '", child_spec.ref,
                         "' names no earlier child"));
      }
      built.push_back(std::move(found));
      continue;
    }
    MODELSTATE_ASSIGN_OR_RETURN(
        std::shared_ptr<Module> child,
        BuildSpec(child_spec, ChildPath(path, names[i]), child_spec_path, ctx));
    built.push_back(std::move(child));
  }
  std::shared_ptr<Module> m = Module::Create(
      spec.type, absl::StrCat("torch.nn.modules.container.", spec.type));
  for (size_t i = 0; i < built.size(); ++i) {
    MODELSTATE_RETURN_IF_ERROR(
        WithSpecPath(ctx.AddModule(*m, path, names[i], std::move(built[i])),
                     absl::StrCat(spec_path, ".children[", i, "]"), spec.type));
  }
  return m;
}

absl::StatusOr<std::vector<Tensor>> SequentialForward(
    const LayerCall& call, const std::vector<Tensor>& in) {
  std::vector<Tensor> x = in;
  for (const auto& item : call.module.children()) {
    if (item.value == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Sequential child '", item.key, "' is None and cannot be called"));
    }
    MODELSTATE_ASSIGN_OR_RETURN(x, call.runner.Call(*item.value, std::move(x)));
  }
  return x;
}

}  // namespace

std::vector<LayerDef> ContainerFamily() {
  return {
      {.type = "Sequential",
       .qualified_name = "torch.nn.modules.container.Sequential",
       .build_container = &BuildContainer,
       .forward = &SequentialForward},
      {.type = "ModuleList",
       .qualified_name = "torch.nn.modules.container.ModuleList",
       .build_container = &BuildContainer},
      {.type = "ModuleDict",
       .qualified_name = "torch.nn.modules.container.ModuleDict",
       .build_container = &BuildContainer},
  };
}

}  // namespace modelstate::internal
