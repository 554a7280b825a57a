// The convolution family: Conv1d, Conv2d and ConvTranspose2d. Construction
// follows torch.nn.modules.conv's _ConvNd (arguments, checks, init);
// forward is im2col + gemm on OpenBLAS (conv1d runs as conv2d with H = 1),
// and the transposed convolution gemm + col2im.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "core/init.h"
#include "nn/kernels/blas.h"
#include "nn/layer_registry.h"
#include "nn/layers/build_util.h"
#include "nn/layers/forward_util.h"

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
                                args.Ints("padding", dims));
    p.padding = padding;
    MODELSTATE_ASSIGN_OR_RETURN(p.output_padding,
                                args.Ints("output_padding", dims));
    return p;
  }
  absl::StatusOr<std::string> padding_str = args.Str("padding");
  if (!padding_str.ok()) {
    MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> padding,
                                args.Ints("padding", dims));
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

// _ConvNd for Conv1d, Conv2d and ConvTranspose2d.
absl::StatusOr<std::shared_ptr<Module>> BuildConv(
    const BoundArgs& args, BuildContext& ctx, const std::string& path,
    absl::string_view type, size_t dims, bool transposed) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t in, args.Int("in_channels"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t out, args.Int("out_channels"));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> kernel,
                              args.Ints("kernel_size", dims));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> stride,
                              args.Ints("stride", dims));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> dilation,
                              args.Ints("dilation", dims));
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

absl::StatusOr<std::shared_ptr<Module>> BuildConv1d(const BoundArgs& args,
                                                    BuildContext& ctx,
                                                    const std::string& path) {
  return BuildConv(args, ctx, path, "Conv1d", 1, false);
}
absl::StatusOr<std::shared_ptr<Module>> BuildConv2d(const BoundArgs& args,
                                                    BuildContext& ctx,
                                                    const std::string& path) {
  return BuildConv(args, ctx, path, "Conv2d", 2, false);
}
absl::StatusOr<std::shared_ptr<Module>> BuildConvTranspose2d(
    const BoundArgs& args, BuildContext& ctx, const std::string& path) {
  return BuildConv(args, ctx, path, "ConvTranspose2d", 2, true);
}

// ---------------------------------------------------------------------------
// Forward.

// Input padded on each side of each spatial dim ([top, bottom, left, right])
// with `mode`: "zeros", "reflect", "replicate" or "circular".
template <typename T>
absl::StatusOr<Tensor> Pad2d(const Tensor& x, const int64_t pad[4],
                             const std::string& mode) {
  const int64_t n = x.shape()[0], c = x.shape()[1], h = x.shape()[2],
                w = x.shape()[3];
  if (pad[0] == 0 && pad[1] == 0 && pad[2] == 0 && pad[3] == 0) return x;
  const int64_t ho = h + pad[0] + pad[1], wo = w + pad[2] + pad[3];
  if (mode == "reflect") {
    if (pad[0] >= h || pad[1] >= h || pad[2] >= w || pad[3] >= w) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Padding size should be less than the corresponding input "
          "dimension, but got: padding (",
          pad[2], ", ", pad[3], ") at dimension 3 of input ",
          Sizes(x.shape())));
    }
  } else if (mode == "circular") {
    if (pad[0] > h || pad[1] > h || pad[2] > w || pad[3] > w) {
      return absl::InvalidArgumentError(
          "Padding value causes wrapping around more than once.");
    }
  } else if (mode == "replicate" && (h == 0 || w == 0)) {
    return absl::InvalidArgumentError(
        "padding mode 'replicate' needs a non-empty input");
  }
  auto index = [&mode](int64_t i, int64_t size) -> int64_t {
    if (i >= 0 && i < size) return i;
    if (mode == "reflect") return i < 0 ? -i : 2 * (size - 1) - i;
    if (mode == "replicate") return i < 0 ? 0 : size - 1;
    if (mode == "circular") return ((i % size) + size) % size;
    return -1;  // zeros
  };
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>({n, c, ho, wo}));
  const T* px = Data<T>(x);
  for (int64_t p = 0; p < n * c; ++p) {
    const T* src = px + p * h * w;
    T* dst = y.data + p * ho * wo;
    for (int64_t i = 0; i < ho; ++i) {
      int64_t si = index(i - pad[0], h);
      for (int64_t j = 0; j < wo; ++j) {
        int64_t sj = index(j - pad[2], w);
        dst[i * wo + j] = (si < 0 || sj < 0) ? T(0) : src[si * w + sj];
      }
    }
  }
  return y.tensor;
}

