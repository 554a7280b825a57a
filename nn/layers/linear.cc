// The Linear family: Identity, Linear, Bilinear and
// NonDynamicallyQuantizableLinear (MultiheadAttention's out_proj; specs
// cannot build it, but it runs Linear's forward). Construction follows
// torch.nn.modules.linear, forward F.linear and F.bilinear on OpenBLAS.
#include "nn/layers/linear.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "core/init.h"
#include "nn/kernels/blas.h"
#include "nn/layer_registry.h"
#include "nn/layers/build_util.h"
#include "nn/layers/forward_util.h"
#include "nn/layers/param_check.h"

namespace modelstate::internal {

absl::StatusOr<LinearTensors> MakeLinearTensors(int64_t in, int64_t out,
                                                bool bias, DType dtype,
                                                Device device,
                                                BuildContext& ctx) {
  LinearTensors t;
  MODELSTATE_ASSIGN_OR_RETURN(t.weight,
                              ctx.NewTensor(dtype, {out, in}, device));
  MODELSTATE_RETURN_IF_ERROR(
      KaimingUniform(t.weight, std::sqrt(5.0), ctx.gen()));
  if (bias) {
    MODELSTATE_ASSIGN_OR_RETURN(t.bias, ctx.NewTensor(dtype, {out}, device));
    double bound = in > 0 ? 1.0 / std::sqrt(static_cast<double>(in)) : 0.0;
    MODELSTATE_RETURN_IF_ERROR(UniformInit(t.bias, -bound, bound, ctx.gen()));
  }
  return t;
}

absl::Status RegisterLinear(Module& m, const std::string& path, LinearTensors t,
                            BuildContext& ctx) {
  MODELSTATE_RETURN_IF_ERROR(ctx.AddParameter(m, path, "weight", t.weight));
  return ctx.AddParameter(m, path, "bias", t.bias);
}

std::shared_ptr<Module> NewLinearModule(absl::string_view type, int64_t in,
                                        int64_t out) {
  std::shared_ptr<Module> m = NewLayer(type, "linear");
  m->SetPlainAttribute("in_features", in);
  m->SetPlainAttribute("out_features", out);
  m->AddClassAttributes({"reset_parameters", "__constants__"});
  return m;
}

absl::StatusOr<std::shared_ptr<Module>> MakeLinear(int64_t in, int64_t out,
                                                   bool bias, DType dtype,
                                                   Device device,
                                                   BuildContext& ctx,
                                                   const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(
      LinearTensors t, MakeLinearTensors(in, out, bias, dtype, device, ctx));
  std::shared_ptr<Module> m = NewLinearModule("Linear", in, out);
  MODELSTATE_RETURN_IF_ERROR(RegisterLinear(*m, path, std::move(t), ctx));
  return m;
}

namespace {

// ---------------------------------------------------------------------------
// Construction.

absl::StatusOr<std::shared_ptr<Module>> BuildIdentity(const BoundArgs&,
                                                      BuildContext&,
                                                      const std::string&) {
  return NewLayer("Identity", "linear");
}

absl::StatusOr<std::shared_ptr<Module>> BuildLinear(const BoundArgs& args,
                                                    BuildContext& ctx,
                                                    const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t in, args.Int("in_features"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t out, args.Int("out_features"));
  MODELSTATE_ASSIGN_OR_RETURN(bool bias, args.Bool("bias"));
  MODELSTATE_ASSIGN_OR_RETURN(FactoryKwargs factory,
                              args.Factory(ctx.options()));
  return MakeLinear(in, out, bias, factory.dtype, factory.device, ctx, path);
}

absl::StatusOr<std::shared_ptr<Module>> BuildBilinear(const BoundArgs& args,
                                                      BuildContext& ctx,
                                                      const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t in1, args.Int("in1_features"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t in2, args.Int("in2_features"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t out, args.Int("out_features"));
  MODELSTATE_ASSIGN_OR_RETURN(bool bias, args.Bool("bias"));
  MODELSTATE_ASSIGN_OR_RETURN(FactoryKwargs factory,
                              args.Factory(ctx.options()));
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor w, ctx.NewTensor(factory.dtype, {out, in1, in2}, factory.device));
  Tensor b;
  if (bias) {
    MODELSTATE_ASSIGN_OR_RETURN(
        b, ctx.NewTensor(factory.dtype, {out}, factory.device));
  }
  // Bilinear.reset_parameters: bound = 1 / sqrt(weight.size(1)), which
  // torch 1.13 computes in Python, so in1_features 0 fails the constructor.
  if (in1 == 0) {
    return absl::InvalidArgumentError(
        "Bilinear: argument 'in1_features' must not be 0 (reset_parameters "
        "computes 1 / math.sqrt(in1_features): ZeroDivisionError: float "
        "division by zero)");
  }
  double bound = 1.0 / std::sqrt(static_cast<double>(in1));
  MODELSTATE_RETURN_IF_ERROR(UniformInit(w, -bound, bound, ctx.gen()));
  if (bias)
    MODELSTATE_RETURN_IF_ERROR(UniformInit(b, -bound, bound, ctx.gen()));
  std::shared_ptr<Module> m = NewLayer("Bilinear", "linear");
  m->SetPlainAttribute("in1_features", in1);
  m->SetPlainAttribute("in2_features", in2);
  m->SetPlainAttribute("out_features", out);
  m->AddClassAttributes({"reset_parameters", "__constants__"});
  MODELSTATE_RETURN_IF_ERROR(ctx.AddParameter(*m, path, "weight", w));
  MODELSTATE_RETURN_IF_ERROR(ctx.AddParameter(*m, path, "bias", b));
  return m;
}

// ---------------------------------------------------------------------------
// Forward.

absl::StatusOr<std::vector<Tensor>> IdentityForward(
    const LayerCall&, const std::vector<Tensor>& in) {
  return in;
}

template <typename T>
absl::StatusOr<Tensor> LinearForward(const LayerCall& call, const Tensor& x,
                                     DType dtype) {
  const Module& m = call.module;
  // As F.linear: the weight's own [out, in] rules.
  MODELSTATE_ASSIGN_OR_RETURN(const Tensor weight, RankedEntry(m, "weight", 2));
  const int64_t out = weight.shape()[0], in = weight.shape()[1];
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor w,
      ShapedParam(m, "weight", dtype, {out, in}, Presence::kRequired));
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor b, ShapedParam(m, "bias", dtype, {out}, Presence::kOptional));
  if (x.dim() == 0) {
    return absl::InvalidArgumentError(
        "both arguments to linear need to have at least 1 dimension, but got "
        "0D and 2D");
  }
  const int64_t k = x.shape().back();
  const int64_t rows = k == 0 ? Prod(x.shape(), 0, x.dim() - 1) : x.numel() / k;
  if (k != in) {
    return absl::InvalidArgumentError(
        absl::StrCat("mat1 and mat2 shapes cannot be multiplied (", rows, "x",
                     k, " and ", in, "x", out, ")"));
  }
  MODELSTATE_RETURN_IF_ERROR(CheckBlasDims({rows, in, out}));
  Shape shape = x.shape();
  shape.back() = out;
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(shape));
  LinearRows(Data<T>(x), rows, in, Data<T>(w), out, Data<T>(b), y.data);
  return y.tensor;
}

