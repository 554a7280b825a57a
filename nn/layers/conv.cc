// The convolution family: Conv1d/2d/3d and ConvTranspose1d/2d/3d.
// Construction follows torch.nn.modules.conv's _ConvNd (arguments, checks,
// init); forward is im2col + gemm on OpenBLAS, every convolution as a 3-D
// one (conv2d with depth 1, conv1d also with height 1), and the transposed
// convolution gemm + col2im.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "core/init.h"
#include "nn/kernels/blas.h"
#include "nn/layer_registry.h"
#include "nn/layers/build_util.h"
#include "nn/layers/forward_util.h"
#include "nn/layers/padding.h"
#include "nn/layers/param_check.h"

namespace modelstate::internal {
namespace {

// ---------------------------------------------------------------------------
// Construction.

// _ConvNd's `padding` attribute (a string, 'same' or 'valid', or ints) and
// the transposed convolutions' output_padding.
struct ConvPadding {
  AttrValue padding;
  std::vector<int64_t> output_padding;
};

absl::StatusOr<ConvPadding> ParseConvPadding(
    const BoundArgs& args, size_t dims, bool transposed,
    const std::vector<int64_t>& stride) {
  ConvPadding p;
  p.output_padding.assign(dims, 0);
  if (transposed) {
    MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> padding,
                                args.IntsAtLeast("padding", dims, 0));
    p.padding = padding;
    MODELSTATE_ASSIGN_OR_RETURN(p.output_padding,
                                args.IntsAtLeast("output_padding", dims, 0));
    return p;
  }
  absl::StatusOr<std::string> padding_str = args.Str("padding");
  if (!padding_str.ok()) {
    MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> padding,
                                args.IntsAtLeast("padding", dims, 0));
    p.padding = padding;
    return p;
  }
  if (*padding_str != "same" && *padding_str != "valid") {
    return absl::InvalidArgumentError(
        absl::StrCat("Invalid padding string '", *padding_str,
                     "', should be one of {'valid', 'same'}"));
  }
  for (int64_t s : stride) {
    if (*padding_str == "same" && s != 1) {
      return absl::InvalidArgumentError(
          "padding='same' is not supported for strided convolutions");
    }
  }
  p.padding = *padding_str;
  return p;
}

// _ConvNd.__init__'s checks of groups and padding_mode.
absl::Status CheckConvConfig(int64_t in, int64_t out, int64_t groups,
                             const std::string& padding_mode, bool transposed,
                             absl::string_view type) {
  if (groups <= 0) {
    return absl::InvalidArgumentError("groups must be a positive integer");
  }
  if (in % groups != 0) {
    return absl::InvalidArgumentError(
        "in_channels must be divisible by groups");
  }
  if (out % groups != 0) {
    return absl::InvalidArgumentError(
        "out_channels must be divisible by groups");
  }
  static constexpr absl::string_view kModes[] = {"zeros", "reflect",
                                                 "replicate", "circular"};
  bool known_mode = false;
  for (absl::string_view mode : kModes) known_mode |= mode == padding_mode;
  if (!known_mode) {
    return absl::InvalidArgumentError(absl::StrCat(
        "padding_mode must be one of ['zeros', 'reflect', 'replicate', "
        "'circular'], but got padding_mode='",
        padding_mode, "'"));
  }
  if (transposed && padding_mode != "zeros") {
    return absl::InvalidArgumentError(
        absl::StrCat("Only \"zeros\" padding mode is supported for ", type));
  }
  return absl::OkStatus();
}

