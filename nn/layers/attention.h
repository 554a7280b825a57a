// File: attention.h
// Private to the layer families: MultiheadAttention's construction, which
// TransformerEncoderLayer reuses for its self_attn.
//
// Example:
//   MhaConfig c{.embed_dim = 64, .num_heads = 4, .dropout = 0.0,
//               .bias = true, .add_bias_kv = false, .add_zero_attn = false,
//               .kdim = 64, .vdim = 64, .batch_first = true,
//               .dtype = DType::kFloat32, .device = Device::Cpu()};
//   MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<Module> mha,
//                               MakeMultiheadAttention(c, ctx, "attn"));
#ifndef MODELSTATE_NN_LAYERS_ATTENTION_H_
#define MODELSTATE_NN_LAYERS_ATTENTION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/module.h"
#include "nn/build_context.h"

namespace modelstate::internal {

// MultiheadAttention's constructor arguments, kdim and vdim resolved.
struct MhaConfig {
  int64_t embed_dim;
  int64_t num_heads;
  double dropout;
  bool bias;
  bool add_bias_kv;
  bool add_zero_attn;
  int64_t kdim;
  int64_t vdim;
  bool batch_first;
  DType dtype;
  Device device;
};

// MultiheadAttention at `path`, its tensors drawn and registered in
// __init__'s order (out_proj's own init in the middle).
absl::StatusOr<std::shared_ptr<Module>> MakeMultiheadAttention(
    const MhaConfig& c, BuildContext& ctx, const std::string& path);

}  // namespace modelstate::internal

#endif  // MODELSTATE_NN_LAYERS_ATTENTION_H_
