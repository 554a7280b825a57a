// The fold family: Unfold(kernel_size, dilation, padding, stride) and
// Fold(output_size, kernel_size, dilation, padding, stride)
// (torch.nn.modules.fold). Modules without state keeping their arguments
// as given; forward is ATen's im2col (Unfold: each sliding block of a
// (N, C, H, W) input becomes a column of (N, C*kh*kw, L)) and col2im (Fold:
// the inverse placement, overlapping values summed), with ATen's checks and
// texts. Unbatched inputs (one dim fewer) are accepted, as in torch 1.13.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "nn/layer_registry.h"
#include "nn/layers/build_util.h"
#include "nn/layers/forward_util.h"

namespace modelstate::internal {
namespace {

template <bool kFold>
absl::StatusOr<std::shared_ptr<Module>> BuildFoldLayer(const BoundArgs& args,
                                                       BuildContext&,
                                                       const std::string&) {
  std::shared_ptr<Module> m = NewStateless(kFold ? "Fold" : "Unfold", "fold");
  std::vector<const char*> names = {"kernel_size", "dilation", "padding",
                                    "stride"};
  if (kFold) names.insert(names.begin(), "output_size");
  for (const char* name : names) {
    // Any int: forward checks the values with ATen's texts.
    MODELSTATE_ASSIGN_OR_RETURN(
        AttrValue value,
        args.IntOrTuple(name, std::numeric_limits<int64_t>::min()));
    m->SetPlainAttribute(name, std::move(value));
  }
  return m;
}

// Both layers' window: sizes per spatial dim (height, width).
struct FoldWindow {
  std::vector<int64_t> k, d, p, s;
  int64_t blocks_h = 0, blocks_w = 0;
};

std::string FoldPair(const std::vector<int64_t>& v) {
  return absl::StrCat("(", v[0], ", ", v[1], ")");
}

// The window's arguments, checked as ATen's im2col / col2im shape checks
// do, and the number of blocks for a (height, width) image.
absl::StatusOr<FoldWindow> ReadFoldWindow(const Module& m, int64_t height,
                                          int64_t width) {
  FoldWindow w;
  MODELSTATE_ASSIGN_OR_RETURN(w.k, AttrInts(m, "kernel_size", 2));
  MODELSTATE_ASSIGN_OR_RETURN(w.d, AttrInts(m, "dilation", 2));
  MODELSTATE_ASSIGN_OR_RETURN(w.p, AttrInts(m, "padding", 2));
  MODELSTATE_ASSIGN_OR_RETURN(w.s, AttrInts(m, "stride", 2));
  struct Check {
    const std::vector<int64_t>& v;
    const char* what;
    const char* name;
    int64_t min;
  } checks[] = {
      {w.k, "kernel size should be greater than zero", "kernel", 1},
      {w.s, "stride should be greater than zero", "stride", 1},
      {w.d, "dilation should be greater than zero", "dilation", 1},
      {w.p, "padding should be non-negative", "pad", 0},
  };
  for (const Check& c : checks) {
    if (c.v[0] < c.min || c.v[1] < c.min) {
      return absl::InvalidArgumentError(
          absl::StrCat(c.what, ", but got ", c.name, "_height: ", c.v[0], " ",
                       c.name, "_width: ", c.v[1]));
    }
  }
  const int64_t size[2] = {height, width};
  int64_t blocks[2];
  for (int i = 0; i < 2; ++i) {
    blocks[i] =
        (size[i] + 2 * w.p[i] - (w.d[i] * (w.k[i] - 1) + 1)) / w.s[i] + 1;
  }
  w.blocks_h = blocks[0];
  w.blocks_w = blocks[1];
  return w;
}

// Calls fn(channel_row, block, image_offset) for every kernel element of
// every block that lands inside the (h, w) image of `channels` channels:
// row c*kh*kw + i*kw + j of the columns, block oh*bw + ow, and the offset of
// its pixel in the image.
template <typename Fn>
void ForEachFoldTap(const FoldWindow& w, int64_t channels, int64_t h,
                    int64_t wd, Fn fn) {
  const int64_t kk = w.k[0] * w.k[1];
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t i = 0; i < w.k[0]; ++i) {
      for (int64_t j = 0; j < w.k[1]; ++j) {
        const int64_t row = c * kk + i * w.k[1] + j;
        for (int64_t oh = 0; oh < w.blocks_h; ++oh) {
          const int64_t y = oh * w.s[0] - w.p[0] + i * w.d[0];
          if (y < 0 || y >= h) continue;
          for (int64_t ow = 0; ow < w.blocks_w; ++ow) {
            const int64_t x = ow * w.s[1] - w.p[1] + j * w.d[1];
            if (x < 0 || x >= wd) continue;
            fn(row, oh * w.blocks_w + ow, (c * h + y) * wd + x);
          }
        }
      }
    }
  }
}