// _ConvNd for the convolutions and the transposed convolutions. torch
// 1.13 accepts a zero stride, dilation or kernel and a negative padding
// here and fails in forward; they are refused at build instead, where the
// spec that asked for them is at hand (forward checks them again).
absl::StatusOr<std::shared_ptr<Module>> BuildConv(
    const BoundArgs& args, BuildContext& ctx, const std::string& path,
    absl::string_view type, size_t dims, bool transposed) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t in, args.Int("in_channels"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t out, args.Int("out_channels"));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> kernel,
                              args.IntsAtLeast("kernel_size", dims, 1));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> stride,
                              args.IntsAtLeast("stride", dims, 1));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> dilation,
                              args.IntsAtLeast("dilation", dims, 1));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t groups, args.Int("groups"));
  MODELSTATE_ASSIGN_OR_RETURN(bool bias, args.Bool("bias"));
  MODELSTATE_ASSIGN_OR_RETURN(std::string padding_mode,
                              args.Str("padding_mode"));
  MODELSTATE_ASSIGN_OR_RETURN(FactoryKwargs factory,
                              args.Factory(ctx.options()));
  MODELSTATE_ASSIGN_OR_RETURN(ConvPadding padding,
                              ParseConvPadding(args, dims, transposed, stride));
  MODELSTATE_RETURN_IF_ERROR(
      CheckConvConfig(in, out, groups, padding_mode, transposed, type));
  Shape weight_shape =
      transposed ? Shape{in, out / groups} : Shape{out, in / groups};
  weight_shape.insert(weight_shape.end(), kernel.begin(), kernel.end());
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor w, ctx.NewTensor(factory.dtype, weight_shape, factory.device));
  Tensor b;
  if (bias) {
    MODELSTATE_ASSIGN_OR_RETURN(
        b, ctx.NewTensor(factory.dtype, {out}, factory.device));
  }
  // _ConvNd.reset_parameters.
  MODELSTATE_RETURN_IF_ERROR(KaimingUniform(w, std::sqrt(5.0), ctx.gen()));
  if (bias) {
    MODELSTATE_ASSIGN_OR_RETURN(auto fans, FanInAndFanOut(w));
    if (fans.first != 0) {
      double bound = 1.0 / std::sqrt(static_cast<double>(fans.first));
      MODELSTATE_RETURN_IF_ERROR(UniformInit(b, -bound, bound, ctx.gen()));
    } else {
      // PyTorch leaves this bias as torch.empty gave it; a server must not
      // hand out its heap, and the same request must give the same values.
      MODELSTATE_RETURN_IF_ERROR(ConstantInit(b, 0.0));
    }
  }
  std::shared_ptr<Module> m = NewLayer(type, "conv");
  m->SetPlainAttribute("in_channels", in);
  m->SetPlainAttribute("out_channels", out);
  m->SetPlainAttribute("kernel_size", kernel);
  m->SetPlainAttribute("stride", stride);
  m->SetPlainAttribute("padding", padding.padding);
  m->SetPlainAttribute("dilation", dilation);
  m->SetPlainAttribute("transposed", transposed);
  m->SetPlainAttribute("output_padding", padding.output_padding);
  m->SetPlainAttribute("groups", groups);
  m->SetPlainAttribute("padding_mode", padding_mode);
  m->AddClassAttributes({"reset_parameters", "__constants__"});
  MODELSTATE_RETURN_IF_ERROR(ctx.AddParameter(*m, path, "weight", w));
  MODELSTATE_RETURN_IF_ERROR(ctx.AddParameter(*m, path, "bias", b));
  return m;
}

// ---------------------------------------------------------------------------
// Forward.
//
// Every convolution runs in 3-D: a 2-D one is a 3-D one with depth 1, a
// 1-D one with depth and height 1. Extents below are (D, H, W).

// `v` (one value per spatial dim of a `dims`-d layer) as three values, the
// missing leading ones `fill`.
std::vector<int64_t> Lift3(std::vector<int64_t> v, int64_t fill) {
  v.insert(v.begin(), 3 - v.size(), fill);
  return v;
}

// The spatial extents as torch's messages print them: "(5 x 6)".
std::string Extents(const std::vector<int64_t>& v, size_t dims) {
  return absl::StrCat("(",
                      absl::StrJoin(v.end() - static_cast<std::ptrdiff_t>(dims),
                                    v.end(), " x "),
                      ")");
}

// Conv's padding of the input as [front, back, top, bottom, left, right]
// for kernel extents `ks` and dilations `dl` (D, H, W): the `padding`
// attribute's ints, or for 'same' what keeps the size (an odd total puts
// the extra one at the end), for 'valid' none.
absl::Status ConvPadding3d(const Module& m, size_t dims,
                           const std::vector<int64_t>& dl,
                           const std::vector<int64_t>& ks, int64_t pad[6]) {
  std::fill(pad, pad + 6, 0);
  const AttrValue* pv = m.attributes().Find("padding");
  if (pv != nullptr && std::holds_alternative<std::string>(*pv)) {
    if (std::get<std::string>(*pv) == "same") {
      for (int d = 0; d < 3; ++d) {
        const int64_t total = dl[d] * (ks[d] - 1);
        pad[2 * d] = total / 2;
        pad[2 * d + 1] = total - total / 2;
      }
    }
    return absl::OkStatus();
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> p,
                              AttrInts(m, "padding", dims));
  MODELSTATE_RETURN_IF_ERROR(CheckAttrAtLeast(
      m, "padding", p, 0, "negative padding is not supported"));
  p = Lift3(std::move(p), 0);
  for (int d = 0; d < 3; ++d) pad[2 * d] = pad[2 * d + 1] = p[d];
  return absl::OkStatus();
}

