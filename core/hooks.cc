#include "core/hooks.h"

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/module.h"
#include "core/status_macros.h"
#include "core/sync.h"

namespace modelstate {
namespace {

// One counter for every hook of every kind and registry (PyTorch 4.12).
std::atomic<uint64_t> next_hook_id{1};

size_t KindIndex(EntryKind kind) { return static_cast<size_t>(kind); }

}  // namespace

absl::string_view EntryKindName(EntryKind kind) {
  switch (kind) {
    case EntryKind::kParameter:
      return "parameter";
    case EntryKind::kBuffer:
      return "buffer";
    case EntryKind::kModule:
      return "module";
  }
  return "unknown";
}

absl::string_view RegistrationActionName(RegistrationAction action) {
  return action == RegistrationAction::kRegister ? "register" : "unregister";
}

HookResult HookResult::Replace(Tensor tensor) {
  HookResult r(Kind::kReplace);
  r.replacement_.tensor = std::move(tensor);
  return r;
}

HookResult HookResult::ReplaceBuffer(Tensor tensor, bool persistent) {
  HookResult r(Kind::kReplace);
  r.replacement_.tensor = std::move(tensor);
  r.replacement_.persistent = persistent;
  r.has_persistent_ = true;
  return r;
}

HookResult HookResult::Replace(std::shared_ptr<Module> module) {
  HookResult r(Kind::kReplace);
  r.replacement_.module = std::move(module);
  return r;
}

HookResult HookResult::Block(std::string reason) {
  HookResult r(Kind::kBlock);
  r.reason_ = std::move(reason);
  return r;
}

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

// Hooks of one registry. Lists are immutable snapshots swapped under the
// mutex, so a running chain never sees a list change under it.
struct RemovableHandle::Shared {
  struct Entry {
    uint64_t id;
    std::shared_ptr<const RegistrationHook> hook;
  };
  using List = std::vector<Entry>;

  mutable Mutex mu;
  std::shared_ptr<const List> lists[3] ABSL_GUARDED_BY(mu) = {
      std::make_shared<List>(), std::make_shared<List>(),
      std::make_shared<List>()};

  std::shared_ptr<const List> Snapshot(EntryKind kind) const {
    MutexLock lock(&mu);
    return lists[KindIndex(kind)];
  }
};

void RemovableHandle::Remove() {
  std::shared_ptr<Shared> shared = registry_.lock();
  if (shared == nullptr) return;
  MutexLock lock(&shared->mu);
  for (auto& list : shared->lists) {
    for (size_t i = 0; i < list->size(); ++i) {
      if ((*list)[i].id == id_) {
        auto copy = std::make_shared<Shared::List>(*list);
        copy->erase(copy->begin() + static_cast<ptrdiff_t>(i));
        list = std::move(copy);
        return;
      }
    }
  }
}

HookRegistry::HookRegistry()
    : shared_(std::make_shared<RemovableHandle::Shared>()) {}

HookRegistry::~HookRegistry() = default;

HookRegistry& HookRegistry::Global() {
  static HookRegistry* global = new HookRegistry();
  return *global;
}

RemovableHandle HookRegistry::AddHook(EntryKind kind, RegistrationHook hook) {
  uint64_t id = next_hook_id.fetch_add(1);
  auto entry = RemovableHandle::Shared::Entry{
      id, std::make_shared<const RegistrationHook>(std::move(hook))};
  MutexLock lock(&shared_->mu);
  auto& list = shared_->lists[KindIndex(kind)];
  auto copy = std::make_shared<RemovableHandle::Shared::List>(*list);
  copy->push_back(std::move(entry));
  list = std::move(copy);
  return RemovableHandle(shared_, id);
}

RemovableHandle HookRegistry::AddParameterHook(RegistrationHook hook) {
  return AddHook(EntryKind::kParameter, std::move(hook));
}
RemovableHandle HookRegistry::AddBufferHook(RegistrationHook hook) {
  return AddHook(EntryKind::kBuffer, std::move(hook));
}
RemovableHandle HookRegistry::AddModuleHook(RegistrationHook hook) {
  return AddHook(EntryKind::kModule, std::move(hook));
}

size_t HookRegistry::HookCount(EntryKind kind) const {
  return shared_->Snapshot(kind)->size();
}

HookDecision HookRegistry::Run(const RegistrationEvent& event) const {
  HookDecision decision;
  decision.value = event.value;
  std::shared_ptr<const RemovableHandle::Shared::List> hooks =
      shared_->Snapshot(event.kind);
  if (hooks->empty()) return decision;
  RegistrationEvent current = event;
  for (const auto& entry : *hooks) {
    HookResult result = (*entry.hook)(current);
    switch (result.kind()) {
      case HookResult::Kind::kKeep:
        break;
      case HookResult::Kind::kBlock:
        decision.kind = HookResult::Kind::kBlock;
        decision.reason = result.reason().empty()
                              ? absl::StrCat("blocked by hook ", entry.id)
                              : result.reason();
        return decision;
      case HookResult::Kind::kReplace: {
        SlotValue replacement = result.replacement();
        if (!result.has_persistent()) {
          replacement.persistent = current.value.persistent;
        }
        absl::StatusOr<SlotValue> normalized =
            NormalizeReplacement(current, std::move(replacement));
        absl::Status valid = normalized.ok()
                                 ? ValidateReplacement(current, *normalized)
                                 : normalized.status();
        if (!valid.ok()) {
          decision.kind = HookResult::Kind::kBlock;
          decision.reason = absl::StrCat(
              "hook ", entry.id,
              " returned an invalid replacement: ", valid.message());
          return decision;
        }
        decision.kind = HookResult::Kind::kReplace;
        decision.value = *normalized;
        if (!result.reason().empty()) decision.reason = result.reason();
        current.value = *normalized;
        break;
      }
    }
  }
  return decision;
}

}  // namespace modelstate
