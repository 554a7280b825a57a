// File: registration.h
// What a registration is, as the hooks see it: the kind of entry
// (parameter, buffer, submodule), the action (register or unregister), the
// value (a tensor, a module, or None), the event a hook is asked about, and
// the three-valued answer (SEMANTICS H1): keep, replace or block. These are
// plain types; HookRegistry (hooks.h) runs hooks over them and Module
// (module.h) stores what they decide.
//
// Example:
//   RegistrationHook no_temp = [](const RegistrationEvent& e) {
//     if (e.name == "temp") return HookResult::Block("no temp buffers");
//     return HookResult::Keep();
//   };
#ifndef MODELSTATE_CORE_REGISTRATION_H_
#define MODELSTATE_CORE_REGISTRATION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "core/tensor.h"

namespace modelstate {

class Module;

// Numbers are stable (wire format, offset by one).
enum class EntryKind : uint8_t { kParameter = 0, kBuffer = 1, kModule = 2 };
enum class RegistrationAction : uint8_t { kRegister = 0, kUnregister = 1 };

// "parameter", "buffer", "module"; "register", "unregister".
absl::string_view EntryKindName(EntryKind kind);
absl::string_view RegistrationActionName(RegistrationAction action);

// What a slot holds: a tensor (parameters, buffers) or a module. Both null
// means PyTorch's None.
struct SlotValue {
  Tensor tensor;
  std::shared_ptr<Module> module;
  bool persistent = true;  // Buffers only.

  bool is_null() const { return !tensor.defined() && module == nullptr; }
};

// One registration about to happen. `value` is what the hook is asked about
// (after the earlier hooks of the chain).
struct RegistrationEvent {
  Module* module = nullptr;  // The module registered into. Never null.
  std::string path;          // That module's path in its tree ("" = root).
  EntryKind kind = EntryKind::kParameter;
  RegistrationAction action = RegistrationAction::kRegister;
  std::string name;
  SlotValue value;  // Null for kUnregister.
};

// A hook's answer (SEMANTICS H1).
class HookResult {
 public:
  enum class Kind : uint8_t { kKeep = 0, kReplace = 1, kBlock = 2 };

  // Register the value unchanged (PyTorch: return None).
  static HookResult Keep() { return HookResult(Kind::kKeep); }
  // Register `tensor` instead (parameters and buffers). For a parameter a
  // plain tensor is wrapped into a parameter keeping the original's
  // requires_grad; a parameter keeps its own flag.
  static HookResult Replace(Tensor tensor);
  // Register `tensor` as a buffer with the given persistence instead.
  static HookResult ReplaceBuffer(Tensor tensor, bool persistent);
  // Register `module` instead (submodules).
  static HookResult Replace(std::shared_ptr<Module> module);
  // Do not register; the slot keeps its previous state.
  static HookResult Block(std::string reason = "");

  Kind kind() const { return kind_; }
  const SlotValue& replacement() const { return replacement_; }
  bool has_persistent() const { return has_persistent_; }
  const std::string& reason() const { return reason_; }

 private:
  explicit HookResult(Kind kind) : kind_(kind) {}
  Kind kind_;
  SlotValue replacement_;
  bool has_persistent_ = false;
  std::string reason_;
};

// The outcome of a whole chain for one event: keep (the value is unchanged),
// replace (`value` is the replacement, already validated) or block.
struct HookDecision {
  HookResult::Kind kind = HookResult::Kind::kKeep;
  SlotValue value;     // What gets stored unless blocked.
  std::string reason;  // Why it was blocked or replaced; who decided.

  bool blocked() const { return kind == HookResult::Kind::kBlock; }
};

using RegistrationHook = std::function<HookResult(const RegistrationEvent&)>;

}  // namespace modelstate

#endif  // MODELSTATE_CORE_REGISTRATION_H_