template <typename T>
absl::StatusOr<Tensor> BilinearForward(const LayerCall& call,
                                       const std::vector<Tensor>& inputs,
                                       DType dtype) {
  const Module& m = call.module;
  const Tensor& x1 = inputs[0];
  const Tensor& x2 = inputs[1];
  // As F.bilinear: the weight's own [out, in1, in2] rules.
  MODELSTATE_ASSIGN_OR_RETURN(const Tensor weight, RankedEntry(m, "weight", 3));
  const int64_t out = weight.shape()[0], in1 = weight.shape()[1],
                in2 = weight.shape()[2];
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor w,
      ShapedParam(m, "weight", dtype, {out, in1, in2}, Presence::kRequired));
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor b, ShapedParam(m, "bias", dtype, {out}, Presence::kOptional));
  if (x1.dim() != x2.dim()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bilinear(): input dimensions do not match: got ",
                     x1.dim(), " and ", x2.dim()));
  }
  if (x1.dim() == 0) {
    return absl::InvalidArgumentError(
        "Dimension specified as -1 but tensor has no dimensions");
  }
  for (int64_t d = 0; d + 1 < x1.dim(); ++d) {
    if (x1.shape()[d] != x2.shape()[d]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bilinear(): input batch dimensions do not match at dim ", d,
          ": got ", x1.shape()[d], " and ", x2.shape()[d]));
    }
  }
  if (x1.shape().back() != in1) {
    return absl::InvalidArgumentError(
        absl::StrCat("bilinear(): input1 size does not match weight size: got ",
                     x1.shape().back(), " but expected ", in1));
  }
  if (x2.shape().back() != in2) {
    return absl::InvalidArgumentError(
        absl::StrCat("bilinear(): input2 size does not match weight size: got ",
                     x2.shape().back(), " but expected ", in2));
  }
  const int64_t rows = Prod(x1.shape(), 0, x1.dim() - 1);
  MODELSTATE_RETURN_IF_ERROR(CheckBlasDims({rows, in1, in2, out}));
  Shape shape = x1.shape();
  shape.back() = out;
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(shape));
  // y[r, o] = sum_ij x1[r, i] W[o, i, j] x2[r, j]: per output feature, one
  // gemm (x1 * W[o]) and a row-wise dot with x2.
  std::vector<T> tmp(static_cast<size_t>(rows * in2));
  const T* p1 = Data<T>(x1);
  const T* p2 = Data<T>(x2);
  const T* pw = Data<T>(w);
  const T* pb = Data<T>(b);
  for (int64_t o = 0; o < out; ++o) {
    if (in1 > 0) {
      Gemm(false, false, rows, in2, in1, T(1), p1, in1, pw + o * in1 * in2, in2,
           T(0), tmp.data(), in2);
    } else {
      std::fill(tmp.begin(), tmp.end(), T(0));
    }
    for (int64_t r = 0; r < rows; ++r) {
      T acc = 0;
      for (int64_t j = 0; j < in2; ++j)
        acc += tmp[r * in2 + j] * p2[r * in2 + j];
      y.data[r * out + o] = acc + (pb ? pb[o] : T(0));
    }
  }
  return y.tensor;
}

}  // namespace

