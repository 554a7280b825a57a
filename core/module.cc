#include "core/module.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/log.h"
#include "base/status_macros.h"

namespace modelstate {

absl::Status ValidateReplacement(const RegistrationEvent& event,
                                 const SlotValue& replacement) {
  if (event.action == RegistrationAction::kUnregister) {
    return absl::InvalidArgumentError(
        "a replacement is not allowed for an unregister event");
  }
  if (event.kind == EntryKind::kModule) {
    if (replacement.module == nullptr || replacement.tensor.defined()) {
      return absl::InvalidArgumentError(
          "a submodule can only be replaced by a module");
    }
    if (replacement.module.get() == event.module) {
      return absl::InvalidArgumentError(
          "a module cannot be registered inside itself");
    }
    // The replacement must not contain the module it is registered in.
    for (const auto& [path, m] : replacement.module->NamedModules()) {
      if (m.get() == event.module) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the replacement module contains the module it would be "
            "registered in (at '",
            path, "')"));
      }
    }
    return absl::OkStatus();
  }
  if (replacement.module != nullptr || !replacement.tensor.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a ", EntryKindName(event.kind),
        " can only be replaced by a tensor (use block to drop it)"));
  }
  const Tensor& original = event.value.tensor;
  const Tensor& t = replacement.tensor;
  if (IsFloatingPoint(original.dtype())) {
    if (!IsFloatingPoint(t.dtype())) {
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", DTypeName(original.dtype()),
                       " may only become another "
                       "floating point dtype, not ",
                       DTypeName(t.dtype())));
    }
  } else if (t.dtype() != original.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype ", DTypeName(original.dtype()),
        " is not floating point and cannot change to ", DTypeName(t.dtype())));
  }
  if (event.module != nullptr && event.module->fixed_shapes() &&
      t.shape() != original.shape()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape must stay ", ShapeToString(original.shape()), " in ",
        event.module->type_name(), ", got ", ShapeToString(t.shape())));
  }
  MODELSTATE_RETURN_IF_ERROR(CheckDeviceAvailable(t.device()));
  if (t.requires_grad() && !IsFloatingPoint(t.dtype())) {
    return absl::InvalidArgumentError(
        "requires_grad needs a floating point dtype");
  }
  return absl::OkStatus();
}

absl::StatusOr<SlotValue> NormalizeReplacement(const RegistrationEvent& event,
                                               SlotValue replacement) {
  if (event.kind == EntryKind::kParameter && replacement.tensor.defined() &&
      !replacement.tensor.is_parameter()) {
    bool requires_grad = event.value.tensor.defined() &&
                         event.value.tensor.requires_grad() &&
                         IsFloatingPoint(replacement.tensor.dtype());
    MODELSTATE_ASSIGN_OR_RETURN(
        replacement.tensor, MakeParameter(replacement.tensor, requires_grad));
  }
  if (event.kind != EntryKind::kBuffer) replacement.persistent = true;
  return replacement;
}

absl::StatusOr<SlotValue> CheckReplacement(const RegistrationEvent& event,
                                           SlotValue replacement) {
  MODELSTATE_ASSIGN_OR_RETURN(
      SlotValue normalized,
      NormalizeReplacement(event, std::move(replacement)));
  MODELSTATE_RETURN_IF_ERROR(ValidateReplacement(event, normalized));
  return normalized;
}

namespace {

// Every attribute of a bare torch.nn.Module instance (dir(nn.Module()) in
// PyTorch 1.13): registering any of these names fails with "attribute 'x'
// already exists", as `hasattr(self, name)` is true for them.
constexpr absl::string_view kModuleClassAttributes[] = {
    "T_destination",
    "__annotations__",
    "__call__",
    "__class__",
    "__delattr__",
    "__dict__",
    "__dir__",
    "__doc__",
    "__eq__",
    "__format__",
    "__ge__",
    "__getattr__",
    "__getattribute__",
    "__getstate__",
    "__gt__",
    "__hash__",
    "__init__",
    "__init_subclass__",
    "__le__",
    "__lt__",
    "__module__",
    "__ne__",
    "__new__",
    "__reduce__",
    "__reduce_ex__",
    "__repr__",
    "__setattr__",
    "__setstate__",
    "__sizeof__",
    "__str__",
    "__subclasshook__",
    "__weakref__",
    "_apply",
    "_backward_hooks",
    "_buffers",
    "_call_impl",
    "_forward_hooks",
    "_forward_pre_hooks",
    "_get_backward_hooks",
    "_get_name",
    "_is_full_backward_hook",
    "_load_from_state_dict",
    "_load_state_dict_post_hooks",
    "_load_state_dict_pre_hooks",
    "_maybe_warn_non_full_backward_hook",
    "_modules",
    "_named_members",
    "_non_persistent_buffers_set",
    "_parameters",
    "_register_load_state_dict_pre_hook",
    "_register_state_dict_hook",
    "_replicate_for_data_parallel",
    "_save_to_state_dict",
    "_slow_forward",
    "_state_dict_hooks",
    "_version",
    "add_module",
    "apply",
    "bfloat16",
    "buffers",
    "children",
    "cpu",
    "cuda",
    "double",
    "dump_patches",
    "eval",
    "extra_repr",
    "float",
    "forward",
    "get_buffer",
    "get_extra_state",
    "get_parameter",
    "get_submodule",
    "half",
    "ipu",
    "load_state_dict",
    "modules",
    "named_buffers",
    "named_children",
    "named_modules",
    "named_parameters",
    "parameters",
    "register_backward_hook",
    "register_buffer",
    "register_forward_hook",
    "register_forward_pre_hook",
    "register_full_backward_hook",
    "register_load_state_dict_post_hook",
    "register_module",
    "register_parameter",
    "requires_grad_",
    "set_extra_state",
    "share_memory",
    "state_dict",
    "to",
    "to_empty",
    "train",
    "training",
    "type",
    "xpu",
    "zero_grad"};

constexpr absl::string_view kExtraStateKey = "_extra_state";

// kModuleClassAttributes, looked up and sorted once for every module: each
// module kept its own set of these names, ~100 allocations per module made
// (a 10,000-module build spent more in that than in its registrations).
const absl::flat_hash_set<absl::string_view>& ModuleClassAttributes() {
  static const auto* names = new absl::flat_hash_set<absl::string_view>(
      std::begin(kModuleClassAttributes), std::end(kModuleClassAttributes));
  return *names;
}
const std::vector<std::string>& SortedModuleClassAttributes() {
  static const auto* names = [] {
    auto* sorted = new std::vector<std::string>(
        std::begin(kModuleClassAttributes), std::end(kModuleClassAttributes));
    std::sort(sorted->begin(), sorted->end());
    return sorted;
  }();
  return *names;
}

std::string JoinName(absl::string_view prefix, absl::string_view name) {
  return prefix.empty() ? std::string(name) : absl::StrCat(prefix, ".", name);
}

// Python's repr of a list of strings: ['a', 'b'].
std::string PyListRepr(const std::vector<std::string>& items) {
  return absl::StrCat("[",
                      absl::StrJoin(items, ", ",
                                    [](std::string* out, const std::string& s) {
                                      absl::StrAppend(out, "'", s, "'");
                                    }),
                      "]");
}

std::string QuotedList(const std::vector<std::string>& items) {
  return absl::StrJoin(items, ", ", [](std::string* out, const std::string& s) {
    absl::StrAppend(out, "\"", s, "\"");
  });
}

// The 0-dim tensor holding element 0 of `t` (PyTorch's `input_param[0]`).
absl::StatusOr<Tensor> FirstElement(const Tensor& t) {
  if (t.numel() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "index 0 is out of bounds for dimension 0 with size ", t.shape()[0]));
  }
  MODELSTATE_ASSIGN_OR_RETURN(Tensor out,
                              Tensor::Empty(t.dtype(), {}, t.device()));
  if (!t.device().has_storage()) return out;
  MODELSTATE_ASSIGN_OR_RETURN(void* dst, out.MutableDataForOverwrite());
  MODELSTATE_RETURN_IF_ERROR(CopyBytes(out.device(), dst, t.device(),
                                       t.raw_data(), ElementSize(t.dtype())));
  return out;
}

