// File: hooks.h
// Global registration hooks with modelstate's three-valued result
// (SEMANTICS H1-H6): every time a parameter, buffer or submodule is about to
// be registered or unregistered, the hooks of that kind run in registration
// order, each seeing the value the previous one produced, and each answers
// keep, replace (with a validated replacement) or block.
//
// Example:
//   RemovableHandle h = HookRegistry::Global().AddBufferHook(
//       [](const RegistrationEvent& e) {
//         if (e.name == "temp_buffer") {
//           return HookResult::Block("no temp buffers");
//         }
//         return HookResult::Keep();
//       });
//   ...
//   h.Remove();
#ifndef MODELSTATE_CORE_HOOKS_H_
#define MODELSTATE_CORE_HOOKS_H_

#include <cstddef>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "core/hook_list.h"
#include "core/registration.h"

namespace modelstate {

// Turns a hook's replacement into the value that would be stored, or says
// why it may not stand in for the event's value (Module's rules:
// CheckReplacement in module.h).
using ReplacementCheck = absl::FunctionRef<absl::StatusOr<SlotValue>(
    const RegistrationEvent& event, SlotValue replacement)>;

// Ordered hook lists, one per entry kind. Thread-safe: hooks may be added
// and removed while other threads run chains. A chain runs over the hooks
// present when it started; removing a hook (even from inside a hook) takes
// effect for the next event.
class HookRegistry {
 public:
  HookRegistry() = default;
  HookRegistry(const HookRegistry&) = delete;
  HookRegistry& operator=(const HookRegistry&) = delete;

  // The process-wide registry (PyTorch's global registration hooks).
  static HookRegistry& Global();

  RemovableHandle AddParameterHook(RegistrationHook hook);
  RemovableHandle AddBufferHook(RegistrationHook hook);
  RemovableHandle AddModuleHook(RegistrationHook hook);
  RemovableHandle AddHook(EntryKind kind, RegistrationHook hook);

  // Number of hooks of `kind` now.
  size_t HookCount(EntryKind kind) const;

  // Runs the hooks of event.kind in order. Each replacement goes through
  // `check` before the next hook sees it; an invalid replacement counts as a
  // failed hook, which blocks (fail-closed) with a reason naming the hook.
  HookDecision Run(const RegistrationEvent& event,
                   ReplacementCheck check) const;

 private:
  const HookList<RegistrationHook>& ListOf(EntryKind kind) const;

  HookList<RegistrationHook> lists_[3];
};

}  // namespace modelstate

#endif  // MODELSTATE_CORE_HOOKS_H_
