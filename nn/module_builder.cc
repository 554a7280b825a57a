// The builder: argument binding, containers, custom modules, and dispatch to
// the layer library (layers.cc).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "core/init.h"
#include "nn/build_context.h"
#include "nn/module_spec.h"

namespace modelstate {
namespace internal {
namespace {

std::string SpecValueTypeName(const SpecValue& v) {
  struct Visitor {
    std::string operator()(std::monostate) const { return "NoneType"; }
    std::string operator()(bool) const { return "bool"; }
    std::string operator()(int64_t) const { return "int"; }
    std::string operator()(double) const { return "float"; }
    std::string operator()(const std::string&) const { return "str"; }
    std::string operator()(const std::vector<int64_t>&) const {
      return "tuple";
    }
  };
  return std::visit(Visitor{}, v);
}

// Python's list of names in "missing ... arguments": 'a', 'a' and 'b',
// 'a', 'b', and 'c'.
std::string PythonNameList(const std::vector<std::string>& names) {
  std::vector<std::string> quoted;
  for (const std::string& n : names)
    quoted.push_back(absl::StrCat("'", n, "'"));
  if (quoted.size() == 1) return quoted[0];
  if (quoted.size() == 2) return absl::StrCat(quoted[0], " and ", quoted[1]);
  std::string last = quoted.back();
  quoted.pop_back();
  return absl::StrCat(absl::StrJoin(quoted, ", "), ", and ", last);
}

constexpr absl::string_view kContainerQualifiedPrefix =
    "torch.nn.modules.container.";

bool IsContainer(absl::string_view type) {
  return type == "Sequential" || type == "ModuleList" || type == "ModuleDict";
}

}  // namespace

absl::StatusOr<BoundArgs> BindArgs(
    absl::string_view type, const std::vector<ArgDef>& signature,
    const std::vector<SpecValue>& args,
    const std::vector<std::pair<std::string, SpecValue>>& kwargs) {
  std::string fn = absl::StrCat(type, ".__init__()");
  size_t required = 0;
  for (const ArgDef& d : signature) {
    if (!d.default_value.has_value()) ++required;
  }
  if (args.size() > signature.size()) {
    std::string takes =
        required == signature.size()
            ? absl::StrCat(signature.size() + 1)
            : absl::StrCat("from ", required + 1, " to ", signature.size() + 1);
    return absl::InvalidArgumentError(
        absl::StrCat(fn, " takes ", takes, " positional argument",
                     signature.size() == 0 ? "" : "s", " but ", args.size() + 1,
                     args.size() + 1 == 1 ? " was" : " were", " given"));
  }
  absl::flat_hash_map<std::string, SpecValue> values;
  for (size_t i = 0; i < args.size(); ++i) {
    values.emplace(std::string(signature[i].name), args[i]);
  }
  for (const auto& [name, value] : kwargs) {
    bool known = false;
    for (const ArgDef& d : signature) known |= d.name == name;
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat(fn, " got an unexpected keyword argument '", name, "'"));
    }
    if (!values.emplace(name, value).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(fn, " got multiple values for argument '", name, "'"));
    }
  }
  std::vector<std::string> missing;
  for (const ArgDef& d : signature) {
    if (values.contains(d.name)) continue;
    if (d.default_value.has_value()) {
      values.emplace(std::string(d.name), *d.default_value);
    } else {
      missing.push_back(std::string(d.name));
    }
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        fn, " missing ", missing.size(), " required positional argument",
        missing.size() == 1 ? "" : "s", ": ", PythonNameList(missing)));
  }
  return BoundArgs(std::string(type), std::move(values));
}

const SpecValue* BoundArgs::Find(absl::string_view name) const {
  auto it = values_.find(name);
  return it == values_.end() ? nullptr : &it->second;
}

absl::Status BoundArgs::WrongType(absl::string_view name,
                                  absl::string_view expected,
                                  const SpecValue& got) const {
  return absl::InvalidArgumentError(
      absl::StrCat(type_, ": argument '", name, "' must be ", expected,
                   ", got ", SpecValueTypeName(got)));
}

bool BoundArgs::IsNone(absl::string_view name) const {
  const SpecValue* v = Find(name);
  return v == nullptr || std::holds_alternative<std::monostate>(*v);
}

absl::StatusOr<int64_t> BoundArgs::Int(absl::string_view name) const {
  const SpecValue* v = Find(name);
  if (v != nullptr) {
    if (const int64_t* i = std::get_if<int64_t>(v)) return *i;
  }
  return WrongType(name, "an int", v ? *v : SpecValue());
}