absl::Status KeyError(std::string message) {
  return absl::InvalidArgumentError(std::move(message));
}

absl::Status AlreadyExists(absl::string_view name) {
  return absl::AlreadyExistsError(
      absl::StrCat("attribute '", name, "' already exists"));
}

}  // namespace

std::string AttrTypeName(const AttrValue& value) {
  struct Visitor {
    std::string operator()(std::monostate) const { return "NoneType"; }
    std::string operator()(bool) const { return "bool"; }
    std::string operator()(int64_t) const { return "int"; }
    std::string operator()(double) const { return "float"; }
    std::string operator()(const std::string&) const { return "str"; }
    std::string operator()(const std::vector<int64_t>&) const { return "list"; }
    std::string operator()(const std::vector<double>&) const { return "list"; }
    std::string operator()(const Tensor& t) const {
      return t.defined() ? t.TypeName() : "NoneType";
    }
  };
  return std::visit(Visitor{}, value);
}

std::string IncompatibleKeys::ToString() const {
  if (missing_keys.empty() && unexpected_keys.empty()) {
    return "<All keys matched successfully>";
  }
  return absl::StrCat(
      "_IncompatibleKeys(missing_keys=", PyListRepr(missing_keys),
      ", unexpected_keys=", PyListRepr(unexpected_keys), ")");
}

Module::Module(std::string type_name, std::string qualified_name)
    : type_name_(std::move(type_name)),
      qualified_name_(qualified_name.empty()
                          ? absl::StrCat("__main__.", type_name_)
                          : std::move(qualified_name)) {}

std::shared_ptr<Module> Module::Create(std::string type_name,
                                       std::string qualified_name) {
  return std::shared_ptr<Module>(
      new Module(std::move(type_name), std::move(qualified_name)));
}

void Module::AddClassAttributes(absl::Span<const absl::string_view> names) {
  for (absl::string_view name : names) {
    if (!ModuleClassAttributes().contains(name)) {
      class_attributes_.insert(std::string(name));
    }
  }
}

bool Module::HasClassAttribute(absl::string_view name) const {
  return ModuleClassAttributes().contains(name) ||
         class_attributes_.contains(name);
}

std::vector<std::string> Module::ClassAttributeNames() const {
  std::vector<std::string> names = SortedModuleClassAttributes();
  if (class_attributes_.empty()) return names;
  names.insert(names.end(), class_attributes_.begin(), class_attributes_.end());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> Module::OwnClassAttributeNames() const {
  std::vector<std::string> names(class_attributes_.begin(),
                                 class_attributes_.end());
  std::sort(names.begin(), names.end());
  return names;
}

void Module::SetPlainAttribute(std::string name, AttrValue value) {
  attributes_.Set(std::move(name), std::move(value));
}

// ---------------------------------------------------------------------------
// Registration

absl::Status Module::CheckNameFree(EntryKind kind,
                                   absl::string_view name) const {
  bool taken = HasClassAttribute(name) || attributes_.Contains(name) ||
               (kind != EntryKind::kParameter && parameters_.Contains(name)) ||
               (kind != EntryKind::kBuffer && buffers_.Contains(name)) ||
               (kind != EntryKind::kModule && children_.Contains(name));
  return taken ? AlreadyExists(name) : absl::OkStatus();
}

bool Module::ContainsModule(const Module* target) const {
  // Runs at each RegisterModule over the subtree being registered, and a
  // build registers bottom up: a module at depth d is visited d times. So
  // pointers only, where NamedModules would also build each one's path
  // and copy each shared_ptr; `seen` keeps a shared submodule to one visit.
  if (children_.empty()) return this == target;
  absl::flat_hash_set<const Module*> seen = {this};
  std::vector<const Module*> stack = {this};
  while (!stack.empty()) {
    const Module* m = stack.back();
    stack.pop_back();
    if (m == target) return true;
    for (const auto& item : m->children_) {
      const Module* child = item.value.get();
      if (child != nullptr && seen.insert(child).second) stack.push_back(child);
    }
  }
  return false;
}

SlotState Module::ReadSlot(EntryKind kind, absl::string_view name) const {
  SlotState state;
  switch (kind) {
    case EntryKind::kParameter:
      if (const Tensor* t = parameters_.Find(name)) {
        state.existed = true;
        state.value.tensor = *t;
        state.position = parameters_.IndexOf(name);
      }
      break;
    case EntryKind::kBuffer:
      if (const Tensor* t = buffers_.Find(name)) {
        state.existed = true;
        state.value.tensor = *t;
        state.value.persistent = IsPersistentBuffer(name);
        state.position = buffers_.IndexOf(name);
      }
      break;
    case EntryKind::kModule:
      if (const auto* m = children_.Find(name)) {
        state.existed = true;
        state.value.module = *m;
        state.position = children_.IndexOf(name);
      }
      break;
  }
  return state;
}

namespace {

// Sets `key` in `dict`: in place if present, else at `position` (>= 0) or
// at the end.
template <typename V>
void SetAt(OrderedDict<V>& dict, const std::string& key, V value,
           ptrdiff_t position) {
  if (position >= 0 && !dict.Contains(key)) {
    dict.InsertAt(static_cast<size_t>(position), key, std::move(value));
  } else {
    dict.Set(key, std::move(value));
  }
}

}  // namespace

void Module::StoreSlot(EntryKind kind, const std::string& name, bool present,
                       const SlotValue& value, ptrdiff_t position) {
  switch (kind) {
    case EntryKind::kParameter:
      if (present) {
        SetAt(parameters_, name, value.tensor, position);
      } else {
        parameters_.Erase(name);
      }
      break;
    case EntryKind::kBuffer:
      if (present) {
        SetAt(buffers_, name, value.tensor, position);
        if (value.persistent) {
          non_persistent_.erase(name);
        } else {
          non_persistent_.insert(name);
        }
      } else {
        buffers_.Erase(name);
        non_persistent_.erase(name);
      }
      break;
    case EntryKind::kModule:
      if (present) {
        SetAt(children_, name, value.module, position);
      } else {
        children_.Erase(name);
      }
      break;
  }
}

absl::StatusOr<RegistrationOutcome> Module::Register(
    EntryKind kind, std::string name, SlotValue value, bool removal,
    const RegistrationContext& ctx) {
  RegistrationEvent event;
  event.module = this;
  event.path = ctx.path;
  event.kind = kind;
  event.action = value.is_null() ? RegistrationAction::kUnregister
                                 : RegistrationAction::kRegister;
  event.name = std::move(name);
  event.value = std::move(value);

  SlotState before = ReadSlot(kind, event.name);
  HookDecision decision;
  if (ctx.hooks != nullptr) {
    decision = ctx.hooks->Run(event, CheckReplacement);
  } else {
    decision.value = event.value;
  }
  bool store = !decision.blocked() && !ctx.dry_run;
  if (store) StoreSlot(kind, event.name, !removal, decision.value);
  if (ctx.records != nullptr) {
    ctx.records->push_back(RegistrationRecord{shared_from_this(), event,
                                              removal, decision,
                                              std::move(before), store});
  }
  return RegistrationOutcome{std::move(decision)};
}

absl::StatusOr<RegistrationOutcome> Module::RegisterParameter(
    std::string name, Tensor param, const RegistrationContext& ctx) {
  if (absl::StrContains(name, '.')) {
    return KeyError("parameter name can't contain \".\"");
  }
  if (name.empty())
    return KeyError("parameter name can't be empty string \"\"");
  MODELSTATE_RETURN_IF_ERROR(CheckNameFree(EntryKind::kParameter, name));
  if (param.defined() && !param.is_parameter()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot assign '", param.TypeName(), "' object to parameter '", name,
        "' (torch.nn.Parameter or None required)"));
  }
  if (param.defined())
    MODELSTATE_RETURN_IF_ERROR(CheckDeviceAvailable(param.device()));
  SlotValue value;
  value.tensor = std::move(param);
  return Register(EntryKind::kParameter, std::move(name), std::move(value),
                  /*removal=*/false, ctx);
}

