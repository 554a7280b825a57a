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
//         if (e.name == "temp_buffer") return HookResult::Block("no temp
//         buffers"); return HookResult::Keep();
//       });
//   ...
//   h.Remove();
#ifndef MODELSTATE_CORE_HOOKS_H_
#define MODELSTATE_CORE_HOOKS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
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

using RegistrationHook = std::function<HookResult(const RegistrationEvent&)>;

// The outcome of a whole chain for one event: keep (the value is unchanged),
// replace (`value` is the replacement, already validated) or block.
struct HookDecision {
  HookResult::Kind kind = HookResult::Kind::kKeep;
  SlotValue value;     // What gets stored unless blocked.
  std::string reason;  // Why it was blocked or replaced; who decided.

  bool blocked() const { return kind == HookResult::Kind::kBlock; }
};

// Checks that `replacement` may stand in for `event`'s value (SEMANTICS H4):
// only register events; same kind of value (tensor vs module), defined; the
// dtype stays floating point if it was (and unchanged otherwise); the shape
// is kept in built-in layers; the device exists; requires_grad only on
// floating dtypes; a module may not contain the module it is registered in.
// Returns INVALID_ARGUMENT saying what is wrong.
absl::Status ValidateReplacement(const RegistrationEvent& event,
                                 const SlotValue& replacement);

// Turns a tensor replacement for a parameter into a parameter (see
// HookResult::Replace); other values are returned as they are.
absl::StatusOr<SlotValue> NormalizeReplacement(const RegistrationEvent& event,
                                               SlotValue replacement);

class HookRegistry;

// Removes one hook. Removing twice, or after the registry is gone, is a
// no-op. Thread-safe. Movable, not copyable; destroying it does NOT remove
// the hook (as in PyTorch, where a dropped handle leaves the hook in place).
class RemovableHandle {
 public:
  RemovableHandle() = default;
  RemovableHandle(RemovableHandle&&) = default;
  RemovableHandle& operator=(RemovableHandle&&) = default;

  void Remove();
  // The hook's id: one process-wide counter shared by all kinds.
  uint64_t id() const { return id_; }

 private:
  friend class HookRegistry;
  struct Shared;
  RemovableHandle(std::weak_ptr<Shared> registry, uint64_t id)
      : registry_(std::move(registry)), id_(id) {}
  std::weak_ptr<Shared> registry_;
  uint64_t id_ = 0;
};

// Ordered hook lists, one per entry kind. Thread-safe: hooks may be added
// and removed while other threads run chains. A chain runs over the hooks
// present when it started; removing a hook (even from inside a hook) takes
// effect for the next event.
class HookRegistry {
 public:
  HookRegistry();
  ~HookRegistry();
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

  // Runs the hooks of event.kind in order. A replacement is normalised and
  // validated before the next hook sees it; an invalid replacement counts as
  // a failed hook, which blocks (fail-closed) with a reason naming the hook.
  HookDecision Run(const RegistrationEvent& event) const;

 private:
  std::shared_ptr<RemovableHandle::Shared> shared_;
};

}  // namespace modelstate

#endif  // MODELSTATE_CORE_HOOKS_H_