// The extents of a grouped 3-D convolution or transposed convolution.
struct ConvGeometry {
  int64_t n = 0, c = 0;   // batch, input channels
  int64_t o = 0, cg = 0;  // output channels, C / groups
  int64_t groups = 1;
  int64_t in[3] = {};              // input (D, H, W) (padded, for conv)
  int64_t k[3] = {};               // kernel
  int64_t st[3] = {}, dl[3] = {};  // stride, dilation
  int64_t out[3] = {};             // output (D, H, W)
  int64_t InPlane() const { return in[0] * in[1] * in[2]; }
  int64_t OutPlane() const { return out[0] * out[1] * out[2]; }
  int64_t Taps() const { return k[0] * k[1] * k[2]; }
};

// Copies the input taps of one kernel offset (a, i, j) of one channel
// plane `src` into `row` [out D * H * W].
template <typename T>
void GatherTap(const ConvGeometry& g, const T* src, int64_t a, int64_t i,
               int64_t j, T* row) {
  const int64_t hw = g.in[1] * g.in[2];
  src += a * g.dl[0] * hw + i * g.dl[1] * g.in[2] + j * g.dl[2];
  for (int64_t od = 0; od < g.out[0]; ++od) {
    for (int64_t oh = 0; oh < g.out[1]; ++oh) {
      const T* s = src + od * g.st[0] * hw + oh * g.st[1] * g.in[2];
      for (int64_t ow = 0; ow < g.out[2]; ++ow) *row++ = s[ow * g.st[2]];
    }
  }
}

// y = conv3d(x, w) + b by im2col + gemm, per batch element and group.
// REQUIRES: the gemm's extents checked with CheckBlasDims.
template <typename T>
void ConvKernel(const ConvGeometry& g, const T* px, const T* pw, const T* pb,
                T* y) {
  const int64_t og = g.o / g.groups, kk = g.cg * g.Taps(), pix = g.OutPlane();
  // A 1x1x1 kernel at stride 1 reads the input as its own column matrix.
  const bool direct =
      g.Taps() == 1 && g.st[0] == 1 && g.st[1] == 1 && g.st[2] == 1;
  std::vector<T> col(direct ? 0 : static_cast<size_t>(kk * pix));
  for (int64_t ni = 0; ni < g.n; ++ni) {
    for (int64_t gi = 0; gi < g.groups; ++gi) {
      const T* xg = px + (ni * g.c + gi * g.cg) * g.InPlane();
      const T* cols = xg;
      if (!direct) {
        T* row = col.data();
        for (int64_t ci = 0; ci < g.cg; ++ci) {
          for (int64_t a = 0; a < g.k[0]; ++a) {
            for (int64_t i = 0; i < g.k[1]; ++i) {
              for (int64_t j = 0; j < g.k[2]; ++j, row += pix) {
                GatherTap(g, xg + ci * g.InPlane(), a, i, j, row);
              }
            }
          }
        }
        cols = col.data();
      }
      T* yg = y + (ni * g.o + gi * og) * pix;
      if (pb != nullptr) {
        for (int64_t oc = 0; oc < og; ++oc) {
          std::fill(yg + oc * pix, yg + (oc + 1) * pix, pb[gi * og + oc]);
        }
      }
      if (kk > 0) {
        Gemm(false, false, og, pix, kk, T(1), pw + gi * og * kk, kk, cols, pix,
             pb ? T(1) : T(0), yg, pix);
      } else if (pb == nullptr) {
        std::fill(yg, yg + og * pix, T(0));
      }
    }
  }
}

