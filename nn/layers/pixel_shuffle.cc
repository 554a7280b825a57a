// The pixel-shuffle family: PixelShuffle and PixelUnshuffle
// (torch.nn.modules.pixelshuffle). Modules without state keeping their
// factor; forward rearranges (*, C*r*r, H, W) <-> (*, C, H*r, W*r) as
// F.pixel_shuffle / F.pixel_unshuffle do.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "nn/layer_registry.h"
#include "nn/layers/build_util.h"
#include "nn/layers/forward_util.h"

namespace modelstate::internal {
namespace {

template <bool kUnshuffle>
absl::StatusOr<std::shared_ptr<Module>> BuildPixelShuffle(const BoundArgs& args,
                                                          BuildContext&,
                                                          const std::string&) {
  const char* arg = kUnshuffle ? "downscale_factor" : "upscale_factor";
  MODELSTATE_ASSIGN_OR_RETURN(int64_t factor, args.Int(arg));
  std::shared_ptr<Module> m = NewStateless(
      kUnshuffle ? "PixelUnshuffle" : "PixelShuffle", "pixelshuffle");
  m->SetPlainAttribute(arg, factor);
  return m;
}

// ATen's checks of pixel_shuffle / pixel_unshuffle, with its texts.
absl::Status CheckPixelShuffleInput(const Tensor& x, int64_t r,
                                    bool unshuffle) {
  const char* op = unshuffle ? "pixel_unshuffle" : "pixel_shuffle";
  if (x.dim() < 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        op,
        " expects input to have at least 3 dimensions, but got input "
        "with ",
        x.dim(), " dimension(s)"));
  }
  if (r <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op,
        unshuffle ? " expects a positive downscale_factor, but got "
                  : " expects a positive upscale_factor, but got ",
        r));
  }
  const int64_t c = x.shape()[x.dim() - 3], h = x.shape()[x.dim() - 2],
                w = x.shape()[x.dim() - 1];
  if (!unshuffle && c % (r * r) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pixel_shuffle expects its input's 'channel' dimension to be "
        "divisible by the square of upscale_factor, but input.size(-3)=",
        c, " is not divisible by ", r * r));
  }
  if (unshuffle && h % r != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pixel_unshuffle expects height to be divisible by downscale_factor, "
        "but input.size(-2)=",
        h, " is not divisible by ", r));
  }
  if (unshuffle && w % r != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pixel_unshuffle expects width to be divisible by downscale_factor, "
        "but input.size(-1)=",
        w, " is not divisible by ", r));
  }
  return absl::OkStatus();
}

// Shuffle: y[b, c, h*r + i, w*r + j] = x[b, c*r*r + i*r + j, h, w];
// unshuffle is its inverse. Both walk the small side's (C, H, W) with
// (i, j) and copy between the two layouts.
template <typename T, bool kUnshuffle>
absl::StatusOr<Tensor> PixelShuffleForward(const LayerCall& call,
                                           const Tensor& x, DType) {
  MODELSTATE_ASSIGN_OR_RETURN(
      int64_t r,
      AttrInt(call.module, kUnshuffle ? "downscale_factor" : "upscale_factor"));
  MODELSTATE_RETURN_IF_ERROR(CheckPixelShuffleInput(x, r, kUnshuffle));
  const size_t nd = x.dim();
  Shape shape = x.shape();
  const int64_t c_in = shape[nd - 3], h_in = shape[nd - 2],
                w_in = shape[nd - 1];
  // The small (channel-expanded) side's (C, H, W).
  const int64_t c = kUnshuffle ? c_in : c_in / (r * r);
  const int64_t h = kUnshuffle ? h_in / r : h_in;
  const int64_t w = kUnshuffle ? w_in / r : w_in;
  shape[nd - 3] = kUnshuffle ? c * r * r : c;
  shape[nd - 2] = kUnshuffle ? h : h * r;
  shape[nd - 1] = kUnshuffle ? w : w * r;
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(shape));
  const int64_t batch = Prod(x.shape(), 0, nd - 3);
  const int64_t plane = c * r * r * h * w;
  const T* px = Data<T>(x);
  for (int64_t b = 0; b < batch; ++b) {
    const T* src = px + b * plane;
    T* dst = y.data + b * plane;
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t i = 0; i < r; ++i) {
        for (int64_t j = 0; j < r; ++j) {
          for (int64_t hh = 0; hh < h; ++hh) {
            for (int64_t ww = 0; ww < w; ++ww) {
              const int64_t packed = (((ch * r + i) * r + j) * h + hh) * w + ww;
              const int64_t spread =
                  (ch * h * r + hh * r + i) * w * r + ww * r + j;
              if (kUnshuffle) {
                dst[packed] = src[spread];
              } else {
                dst[spread] = src[packed];
              }
            }
          }
        }
      }
    }
  }
  return y.tensor;
}

}  // namespace

std::vector<LayerDef> PixelShuffleFamily() {
  return {
      {.type = "PixelShuffle",
       .qualified_name = "torch.nn.modules.pixelshuffle.PixelShuffle",
       .signature = {{"upscale_factor", {}}},
       .build = &BuildPixelShuffle<false>,
       .forward = &FloatForward<&PixelShuffleForward<float, false>,
                                &PixelShuffleForward<double, false>>},
      {.type = "PixelUnshuffle",
       .qualified_name = "torch.nn.modules.pixelshuffle.PixelUnshuffle",
       .signature = {{"downscale_factor", {}}},
       .build = &BuildPixelShuffle<true>,
       .forward = &FloatForward<&PixelShuffleForward<float, true>,
                                &PixelShuffleForward<double, true>>},
  };
}

}  // namespace modelstate::internal