absl::StatusOr<double> BoundArgs::Float(absl::string_view name) const {
  const SpecValue* v = Find(name);
  if (v != nullptr) {
    if (const double* d = std::get_if<double>(v)) return *d;
    if (const int64_t* i = std::get_if<int64_t>(v)) {
      return static_cast<double>(*i);
    }
  }
  return WrongType(name, "a float", v ? *v : SpecValue());
}

absl::StatusOr<bool> BoundArgs::Bool(absl::string_view name) const {
  const SpecValue* v = Find(name);
  if (v != nullptr) {
    if (const bool* b = std::get_if<bool>(v)) return *b;
  }
  return WrongType(name, "a bool", v ? *v : SpecValue());
}

absl::StatusOr<std::string> BoundArgs::Str(absl::string_view name) const {
  const SpecValue* v = Find(name);
  if (v != nullptr) {
    if (const std::string* s = std::get_if<std::string>(v)) return *s;
  }
  return WrongType(name, "a str", v ? *v : SpecValue());
}

absl::StatusOr<std::vector<int64_t>> BoundArgs::Ints(absl::string_view name,
                                                     size_t n) const {
  const SpecValue* v = Find(name);
  if (v != nullptr) {
    if (const int64_t* i = std::get_if<int64_t>(v)) {
      return std::vector<int64_t>(n == 0 ? 1 : n, *i);
    }
    if (const auto* t = std::get_if<std::vector<int64_t>>(v)) {
      if (n != 0 && t->size() != n) {
        return absl::InvalidArgumentError(
            absl::StrCat(type_, ": argument '", name, "' must have ", n,
                         " elements, got ", t->size()));
      }
      return *t;
    }
  }
  return WrongType(name, "an int or a tuple of ints", v ? *v : SpecValue());
}

absl::StatusOr<AttrValue> BoundArgs::IntOrTuple(absl::string_view name,
                                                int64_t min) const {
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> values, Ints(name, 0));
  for (int64_t v : values) {
    if (v < min) {
      return absl::InvalidArgumentError(
          absl::StrCat(type_, ": argument '", name, "' must be at least ", min,
                       ", got ", v));
    }
  }
  const SpecValue* v = Find(name);
  if (std::holds_alternative<int64_t>(*v)) return AttrValue(values[0]);
  return AttrValue(std::move(values));
}

absl::StatusOr<DType> BoundArgs::FactoryDType(DType build_dtype) const {
  if (IsNone("dtype")) return build_dtype;
  MODELSTATE_ASSIGN_OR_RETURN(std::string text, Str("dtype"));
  MODELSTATE_ASSIGN_OR_RETURN(DType dtype, ParseDType(text));
  if (!IsFloatingPoint(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat(type_, ": dtype must be a floating point dtype, got ",
                     DTypeName(dtype)));
  }
  return dtype;
}

absl::StatusOr<Device> BoundArgs::FactoryDevice(Device build_device) const {
  if (IsNone("device")) return build_device;
  MODELSTATE_ASSIGN_OR_RETURN(std::string text, Str("device"));
  MODELSTATE_ASSIGN_OR_RETURN(Device device, ParseDevice(text));
  if (!device.is_cpu() && !device.is_meta()) {
    return absl::InvalidArgumentError(
        absl::StrCat(type_, ": modules are built on cpu or meta (got '", text,
                     "'); move them afterwards"));
  }
  return device;
}

BuildContext::BuildContext(const BuildOptions& options)
    : options_(options), gen_(options.seed) {}

absl::StatusOr<Tensor> BuildContext::NewTensor(DType dtype, Shape shape,
                                               Device device) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t numel, CheckedNumElements(shape));
  MODELSTATE_ASSIGN_OR_RETURN(uint64_t nbytes, CheckedNumBytes(numel, dtype));
  if (device.has_storage()) {
    if (nbytes > options_.limits.max_tensor_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "A ", DTypeName(dtype), ShapeToString(shape), " tensor needs ",
          nbytes, " bytes, over the max_tensor_bytes limit of ",
          options_.limits.max_tensor_bytes));
    }
    if (nbytes > options_.limits.max_total_bytes - total_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "The module needs more than the max_total_bytes limit of ",
          options_.limits.max_total_bytes, " bytes"));
    }
    total_bytes_ += nbytes;
  }
  return Tensor::Empty(dtype, std::move(shape), device);
}

absl::Status BuildContext::CountEntry() {
  if (++entries_ > options_.limits.max_entries) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "The module has more than the max_entries limit of ",
        options_.limits.max_entries, " parameters, buffers and submodules"));
  }
  return absl::OkStatus();
}

RegistrationContext BuildContext::Context(const std::string& path) {
  RegistrationContext ctx;
  ctx.hooks = options_.hooks;
  ctx.records = &records_;
  ctx.path = path;
  return ctx;
}

