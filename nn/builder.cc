// The spec-driven builder: walks a ModuleSpec, builds custom modules entry by
// entry (members, refs, ties), and hands library types to their entries in
// the layer table (layer_registry.h): layers get their bound constructor
// arguments, containers their spec's children.
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "core/init.h"
#include "nn/build_context.h"
#include "nn/layer_registry.h"
#include "nn/module_spec.h"
#include "nn/unknown_type.h"

namespace modelstate {
namespace internal {
namespace {

// Initialises a custom module's tensor per its InitSpec.
absl::Status InitCustomTensor(Tensor& t, const InitSpec& init,
                              BuildContext& ctx) {
  std::optional<Generator> own;
  if (init.seed.has_value()) own.emplace(*init.seed);
  Generator& gen = own.has_value() ? *own : ctx.gen();
  switch (init.kind) {
    case InitSpec::Kind::kZeros:
    case InitSpec::Kind::kEmpty:
      return ConstantInit(t, 0.0);
    case InitSpec::Kind::kOnes:
      return ConstantInit(t, 1.0);
    case InitSpec::Kind::kConstant:
      return ConstantInit(t, init.a);
    case InitSpec::Kind::kUniform:
      return UniformInit(t, init.a, init.b, gen);
    case InitSpec::Kind::kNormal:
      return NormalInit(t, init.a, init.b, gen);
    case InitSpec::Kind::kKaimingUniform:
      return KaimingUniform(t, init.a, gen);
    case InitSpec::Kind::kXavierUniform:
      return XavierUniform(t, init.a, gen);
    case InitSpec::Kind::kXavierNormal:
      return XavierNormal(t, init.a, gen);
  }
  return absl::InvalidArgumentError("unknown init kind");
}

}  // namespace

absl::StatusOr<Tensor> MakeCustomTensor(const TensorSpec& spec,
                                        BuildContext& ctx) {
  Device device = ctx.options().device;
  if (spec.data.defined()) {
    MODELSTATE_ASSIGN_OR_RETURN(
        Tensor t, ctx.NewTensor(spec.data.dtype(), spec.data.shape(), device));
    MODELSTATE_RETURN_IF_ERROR(t.CopyFrom(spec.data));
    return t;
  }
  DType dtype = spec.dtype.value_or(ctx.options().dtype);
  MODELSTATE_ASSIGN_OR_RETURN(Tensor t,
                              ctx.NewTensor(dtype, spec.shape, device));
  MODELSTATE_RETURN_IF_ERROR(InitCustomTensor(t, spec.init, ctx));
  return t;
}

absl::StatusOr<std::shared_ptr<Module>> ResolveRef(const ModuleSpec& spec,
                                                   const Module& scope) {
  if (!spec.type.empty() || !spec.args.empty() || !spec.kwargs.empty() ||
      !spec.children.empty() || !spec.members.empty() || !spec.ties.empty() ||
      spec.custom) {
    return absl::InvalidArgumentError(
        "a 'ref' spec must not have any other field");
  }
  absl::StatusOr<std::shared_ptr<Module>> found = scope.GetSubmodule(spec.ref);
  if (!found.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ref '", spec.ref, "' names no module built so far (",
                     found.status().message(), ")"));
  }
  return found;
}

namespace {

// Splits "a.b.c" into ("a.b", "c").
std::pair<std::string, std::string> SplitOwner(absl::string_view path) {
  size_t dot = path.rfind('.');
  if (dot == absl::string_view::npos) return {"", std::string(path)};
  return {std::string(path.substr(0, dot)), std::string(path.substr(dot + 1))};
}

absl::Status ApplyTie(const TieSpec& tie, Module& scope,
                      const std::string& path, BuildContext& ctx) {
  auto [source_owner_path, source_name] = SplitOwner(tie.source);
  MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<Module> source_owner,
                              scope.GetSubmodule(source_owner_path));
  const Tensor* source = source_owner->parameters().Find(source_name);
  bool is_parameter = source != nullptr;
  if (source == nullptr) source = source_owner->buffers().Find(source_name);
  if (source == nullptr || !source->defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat("source '", tie.source, "' is not a parameter or buffer"));
  }
  auto [target_owner_path, target_name] = SplitOwner(tie.target);
  MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<Module> target_owner,
                              scope.GetSubmodule(target_owner_path));
  std::string target_path =
      target_owner_path.empty() ? path : ChildPath(path, target_owner_path);
  if (is_parameter) {
    return ctx.AddParameter(*target_owner, target_path, target_name, *source,
                            source->requires_grad());
  }
  return ctx.AddBuffer(*target_owner, target_path, target_name, *source,
                       source_owner->IsPersistentBuffer(source_name));
}

