// The dropout family: Dropout, Dropout1d/2d/3d (whole channels),
// AlphaDropout and FeatureAlphaDropout (alpha dropout of whole channels). In
// eval mode their inputs pass through untouched (Dropout1d still checks its
// input's rank, as F.dropout1d does); in training mode each element (each
// channel) is kept with probability 1 - p and scaled by 1 / (1 - p),
// AlphaDropout keeping mean and variance as F.alpha_dropout does. Masks come
// from ForwardOptions' generator: deterministic for a seed, but not the masks
// torch draws.
#include "nn/layers/dropout.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "core/generator.h"
#include "nn/layer_registry.h"
#include "nn/layers/build_util.h"
#include "nn/layers/forward_util.h"

namespace modelstate::internal {

std::shared_ptr<Module> NewDropout(double p, bool inplace) {
  std::shared_ptr<Module> m = NewStateless("Dropout", "dropout");
  m->SetPlainAttribute("p", p);
  m->SetPlainAttribute("inplace", inplace);
  return m;
}

namespace {

constexpr const char* kDropoutVariantNames[] = {
    "Dropout",   "Dropout1d",    "Dropout2d",
    "Dropout3d", "AlphaDropout", "FeatureAlphaDropout"};
enum DropoutVariant {
  kElementwise = 0,
  k1d,
  k2d,
  k3d,
  kAlphaElementwise,
  kFeatureAlpha
};

template <int kVariant>
absl::StatusOr<std::shared_ptr<Module>> BuildDropout(const BoundArgs& args,
                                                     BuildContext&,
                                                     const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(double p, args.Float("p"));
  MODELSTATE_ASSIGN_OR_RETURN(bool inplace, args.Bool("inplace"));
  if (p < 0 || p > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dropout probability has to be between 0 and 1, but got ", p));
  }
  if (kVariant == kElementwise) return NewDropout(p, inplace);
  std::shared_ptr<Module> m =
      NewStateless(kDropoutVariantNames[kVariant], "dropout");
  m->SetPlainAttribute("p", p);
  m->SetPlainAttribute("inplace", inplace);
  return m;
}

// Training mode: a copy of the input with DropoutInPlace applied.
template <typename T>
absl::StatusOr<Tensor> DropoutKernel(const LayerCall& call, const Tensor& x,
                                     DType) {
  MODELSTATE_ASSIGN_OR_RETURN(double p, AttrDouble(call.module, "p"));
  if (p == 0) return x;
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(x.shape()));
  std::copy(Data<T>(x), Data<T>(x) + x.numel(), y.data);
  DropoutInPlace(y.data, x.numel(), p, call.runner.gen());
  return y.tensor;
}

// F.dropout1d's check, made in eval mode too.
absl::Status CheckDropout1dRank(const Tensor& x) {
  if (x.dim() == 2 || x.dim() == 3) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "dropout1d: Expected 2D or 3D input, but received a ", x.dim(),
      "D input. Note that dropout1d exists to provide channel-wise dropout "
      "on inputs with 1 spatial dimension, a channel dimension, and an "
      "optional batch dimension (i.e. 2D or 3D inputs)."));
}

// Channel-wise dropout: one draw per channel, a channel being everything
// after the (batch, channel) dims; an unbatched Dropout1d/Dropout3d input
// has one leading dim only (torch unsqueezes it), Dropout2d's 3-D input
// counts as batched (N, C, L) as in torch 1.13.
template <typename T, int kVariant>
absl::StatusOr<Tensor> FeatureDropoutKernel(const LayerCall& call,
                                            const Tensor& x, DType) {
  MODELSTATE_ASSIGN_OR_RETURN(double p, AttrDouble(call.module, "p"));
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(x.shape()));
  std::copy(Data<T>(x), Data<T>(x) + x.numel(), y.data);
  if (p == 0 || x.numel() == 0) return y.tensor;
  const bool unbatched =
      (kVariant == k1d && x.dim() == 2) || (kVariant == k3d && x.dim() == 4);
  const size_t lead = unbatched || x.dim() < 2 ? 1 : 2;
  const int64_t channels = Prod(x.shape(), 0, std::min<size_t>(lead, x.dim()));
  const int64_t block = channels == 0 ? 0 : x.numel() / channels;
  std::vector<T> keep(channels, T(1));
  DropoutInPlace(keep.data(), channels, p, call.runner.gen());
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t i = 0; i < block; ++i) y.data[c * block + i] *= keep[c];
  }
  return y.tensor;
}