absl::StatusOr<RegistrationOutcome> Module::RegisterBuffer(
    std::string name, Tensor tensor, bool persistent,
    const RegistrationContext& ctx) {
  if (absl::StrContains(name, '.')) {
    return KeyError("buffer name can't contain \".\"");
  }
  if (name.empty()) return KeyError("buffer name can't be empty string \"\"");
  MODELSTATE_RETURN_IF_ERROR(CheckNameFree(EntryKind::kBuffer, name));
  if (tensor.defined())
    MODELSTATE_RETURN_IF_ERROR(CheckDeviceAvailable(tensor.device()));
  SlotValue value;
  value.tensor = std::move(tensor);
  value.persistent = persistent;
  return Register(EntryKind::kBuffer, std::move(name), std::move(value),
                  /*removal=*/false, ctx);
}

absl::StatusOr<RegistrationOutcome> Module::RegisterModule(
    std::string name, std::shared_ptr<Module> child,
    const RegistrationContext& ctx) {
  // PyTorch checks the name in a different order for modules (2.13).
  MODELSTATE_RETURN_IF_ERROR(CheckNameFree(EntryKind::kModule, name));
  if (absl::StrContains(name, '.')) {
    return KeyError(
        absl::StrCat("module name can't contain \".\", got: ", name));
  }
  if (name.empty()) return KeyError("module name can't be empty string \"\"");
  if (child != nullptr &&
      (child.get() == this || child->ContainsModule(this))) {
    return absl::InvalidArgumentError(
        absl::StrCat("Registering '", name, "' in ", type_name_,
                     " would make the module tree cyclic"));
  }
  SlotValue value;
  value.module = std::move(child);
  return Register(EntryKind::kModule, std::move(name), std::move(value),
                  /*removal=*/false, ctx);
}

absl::StatusOr<RegistrationOutcome> Module::RemoveEntry(
    absl::string_view name, const RegistrationContext& ctx) {
  EntryKind kind;
  if (parameters_.Contains(name)) {
    kind = EntryKind::kParameter;
  } else if (buffers_.Contains(name)) {
    kind = EntryKind::kBuffer;
  } else if (children_.Contains(name)) {
    kind = EntryKind::kModule;
  } else {
    return absl::NotFoundError(absl::StrCat(
        "'", type_name_, "' object has no attribute '", name, "'"));
  }
  SlotValue none;
  none.persistent = kind != EntryKind::kBuffer || IsPersistentBuffer(name);
  return Register(kind, std::string(name), std::move(none), /*removal=*/true,
                  ctx);
}