// The input as [N, C, D, H, W] (a view of the same storage) for a layer
// of `dims` spatial dims, and whether it came unbatched; INVALID_ARGUMENT
// naming `op` for an input of the wrong rank.
absl::StatusOr<std::pair<Tensor, bool>> As5d(const Tensor& x, size_t dims,
                                             absl::string_view op) {
  const int64_t batched_dim = static_cast<int64_t>(dims) + 2;
  if (x.dim() != batched_dim && x.dim() != batched_dim - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Expected ", batched_dim - 1, "D (unbatched) or ",
                     batched_dim, "D (batched) input to ", op,
                     ", but got input of size: ", Sizes(x.shape())));
  }
  const bool unbatched = x.dim() == batched_dim - 1;
  Shape s5 = x.shape();
  if (unbatched) s5.insert(s5.begin(), 1);
  s5.insert(s5.begin() + 2, 3 - dims, 1);
  MODELSTATE_ASSIGN_OR_RETURN(Tensor x5,
                              Tensor::FromStorage(x.dtype(), s5, x.storage()));
  return std::make_pair(x5, unbatched);
}

// A [N, O, D, H, W] result as the layer returns it: the lifted dims and an
// added batch dim dropped again.
absl::StatusOr<Tensor> From5d(const Tensor& y, size_t dims, bool unbatched) {
  Shape shape = y.shape();
  shape.erase(shape.begin() + 2, shape.begin() + 2 + (3 - dims));
  if (unbatched) shape.erase(shape.begin());
  return Tensor::FromStorage(y.dtype(), shape, y.storage());
}

// The weight [O, C/g, k...] (transposed: [C, O/g, k...]) as 5-D extents.
Shape Weight5d(const Tensor& w, size_t dims) {
  Shape ws = w.shape();
  ws.insert(ws.begin() + 2, 3 - dims, 1);
  return ws;
}

// The size attributes the kernels divide by, checked as torch's conv checks
// them (a module restored with a zero stride must not reach a division by
// zero); then the weight and bias. As in F.conv*d, the weight's own shape
// rules, not the attributes (PyTorch lets a weight of another shape be
// assigned): [out, in / groups, k...] (transposed: [in, out / groups,
// k...]) of the layer's rank, its first extent divisible by groups, every
// kernel extent at least 1, and a bias of [out].
struct ConvParams {
  Tensor weight, bias;
  std::vector<int64_t> stride, dilation;
  int64_t groups;
};

absl::StatusOr<ConvParams> ReadConvParams(const Module& m, size_t dims,
                                          bool transposed, DType dtype) {
  ConvParams p;
  MODELSTATE_ASSIGN_OR_RETURN(p.groups, AttrInt(m, "groups"));
  MODELSTATE_ASSIGN_OR_RETURN(p.stride, AttrInts(m, "stride", dims));
  MODELSTATE_ASSIGN_OR_RETURN(p.dilation, AttrInts(m, "dilation", dims));
  MODELSTATE_RETURN_IF_ERROR(CheckAttrAtLeast(
      m, "groups", {p.groups}, 1, "groups must be a positive integer"));
  MODELSTATE_RETURN_IF_ERROR(CheckAttrAtLeast(
      m, "stride", p.stride, 1, "non-positive stride is not supported"));
  MODELSTATE_RETURN_IF_ERROR(CheckAttrAtLeast(
      m, "dilation", p.dilation, 1, "dilation should be greater than zero"));
  MODELSTATE_ASSIGN_OR_RETURN(
      const Tensor w, RankedEntry(m, "weight", static_cast<int64_t>(dims) + 2));
  if (w.shape()[0] < p.groups) {
    // A Conv with out_channels 0 (or ConvTranspose with in_channels 0)
    // builds, as in PyTorch, and fails here as ATen's forward does.
    return absl::FailedPreconditionError(absl::StrCat(
        "Given groups=", p.groups, ", expected weight to be at least ",
        p.groups, " at dimension 0, but got weight of size ", Sizes(w.shape()),
        " instead"));
  }
  if (w.shape()[0] % p.groups != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Given groups=", p.groups, ", expected weight to be divisible by ",
        p.groups, " at dimension 0, but got weight of size ", Sizes(w.shape()),
        " instead"));
  }
  for (size_t d = 2; d < w.shape().size(); ++d) {
    if (w.shape()[d] < 1) {
      return absl::FailedPreconditionError(
          absl::StrCat(m.type_name(), ".weight has shape ", Sizes(w.shape()),
                       ": kernel size should be greater than zero"));
    }
  }
  const int64_t out = transposed ? w.shape()[1] * p.groups : w.shape()[0];
  MODELSTATE_ASSIGN_OR_RETURN(
      p.weight,
      ShapedParam(m, "weight", dtype, w.shape(), Presence::kRequired));
  MODELSTATE_ASSIGN_OR_RETURN(
      p.bias, ShapedParam(m, "bias", dtype, {out}, Presence::kOptional));
  return p;
}

