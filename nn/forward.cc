// Forward execution: the module-call protocol (hooks around every call) and
// dispatch to each layer's forward through the layer table
// (layer_registry.h). The layers' forwards live with their families in
// nn/layers/; their numeric kernels in nn/kernels/.
#include "nn/forward.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "nn/forward_runner.h"
#include "nn/kernels/blas.h"
#include "nn/layer_registry.h"
#include "nn/layers/forward_util.h"

namespace modelstate {
namespace internal {

ForwardRunner::ForwardRunner(const ForwardOptions& options)
    : options_(options),
      threads_(options.num_threads > 0 ? options.num_threads : BlasThreads()) {
  if (options.generator == nullptr) local_gen_.emplace(options.seed);
}

absl::StatusOr<std::vector<Tensor>> ForwardRunner::Call(Module& m,
                                                        std::vector<Tensor> in,
                                                        CallFlags flags) {
  const ForwardHookList& global = ForwardHookList::Global();
  const ForwardHookList& own = m.forward_hooks();
  if (global.HasPreHooks() || own.HasPreHooks()) {
    std::vector<ForwardPreHook> hooks = global.PreHooks();
    for (ForwardPreHook& h : own.PreHooks()) hooks.push_back(std::move(h));
    for (const ForwardPreHook& hook : hooks) {
      ForwardHookResult r = hook(m, in);
      if (!r.ok()) return r.status();
      if (r->has_value()) in = std::move(**r);
    }
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<Tensor> out, Run(m, in, flags));
  if (global.HasHooks() || own.HasHooks()) {
    std::vector<ForwardHook> hooks = global.Hooks();
    for (ForwardHook& h : own.Hooks()) hooks.push_back(std::move(h));
    for (const ForwardHook& hook : hooks) {
      ForwardHookResult r = hook(m, in, out);
      if (!r.ok()) return r.status();
      if (r->has_value()) out = std::move(**r);
    }
  }
  return out;
}

absl::StatusOr<Tensor> ForwardRunner::CallChild(Module& m,
                                                absl::string_view name,
                                                std::vector<Tensor> in) {
  const std::shared_ptr<Module>* child = m.children().Find(name);
  if (child == nullptr || *child == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", m.type_name(), "' object has no submodule '", name, "'"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<Tensor> out,
                              Call(**child, std::move(in)));
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(m.type_name(), ".", name, " returned no outputs"));
  }
  return out[0];
}

absl::StatusOr<std::vector<Tensor>> ForwardRunner::Run(
    Module& m, const std::vector<Tensor>& in, CallFlags flags) {
  for (const Tensor& t : in) MODELSTATE_RETURN_IF_ERROR(CheckCpu(t));
  const LayerDef* layer = FindLayer(m.type_name());
  if (layer == nullptr || layer->forward == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("Module [", m.type_name(),
                     "] is missing the required \"forward\" function"));
  }
  return layer->forward(LayerCall{*this, m, flags}, in);
}

}  // namespace internal

absl::StatusOr<std::vector<Tensor>> Forward(Module& module,
                                            std::vector<Tensor> inputs,
                                            const ForwardOptions& options) {
  if (options.num_threads > 0) internal::SetBlasThreads(options.num_threads);
  // Outputs and intermediates of one call come in the same few sizes on
  // every call: recycle their mappings rather than fault in fresh pages.
  ScopedStorageReuse reuse;
  internal::ForwardRunner runner(options);
  return runner.Call(module, std::move(inputs));
}

RemovableHandle RegisterGlobalForwardPreHook(ForwardPreHook hook,
                                             bool prepend) {
  return ForwardHookList::Global().AddPreHook(std::move(hook), prepend);
}

RemovableHandle RegisterGlobalForwardHook(ForwardHook hook, bool prepend) {
  return ForwardHookList::Global().AddHook(std::move(hook), prepend);
}

}  // namespace modelstate