absl::StatusOr<std::shared_ptr<Module>> BuildCustom(
    const ModuleSpec& spec, const std::string& path,
    const std::string& spec_path, BuildContext& ctx) {
  if (!spec.args.empty() || !spec.kwargs.empty() || !spec.children.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec_path, " (", spec.type,
        "): a custom module is built from 'members'; 'args', 'kwargs' and "
        "'children' are for library types (",
        absl::StrJoin(LayerTypes(), ", "), ")"));
  }
  std::shared_ptr<Module> m = Module::Create(spec.type);
  if (spec.has_extra_state) {
    MODELSTATE_ASSIGN_OR_RETURN(Tensor empty,
                                Tensor::Empty(DType::kUInt8, {0}));
    m->EnableExtraState(empty);
  }
  for (size_t i = 0; i < spec.members.size(); ++i) {
    const MemberSpec& member = spec.members[i];
    std::string member_path = absl::StrCat(spec_path, ".members[", i, "]");
    absl::Status status;
    switch (member.kind) {
      case EntryKind::kParameter:
      case EntryKind::kBuffer: {
        Tensor t;
        if (!member.is_none) {
          absl::StatusOr<Tensor> made = MakeCustomTensor(member.tensor, ctx);
          if (!made.ok()) {
            status = made.status();
            break;
          }
          t = *std::move(made);
        }
        status = member.kind == EntryKind::kParameter
                     ? ctx.AddParameter(*m, path, member.name, std::move(t),
                                        member.requires_grad)
                     : ctx.AddBuffer(*m, path, member.name, std::move(t),
                                     member.persistent);
        break;
      }
      case EntryKind::kModule: {
        std::shared_ptr<Module> child;
        if (!member.is_none) {
          if (member.module == nullptr) {
            status =
                absl::InvalidArgumentError("a module member needs 'module'");
            break;
          }
          if (!member.module->ref.empty()) {
            absl::StatusOr<std::shared_ptr<Module>> found =
                ResolveRef(*member.module, *m);
            if (!found.ok()) {
              status = found.status();
              break;
            }
            child = *found;
          } else {
            MODELSTATE_ASSIGN_OR_RETURN(
                child, BuildSpec(*member.module, ChildPath(path, member.name),
                                 member_path + ".module", ctx));
          }
        }
        status = ctx.AddModule(*m, path, member.name, std::move(child));
        break;
      }
    }
    if (!status.ok()) {
      return absl::Status(
          status.code(),
          absl::StrCat(member_path, " (", EntryKindName(member.kind), " '",
                       member.name, "'): ", status.message()));
    }
  }
  for (size_t i = 0; i < spec.ties.size(); ++i) {
    absl::Status status = ApplyTie(spec.ties[i], *m, path, ctx);
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat(spec_path, ".ties[", i,
                                                      "]: ", status.message()));
    }
  }
  return m;
}

// A library layer from its constructor arguments.
absl::StatusOr<std::shared_ptr<Module>> BuildLayer(const LayerDef& layer,
                                                   const ModuleSpec& spec,
                                                   const std::string& path,
                                                   const std::string& spec_path,
                                                   BuildContext& ctx) {
  if (!spec.children.empty() || !spec.members.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec_path, " (", spec.type,
                     "): a library layer is configured by "
                     "'args' and 'kwargs' only"));
  }
  std::vector<ArgDef> no_signature;
  absl::StatusOr<BoundArgs> bound =
      layer.accepts_anything
          ? BindArgs(spec.type, no_signature, {}, {})
          : BindArgs(spec.type, layer.signature, spec.args, spec.kwargs);
  if (!bound.ok()) return WithSpecPath(bound.status(), spec_path, spec.type);
  absl::StatusOr<std::shared_ptr<Module>> built =
      layer.build(*bound, ctx, path);
  if (!built.ok()) return WithSpecPath(built.status(), spec_path, spec.type);
  return built;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Module>> BuildSpec(const ModuleSpec& spec,
                                                  const std::string& path,
                                                  const std::string& spec_path,
                                                  BuildContext& ctx) {
  if (!spec.ref.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec_path,
                     ".ref: only a container child or a custom module's member "
                     "may refer to another module"));
  }
  if (spec.type.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec_path, ".type: must not be empty"));
  }
  MODELSTATE_RETURN_IF_ERROR(WithSpecPath(ctx.Enter(), spec_path, spec.type));
  absl::StatusOr<std::shared_ptr<Module>> result;
  // `custom` builds a custom module even under a library type's name (a
  // user's own class called Linear).
  const LayerDef* layer = spec.custom ? nullptr : FindLayer(spec.type);
  if (layer != nullptr && layer->build_container != nullptr) {
    result = layer->build_container(spec, path, spec_path, ctx);
  } else if (layer != nullptr && layer->build != nullptr) {
    result = BuildLayer(*layer, spec, path, spec_path, ctx);
  } else if (IsCustomSpec(spec)) {
    result = BuildCustom(spec, path, spec_path, ctx);
  } else {
    // A typo or a layer the library lacks must not become an empty module.
    result = UnknownTypeError(spec.type, spec_path);
  }
  ctx.Leave();
  return result;
}

}  // namespace internal