template <typename T>
absl::StatusOr<Tensor> UnfoldForward(const LayerCall& call, const Tensor& x,
                                     DType) {
  if (x.dim() != 3 && x.dim() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Expected 3D or 4D (batch mode) tensor with possibly 0 batch size "
        "and other non-zero dimensions for input, but got: ",
        Sizes(x.shape())));
  }
  const bool batched = x.dim() == 4;
  const int64_t n = batched ? x.shape()[0] : 1;
  const int64_t c = x.shape()[x.dim() - 3], h = x.shape()[x.dim() - 2],
                wd = x.shape()[x.dim() - 1];
  MODELSTATE_ASSIGN_OR_RETURN(FoldWindow w, ReadFoldWindow(call.module, h, wd));
  if (w.blocks_h < 1 || w.blocks_w < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Given input with spatial size (", h, ", ", wd,
        "), kernel_size=", FoldPair(w.k), ", dilation=", FoldPair(w.d),
        ", padding=", FoldPair(w.p),
        ", calculated shape of the array of sliding blocks as (", w.blocks_h,
        ", ", w.blocks_w, "), but its components must be at least one."));
  }
  const int64_t rows = c * w.k[0] * w.k[1], blocks = w.blocks_h * w.blocks_w;
  Shape shape = {rows, blocks};
  if (batched) shape.insert(shape.begin(), n);
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(shape));
  std::fill(y.data, y.data + n * rows * blocks, T(0));
  const T* px = Data<T>(x);
  for (int64_t b = 0; b < n; ++b) {
    const T* src = px + b * c * h * wd;
    T* dst = y.data + b * rows * blocks;
    ForEachFoldTap(w, c, h, wd, [&](int64_t row, int64_t block, int64_t at) {
      dst[row * blocks + block] = src[at];
    });
  }
  return y.tensor;
}

template <typename T>
absl::StatusOr<Tensor> FoldForward(const LayerCall& call, const Tensor& x,
                                   DType) {
  if (x.dim() != 2 && x.dim() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Expected 2D or 3D (batch mode) tensor for input with possibly 0 "
        "batch size and non-zero dimensions for input, but got: ",
        Sizes(x.shape())));
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> out,
                              AttrInts(call.module, "output_size", 2));
  MODELSTATE_ASSIGN_OR_RETURN(FoldWindow w,
                              ReadFoldWindow(call.module, out[0], out[1]));
  const bool batched = x.dim() == 3;
  const int64_t n = batched ? x.shape()[0] : 1;
  const int64_t rows = x.shape()[x.dim() - 2], cols = x.shape()[x.dim() - 1];
  const int64_t kk = w.k[0] * w.k[1];
  if (rows % kk != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Expected size of input's dimension 1 to be divisible by the product "
        "of kernel_size, but got input.size(1)=",
        rows, " and kernel_size=", FoldPair(w.k), "."));
  }
  if (cols != w.blocks_h * w.blocks_w) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Given output_size=", FoldPair(out), ", kernel_size=", FoldPair(w.k),
        ", dilation=", FoldPair(w.d), ", padding=", FoldPair(w.p),
        ", stride=", FoldPair(w.s),
        ", expected size of input's dimension 2 to match the calculated "
        "number of sliding blocks ",
        w.blocks_h, " * ", w.blocks_w, " = ", w.blocks_h * w.blocks_w,
        ", but got input.size(2)=", cols, "."));
  }
  const int64_t c = rows / kk;
  Shape shape = {c, out[0], out[1]};
  if (batched) shape.insert(shape.begin(), n);
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(shape));
  const int64_t plane = c * out[0] * out[1];
  std::fill(y.data, y.data + n * plane, T(0));
  const T* px = Data<T>(x);
  for (int64_t b = 0; b < n; ++b) {
    const T* src = px + b * rows * cols;
    T* dst = y.data + b * plane;
    ForEachFoldTap(w, c, out[0], out[1],
                   [&](int64_t row, int64_t block, int64_t at) {
                     dst[at] += src[row * cols + block];
                   });
  }
  return y.tensor;
}

}  // namespace

std::vector<LayerDef> FoldFamily() {
  return {
      {.type = "Fold",
       .qualified_name = "torch.nn.modules.fold.Fold",
       .signature = {{"output_size", {}},
                     {"kernel_size", {}},
                     {"dilation", I(1)},
                     {"padding", I(0)},
                     {"stride", I(1)}},
       .build = &BuildFoldLayer<true>,
       .forward = &FloatForward<&FoldForward<float>, &FoldForward<double>>},
      {.type = "Unfold",
       .qualified_name = "torch.nn.modules.fold.Unfold",
       .signature = {{"kernel_size", {}},
                     {"dilation", I(1)},
                     {"padding", I(0)},
                     {"stride", I(1)}},
       .build = &BuildFoldLayer<false>,
       .forward = &FloatForward<&UnfoldForward<float>, &UnfoldForward<double>>},
  };
}

}  // namespace modelstate::internal
