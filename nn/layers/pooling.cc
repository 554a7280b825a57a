// The pooling family: MaxPool2d and AdaptiveAvgPool2d. Modules without
// state (torch.nn.modules.pooling) that keep kernel_size, stride, ... as
// given (an int or a tuple); forward follows F.max_pool2d (ceil_mode,
// dilation, return_indices) and F.adaptive_avg_pool2d.
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "nn/layer_registry.h"
#include "nn/layers/build_util.h"
#include "nn/layers/forward_util.h"

namespace modelstate::internal {
namespace {

// ---------------------------------------------------------------------------
// Construction.

absl::StatusOr<std::shared_ptr<Module>> BuildMaxPool2d(const BoundArgs& args,
                                                       BuildContext&,
                                                       const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(AttrValue kernel,
                              args.IntOrTuple("kernel_size", 1));
  // PyTorch: stride = stride if (stride is not None) else kernel_size.
  AttrValue stride = kernel;
  if (!args.IsNone("stride")) {
    MODELSTATE_ASSIGN_OR_RETURN(stride, args.IntOrTuple("stride", 1));
  }
  MODELSTATE_ASSIGN_OR_RETURN(AttrValue padding, args.IntOrTuple("padding", 0));
  MODELSTATE_ASSIGN_OR_RETURN(AttrValue dilation,
                              args.IntOrTuple("dilation", 1));
  MODELSTATE_ASSIGN_OR_RETURN(bool return_indices, args.Bool("return_indices"));
  MODELSTATE_ASSIGN_OR_RETURN(bool ceil_mode, args.Bool("ceil_mode"));
  std::shared_ptr<Module> m = NewStateless("MaxPool2d", "pooling");
  m->SetPlainAttribute("kernel_size", kernel);
  m->SetPlainAttribute("stride", stride);
  m->SetPlainAttribute("padding", padding);
  m->SetPlainAttribute("dilation", dilation);
  m->SetPlainAttribute("return_indices", return_indices);
  m->SetPlainAttribute("ceil_mode", ceil_mode);
  return m;
}

absl::StatusOr<std::shared_ptr<Module>> BuildAdaptiveAvgPool2d(
    const BoundArgs& args, BuildContext&, const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(AttrValue size,
                              args.IntOrTuple("output_size", 0));
  std::shared_ptr<Module> m = NewStateless("AdaptiveAvgPool2d", "pooling");
  m->SetPlainAttribute("output_size", size);
  return m;
}

// ---------------------------------------------------------------------------
// Forward.

// The maximum of each pooling window of each [h, w] plane into y[planes,
// ho, wo], and where it is (an index into the plane) into `indices` unless
// null. A NaN wins its window, as in ATen.
template <typename T>
void MaxPool2dKernel(const T* px, int64_t planes, int64_t h, int64_t w,
                     int64_t ho, int64_t wo, const std::vector<int64_t>& k,
                     const std::vector<int64_t>& st,
                     const std::vector<int64_t>& pd,
                     const std::vector<int64_t>& dl, T* y, int64_t* indices) {
  for (int64_t p = 0; p < planes; ++p) {
    const T* src = px + p * h * w;
    for (int64_t i = 0; i < ho; ++i) {
      for (int64_t j = 0; j < wo; ++j) {
        T best = -std::numeric_limits<T>::infinity();
        int64_t best_at = -1;
        for (int64_t a = 0; a < k[0]; ++a) {
          int64_t hi = i * st[0] - pd[0] + a * dl[0];
          if (hi < 0 || hi >= h) continue;
          for (int64_t c = 0; c < k[1]; ++c) {
            int64_t wi = j * st[1] - pd[1] + c * dl[1];
            if (wi < 0 || wi >= w) continue;
            T v = src[hi * w + wi];
            if (best_at < 0 || v > best || std::isnan(v)) {
              if (!(best_at >= 0 && std::isnan(best))) {
                best = v;
                best_at = hi * w + wi;
              }
            }
          }
        }
        y[(p * ho + i) * wo + j] = best;
        if (indices) indices[(p * ho + i) * wo + j] = best_at;
      }
    }
  }
}

template <typename T>
absl::StatusOr<std::vector<Tensor>> MaxPool2dForward(const LayerCall& call,
                                                     const Tensor& x, DType) {
  const Module& m = call.module;
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> k,
                              AttrInts(m, "kernel_size", 2));
  std::vector<int64_t> st = k;
  const AttrValue* sv = m.attributes().Find("stride");
  bool stride_empty = sv == nullptr ||
                      std::holds_alternative<std::monostate>(*sv) ||
                      (std::holds_alternative<std::vector<int64_t>>(*sv) &&
                       std::get<std::vector<int64_t>>(*sv).empty());
  if (!stride_empty) {
    MODELSTATE_ASSIGN_OR_RETURN(st, AttrInts(m, "stride", 2));
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> pd,
                              AttrInts(m, "padding", 2));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> dl,
                              AttrInts(m, "dilation", 2));
  MODELSTATE_ASSIGN_OR_RETURN(bool ceil_mode, AttrBool(m, "ceil_mode"));
  MODELSTATE_ASSIGN_OR_RETURN(bool return_indices,
                              AttrBool(m, "return_indices"));
  if (x.dim() != 3 && x.dim() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "non-empty 3D or 4D (batch mode) tensor expected for input, but got: ",
        Sizes(x.shape())));
  }
  for (int d = 0; d < 2; ++d) {
    if (k[d] <= 0 || st[d] <= 0 || dl[d] <= 0) {
      return absl::InvalidArgumentError(
          "max_pool2d: kernel_size, stride and dilation must be greater than "
          "zero");
    }
    if (pd[d] > k[d] / 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pad should be at most half of effective kernel size, but got pad=",
          pd[d], ", kernel_size=", k[d], " and dilation=", dl[d]));
    }
  }
  const int64_t planes = Prod(x.shape(), 0, x.dim() - 2);
  const int64_t h = x.shape()[x.dim() - 2], w = x.shape()[x.dim() - 1];
  auto out_size = [&](int64_t in, int d) {
    int64_t num = in + 2 * pd[d] - dl[d] * (k[d] - 1) - 1;
    int64_t o = (ceil_mode ? (num + st[d] - 1) / st[d] : num / st[d]) + 1;
    if (num < 0)
      o = ceil_mode ? -((-num) / st[d]) + 1 : -((-num + st[d] - 1) / st[d]) + 1;
    if (ceil_mode && (o - 1) * st[d] >= in + pd[d]) --o;
    return o;
  };
  const int64_t ho = out_size(h, 0), wo = out_size(w, 1);
  if (ho < 1 || wo < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Given input size: (", x.dim() == 4 ? x.shape()[1] : x.shape()[0], "x",
        h, "x", w, "). Calculated output size: (",
        x.dim() == 4 ? x.shape()[1] : x.shape()[0], "x", ho, "x", wo,
        "). Output size is too small"));
  }
  Shape shape = x.shape();
  shape[shape.size() - 2] = ho;
  shape[shape.size() - 1] = wo;
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(shape));
  Tensor indices;
  int64_t* pi = nullptr;
  if (return_indices) {
    MODELSTATE_ASSIGN_OR_RETURN(indices, Tensor::Empty(DType::kInt64, shape));
    MODELSTATE_ASSIGN_OR_RETURN(void* raw, indices.MutableDataForOverwrite());
    pi = static_cast<int64_t*>(raw);
  }
  MaxPool2dKernel(Data<T>(x), planes, h, w, ho, wo, k, st, pd, dl, y.data, pi);
  std::vector<Tensor> out = {y.tensor};
  if (return_indices) out.push_back(indices);
  return out;
}