// Conv's padding of the [N, C, H, W] input as [top, bottom, left, right]
// for kernel extents `ks` and dilations `dl` (H first): the `padding`
// attribute's ints, or for 'same' what keeps the size (an odd total puts
// the extra one at the end), for 'valid' none.
absl::Status ConvPadding2d(const Module& m, size_t dims,
                           const std::vector<int64_t>& dl, const int64_t ks[2],
                           int64_t pad[4]) {
  std::fill(pad, pad + 4, 0);
  const AttrValue* pv = m.attributes().Find("padding");
  if (pv != nullptr && std::holds_alternative<std::string>(*pv)) {
    if (std::get<std::string>(*pv) == "same") {
      for (int d = 0; d < 2; ++d) {
        int64_t total = dl[d] * (ks[d] - 1);
        pad[2 * d] = total / 2;
        pad[2 * d + 1] = total - total / 2;
      }
    }
    return absl::OkStatus();
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> p,
                              AttrInts(m, "padding", dims));
  if (dims == 1) p.insert(p.begin(), 0);
  pad[0] = pad[1] = p[0];
  pad[2] = pad[3] = p[1];
  return absl::OkStatus();
}

// The extents of a grouped 2-D convolution or transposed convolution.
struct ConvGeometry {
  int64_t n, c, h, w;     // input [N, C, H, W] (padded, for conv2d)
  int64_t o, cg, kh, kw;  // O output channels, C / groups per group, kernel
  int64_t groups;
  int64_t sh, sw, dh, dw;  // stride, dilation
  int64_t ho, wo;          // output [N, O, HO, WO]
};

// y = conv2d(x, w) + b by im2col + gemm, per batch element and group.
// REQUIRES: the gemm's extents checked with CheckBlasDims.
template <typename T>
void Conv2dKernel(const ConvGeometry& g, const T* px, const T* pw, const T* pb,
                  T* y) {
  const int64_t og = g.o / g.groups, kk = g.cg * g.kh * g.kw, pix = g.ho * g.wo;
  // A 1x1 kernel at stride 1 reads the input as its own column matrix.
  const bool direct = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1;
  std::vector<T> col(direct ? 0 : static_cast<size_t>(kk * pix));
  for (int64_t ni = 0; ni < g.n; ++ni) {
    for (int64_t gi = 0; gi < g.groups; ++gi) {
      const T* xg = px + (ni * g.c + gi * g.cg) * g.h * g.w;
      const T* cols = xg;
      if (!direct) {
        for (int64_t ci = 0; ci < g.cg; ++ci) {
          for (int64_t i = 0; i < g.kh; ++i) {
            for (int64_t j = 0; j < g.kw; ++j) {
              T* row = col.data() + ((ci * g.kh + i) * g.kw + j) * pix;
              const T* src = xg + ci * g.h * g.w + i * g.dh * g.w + j * g.dw;
              for (int64_t oi = 0; oi < g.ho; ++oi) {
                const T* s = src + oi * g.sh * g.w;
                T* d = row + oi * g.wo;
                for (int64_t oj = 0; oj < g.wo; ++oj) d[oj] = s[oj * g.sw];
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

// Conv1d and Conv2d.
template <typename T, size_t kDims>
absl::StatusOr<Tensor> ConvForward(const LayerCall& call, const Tensor& x_in,
                                   DType dtype) {
  const Module& m = call.module;
  MODELSTATE_ASSIGN_OR_RETURN(Tensor w, Param(m, "weight", dtype));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor b, Param(m, "bias", dtype));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> stride,
                              AttrInts(m, "stride", kDims));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> dilation,
                              AttrInts(m, "dilation", kDims));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t groups, AttrInt(m, "groups"));
  MODELSTATE_ASSIGN_OR_RETURN(std::string mode, AttrStr(m, "padding_mode"));
  const std::string op = kDims == 1 ? "conv1d" : "conv2d";
  const int64_t batched_dim = static_cast<int64_t>(kDims) + 2;
  if (x_in.dim() != batched_dim && x_in.dim() != batched_dim - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Expected ", batched_dim - 1, "D (unbatched) or ",
                     batched_dim, "D (batched) input to ", op,
                     ", but got input of size: ", Sizes(x_in.shape())));
  }
  const bool unbatched = x_in.dim() == batched_dim - 1;
  // Work on [N, C, H, W]; conv1d is conv2d with H = 1.
  Shape s4 = x_in.shape();
  if (unbatched) s4.insert(s4.begin(), 1);
  if (kDims == 1) s4.insert(s4.begin() + 2, 1);
  const int64_t n = s4[0], c = s4[1];
  Shape ws = w.shape();
  if (kDims == 1) ws.insert(ws.begin() + 2, 1);
  const int64_t o = ws[0], cg = ws[1], kh = ws[2], kw = ws[3];
  if (c != cg * groups) {
    Shape shown = x_in.shape();
    if (unbatched) shown.insert(shown.begin(), 1);
    return absl::InvalidArgumentError(absl::StrCat(
        "Given groups=", groups, ", weight of size ", Sizes(w.shape()),
        ", expected input", Sizes(shown), " to have ", cg * groups,
        " channels, but got ", c, " channels instead"));
  }
  std::vector<int64_t> st = stride, dl = dilation;
  if (kDims == 1) {
    st.insert(st.begin(), 1);
    dl.insert(dl.begin(), 1);
  }
  int64_t pad[4];
  const int64_t ks[2] = {kh, kw};
  MODELSTATE_RETURN_IF_ERROR(ConvPadding2d(m, kDims, dl, ks, pad));
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor x4, Tensor::FromStorage(x_in.dtype(), s4, x_in.storage()));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor xp, Pad2d<T>(x4, pad, mode));
  const int64_t h = xp.shape()[2], wd = xp.shape()[3];
  const int64_t ho = (h - dl[0] * (kh - 1) - 1) / st[0] + 1;
  const int64_t wo = (wd - dl[1] * (kw - 1) - 1) / st[1] + 1;
  if (h < dl[0] * (kh - 1) + 1 || wd < dl[1] * (kw - 1) + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Calculated padded input size per channel: (",
        kDims == 1 ? absl::StrCat(wd) : absl::StrCat(h, " x ", wd),
        "). Kernel size: (",
        kDims == 1
            ? absl::StrCat(dl[1] * (kw - 1) + 1)
            : absl::StrCat(dl[0] * (kh - 1) + 1, " x ", dl[1] * (kw - 1) + 1),
        "). Kernel size can't be greater than actual input size"));
  }
  const int64_t og = o / groups, kk = cg * kh * kw, pix = ho * wo;
  MODELSTATE_RETURN_IF_ERROR(CheckBlasDims({og, kk, pix}));
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>({n, o, ho, wo}));
  const ConvGeometry g{n,      c,     h,     wd,    o,     cg, kh, kw,
                       groups, st[0], st[1], dl[0], dl[1], ho, wo};
  Conv2dKernel(g, Data<T>(xp), Data<T>(w), Data<T>(b), y.data);
  Shape out_shape = {n, o, ho, wo};
  if (kDims == 1) out_shape.erase(out_shape.begin() + 2);
  if (unbatched) out_shape.erase(out_shape.begin());
  return Tensor::FromStorage(y.tensor.dtype(), out_shape, y.tensor.storage());
}