absl::StatusOr<RegistrationOutcome> Module::SetAttr(
    std::string name, AttrAssignment value, const RegistrationContext& ctx) {
  const Tensor* tensor = std::get_if<Tensor>(&value);
  const auto* module = std::get_if<std::shared_ptr<Module>>(&value);
  bool is_none = std::holds_alternative<std::nullptr_t>(value) ||
                 (tensor != nullptr && !tensor->defined()) ||
                 (module != nullptr && *module == nullptr);
  auto type_name = [&]() -> std::string {
    if (tensor != nullptr) return tensor->TypeName();
    if (module != nullptr) return (*module)->qualified_name();
    if (const auto* plain = std::get_if<AttrValue>(&value)) {
      return AttrTypeName(*plain);
    }
    return "NoneType";
  };
  // 3.4a: a Parameter.
  if (tensor != nullptr && tensor->defined() && tensor->is_parameter()) {
    return RegisterParameter(std::move(name), *tensor, ctx);
  }
  // 3.4b: an existing parameter accepts only None.
  if (parameters_.Contains(name)) {
    if (!is_none) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot assign '", type_name(), "' as parameter '", name,
                       "' (torch.nn.Parameter or None expected)"));
    }
    return RegisterParameter(std::move(name), Tensor(), ctx);
  }
  // 3.4c: a Module.
  if (module != nullptr && *module != nullptr) {
    return RegisterModule(std::move(name), *module, ctx);
  }
  // 3.4d: an existing submodule accepts only None.
  if (children_.Contains(name)) {
    if (!is_none) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot assign '", type_name(), "' as child module '",
                       name, "' (torch.nn.Module or None expected)"));
    }
    return RegisterModule(std::move(name), nullptr, ctx);
  }
  // 3.4e: an existing buffer accepts a tensor or None; persistence is kept.
  if (buffers_.Contains(name)) {
    if (!is_none && tensor == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot assign '", type_name(), "' as buffer '", name,
                       "' (torch.Tensor or None expected)"));
    }
    bool persistent = IsPersistentBuffer(name);
    return RegisterBuffer(std::move(name), is_none ? Tensor() : *tensor,
                          persistent, ctx);
  }
  // 3.4f: a plain attribute (a plain tensor on a new name is not a buffer).
  AttrValue plain;
  if (tensor != nullptr) {
    plain = *tensor;
  } else if (const auto* v = std::get_if<AttrValue>(&value)) {
    plain = *v;
  }
  attributes_.Set(std::move(name), std::move(plain));
  return RegistrationOutcome{};
}

absl::StatusOr<AttrLookup> Module::GetAttr(absl::string_view name) const {
  if (const Tensor* t = parameters_.Find(name)) return AttrLookup(*t);
  if (const Tensor* t = buffers_.Find(name)) return AttrLookup(*t);
  if (const auto* m = children_.Find(name)) return AttrLookup(*m);
  if (const AttrValue* v = attributes_.Find(name)) return AttrLookup(*v);
  if (HasClassAttribute(name)) {
    return AttrLookup(
        AttrValue(absl::StrCat("<attribute ", name, " of ", type_name_, ">")));
  }
  return absl::NotFoundError(
      absl::StrCat("'", type_name_, "' object has no attribute '", name, "'"));
}

absl::StatusOr<RegistrationOutcome> Module::DelAttr(
    absl::string_view name, const RegistrationContext& ctx) {
  if (parameters_.Contains(name) || buffers_.Contains(name) ||
      children_.Contains(name)) {
    return RemoveEntry(name, ctx);
  }
  if (attributes_.Erase(name)) return RegistrationOutcome{};
  return absl::NotFoundError(
      absl::StrCat("'", type_name_, "' object has no attribute '", name, "'"));
}

absl::StatusOr<std::shared_ptr<Module>> Module::GetSubmodule(
    absl::string_view path) const {
  auto current = std::const_pointer_cast<Module>(shared_from_this());
  if (path.empty()) return current;
  for (absl::string_view item : absl::StrSplit(path, '.')) {
    const auto* child = current->children_.Find(item);
    if (child == nullptr || *child == nullptr) {
      return absl::NotFoundError(
          absl::StrCat(current->type_name_, " has no attribute `", item, "`"));
    }
    current = *child;
  }
  return current;
}

// ---------------------------------------------------------------------------
// Traversal

std::vector<std::pair<std::string, std::shared_ptr<Module>>>
Module::NamedModules(absl::string_view prefix, bool remove_duplicate) const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  absl::flat_hash_set<const Module*> memo;
  // Pre-order DFS; a module seen before is skipped with its subtree.
  struct Walker {
    bool remove_duplicate;
    absl::flat_hash_set<const Module*>& memo;
    std::vector<std::pair<std::string, std::shared_ptr<Module>>>& out;
    void Visit(const std::shared_ptr<Module>& m, const std::string& prefix) {
      if (remove_duplicate && !memo.insert(m.get()).second) return;
      out.emplace_back(prefix, m);
      for (const auto& item : m->children_) {
        if (item.value == nullptr) continue;
        Visit(item.value, JoinName(prefix, item.key));
      }
    }
  };
  Walker walker{remove_duplicate, memo, out};
  walker.Visit(std::const_pointer_cast<Module>(shared_from_this()),
               std::string(prefix));
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>>
Module::NamedChildren() const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  absl::flat_hash_set<const Module*> memo;
  for (const auto& item : children_) {
    if (item.value == nullptr || !memo.insert(item.value.get()).second) {
      continue;
    }
    out.emplace_back(item.key, item.value);
  }
  return out;
}