template <typename T>
absl::StatusOr<Tensor> AdaptiveAvgPool2dForward(const LayerCall& call,
                                                const Tensor& x, DType) {
  const Module& m = call.module;
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> size,
                              AttrInts(m, "output_size", 2));
  if (x.dim() != 3 && x.dim() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "adaptive_avg_pool2d(): Expected 3D or 4D tensor, but got ",
        Sizes(x.shape())));
  }
  const int64_t planes = Prod(x.shape(), 0, x.dim() - 2);
  const int64_t h = x.shape()[x.dim() - 2], w = x.shape()[x.dim() - 1];
  const int64_t ho = size[0], wo = size[1];
  Shape shape = x.shape();
  shape[shape.size() - 2] = ho;
  shape[shape.size() - 1] = wo;
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(shape));
  const T* px = Data<T>(x);
  for (int64_t p = 0; p < planes; ++p) {
    const T* src = px + p * h * w;
    for (int64_t i = 0; i < ho; ++i) {
      const int64_t h0 = (i * h) / ho, h1 = ((i + 1) * h + ho - 1) / ho;
      for (int64_t j = 0; j < wo; ++j) {
        const int64_t w0 = (j * w) / wo, w1 = ((j + 1) * w + wo - 1) / wo;
        T sum = 0;
        for (int64_t a = h0; a < h1; ++a) {
          for (int64_t c = w0; c < w1; ++c) sum += src[a * w + c];
        }
        y.data[(p * ho + i) * wo + j] =
            sum / static_cast<T>((h1 - h0) * (w1 - w0));
      }
    }
  }
  return y.tensor;
}

}  // namespace

std::vector<LayerDef> PoolingFamily() {
  return {
      {.type = "MaxPool2d",
       .qualified_name = "torch.nn.modules.pooling.MaxPool2d",
       .signature = {{"kernel_size", {}},
                     {"stride", kNone},
                     {"padding", I(0)},
                     {"dilation", I(1)},
                     {"return_indices", B(false)},
                     {"ceil_mode", B(false)}},
       .build = &BuildMaxPool2d,
       .forward =
           &FloatForward<&MaxPool2dForward<float>, &MaxPool2dForward<double>>},
      {.type = "AdaptiveAvgPool2d",
       .qualified_name = "torch.nn.modules.pooling.AdaptiveAvgPool2d",
       .signature = {{"output_size", {}}},
       .build = &BuildAdaptiveAvgPool2d,
       .forward = &FloatForward<&AdaptiveAvgPool2dForward<float>,
                                &AdaptiveAvgPool2dForward<double>>},
  };
}

}  // namespace modelstate::internal
