// Constructor-argument binding (Python's rules and error texts), typed
// access to the bound values, and the per-build state: tensor allocation
// under the limits and registration through the hooks.
#include "nn/build_context.h"

#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace modelstate::internal {
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
    std::string operator()(const std::vector<double>&) const { return "tuple"; }
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

absl::StatusOr<int64_t> BoundArgs::IntAtLeast(absl::string_view name,
                                              int64_t min) const {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t value, Int(name));
  if (value < min) {
    return absl::InvalidArgumentError(absl::StrCat(type_, ": argument '", name,
                                                   "' must be at least ", min,
                                                   ", got ", value));
  }
  return value;
}

absl::StatusOr<std::vector<int64_t>> BoundArgs::IntsAtLeast(
    absl::string_view name, size_t n, int64_t min) const {
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> values, Ints(name, n));
  for (int64_t v : values) {
    if (v < min) {
      return absl::InvalidArgumentError(
          absl::StrCat(type_, ": argument '", name, "' must be at least ", min,
                       ", got ", v));
    }
  }
  return values;
}

absl::StatusOr<AttrValue> BoundArgs::IntOrTuple(absl::string_view name,
                                                int64_t min) const {
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> values,
                              IntsAtLeast(name, 0, min));
  const SpecValue* v = Find(name);
  if (std::holds_alternative<int64_t>(*v)) return AttrValue(values[0]);
  return AttrValue(std::move(values));
}

absl::StatusOr<AttrValue> BoundArgs::FloatOrTuple(
    absl::string_view name) const {
  const SpecValue* v = Find(name);
  if (v != nullptr) {
    if (const auto* ints = std::get_if<std::vector<int64_t>>(v)) {
      return AttrValue(std::vector<double>(ints->begin(), ints->end()));
    }
    if (const auto* floats = std::get_if<std::vector<double>>(v)) {
      return AttrValue(*floats);
    }
  }
  MODELSTATE_ASSIGN_OR_RETURN(double f, Float(name));
  return AttrValue(f);
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

absl::StatusOr<FactoryKwargs> BoundArgs::Factory(
    const BuildOptions& build) const {
  FactoryKwargs factory;
  MODELSTATE_ASSIGN_OR_RETURN(factory.dtype, FactoryDType(build.dtype));
  MODELSTATE_ASSIGN_OR_RETURN(factory.device, FactoryDevice(build.device));
  return factory;
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
  if (presets_ != nullptr && data.defined() && !data.is_parameter()) {
    auto preset = presets_->find(ChildPath(path, name));
    if (preset != presets_->end()) {
      MODELSTATE_RETURN_IF_ERROR(data.CopyFrom(preset->second));
    }
  }
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

}  // namespace modelstate::internal