std::vector<LayerDef> LinearFamily() {
  return {
      {.type = "Identity",
       .qualified_name = "torch.nn.modules.linear.Identity",
       .build = &BuildIdentity,
       .forward = &IdentityForward,
       .accepts_anything = true},
      {.type = "Linear",
       .qualified_name = "torch.nn.modules.linear.Linear",
       .signature = WithFactory(
           {{"in_features", {}}, {"out_features", {}}, {"bias", B(true)}}),
       .build = &BuildLinear,
       .forward = &FloatForward<&LinearForward<float>, &LinearForward<double>>},
      {.type = "Bilinear",
       .qualified_name = "torch.nn.modules.linear.Bilinear",
       .signature = WithFactory({{"in1_features", {}},
                                 {"in2_features", {}},
                                 {"out_features", {}},
                                 {"bias", B(true)}}),
       .build = &BuildBilinear,
       .forward = &FloatForward<&BilinearForward<float>,
                                &BilinearForward<double>, FloatInputs{2, 2}>},
      {.type = "NonDynamicallyQuantizableLinear",
       .qualified_name =
           "torch.nn.modules.linear.NonDynamicallyQuantizableLinear",
       .forward = &FloatForward<&LinearForward<float>, &LinearForward<double>>},
  };
}

}  // namespace modelstate::internal