// Conv1d, Conv2d and Conv3d.
template <typename T, size_t kDims>
absl::StatusOr<Tensor> ConvForward(const LayerCall& call, const Tensor& x_in,
                                   DType dtype) {
  const Module& m = call.module;
  MODELSTATE_ASSIGN_OR_RETURN(ConvParams params,
                              ReadConvParams(m, kDims, false, dtype));
  const Tensor& w = params.weight;
  const Tensor& b = params.bias;
  const std::vector<int64_t>& stride = params.stride;
  const std::vector<int64_t>& dilation = params.dilation;
  const int64_t groups = params.groups;
  MODELSTATE_ASSIGN_OR_RETURN(std::string mode, AttrStr(m, "padding_mode"));
  MODELSTATE_ASSIGN_OR_RETURN(
      auto lifted, As5d(x_in, kDims, absl::StrCat("conv", kDims, "d")));
  const auto& [x5, unbatched] = lifted;
  const int64_t n = x5.shape()[0], c = x5.shape()[1];
  const Shape ws = Weight5d(w, kDims);
  const int64_t o = ws[0], cg = ws[1];
  if (c != cg * groups) {
    Shape shown = x_in.shape();
    if (unbatched) shown.insert(shown.begin(), 1);
    return absl::InvalidArgumentError(absl::StrCat(
        "Given groups=", groups, ", weight of size ", Sizes(w.shape()),
        ", expected input", Sizes(shown), " to have ", cg * groups,
        " channels, but got ", c, " channels instead"));
  }
  const std::vector<int64_t> st = Lift3(stride, 1), dl = Lift3(dilation, 1);
  const std::vector<int64_t> ks = {ws[2], ws[3], ws[4]};
  int64_t pad[6];
  MODELSTATE_RETURN_IF_ERROR(ConvPadding3d(m, kDims, dl, ks, pad));
  MODELSTATE_ASSIGN_OR_RETURN(PadMode pad_mode, ParsePadMode(mode));
  // F.pad's order: the last dim first.
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor xp,
      PadLastDims(x5, {pad[4], pad[5], pad[2], pad[3], pad[0], pad[1]},
                  pad_mode));
  ConvGeometry g{.n = n, .c = c, .o = o, .cg = cg, .groups = groups};
  std::vector<int64_t> padded(3), extent(3);
  bool too_small = false;
  for (int d = 0; d < 3; ++d) {
    g.in[d] = padded[d] = xp.shape()[2 + d];
    g.k[d] = ks[d];
    g.st[d] = st[d];
    g.dl[d] = dl[d];
    extent[d] = dl[d] * (ks[d] - 1) + 1;
    too_small |= padded[d] < extent[d];
    g.out[d] = (padded[d] - extent[d]) / st[d] + 1;
  }
  if (too_small) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Calculated padded input size per channel: ", Extents(padded, kDims),
        ". Kernel size: ", Extents(extent, kDims),
        ". Kernel size can't be greater than actual input size"));
  }
  const int64_t og = o / groups, kk = cg * g.Taps(), pix = g.OutPlane();
  MODELSTATE_RETURN_IF_ERROR(CheckBlasDims({og, kk, pix}));
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y,
                              NewOut<T>({n, o, g.out[0], g.out[1], g.out[2]}));
  ConvKernel(g, Data<T>(xp), Data<T>(w), Data<T>(b), y.data);
  return From5d(y.tensor, kDims, unbatched);
}

