// The embedding family: Embedding. Construction follows
// torch.nn.modules.sparse (weight ~ N(0, 1), the padding_idx row zeroed);
// forward looks rows up, renormalising them in the weight first when
// max_norm is set, as F.embedding does.
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "core/init.h"
#include "nn/layer_registry.h"
#include "nn/layers/build_util.h"
#include "nn/layers/forward_util.h"

namespace modelstate::internal {
namespace {

absl::StatusOr<std::shared_ptr<Module>> BuildEmbedding(
    const BoundArgs& args, BuildContext& ctx, const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t n, args.Int("num_embeddings"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t d, args.Int("embedding_dim"));
  MODELSTATE_ASSIGN_OR_RETURN(FactoryKwargs factory,
                              args.Factory(ctx.options()));
  MODELSTATE_ASSIGN_OR_RETURN(bool freeze, args.Bool("_freeze"));  // 2.x
  AttrValue padding_attr;
  std::optional<int64_t> padding_idx;
  if (!args.IsNone("padding_idx")) {
    MODELSTATE_ASSIGN_OR_RETURN(int64_t idx, args.Int("padding_idx"));
    if (idx > 0 && idx >= n) {
      return absl::InvalidArgumentError(
          "Padding_idx must be within num_embeddings");
    }
    if (idx < 0) {
      if (idx < -n) {
        return absl::InvalidArgumentError(
            "Padding_idx must be within num_embeddings");
      }
      idx += n;
    }
    padding_idx = idx;
    padding_attr = idx;
  }
  if (!args.IsNone("_weight")) {
    return absl::InvalidArgumentError(
        "_weight is not supported here; build the layer, then load the "
        "values with LoadStateDict");
  }
  AttrValue max_norm;
  if (!args.IsNone("max_norm")) {
    MODELSTATE_ASSIGN_OR_RETURN(double v, args.Float("max_norm"));
    max_norm = v;
  }
  MODELSTATE_ASSIGN_OR_RETURN(double norm_type, args.Float("norm_type"));
  MODELSTATE_ASSIGN_OR_RETURN(bool scale, args.Bool("scale_grad_by_freq"));
  MODELSTATE_ASSIGN_OR_RETURN(bool sparse, args.Bool("sparse"));
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor w, ctx.NewTensor(factory.dtype, {n, d}, factory.device));
  MODELSTATE_RETURN_IF_ERROR(NormalInit(w, 0.0, 1.0, ctx.gen()));
  if (padding_idx.has_value() && factory.device.has_storage() && d > 0) {
    // _fill_padding_idx_with_zero: the row is zeroed after the draw.
    MODELSTATE_ASSIGN_OR_RETURN(void* data, w.MutableDataForOverwrite());
    for (int64_t j = 0; j < d; ++j) {
      WriteElementFromDouble(data, factory.dtype, *padding_idx * d + j, 0.0);
    }
  }
  std::shared_ptr<Module> m = NewLayer("Embedding", "sparse");
  m->SetPlainAttribute("num_embeddings", n);
  m->SetPlainAttribute("embedding_dim", d);
  m->SetPlainAttribute("padding_idx", padding_attr);
  m->SetPlainAttribute("max_norm", max_norm);
  m->SetPlainAttribute("norm_type", norm_type);
  m->SetPlainAttribute("scale_grad_by_freq", scale);
  m->SetPlainAttribute("sparse", sparse);
  m->AddClassAttributes({"reset_parameters", "__constants__", "from_pretrained",
                         "_fill_padding_idx_with_zero"});
  MODELSTATE_RETURN_IF_ERROR(
      ctx.AddParameter(*m, path, "weight", w, /*requires_grad=*/!freeze));
  return m;
}

// F.embedding, with embedding_renorm_ first when max_norm is set.
absl::StatusOr<Tensor> Embed(const Module& m, const Tensor& indices) {
  Tensor weight = Entry(m, "weight");
  MODELSTATE_RETURN_IF_ERROR(CheckCpu(weight));
  if (indices.dtype() != DType::kInt64 && indices.dtype() != DType::kInt32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Expected tensor for argument #1 'indices' to have one of the "
        "following scalar types: Long, Int; but got ",
        indices.TypeName(),
        " instead (while checking arguments for "
        "embedding)"));
  }
  const int64_t num = weight.shape()[0], dim = weight.shape()[1];
  const int64_t count = indices.numel();
  std::vector<int64_t> idx(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    idx[i] = indices.dtype() == DType::kInt64
                 ? indices.data<int64_t>()[i]
                 : static_cast<int64_t>(indices.data<int32_t>()[i]);
    if (idx[i] < 0 || idx[i] >= num) {
      return absl::InvalidArgumentError("index out of range in self");
    }
  }
  if (!AttrIsNone(m, "max_norm")) {
    // embedding_renorm_: rows looked up whose norm exceeds max_norm are
    // scaled down in the weight itself, before the lookup.
    MODELSTATE_ASSIGN_OR_RETURN(double max_norm, AttrDouble(m, "max_norm"));
    MODELSTATE_ASSIGN_OR_RETURN(double p, AttrDouble(m, "norm_type"));
    MODELSTATE_ASSIGN_OR_RETURN(Tensor w64,
                                weight.To(Device::Cpu(), DType::kFloat64));
    MODELSTATE_ASSIGN_OR_RETURN(Tensor w64_own, w64.Clone());
    MODELSTATE_ASSIGN_OR_RETURN(void* raw, w64_own.MutableDataForOverwrite());
    double* pw = static_cast<double*>(raw);
    bool changed = false;
    absl::flat_hash_set<int64_t> seen;
    for (int64_t row : idx) {
      if (!seen.insert(row).second) continue;
      double norm = 0;
      double* r = pw + row * dim;
      if (p == 1) {
        for (int64_t j = 0; j < dim; ++j) norm += std::abs(r[j]);
      } else if (p == 2) {
        for (int64_t j = 0; j < dim; ++j) norm += r[j] * r[j];
        norm = std::sqrt(norm);
      } else {
        for (int64_t j = 0; j < dim; ++j) norm += std::pow(std::abs(r[j]), p);
        norm = std::pow(norm, 1.0 / p);
      }
      if (norm > max_norm) {
        double scale = max_norm / (norm + 1e-7);
        for (int64_t j = 0; j < dim; ++j) r[j] *= scale;
        changed = true;
      }
    }
    if (changed) MODELSTATE_RETURN_IF_ERROR(weight.CopyFrom(w64_own));
  }
  Shape shape = indices.shape();
  shape.push_back(dim);
  MODELSTATE_ASSIGN_OR_RETURN(Tensor y, Tensor::Empty(weight.dtype(), shape));
  MODELSTATE_ASSIGN_OR_RETURN(void* out, y.MutableDataForOverwrite());
  const size_t row_bytes =
      static_cast<size_t>(dim) * ElementSize(weight.dtype());
  const char* src = static_cast<const char*>(weight.raw_data());
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(static_cast<char*>(out) + i * row_bytes,
                src + idx[i] * row_bytes, row_bytes);
  }
  return y;
}

// Inputs: [indices (int64 or int32)], of any shape.
absl::StatusOr<std::vector<Tensor>> EmbeddingForward(
    const LayerCall& call, const std::vector<Tensor>& in) {
  MODELSTATE_RETURN_IF_ERROR(CheckNumInputs(call.module, in, 1, 1));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor y, Embed(call.module, in[0]));
  return std::vector<Tensor>{y};
}

}  // namespace

std::vector<LayerDef> EmbeddingFamily() {
  return {
      // Embedding's `_freeze` is PyTorch 2.x's (after _weight).
      {.type = "Embedding",
       .qualified_name = "torch.nn.modules.sparse.Embedding",
       .signature = {{"num_embeddings", {}},
                     {"embedding_dim", {}},
                     {"padding_idx", kNone},
                     {"max_norm", kNone},
                     {"norm_type", F(2.0)},
                     {"scale_grad_by_freq", B(false)},
                     {"sparse", B(false)},
                     {"_weight", kNone},
                     {"_freeze", B(false)},
                     {"device", kNone},
                     {"dtype", kNone}},
       .build = &BuildEmbedding,
       .forward = &EmbeddingForward},
  };
}

}  // namespace modelstate::internal