// The transposed convolution's scatter: adds each column of col
// [og * kh * kw, h * w] (W_g^T * x_g for one group) to the output plane
// positions its kernel tap reaches, for one group's og output channels of
// y [og, ho, wo]. `pad` is [top, left]; g.h, g.w the input's extents.
template <typename T>
void Col2Im(const ConvGeometry& g, const std::vector<int64_t>& pad,
            const T* col, T* y) {
  const int64_t og = g.o / g.groups, pix = g.h * g.w;
  for (int64_t oc = 0; oc < og; ++oc) {
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        const T* row = col + ((oc * g.kh + i) * g.kw + j) * pix;
        T* dst = y + oc * g.ho * g.wo;
        for (int64_t hi = 0; hi < g.h; ++hi) {
          int64_t yi = hi * g.sh - pad[0] + i * g.dh;
          if (yi < 0 || yi >= g.ho) continue;
          for (int64_t wi = 0; wi < g.w; ++wi) {
            int64_t yj = wi * g.sw - pad[1] + j * g.dw;
            if (yj < 0 || yj >= g.wo) continue;
            dst[yi * g.wo + yj] += row[hi * g.w + wi];
          }
        }
      }
    }
  }
}

template <typename T>
absl::StatusOr<Tensor> ConvTranspose2dForward(const LayerCall& call,
                                              const Tensor& x_in, DType dtype) {
  const Module& m = call.module;
  MODELSTATE_ASSIGN_OR_RETURN(Tensor w, Param(m, "weight", dtype));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor b, Param(m, "bias", dtype));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> st,
                              AttrInts(m, "stride", 2));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> dl,
                              AttrInts(m, "dilation", 2));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> pd,
                              AttrInts(m, "padding", 2));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> op,
                              AttrInts(m, "output_padding", 2));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t groups, AttrInt(m, "groups"));
  if (x_in.dim() != 4 && x_in.dim() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Expected 3D (unbatched) or 4D (batched) input to conv_transpose2d, "
        "but got input of size: ",
        Sizes(x_in.shape())));
  }
  const bool unbatched = x_in.dim() == 3;
  Shape s4 = x_in.shape();
  if (unbatched) s4.insert(s4.begin(), 1);
  const int64_t n = s4[0], c = s4[1], h = s4[2], wd = s4[3];
  const int64_t cg = w.shape()[0] / groups, og = w.shape()[1],
                kh = w.shape()[2], kw = w.shape()[3], o = og * groups;
  if (c != w.shape()[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat("Given transposed=1, weight of size ", Sizes(w.shape()),
                     ", expected input", Sizes(s4), " to have ", w.shape()[0],
                     " channels, but got ", c, " channels instead"));
  }
  for (int d = 0; d < 2; ++d) {
    if (op[d] >= st[d] && op[d] >= dl[d]) {
      return absl::InvalidArgumentError(
          "output padding must be smaller than either stride or dilation");
    }
  }
  const int64_t ho = (h - 1) * st[0] - 2 * pd[0] + dl[0] * (kh - 1) + op[0] + 1;
  const int64_t wo =
      (wd - 1) * st[1] - 2 * pd[1] + dl[1] * (kw - 1) + op[1] + 1;
  if (ho <= 0 || wo <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Given input size per channel: (", h, " x ", wd,
                     "). Calculated output size per channel: (", ho, " x ", wo,
                     "). Output size is too small"));
  }
  const int64_t kk = og * kh * kw, pix = h * wd;
  MODELSTATE_RETURN_IF_ERROR(CheckBlasDims({kk, pix, cg}));
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>({n, o, ho, wo}));
  std::fill(y.data, y.data + n * o * ho * wo, T(0));
  std::vector<T> col(static_cast<size_t>(kk * pix));
  const T* px = Data<T>(x_in);
  const T* pw = Data<T>(w);
  const T* pb = Data<T>(b);
  const ConvGeometry geometry{n,      c,     h,     wd,    o,     cg, kh, kw,
                              groups, st[0], st[1], dl[0], dl[1], ho, wo};
  for (int64_t ni = 0; ni < n; ++ni) {
    for (int64_t g = 0; g < groups; ++g) {
      // col[og*kh*kw, h*w] = W_g^T * x_g.
      if (cg > 0) {
        Gemm(true, false, kk, pix, cg, T(1), pw + g * cg * kk, kk,
             px + (ni * c + g * cg) * pix, pix, T(0), col.data(), pix);
      } else {
        std::fill(col.begin(), col.end(), T(0));
      }
      Col2Im(geometry, pd, col.data(), y.data + (ni * o + g * og) * ho * wo);
    }
  }
  if (pb != nullptr) {
    for (int64_t ni = 0; ni < n; ++ni) {
      for (int64_t oc = 0; oc < o; ++oc) {
        T* dst = y.data + (ni * o + oc) * ho * wo;
        for (int64_t i = 0; i < ho * wo; ++i) dst[i] += pb[oc];
      }
    }
  }
  Shape out_shape = {n, o, ho, wo};
  if (unbatched) out_shape.erase(out_shape.begin());
  return Tensor::FromStorage(y.tensor.dtype(), out_shape, y.tensor.storage());
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
  return {
      {.type = "Conv1d",
       .qualified_name = "torch.nn.modules.conv.Conv1d",
       .signature = conv,
       .build = &BuildConv1d,
       .forward =
           &FloatForward<&ConvForward<float, 1>, &ConvForward<double, 1>>},
      {.type = "Conv2d",
       .qualified_name = "torch.nn.modules.conv.Conv2d",
       .signature = conv,
       .build = &BuildConv2d,
       .forward =
           &FloatForward<&ConvForward<float, 2>, &ConvForward<double, 2>>},
      {.type = "ConvTranspose2d",
       .qualified_name = "torch.nn.modules.conv.ConvTranspose2d",
       .signature = WithFactory({{"in_channels", {}},
                                 {"out_channels", {}},
                                 {"kernel_size", {}},
                                 {"stride", I(1)},
                                 {"padding", I(0)},
                                 {"output_padding", I(0)},
                                 {"groups", I(1)},
                                 {"bias", B(true)},
                                 {"dilation", I(1)},
                                 {"padding_mode", S("zeros")}}),
       .build = &BuildConvTranspose2d,
       .forward = &FloatForward<&ConvTranspose2dForward<float>,
                                &ConvTranspose2dForward<double>>},
  };
}

}  // namespace modelstate::internal