// The transposed convolution's scatter: adds each column of col
// [og * taps, D * H * W] (W_g^T * x_g for one group) to the output
// positions its kernel tap reaches, for one group's og output channels of
// y [og, OD, OH, OW]. `pad` is (D, H, W).
template <typename T>
void Col2Im(const ConvGeometry& g, const std::vector<int64_t>& pad,
            const T* col, T* y) {
  const int64_t og = g.o / g.groups, pix = g.InPlane();
  for (int64_t oc = 0; oc < og; ++oc) {
    T* dst = y + oc * g.OutPlane();
    for (int64_t t = 0; t < g.Taps(); ++t, col += pix) {
      const int64_t a = t / (g.k[1] * g.k[2]), i = t / g.k[2] % g.k[1],
                    j = t % g.k[2];
      for (int64_t di = 0; di < g.in[0]; ++di) {
        const int64_t yd = di * g.st[0] - pad[0] + a * g.dl[0];
        if (yd < 0 || yd >= g.out[0]) continue;
        for (int64_t hi = 0; hi < g.in[1]; ++hi) {
          const int64_t yi = hi * g.st[1] - pad[1] + i * g.dl[1];
          if (yi < 0 || yi >= g.out[1]) continue;
          const T* src = col + (di * g.in[1] + hi) * g.in[2];
          T* out = dst + (yd * g.out[1] + yi) * g.out[2];
          for (int64_t wi = 0; wi < g.in[2]; ++wi) {
            const int64_t yj = wi * g.st[2] - pad[2] + j * g.dl[2];
            if (yj < 0 || yj >= g.out[2]) continue;
            out[yj] += src[wi];
          }
        }
      }
    }
  }
}

// ConvTranspose1d, ConvTranspose2d and ConvTranspose3d.
template <typename T, size_t kDims>
absl::StatusOr<Tensor> ConvTransposeForward(const LayerCall& call,
                                            const Tensor& x_in, DType dtype) {
  const Module& m = call.module;
  MODELSTATE_ASSIGN_OR_RETURN(ConvParams params,
                              ReadConvParams(m, kDims, true, dtype));
  const Tensor& w = params.weight;
  const Tensor& b = params.bias;
  const int64_t groups = params.groups;
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> padding,
                              AttrInts(m, "padding", kDims));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> output_padding,
                              AttrInts(m, "output_padding", kDims));
  MODELSTATE_RETURN_IF_ERROR(CheckAttrAtLeast(
      m, "padding", padding, 0, "negative padding is not supported"));
  MODELSTATE_RETURN_IF_ERROR(
      CheckAttrAtLeast(m, "output_padding", output_padding, 0,
                       "negative output_padding is not supported"));
  const std::vector<int64_t> st = Lift3(params.stride, 1),
                             dl = Lift3(params.dilation, 1),
                             pd = Lift3(std::move(padding), 0),
                             op = Lift3(std::move(output_padding), 0);
  MODELSTATE_ASSIGN_OR_RETURN(
      auto lifted,
      As5d(x_in, kDims, absl::StrCat("conv_transpose", kDims, "d")));
  const auto& [x5, unbatched] = lifted;
  const Shape ws = Weight5d(w, kDims);
  const int64_t n = x5.shape()[0], c = x5.shape()[1];
  const int64_t cg = ws[0] / groups, og = ws[1], o = og * groups;
  if (c != ws[0]) {
    Shape shown = x_in.shape();
    if (unbatched) shown.insert(shown.begin(), 1);
    return absl::InvalidArgumentError(
        absl::StrCat("Given transposed=1, weight of size ", Sizes(w.shape()),
                     ", expected input", Sizes(shown), " to have ", ws[0],
                     " channels, but got ", c, " channels instead"));
  }
  ConvGeometry g{.n = n, .c = c, .o = o, .cg = cg, .groups = groups};
  std::vector<int64_t> in(3), out(3);
  bool too_small = false;
  for (int d = 0; d < 3; ++d) {
    if (op[d] >= st[d] && op[d] >= dl[d]) {
      return absl::InvalidArgumentError(
          "output padding must be smaller than either stride or dilation");
    }
    g.in[d] = in[d] = x5.shape()[2 + d];
    g.k[d] = ws[2 + d];
    g.st[d] = st[d];
    g.dl[d] = dl[d];
    g.out[d] = out[d] =
        (in[d] - 1) * st[d] - 2 * pd[d] + dl[d] * (ws[2 + d] - 1) + op[d] + 1;
    too_small |= out[d] <= 0;
  }
  if (too_small) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Given input size per channel: ", Extents(in, kDims),
        ". Calculated output size per channel: ", Extents(out, kDims),
        ". Output size is too small"));
  }
  const int64_t kk = og * g.Taps(), pix = g.InPlane(), opix = g.OutPlane();
  MODELSTATE_RETURN_IF_ERROR(CheckBlasDims({kk, pix, cg}));
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y,
                              NewOut<T>({n, o, out[0], out[1], out[2]}));
  std::fill(y.data, y.data + n * o * opix, T(0));
  std::vector<T> col(static_cast<size_t>(kk * pix));
  const T* px = Data<T>(x5);
  const T* pw = Data<T>(w);
  const T* pb = Data<T>(b);
  for (int64_t ni = 0; ni < n; ++ni) {
    for (int64_t gi = 0; gi < groups; ++gi) {
      // col[og * taps, D * H * W] = W_g^T * x_g.
      if (cg > 0) {
        Gemm(true, false, kk, pix, cg, T(1), pw + gi * cg * kk, kk,
             px + (ni * c + gi * cg) * pix, pix, T(0), col.data(), pix);
      } else {
        std::fill(col.begin(), col.end(), T(0));
      }
      Col2Im(g, pd, col.data(), y.data + (ni * o + gi * og) * opix);
    }
  }
  if (pb != nullptr) {
    for (int64_t ni = 0; ni < n; ++ni) {
      for (int64_t oc = 0; oc < o; ++oc) {
        T* dst = y.data + (ni * o + oc) * opix;
        for (int64_t i = 0; i < opix; ++i) dst[i] += pb[oc];
      }
    }
  }
  return From5d(y.tensor, kDims, unbatched);
}