// F.alpha_dropout in training mode: a dropped element becomes -alpha' and
// the result is scaled and shifted so that a standard normal input keeps
// mean 0 and variance 1 (alpha' = SELU's scale * alpha).
// F.feature_alpha_dropout (kFeature) draws once per (batch, channel) pair
// of an input of at least 2 dims, as ATen's make_feature_noise does.
template <typename T, bool kFeature>
absl::StatusOr<Tensor> AlphaDropoutKernel(const LayerCall& call,
                                          const Tensor& x, DType) {
  MODELSTATE_ASSIGN_OR_RETURN(double p, AttrDouble(call.module, "p"));
  if (p == 0 || x.numel() == 0) return x;
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(x.shape()));
  const T* px = Data<T>(x);
  if (p == 1) {
    std::fill(y.data, y.data + x.numel(), T(0));
    return y.tensor;
  }
  if (kFeature && x.dim() < 2) {
    return absl::InvalidArgumentError(
        "Feature dropout requires at least 2 dimensions in the input");
  }
  constexpr double kAlpha = 1.7580993408473766;
  const double a = 1.0 / std::sqrt((kAlpha * kAlpha * p + 1) * (1 - p));
  const int64_t draws = kFeature ? Prod(x.shape(), 0, 2) : x.numel();
  const int64_t block = x.numel() / draws;
  std::vector<T> keep(draws, T(1));
  DropoutInPlace(keep.data(), draws, p, call.runner.gen());
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double noise = keep[i / block] != 0 ? 1.0 : 0.0;
    const double b = (noise - 1) * kAlpha * a + kAlpha * a * p;
    y.data[i] = static_cast<T>(px[i] * (noise * a) + b);
  }
  return y.tensor;
}

template <int kVariant>
absl::StatusOr<std::vector<Tensor>> DropoutForward(
    const LayerCall& call, const std::vector<Tensor>& in) {
  if (kVariant == k1d && !in.empty()) {
    MODELSTATE_RETURN_IF_ERROR(CheckDropout1dRank(in[0]));
  }
  // Eval mode: the inputs come back as given, unchecked.
  if (!call.module.is_training()) return in;
  if constexpr (kVariant == kElementwise) {
    return FloatForward<&DropoutKernel<float>, &DropoutKernel<double>>(call,
                                                                       in);
  } else if constexpr (kVariant == kAlphaElementwise ||
                       kVariant == kFeatureAlpha) {
    constexpr bool kFeature = kVariant == kFeatureAlpha;
    return FloatForward<&AlphaDropoutKernel<float, kFeature>,
                        &AlphaDropoutKernel<double, kFeature>>(call, in);
  } else {
    return FloatForward<&FeatureDropoutKernel<float, kVariant>,
                        &FeatureDropoutKernel<double, kVariant>>(call, in);
  }
}

template <int kVariant>
LayerDef DropoutDef(absl::string_view qualified_name) {
  return {.type = kDropoutVariantNames[kVariant],
          .qualified_name = qualified_name,
          .signature = {{"p", F(0.5)}, {"inplace", B(false)}},
          .build = &BuildDropout<kVariant>,
          .forward = &DropoutForward<kVariant>};
}

}  // namespace

template <typename T>
void DropoutInPlace(T* data, int64_t n, double p, Generator& gen) {
  if (p <= 0) return;
  if (p >= 1) {
    std::fill(data, data + n, T(0));
    return;
  }
  // Keep each element with probability 1 - p and scale by 1 / (1 - p).
  const T scale = static_cast<T>(1.0 / (1.0 - p));
  const double keep = 1.0 - p;
  for (int64_t i = 0; i < n; ++i) {
    double u = static_cast<double>(gen.Random()) * (1.0 / 4294967296.0);
    data[i] = u < keep ? data[i] * scale : T(0);
  }
}

template void DropoutInPlace<float>(float*, int64_t, double, Generator&);
template void DropoutInPlace<double>(double*, int64_t, double, Generator&);

std::vector<LayerDef> DropoutFamily() {
  return {
      DropoutDef<kElementwise>("torch.nn.modules.dropout.Dropout"),
      DropoutDef<k1d>("torch.nn.modules.dropout.Dropout1d"),
      DropoutDef<k2d>("torch.nn.modules.dropout.Dropout2d"),
      DropoutDef<k3d>("torch.nn.modules.dropout.Dropout3d"),
      DropoutDef<kAlphaElementwise>("torch.nn.modules.dropout.AlphaDropout"),
      DropoutDef<kFeatureAlpha>("torch.nn.modules.dropout.FeatureAlphaDropout"),
  };
}

}  // namespace modelstate::internal
