// The pixel-shuffle family: PixelShuffle and PixelUnshuffle
// (torch.nn.modules.pixelshuffle). Modules without state keeping their
// factor; forward rearranges (*, C*r*r, H, W) <-> (*, C, H*r, W*r) as
// F.pixel_shuffle / F.pixel_unshuffle do. ChannelShuffle
// (torch.nn.modules.channelshuffle) keeps its `groups` and reorders the
// channels (dim 1) of a (N, g*k, *) input from (g, k) to (k, g) order.
#include <algorithm>
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

absl::StatusOr<std::shared_ptr<Module>> BuildChannelShuffle(
    const BoundArgs& args, BuildContext&, const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t groups, args.Int("groups"));
  std::shared_ptr<Module> m = NewStateless("ChannelShuffle", "channelshuffle");
  m->SetPlainAttribute("groups", groups);
  return m;
}

// F.channel_shuffle, with ATen's checks: output channel j * g + i is input
// channel i * k + j (k = C / g), for every batch row and position.
template <typename T>
absl::StatusOr<Tensor> ChannelShuffleForward(const LayerCall& call,
                                             const Tensor& x, DType) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t g, AttrInt(call.module, "groups"));
  if (x.dim() <= 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("channel_shuffle expects input with > 2 dims, but got "
                     "input with sizes ",
                     Sizes(x.shape())));
  }
  if (g <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Number of groups to divide channels in must be positive. Value of "
        "groups:",
        g));
  }
  const int64_t channels = x.shape()[1];
  if (channels % g != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Number of channels must be divisible by groups. Got ",
                     channels, " channels and ", g, " groups."));
  }
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(x.shape()));
  const int64_t k = channels / g;
  const int64_t inner = Prod(x.shape(), 2, x.dim());
  const T* px = Data<T>(x);
  for (int64_t n = 0; n < x.shape()[0]; ++n) {
    const T* src = px + n * channels * inner;
    T* dst = y.data + n * channels * inner;
    for (int64_t i = 0; i < g; ++i) {
      for (int64_t j = 0; j < k; ++j) {
        std::copy(src + (i * k + j) * inner, src + (i * k + j + 1) * inner,
                  dst + (j * g + i) * inner);
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
      {.type = "ChannelShuffle",
       .qualified_name = "torch.nn.modules.channelshuffle.ChannelShuffle",
       .signature = {{"groups", {}}},
       .build = &BuildChannelShuffle,
       .forward = &FloatForward<&ChannelShuffleForward<float>,
                                &ChannelShuffleForward<double>>},
  };
}

}  // namespace modelstate::internal
