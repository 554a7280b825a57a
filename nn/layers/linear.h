// File: linear.h
// Private to the layer families: the pieces of the Linear family that
// composite layers reuse. MultiheadAttention's out_proj is a
// NonDynamicallyQuantizableLinear whose tensors are drawn in the middle of
// its own init; TransformerEncoderLayer holds two Linears.
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(
//       std::shared_ptr<Module> lin,
//       MakeLinear(16, 32, /*bias=*/true, dtype, device, ctx, "block.fc"));
#ifndef MODELSTATE_NN_LAYERS_LINEAR_H_
#define MODELSTATE_NN_LAYERS_LINEAR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/module.h"
#include "core/tensor.h"
#include "nn/build_context.h"

namespace modelstate::internal {

struct LinearTensors {
  Tensor weight;
  Tensor bias;  // undefined without bias
};

// Linear's tensors, initialised like Linear.reset_parameters().
absl::StatusOr<LinearTensors> MakeLinearTensors(int64_t in, int64_t out,
                                                bool bias, DType dtype,
                                                Device device,
                                                BuildContext& ctx);

// Registers `t` as the weight and bias of `m` (at `path`).
absl::Status RegisterLinear(Module& m, const std::string& path, LinearTensors t,
                            BuildContext& ctx);

// An empty linear module of `type` (Linear or
// NonDynamicallyQuantizableLinear) with its attributes.
std::shared_ptr<Module> NewLinearModule(absl::string_view type, int64_t in,
                                        int64_t out);

// Linear(in, out, bias) at `path`, initialised and registered.
absl::StatusOr<std::shared_ptr<Module>> MakeLinear(int64_t in, int64_t out,
                                                   bool bias, DType dtype,
                                                   Device device,
                                                   BuildContext& ctx,
                                                   const std::string& path);

}  // namespace modelstate::internal

#endif  // MODELSTATE_NN_LAYERS_LINEAR_H_
