// File: normalization.h
// Private to the layer families: LayerNorm's construction, which
// TransformerEncoderLayer reuses for its norm1 and norm2.
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(
//       std::shared_ptr<Module> norm,
//       MakeLayerNorm({d_model}, 1e-5, /*affine=*/true, /*bias=*/true,
//                     dtype, device, ctx, "layer.norm1"));
#ifndef MODELSTATE_NN_LAYERS_NORMALIZATION_H_
#define MODELSTATE_NN_LAYERS_NORMALIZATION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/module.h"
#include "nn/build_context.h"

namespace modelstate::internal {

// LayerNorm(normalized_shape, eps, elementwise_affine, bias) at `path`,
// initialised and registered.
absl::StatusOr<std::shared_ptr<Module>> MakeLayerNorm(
    const std::vector<int64_t>& shape, double eps, bool affine, bool bias,
    DType dtype, Device device, BuildContext& ctx, const std::string& path);

}  // namespace modelstate::internal

#endif  // MODELSTATE_NN_LAYERS_NORMALIZATION_H_
