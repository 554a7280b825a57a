// File: forward_runner.h
// Private to nn: the module-call protocol behind Forward() (forward.h) as
// the layers' forward functions see it. A layer's forward gets a LayerCall:
// the module being called, the call's flags, and the runner, through which
// it calls its submodules (hooks included), draws dropout masks and learns
// how many threads its kernels may use.
//
// Example (a composite layer's forward, in a family file):
//   absl::StatusOr<std::vector<Tensor>> BlockForward(
//       const LayerCall& call, const std::vector<Tensor>& in) {
//     MODELSTATE_ASSIGN_OR_RETURN(
//         Tensor h, call.runner.CallChild(call.module, "linear", {in[0]}));
//     return std::vector<Tensor>{h};
//   }
#ifndef MODELSTATE_NN_FORWARD_RUNNER_H_
#define MODELSTATE_NN_FORWARD_RUNNER_H_

#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/generator.h"
#include "core/module.h"
#include "core/tensor.h"
#include "nn/forward.h"

namespace modelstate::internal {

// How a module is called, beyond its inputs.
struct CallFlags {
  // MultiheadAttention: compute and return the averaged attention weights.
  bool need_weights = true;
};

// One Forward() call: runs module calls with their forward hooks and
// dispatches each to its layer's forward in the layer table
// (layer_registry.h). Thread-compatible; one per Forward() call.
class ForwardRunner {
 public:
  explicit ForwardRunner(const ForwardOptions& options);

  ForwardRunner(const ForwardRunner&) = delete;
  ForwardRunner& operator=(const ForwardRunner&) = delete;

  // module(*inputs): the global and the module's forward pre-hooks, the
  // layer's forward, then the forward hooks. UNIMPLEMENTED for a module
  // without a forward; errors of Forward() (forward.h) otherwise.
  absl::StatusOr<std::vector<Tensor>> Call(Module& m, std::vector<Tensor> in,
                                           CallFlags flags = {});

  // The first output of `m`'s submodule `name` called on `in`.
  // FAILED_PRECONDITION if `m` has no such submodule; INVALID_ARGUMENT if it
  // returns nothing.
  absl::StatusOr<Tensor> CallChild(Module& m, absl::string_view name,
                                   std::vector<Tensor> in);

  // Where Dropout draws its masks: ForwardOptions' generator, or one seeded
  // with ForwardOptions::seed for this call.
  Generator& gen() {
    return options_.generator != nullptr ? *options_.generator : *local_gen_;
  }

  // How many threads the kernels' own parallel loops may use.
  int threads() const { return threads_; }

 private:
  // The layer's forward, without hooks.
  absl::StatusOr<std::vector<Tensor>> Run(Module& m,
                                          const std::vector<Tensor>& in,
                                          CallFlags flags);

  const ForwardOptions& options_;
  const int threads_;
  std::optional<Generator> local_gen_;
};

// One call of a layer's forward.
struct LayerCall {
  ForwardRunner& runner;
  Module& module;
  CallFlags flags;
};

}  // namespace modelstate::internal

#endif  // MODELSTATE_NN_FORWARD_RUNNER_H_
