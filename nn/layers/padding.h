// File: padding.h
// Private to the layer families: F.pad over the last one to three dims of
// a float or double tensor, which the padding layers (padding.cc) and the
// convolutions' padding_mode (conv.cc) share.
//
// Example (conv2d's reflect padding of [N, C, H, W] by 1 on each side):
//   MODELSTATE_ASSIGN_OR_RETURN(
//       Tensor padded, PadLastDims(x, {1, 1, 1, 1}, PadMode::kReflect));
#ifndef MODELSTATE_NN_LAYERS_PADDING_H_
#define MODELSTATE_NN_LAYERS_PADDING_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/tensor.h"

namespace modelstate::internal {

enum class PadMode { kConstant, kReflect, kReplicate, kCircular };

// The mode of F.pad's name ("constant", "reflect", "replicate",
// "circular"; conv's "zeros" is "constant"); INVALID_ARGUMENT otherwise.
absl::StatusOr<PadMode> ParsePadMode(absl::string_view name);

// `x` padded as F.pad(x, pad, mode, value): `pad` holds (before, after)
// pairs from the last dim backwards, at most three; a negative amount
// crops. PyTorch's messages for a reflection or wrap-around that does not
// fit. REQUIRES: x is float32 or float64 with at least pad.size() / 2 dims.
absl::StatusOr<Tensor> PadLastDims(const Tensor& x,
                                   const std::vector<int64_t>& pad,
                                   PadMode mode, double value = 0.0);

}  // namespace modelstate::internal

#endif  // MODELSTATE_NN_LAYERS_PADDING_H_