template <size_t kDims>
LayerForwardFn ConvFn() {
  return &FloatForward<&ConvForward<float, kDims>, &ConvForward<double, kDims>>;
}

template <size_t kDims>
LayerForwardFn ConvTransposeFn() {
  return &FloatForward<&ConvTransposeForward<float, kDims>,
                       &ConvTransposeForward<double, kDims>>;
}

template <size_t kDims, bool kTransposed>
absl::StatusOr<std::shared_ptr<Module>> BuildConvNd(const BoundArgs& args,
                                                    BuildContext& ctx,
                                                    const std::string& path) {
  const std::string type =
      absl::StrCat(kTransposed ? "ConvTranspose" : "Conv", kDims, "d");
  return BuildConv(args, ctx, path, type, kDims, kTransposed);
}

}  // namespace

std::vector<LayerDef> ConvFamily() {
  std::vector<ArgDef> conv = WithFactory({{"in_channels", {}},
                                          {"out_channels", {}},
                                          {"kernel_size", {}},
                                          {"stride", I(1)},
                                          {"padding", I(0)},
                                          {"dilation", I(1)},
                                          {"groups", I(1)},
                                          {"bias", B(true)},
                                          {"padding_mode", S("zeros")}});
  std::vector<ArgDef> transposed = WithFactory({{"in_channels", {}},
                                                {"out_channels", {}},
                                                {"kernel_size", {}},
                                                {"stride", I(1)},
                                                {"padding", I(0)},
                                                {"output_padding", I(0)},
                                                {"groups", I(1)},
                                                {"bias", B(true)},
                                                {"dilation", I(1)},
                                                {"padding_mode", S("zeros")}});
  return {
      {.type = "Conv1d",
       .qualified_name = "torch.nn.modules.conv.Conv1d",
       .signature = conv,
       .build = &BuildConvNd<1, false>,
       .forward = ConvFn<1>()},
      {.type = "Conv2d",
       .qualified_name = "torch.nn.modules.conv.Conv2d",
       .signature = conv,
       .build = &BuildConvNd<2, false>,
       .forward = ConvFn<2>()},
      {.type = "Conv3d",
       .qualified_name = "torch.nn.modules.conv.Conv3d",
       .signature = conv,
       .build = &BuildConvNd<3, false>,
       .forward = ConvFn<3>()},
      {.type = "ConvTranspose1d",
       .qualified_name = "torch.nn.modules.conv.ConvTranspose1d",
       .signature = transposed,
       .build = &BuildConvNd<1, true>,
       .forward = ConvTransposeFn<1>()},
      {.type = "ConvTranspose2d",
       .qualified_name = "torch.nn.modules.conv.ConvTranspose2d",
       .signature = transposed,
       .build = &BuildConvNd<2, true>,
       .forward = ConvTransposeFn<2>()},
      {.type = "ConvTranspose3d",
       .qualified_name = "torch.nn.modules.conv.ConvTranspose3d",
       .signature = transposed,
       .build = &BuildConvNd<3, true>,
       .forward = ConvTransposeFn<3>()},
  };
}

}  // namespace modelstate::internal