namespace {

// PyTorch's Module._named_members over parameters or buffers.
template <typename GetMembers>
std::vector<std::pair<std::string, Tensor>> NamedMembers(
    const Module& self, absl::string_view prefix, bool recurse,
    bool remove_duplicate, GetMembers get_members) {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> modules;
  if (recurse) {
    modules = self.NamedModules(prefix, remove_duplicate);
  } else {
    modules.emplace_back(std::string(prefix), std::const_pointer_cast<Module>(
                                                  self.shared_from_this()));
  }
  std::vector<std::pair<std::string, Tensor>> out;
  absl::flat_hash_set<const void*> memo;
  for (const auto& entry : modules) {
    const std::string& module_prefix = entry.first;
    get_members(*entry.second, [&](const std::string& name, const Tensor& t) {
      if (!t.defined() || memo.contains(t.identity())) return;
      if (remove_duplicate) memo.insert(t.identity());
      out.emplace_back(JoinName(module_prefix, name), t);
    });
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> Module::NamedParameters(
    absl::string_view prefix, bool recurse, bool remove_duplicate) const {
  return NamedMembers(*this, prefix, recurse, remove_duplicate,
                      [](const Module& m, const auto& emit) {
                        for (const auto& item : m.parameters()) {
                          emit(item.key, item.value);
                        }
                      });
}

std::vector<std::pair<std::string, Tensor>> Module::NamedBuffers(
    absl::string_view prefix, bool recurse, bool remove_duplicate) const {
  return NamedMembers(*this, prefix, recurse, remove_duplicate,
                      [](const Module& m, const auto& emit) {
                        for (const auto& item : m.buffers()) {
                          emit(item.key, item.value);
                        }
                      });
}

// ---------------------------------------------------------------------------
// state_dict

namespace {

void SaveTo(const Module& m, const std::string& prefix, bool keep_vars,
            StateDict& out) {
  std::string meta_key =
      prefix.empty() ? "" : prefix.substr(0, prefix.size() - 1);
  out.metadata->Set(meta_key, m.version());
  auto put = [&](const std::string& name, const Tensor& t) {
    out.tensors.Set(prefix + name, keep_vars ? t : t.Detach());
  };
  for (const auto& item : m.parameters()) {
    if (item.value.defined()) put(item.key, item.value);
  }
  for (const auto& item : m.buffers()) {
    if (item.value.defined() && m.IsPersistentBuffer(item.key)) {
      put(item.key, item.value);
    }
  }
  if (m.has_extra_state() && m.extra_state().defined()) {
    put(std::string(kExtraStateKey), m.extra_state());
  }
  for (const auto& item : m.children()) {
    if (item.value != nullptr) {
      SaveTo(*item.value, prefix + item.key + ".", keep_vars, out);
    }
  }
}

}  // namespace

StateDict Module::GetStateDict(absl::string_view prefix, bool keep_vars) const {
  StateDict out;
  out.metadata.emplace();
  SaveTo(*this, std::string(prefix), keep_vars, out);
  return out;
}

void Module::EnableExtraState(Tensor initial) {
  has_extra_state_ = true;
  extra_state_ = std::move(initial);
}

// ---------------------------------------------------------------------------
// load_state_dict

namespace {

// One entry the load will write: copy `source` into the slot's tensor, or
// (assign) install it.
struct PlannedWrite {
  Module* module;
  std::string prefix;
  EntryKind kind;  // kParameter, kBuffer; kModule marks extra state.
  std::string name;
  std::string key;
  Tensor target;
  Tensor source;
  // Assign mode: the value could not be prepared (its error is recorded).
  bool failed = false;
};

// PyTorch's text for an exception raised while loading entry `key`.
std::string LoadExceptionText(const std::string& key, const Tensor& target,
                              const Tensor& source, absl::string_view message) {
  return absl::StrCat("While copying the parameter named \"", key,
                      "\", whose dimensions in the model are ",
                      TorchSizeString(target.shape()),
                      " and whose dimensions in the checkpoint are ",
                      TorchSizeString(source.shape()),
                      ", an exception occurred : ('", message, "',).");
}

struct LoadPlan {
  std::vector<PlannedWrite> writes;
  std::vector<std::string> missing;
  std::vector<std::string> unexpected;
  std::vector<std::string> errors;
};

// torch's _InstanceNorm._load_from_state_dict: a state_dict without
// _metadata (from before 0.4.0, when InstanceNorm tracked running stats by
// default) may carry running_mean / running_var that an InstanceNorm
// without track_running_stats does not have. Those keys are an error, even
// with strict=False, and not unexpected keys. Returns them.
std::vector<std::string> LegacyRunningStats(const Module& m,
                                            const std::string& prefix,
                                            const StateDict& sd,
                                            std::optional<int> version) {
  std::vector<std::string> present;
  if (version.has_value() ||
      !absl::StartsWith(m.qualified_name(), "torch.nn.modules.instancenorm.")) {
    return present;
  }
  const AttrValue* track = m.attributes().Find("track_running_stats");
  if (track == nullptr || !std::holds_alternative<bool>(*track) ||
      std::get<bool>(*track)) {
    return present;
  }
  for (const char* name : {"running_mean", "running_var"}) {
    std::string key = prefix + name;
    if (sd.tensors.Contains(key)) present.push_back(std::move(key));
  }
  return present;
}

std::string LegacyRunningStatsText(absl::string_view klass,
                                   const std::vector<std::string>& keys) {
  return absl::StrCat(
      "Unexpected running stats buffer(s) \"", absl::StrJoin(keys, "\" and \""),
      "\" for ", klass,
      " with track_running_stats=False. If state_dict is a checkpoint saved "
      "before 0.4.0, this may be expected because ",
      klass,
      " does not track running stats by default since 0.4.0. Please remove "
      "these keys from state_dict. If the running stats are actually needed, "
      "instead set track_running_stats=True in ",
      klass, " to enable them. See the documentation of ", klass,
      " for details.");
}

// The rest of PlanLoad for one module: its extra state, and the keys under
// its prefix that name nothing it has (but for `dropped`, which are no
// longer in torch's copy of the state_dict).
void PlanExtraStateAndUnexpected(
    Module& m, const std::string& prefix, const StateDict& sd,
    const absl::flat_hash_set<std::string>& local_names,
    const std::vector<std::string>& dropped, LoadPlan& plan) {
  std::string extra_key = prefix + std::string(kExtraStateKey);
  if (m.has_extra_state()) {
    if (const Tensor* t = sd.tensors.Find(extra_key)) {
      plan.writes.push_back(PlannedWrite{&m, prefix, EntryKind::kModule,
                                         std::string(kExtraStateKey), extra_key,
                                         m.extra_state(), *t});
    } else {
      plan.missing.push_back(extra_key);
    }
  } else if (sd.tensors.Contains(extra_key)) {
    plan.unexpected.push_back(extra_key);
  }
  // Unexpected keys (PyTorch main): a dotted remainder must start with a
  // child's name; an undotted one must name local state.
  for (const auto& item : sd.tensors) {
    const std::string& key = item.key;
    if (!absl::StartsWith(key, prefix) || key == extra_key) continue;
    if (absl::c_linear_search(dropped, key)) continue;
    absl::string_view rest = absl::string_view(key).substr(prefix.size());
    size_t dot = rest.find('.');
    if (dot != absl::string_view::npos) {
      if (!m.children().Contains(rest.substr(0, dot))) {
        plan.unexpected.push_back(key);
      }
    } else if (!local_names.contains(rest)) {
      plan.unexpected.push_back(key);
    }
  }
}

// PyTorch's Module._load_from_state_dict for one module, then its children
// (the raw child map: a shared child is visited once per path).
absl::Status PlanLoad(Module& m, const std::string& prefix, const StateDict& sd,
                      const LoadOptions& options, LoadPlan& plan) {
  std::optional<int> version;
  if (sd.metadata.has_value()) {
    std::string meta_key =
        prefix.empty() ? "" : prefix.substr(0, prefix.size() - 1);
    if (const int* v = sd.metadata->Find(meta_key)) version = *v;
  }
  std::vector<std::string> dropped = LegacyRunningStats(m, prefix, sd, version);
  if (!dropped.empty()) {
    plan.errors.push_back(LegacyRunningStatsText(m.type_name(), dropped));
  }
  // local_state: non-null parameters, then non-null persistent buffers.
  std::vector<std::pair<std::string, EntryKind>> local;
  absl::flat_hash_set<std::string> local_names;
  for (const auto& item : m.parameters()) {
    if (!item.value.defined()) continue;
    local.emplace_back(item.key, EntryKind::kParameter);
    local_names.insert(item.key);
  }
  for (const auto& item : m.buffers()) {
    if (!item.value.defined() || !m.IsPersistentBuffer(item.key)) continue;
    local.emplace_back(item.key, EntryKind::kBuffer);
    local_names.insert(item.key);
  }
  for (const auto& [name, kind] : local) {
    std::string key = prefix + name;
    const Tensor& target = kind == EntryKind::kParameter
                               ? *m.parameters().Find(name)
                               : *m.buffers().Find(name);
    const Tensor* found = sd.tensors.Find(key);
    if (found == nullptr) {
      // BatchNorm before version 2 had no num_batches_tracked: keep the
      // module's own counter (PyTorch >= 2.2) instead of reporting it.
      bool legacy_counter = kind == EntryKind::kBuffer &&
                            name == "num_batches_tracked" && m.version() >= 2 &&
                            (!version.has_value() || *version < 2);
      if (!legacy_counter) plan.missing.push_back(key);
      continue;
    }
    Tensor input = *found;
    if (!input.defined()) {
      plan.errors.push_back(absl::StrCat(
          "While copying the parameter named \"", key,
          "\", expected torch.Tensor or Tensor-like object from checkpoint "
          "but received <class 'NoneType'>"));
      continue;
    }
    if (target.dim() == 0 && input.dim() == 1) {
      // A source copies the first element itself (LoadSource::CopyInto).
      MODELSTATE_ASSIGN_OR_RETURN(
          input, options.source == nullptr
                     ? FirstElement(input)
                     : Tensor::Empty(input.dtype(), {}, Device::Meta()));
    }
    if (input.shape() != target.shape()) {
      plan.errors.push_back(absl::StrCat(
          "size mismatch for ", key, ": copying a param with shape ",
          TorchSizeString(input.shape()),
          " from checkpoint, the shape in current model is ",
          TorchSizeString(target.shape()), "."));
      continue;
    }
    if (!options.assign && options.source == nullptr &&
        target.device().has_storage() && input.device().is_meta() &&
        target.numel() > 0) {
      plan.errors.push_back(absl::StrCat(
          "While copying the parameter named \"", key,
          "\", whose dimensions in the model are ",
          TorchSizeString(target.shape()),
          " and whose dimensions in the checkpoint are ",
          TorchSizeString(input.shape()),
          ", an exception occurred : ('Cannot copy out of meta tensor; no "
          "data!',)."));
      continue;
    }
    if (options.assign && kind == EntryKind::kParameter &&
        target.requires_grad() && !IsFloatingPoint(input.dtype())) {
      // PyTorch wraps the value in Parameter(requires_grad=True), which
      // refuses an integer dtype; found here, before anything is installed.
      plan.errors.push_back(LoadExceptionText(
          key, target, input,
          "Only Tensors of floating point and complex dtype can require "
          "gradients"));
      continue;
    }
    plan.writes.push_back(
        PlannedWrite{&m, prefix, kind, name, key, target, std::move(input)});
  }
  PlanExtraStateAndUnexpected(m, prefix, sd, local_names, dropped, plan);
  for (const auto& item : m.children()) {
    if (item.value == nullptr) continue;
    MODELSTATE_RETURN_IF_ERROR(
        PlanLoad(*item.value, prefix + item.key + ".", sd, options, plan));
  }
  return absl::OkStatus();
}

// An assign load's values, read from the source and made parameters where
// they replace one, before anything is installed; a value that cannot be
// is marked failed with its error.
void WrapAssignedValues(std::vector<PlannedWrite>& writes,
                        const LoadOptions& options,
                        std::vector<std::string>& errors) {
  for (PlannedWrite& w : writes) {
    if (options.source != nullptr) {
      absl::StatusOr<Tensor> read = options.source->Read(w.key);
      if (!read.ok()) {
        errors.push_back(LoadExceptionText(w.key, w.target, w.source,
                                           read.status().message()));
        w.failed = true;
        continue;
      }
      w.source = *std::move(read);
    }
    if (w.kind != EntryKind::kParameter) continue;
    // Installed as a parameter with the module's requires_grad (checked
    // against the dtype by PlanLoad).
    bool requires_grad = w.target.requires_grad();
    absl::Status made;
    if (w.source.is_parameter()) {
      made = w.source.SetRequiresGrad(requires_grad);
    } else {
      absl::StatusOr<Tensor> param = MakeParameter(w.source, requires_grad);
      made = param.status();
      if (param.ok()) w.source = *std::move(param);
    }
    if (!made.ok()) {
      errors.push_back(
          LoadExceptionText(w.key, w.target, w.source, made.message()));
      w.failed = true;
    }
  }
}

}  // namespace

absl::StatusOr<LoadResult> Module::LoadStateDict(
    const StateDict& state_dict, const LoadOptions& options,
    const RegistrationContext& ctx) {
  LoadPlan plan;
  MODELSTATE_RETURN_IF_ERROR(PlanLoad(*this, "", state_dict, options, plan));
  std::vector<std::string> errors = plan.errors;
  if (options.strict) {
    if (!plan.unexpected.empty()) {
      errors.insert(errors.begin(),
                    absl::StrCat("Unexpected key(s) in state_dict: ",
                                 QuotedList(plan.unexpected), ". "));
    }
    if (!plan.missing.empty()) {
      errors.insert(errors.begin(),
                    absl::StrCat("Missing key(s) in state_dict: ",
                                 QuotedList(plan.missing), ". "));
    }
  }
  LoadResult result;
  result.keys.missing_keys = plan.missing;
  result.keys.unexpected_keys = plan.unexpected;
  // A dry run copies nothing; in assign mode it records the registrations.
  bool write =
      (!options.atomic || errors.empty()) && (options.assign || !ctx.dry_run);
  if (write && !options.assign) {
    // Take every storage this load overwrites first, so that running out of
    // memory (copy-on-write of a shared storage) fails before any byte moved.
    for (PlannedWrite& w : plan.writes) {
      if (w.kind == EntryKind::kModule) continue;
      absl::StatusOr<void*> dst = w.target.MutableDataForOverwrite();
      if (!dst.ok()) {
        if (options.atomic) return dst.status();
        errors.push_back(std::string(dst.status().message()));
      }
    }
  }
  if (write && options.assign) {
    // Read and wrap every value before the first installation: an atomic
    // assign load that fails here has installed nothing.
    WrapAssignedValues(plan.writes, options, errors);
    if (options.atomic && !errors.empty()) write = false;
  }
  if (write) {
    for (PlannedWrite& w : plan.writes) {
      if (w.failed) continue;
      if (options.source != nullptr && w.kind == EntryKind::kModule &&
          !options.assign) {
        MODELSTATE_ASSIGN_OR_RETURN(w.source, options.source->Read(w.key));
      }
      if (w.kind == EntryKind::kModule) {  // extra state
        if (!ctx.dry_run) w.module->extra_state_ = w.source;
        continue;
      }
      if (!options.assign) {
        absl::Status copied =
            options.source == nullptr || !w.target.device().has_storage()
                ? w.target.CopyFrom(w.source)
                : options.source->CopyInto(w.key, w.target);
        if (!copied.ok()) {
          errors.push_back(
              LoadExceptionText(w.key, w.target, w.source, copied.message()));
        }
        continue;
      }
      RegistrationContext sub = ctx;
      sub.path =
          w.prefix.empty() ? "" : w.prefix.substr(0, w.prefix.size() - 1);
      absl::StatusOr<RegistrationOutcome> outcome;
      if (w.kind == EntryKind::kParameter) {
        outcome = w.module->Register(EntryKind::kParameter, w.name,
                                     SlotValue{w.source, nullptr, true},
                                     /*removal=*/false, sub);
      } else {
        outcome = w.module->Register(
            EntryKind::kBuffer, w.name,
            SlotValue{w.source, nullptr, w.module->IsPersistentBuffer(w.name)},
            /*removal=*/false, sub);
      }
      if (!outcome.ok()) return outcome.status();
      result.registrations.emplace_back(w.key, *std::move(outcome));
    }
  }
  if (!errors.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("Error(s) in loading state_dict for ", type_name_, ":\n\t",
                     absl::StrJoin(errors, "\n\t")));
  }
  return result;
}

// ---------------------------------------------------------------------------
// Conversion

namespace {

// A slot's tensor and the data it will take.
struct PlannedConversion {
  Module* module;  // The module whose map holds the slot.
  std::string name;
  bool is_parameter;
  Tensor tensor;
  Tensor converted;
  // Convert `tensor`'s own storage to `dtype` when applying (`converted`
  // is made then): a narrowing conversion of a storage nobody else holds
  // needs no second buffer.
  bool in_place = false;
  DType dtype = DType::kFloat32;
  // A parameter that keeps its object (torch's `param.data = ...`), so
  // every slot holding the object sees the conversion; otherwise the slot
  // gets `converted`, a new object (a new Parameter for a parameter).
  bool set_data = false;
};

// What PlanConversion has visited.
struct ConversionSeen {
  // torch visits a module shared by two parents twice, and the second
  // visit finds every slot converted: it is planned once.
  absl::flat_hash_set<const Module*> modules;
  // The parameter objects converted in place of themselves.
  absl::flat_hash_set<const void*> set_data;
};

// Plans the conversion of every tensor of the tree as torch 1.13's
// Module._apply does it: children first, then each slot. A parameter keeps
// its object when the new tensor's type is compatible
// (_has_compatible_shallow_copy_type: not to or from meta), and a later
// slot holding that object then finds it converted. Any other conversion
// (a buffer's, a parameter's to or from meta) gives the slot a new object
// and leaves the old one as it was, so a later slot holding the old one
// converts it again: those ties break.
template <typename TargetDType>
absl::Status PlanConversion(Module& m, const std::optional<Device>& device,
                            const TargetDType& target_dtype,
                            ConversionSeen& seen,
                            std::vector<PlannedConversion>& plan) {
  if (!seen.modules.insert(&m).second) return absl::OkStatus();
  absl::flat_hash_set<const void*>& set_data = seen.set_data;
  for (const auto& [name, child] : m.NamedChildren()) {
    MODELSTATE_RETURN_IF_ERROR(
        PlanConversion(*child, device, target_dtype, seen, plan));
  }
  auto visit = [&](const std::string& name, const Tensor& t,
                   bool is_parameter) -> absl::Status {
    if (!t.defined() || set_data.contains(t.identity())) {
      return absl::OkStatus();
    }
    Device new_device = device.value_or(t.device());
    DType new_dtype = target_dtype(t.dtype());
    if (new_device == t.device() && new_dtype == t.dtype()) {
      return absl::OkStatus();
    }
    PlannedConversion c{&m, name, is_parameter, t, Tensor(), false, new_dtype};
    c.set_data = is_parameter && new_device.is_meta() == t.device().is_meta();
    if (c.set_data) set_data.insert(t.identity());
    if (new_device == t.device() && t.CanConvertInPlace(new_dtype) &&
        (c.set_data || t.IsSoleHandle())) {
      // A buffer gets a new tensor object, as in PyTorch, so its old one
      // must be unobservable (only the module holds it) to reuse the bytes.
      c.in_place = true;
    } else {
      MODELSTATE_ASSIGN_OR_RETURN(c.converted, t.To(new_device, new_dtype));
      if (is_parameter && !c.set_data) {
        MODELSTATE_ASSIGN_OR_RETURN(
            c.converted, MakeParameter(c.converted, t.requires_grad()));
      }
    }
    plan.push_back(std::move(c));
    return absl::OkStatus();
  };
  for (const auto& item : m.parameters()) {
    MODELSTATE_RETURN_IF_ERROR(visit(item.key, item.value, true));
  }
  for (const auto& item : m.buffers()) {
    MODELSTATE_RETURN_IF_ERROR(visit(item.key, item.value, false));
  }
  return absl::OkStatus();
}

}  // namespace

struct ModuleInternals {
  static void StoreSlot(Module& m, EntryKind kind, const std::string& name,
                        bool present, const SlotValue& value,
                        ptrdiff_t position) {
    m.StoreSlot(kind, name, present, value, position);
  }

  // Runs a conversion plan: a set_data parameter keeps its object (data
  // swapped in place); every other slot gets the converted tensor object.
  static void ApplyConversions(std::vector<PlannedConversion>& plan) {
    const ScopedDeferredUnmap unmap_after_all;
    for (PlannedConversion& c : plan) {
      if (c.in_place) {
        // Checked when planned; nothing since could share the storage.
        absl::Status converted = c.tensor.ConvertInPlace(c.dtype);
        MODELSTATE_CHECK(converted.ok()) << converted;
        c.converted = c.set_data ? c.tensor : c.tensor.Detach();
      }
      if (c.set_data) {
        c.tensor.SetData(c.converted);
      } else if (c.is_parameter) {
        c.module->StoreSlot(EntryKind::kParameter, c.name, true,
                            SlotValue{c.converted, nullptr, true});
      } else {
        c.module->StoreSlot(EntryKind::kBuffer, c.name, true,
                            SlotValue{c.converted, nullptr,
                                      c.module->IsPersistentBuffer(c.name)});
      }
    }
  }
};

absl::Status Module::To(std::optional<Device> device,
                        std::optional<DType> dtype) {
  if (dtype.has_value() && !IsFloatingPoint(*dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nn.Module.to only accepts floating point or complex dtypes, but got "
        "desired dtype=",
        TorchDTypeName(*dtype)));
  }
  if (device.has_value())
    MODELSTATE_RETURN_IF_ERROR(CheckDeviceAvailable(*device));
  ConversionSeen done;
  std::vector<PlannedConversion> plan;
  MODELSTATE_RETURN_IF_ERROR(PlanConversion(
      *this, device,
      [&](DType current) {
        return dtype.has_value() && IsFloatingPoint(current) ? *dtype : current;
      },
      done, plan));
  ModuleInternals::ApplyConversions(plan);
  return absl::OkStatus();
}

absl::Status Module::Type(DType dtype, std::optional<Device> device) {
  if (device.has_value())
    MODELSTATE_RETURN_IF_ERROR(CheckDeviceAvailable(*device));
  ConversionSeen done;
  std::vector<PlannedConversion> plan;
  MODELSTATE_RETURN_IF_ERROR(PlanConversion(
      *this, device, [&](DType) { return dtype; }, done, plan));
  // A parameter that requires grad cannot become an integer tensor: torch
  // 1.13 fails in `param.data = ...` (set_data) with these words.
  for (const PlannedConversion& c : plan) {
    if (c.is_parameter && c.tensor.requires_grad() && !IsFloatingPoint(dtype)) {
      return absl::InvalidArgumentError(
          "data set to a tensor that requires gradients must be floating "
          "point or complex dtype");
    }
  }
  ModuleInternals::ApplyConversions(plan);
  return absl::OkStatus();
}

absl::Status Module::RequiresGrad(bool value) {
  std::vector<std::pair<std::string, Tensor>> params = NamedParameters();
  if (value) {
    for (const auto& [name, t] : params) {
      if (!IsFloatingPoint(t.dtype())) {
        return absl::InvalidArgumentError(
            "Only Tensors of floating point and complex dtype can require "
            "gradients");
      }
    }
  }
  for (auto& [name, t] : params) {
    Tensor handle = t;
    MODELSTATE_RETURN_IF_ERROR(handle.SetRequiresGrad(value));
  }
  return absl::OkStatus();
}

void Module::Train(bool mode) {
  training_ = mode;
  for (const auto& [name, child] : NamedChildren()) child->Train(mode);
}

uint64_t Module::TotalBytes() const {
  uint64_t total = 0;
  for (const auto& [name, t] : NamedParameters()) total += t.nbytes();
  for (const auto& [name, t] : NamedBuffers()) total += t.nbytes();
  return total;
}

// ---------------------------------------------------------------------------
// Deferred decisions

namespace {

// One registration slot: (module, kind, name).
struct SlotKey {
  Module* module;
  EntryKind kind;
  std::string name;
  bool operator==(const SlotKey& o) const {
    return module == o.module && kind == o.kind && name == o.name;
  }
  template <typename H>
  friend H AbslHashValue(H h, const SlotKey& k) {
    return H::combine(std::move(h), k.module, k.kind, k.name);
  }
};

}  // namespace

absl::Status ApplyFinalDecisions(absl::Span<const RegistrationRecord> records,
                                 absl::Span<const HookDecision> finals) {
  if (records.size() != finals.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ApplyFinalDecisions: ", records.size(), " records but ",
                     finals.size(), " decisions"));
  }
  // Replays every slot's registrations in order with the final decisions:
  // the slot ends as its last non-blocked registration left it, or as it was
  // before the first one.
  struct SlotEnd {
    bool present;
    SlotValue value;
    ptrdiff_t position;  // Where it was before the first registration.
    bool changed;        // Differs from what the in-process pass stored.
  };
  absl::flat_hash_map<SlotKey, SlotEnd> ends;
  std::vector<SlotKey> order;
  for (size_t i = 0; i < records.size(); ++i) {
    const RegistrationRecord& r = records[i];
    SlotKey key{r.owner.get(), r.event.kind, r.event.name};
    auto [it, inserted] = ends.try_emplace(
        key,
        SlotEnd{r.before.existed, r.before.value, r.before.position, false});
    if (inserted) order.push_back(key);
    const HookDecision& final_decision = finals[i];
    bool local_stored = r.applied;
    bool final_stored = !final_decision.blocked();
    if (final_stored) {
      it->second.present = !r.removal;
      it->second.value = final_decision.value;
    }
    if (local_stored != final_stored ||
        (final_stored &&
         (!final_decision.value.tensor.is_same(r.local.value.tensor) ||
          final_decision.value.module != r.local.value.module ||
          final_decision.value.persistent != r.local.value.persistent))) {
      it->second.changed = true;
    }
  }
  for (const SlotKey& key : order) {
    const SlotEnd& end = ends.at(key);
    if (!end.changed) continue;
    ModuleInternals::StoreSlot(*key.module, key.kind, key.name, end.present,
                               end.value, end.position);
  }
  return absl::OkStatus();
}