absl::string_view InitKindName(InitSpec::Kind kind) {
  switch (kind) {
    case InitSpec::Kind::kZeros:
      return "zeros";
    case InitSpec::Kind::kOnes:
      return "ones";
    case InitSpec::Kind::kConstant:
      return "constant";
    case InitSpec::Kind::kUniform:
      return "uniform";
    case InitSpec::Kind::kNormal:
      return "normal";
    case InitSpec::Kind::kKaimingUniform:
      return "kaiming_uniform";
    case InitSpec::Kind::kXavierUniform:
      return "xavier_uniform";
    case InitSpec::Kind::kXavierNormal:
      return "xavier_normal";
    case InitSpec::Kind::kEmpty:
      return "empty";
  }
  return "unknown";
}

ModuleSpec ModuleSpec::Layer(
    std::string type, std::vector<SpecValue> args,
    std::vector<std::pair<std::string, SpecValue>> kwargs) {
  ModuleSpec spec;
  spec.type = std::move(type);
  spec.args = std::move(args);
  spec.kwargs = std::move(kwargs);
  return spec;
}

std::vector<std::string> LayerTypes() {
  std::vector<std::string> types;
  for (const internal::LayerDef& def : internal::AllLayers()) {
    if (internal::IsBuildable(def)) types.push_back(std::string(def.type));
  }
  return types;
}

bool IsLayerType(absl::string_view type) {
  const internal::LayerDef* def = internal::FindLayer(type);
  return def != nullptr && internal::IsBuildable(*def);
}

absl::StatusOr<Tensor> CreateTensor(const TensorSpec& spec, uint64_t seed,
                                    DType default_dtype, Device device,
                                    const BuildLimits& limits) {
  BuildOptions options;
  options.seed = seed;
  options.dtype = default_dtype;
  options.device = device;
  options.limits = limits;
  internal::BuildContext ctx(options);
  return internal::MakeCustomTensor(spec, ctx);
}

absl::Status CheckTraversalEntries(uint64_t entries,
                                   const BuildLimits& limits) {
  if (entries <= static_cast<uint64_t>(limits.max_entries)) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "The module would have ",
      entries == std::numeric_limits<uint64_t>::max() ? "more than " : "",
      entries,
      " state_dict keys and submodule paths (a shared submodule counts once "
      "per path), more than the max_entries limit of ",
      limits.max_entries));
}

absl::StatusOr<BuildResult> BuildModule(const ModuleSpec& spec,
                                        const BuildOptions& options) {
  if (!IsFloatingPoint(options.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype must be a floating point dtype, got ",
                     DTypeName(options.dtype)));
  }
  if (!options.device.is_cpu() && !options.device.is_meta()) {
    return absl::InvalidArgumentError(
        absl::StrCat("device: modules are built on cpu or meta, not ",
                     options.device.ToString(), "; move them afterwards"));
  }
  internal::BuildContext ctx(options);
  MODELSTATE_ASSIGN_OR_RETURN(
      std::shared_ptr<Module> root,
      internal::BuildSpec(spec, options.root_path, "spec", ctx));
  // A `ref` adds no entry to the count above, but state_dict and
  // load_state_dict walk a shared submodule once per path: a few refs
  // nested as diamonds would give a tiny spec billions of keys.
  MODELSTATE_RETURN_IF_ERROR(
      CheckTraversalEntries(TraversalEntries(*root), options.limits));
  return BuildResult{std::move(root), std::move(ctx.records())};
}

}  // namespace modelstate
