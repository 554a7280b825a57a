// File: forward_hooks.h
// Forward pre-hooks and forward hooks, PyTorch's
// `Module.register_forward_pre_hook` / `register_forward_hook` and the global
// `nn.modules.module.register_module_forward_pre_hook` /
// `register_module_forward_hook` (seed 003). Forward() (forward.h) runs them
// around every module call, its submodules' calls included:
//
//   1. global pre-hooks, then the module's pre-hooks, in registration order;
//      each may replace the inputs (the next hook and forward see the
//      replacement);
//   2. the module's forward;
//   3. global forward hooks, then the module's forward hooks, in registration
//      order; each sees the (possibly replaced) inputs and the outputs so far,
//      and may replace the outputs.
//
// A hook answers keep (std::nullopt: PyTorch's `return None`), replace (a
// vector of tensors) or fail (an error status, PyTorch's `raise`), which
// aborts the forward with that status. `prepend` puts a hook before the
// others of its list (PyTorch 2.x's prepend=True).
//
// Example:
//   RemovableHandle h = module->RegisterForwardHook(
//       [](Module& m, const std::vector<Tensor>& in,
//          const std::vector<Tensor>& out) -> ForwardHookResult {
//         if (!in[0].defined()) return absl::InvalidArgumentError("no input");
//         return std::nullopt;  // keep the output
//       });
//   ...
//   h.Remove();
#ifndef MODELSTATE_CORE_FORWARD_HOOKS_H_
#define MODELSTATE_CORE_FORWARD_HOOKS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/hook_list.h"
#include "core/tensor.h"

namespace modelstate {

class Module;

// What a forward hook returns: std::nullopt keeps the value, a vector
// replaces it, an error aborts the forward.
using ForwardHookResult = absl::StatusOr<std::optional<std::vector<Tensor>>>;

// Called before forward with the module and its inputs (an undefined tensor
// stands for None, e.g. an absent mask).
using ForwardPreHook =
    std::function<ForwardHookResult(Module&, const std::vector<Tensor>&)>;

// Called after forward with the module, its inputs and its outputs.
using ForwardHook = std::function<ForwardHookResult(
    Module&, const std::vector<Tensor>&, const std::vector<Tensor>&)>;

// The pre-hooks and forward hooks of one module, or the global ones.
// Thread-safe: hooks may be added and removed while other threads run
// forwards; a forward runs the hooks present when it took its snapshot, so
// removing a hook from inside a hook takes effect for the next call.
class ForwardHookList {
 public:
  ForwardHookList() = default;
  ForwardHookList(const ForwardHookList&) = delete;
  ForwardHookList& operator=(const ForwardHookList&) = delete;

  // The process-wide hooks, run before every module's own.
  static ForwardHookList& Global();

  RemovableHandle AddPreHook(ForwardPreHook hook, bool prepend = false);
  RemovableHandle AddHook(ForwardHook hook, bool prepend = false);

  // Snapshots, in run order.
  std::vector<ForwardPreHook> PreHooks() const;
  std::vector<ForwardHook> Hooks() const;
  // Cheap checks that let a forward skip the snapshots.
  bool HasPreHooks() const;
  bool HasHooks() const;

 private:
  HookList<ForwardPreHook> pre_;
  HookList<ForwardHook> post_;
};

}  // namespace modelstate

#endif  // MODELSTATE_CORE_FORWARD_HOOKS_H_