absl::Status BuildContext::AddParameter(Module& module, const std::string& path,
                                        std::string name, Tensor data,
                                        bool requires_grad) {
  MODELSTATE_RETURN_IF_ERROR(CountEntry());
  // A parameter (a tie) is registered as the same object; plain data is
  // wrapped into a new parameter.
  Tensor param = data;
  if (data.defined() && !data.is_parameter()) {
    MODELSTATE_ASSIGN_OR_RETURN(param, MakeParameter(data, requires_grad));
  }
  return module
      .RegisterParameter(std::move(name), std::move(param), Context(path))
      .status();
}

absl::Status BuildContext::AddBuffer(Module& module, const std::string& path,
                                     std::string name, Tensor tensor,
                                     bool persistent) {
  MODELSTATE_RETURN_IF_ERROR(CountEntry());
  return module
      .RegisterBuffer(std::move(name), std::move(tensor), persistent,
                      Context(path))
      .status();
}

absl::Status BuildContext::AddModule(Module& module, const std::string& path,
                                     std::string name,
                                     std::shared_ptr<Module> child) {
  MODELSTATE_RETURN_IF_ERROR(CountEntry());
  return module.RegisterModule(std::move(name), std::move(child), Context(path))
      .status();
}

absl::Status BuildContext::Enter() {
  if (++depth_ > options_.limits.max_depth) {
    return absl::ResourceExhaustedError(
        absl::StrCat("The spec nests modules deeper than the max_depth limit "
                     "of ",
                     options_.limits.max_depth));
  }
  return absl::OkStatus();
}

namespace {

std::string ChildPath(const std::string& path, absl::string_view name) {
  return path.empty() ? std::string(name) : absl::StrCat(path, ".", name);
}

absl::Status WithSpecPath(const absl::Status& status,
                          const std::string& spec_path,
                          absl::string_view type) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(spec_path, " (", type,
                                                  "): ", status.message()));
}

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

namespace {

// Splits "a.b.c" into ("a", "b.c").
std::pair<std::string, std::string> SplitFirst(absl::string_view path) {
  size_t dot = path.find('.');
  if (dot == absl::string_view::npos) return {std::string(path), ""};
  return {std::string(path.substr(0, dot)), std::string(path.substr(dot + 1))};
}

// Splits "a.b.c" into ("a.b", "c").
std::pair<std::string, std::string> SplitOwner(absl::string_view path) {
  size_t dot = path.rfind('.');
  if (dot == absl::string_view::npos) return {"", std::string(path)};
  return {std::string(path.substr(0, dot)), std::string(path.substr(dot + 1))};
}

absl::StatusOr<std::shared_ptr<Module>> ResolveRef(const ModuleSpec& spec,
                                                   const Module& scope) {
  if (!spec.type.empty() || !spec.args.empty() || !spec.kwargs.empty() ||
      !spec.children.empty() || !spec.members.empty() || !spec.ties.empty()) {
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
      spec.type, absl::StrCat(kContainerQualifiedPrefix, spec.type));
  for (size_t i = 0; i < built.size(); ++i) {
    MODELSTATE_RETURN_IF_ERROR(
        WithSpecPath(ctx.AddModule(*m, path, names[i], std::move(built[i])),
                     absl::StrCat(spec_path, ".children[", i, "]"), spec.type));
  }
  return m;
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
  if (IsContainer(spec.type)) {
    result = BuildContainer(spec, path, spec_path, ctx);
  } else if (const LayerDef* layer = FindLayer(spec.type)) {
    if (!spec.children.empty() || !spec.members.empty()) {
      result = absl::InvalidArgumentError(
          absl::StrCat(spec_path, " (", spec.type,
                       "): a library layer is configured by "
                       "'args' and 'kwargs' only"));
    } else {
      std::vector<ArgDef> no_signature;
      absl::StatusOr<BoundArgs> bound =
          layer->accepts_anything
              ? BindArgs(spec.type, no_signature, {}, {})
              : BindArgs(spec.type, layer->signature, spec.args, spec.kwargs);
      if (!bound.ok()) {
        result = WithSpecPath(bound.status(), spec_path, spec.type);
      } else {
        result = layer->build(*bound, ctx, path);
        if (!result.ok()) {
          result = WithSpecPath(result.status(), spec_path, spec.type);
        }
      }
    }
  } else {
    result = BuildCustom(spec, path, spec_path, ctx);
  }
  ctx.Leave();
  return result;
}

}  // namespace internal

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
    types.push_back(std::string(def.type));
  }
  types.push_back("Sequential");
  types.push_back("ModuleList");
  types.push_back("ModuleDict");
  return types;
}

bool IsLayerType(absl::string_view type) {
  return internal::IsContainer(type) || internal::FindLayer(type) != nullptr;
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
  return BuildResult{std::move(root), std::move(ctx.records())};
}

}  // namespace modelstate
