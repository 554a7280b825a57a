#include "core/hooks.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

namespace modelstate {

HookRegistry& HookRegistry::Global() {
  static HookRegistry* global = new HookRegistry();
  return *global;
}

const HookList<RegistrationHook>& HookRegistry::ListOf(EntryKind kind) const {
  return lists_[static_cast<size_t>(kind)];
}

RemovableHandle HookRegistry::AddHook(EntryKind kind, RegistrationHook hook) {
  return lists_[static_cast<size_t>(kind)].Add(std::move(hook));
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
  return ListOf(kind).size();
}

HookDecision HookRegistry::Run(const RegistrationEvent& event,
                               ReplacementCheck check) const {
  HookDecision decision;
  decision.value = event.value;
  const HookList<RegistrationHook>& list = ListOf(event.kind);
  if (list.empty()) return decision;
  RegistrationEvent current = event;
  // Held for the whole chain: hooks removed meanwhile still finish it.
  const auto hooks = list.Snapshot();
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
        absl::StatusOr<SlotValue> checked =
            check(current, std::move(replacement));
        if (!checked.ok()) {
          decision.kind = HookResult::Kind::kBlock;
          decision.reason = absl::StrCat(
              "hook ", entry.id,
              " returned an invalid replacement: ", checked.status().message());
          return decision;
        }
        decision.kind = HookResult::Kind::kReplace;
        decision.value = *checked;
        if (!result.reason().empty()) decision.reason = result.reason();
        current.value = *std::move(checked);
        break;
      }
    }
  }
  return decision;
}

}  // namespace modelstate