absl::Status CheckHeldBytes(const Module& module) {
  for (const auto& [key, t] : module.NamedParameters()) {
    MODELSTATE_RETURN_IF_ERROR(CheckTensorBytes(key, t));
  }
  for (const auto& [key, t] : module.NamedBuffers()) {
    MODELSTATE_RETURN_IF_ERROR(CheckTensorBytes(key, t));
  }
  return absl::OkStatus();
}

namespace {

uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  return a > std::numeric_limits<uint64_t>::max() - b
             ? std::numeric_limits<uint64_t>::max()
             : a + b;
}

// TraversalEntries with a memo: a module shared along many paths is
// counted once and its total reused.
uint64_t CountTraversal(const Module& m,
                        absl::flat_hash_map<const Module*, uint64_t>& memo) {
  if (auto it = memo.find(&m); it != memo.end()) return it->second;
  uint64_t n = 0;
  for (const auto& item : m.parameters()) n += item.value.defined() ? 1 : 0;
  for (const auto& item : m.buffers()) n += item.value.defined() ? 1 : 0;
  for (const auto& item : m.children()) {
    if (item.value == nullptr) continue;
    n = SaturatingAdd(n, SaturatingAdd(1, CountTraversal(*item.value, memo)));
  }
  memo[&m] = n;
  return n;
}

uint64_t CountPaths(const Module& m, const Module& target,
                    absl::flat_hash_map<const Module*, uint64_t>& memo) {
  if (&m == &target) return 1;
  if (auto it = memo.find(&m); it != memo.end()) return it->second;
  uint64_t n = 0;
  for (const auto& item : m.children()) {
    if (item.value == nullptr) continue;
    n = SaturatingAdd(n, CountPaths(*item.value, target, memo));
  }
  memo[&m] = n;
  return n;
}

}  // namespace

uint64_t TraversalEntries(const Module& module) {
  absl::flat_hash_map<const Module*, uint64_t> memo;
  return CountTraversal(module, memo);
}

uint64_t PathsTo(const Module& root, const Module& target) {
  absl::flat_hash_map<const Module*, uint64_t> memo;
  return CountPaths(root, target, memo);
}

}  // namespace modelstate
