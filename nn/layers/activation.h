// File: activation.h
// Private to the layer families: an activation applied as a function
// rather than as a module call (TransformerEncoderLayer's `activation`
// string: no module, no hooks).
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(
//       Tensor y, Activate(Act::kGELU, x, call.runner.threads()));
#ifndef MODELSTATE_NN_LAYERS_ACTIVATION_H_
#define MODELSTATE_NN_LAYERS_ACTIVATION_H_

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "nn/kernels/elementwise.h"

namespace modelstate::internal {

// act(x) as a new tensor. REQUIRES: x is float32 or float64 (widened).
absl::StatusOr<Tensor> Activate(Act act, const Tensor& x, int threads);

}  // namespace modelstate::internal

#endif  // MODELSTATE_NN_LAYERS_ACTIVATION_H_
