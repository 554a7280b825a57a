// The activation family: ReLU, GELU, SiLU, Tanh, Sigmoid, Softmax,
// LogSoftmax, LeakyReLU, ELU, Hardswish, Hardsigmoid, Mish, Softplus,
// PReLU, ReLU6, Hardtanh, SELU, CELU, GLU, LogSigmoid, Softmin, Softsign,
// Softshrink, Hardshrink, Tanhshrink, Threshold and Softmax2d
// (torch.nn.modules.activation). All but PReLU are without state;
// PReLU holds a learnable slope `weight` ([num_parameters], filled with
// `init`). Forward runs the element-wise kernels of
// nn/kernels/elementwise.h, and here the ones with arguments (a slope, an
// alpha, a beta), in the compute type with ATen's formulas.
#include "nn/layers/activation.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "core/init.h"
#include "nn/layer_registry.h"
#include "nn/layers/build_util.h"
#include "nn/layers/forward_util.h"
#include "nn/layers/param_check.h"

namespace modelstate::internal {
namespace {

// ---------------------------------------------------------------------------
// Construction.

template <const char* kType>
absl::StatusOr<std::shared_ptr<Module>> BuildInplaceActivation(
    const BoundArgs& args, BuildContext&, const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(bool inplace, args.Bool("inplace"));
  std::shared_ptr<Module> m = NewStateless(kType, "activation");
  m->SetPlainAttribute("inplace", inplace);
  return m;
}

template <const char* kType>
absl::StatusOr<std::shared_ptr<Module>> BuildPlainActivation(
    const BoundArgs&, BuildContext&, const std::string&) {
  return NewStateless(kType, "activation");
}

constexpr char kReLU[] = "ReLU";
constexpr char kSiLU[] = "SiLU";
constexpr char kTanh[] = "Tanh";
constexpr char kSigmoid[] = "Sigmoid";
constexpr char kHardswish[] = "Hardswish";
constexpr char kHardsigmoid[] = "Hardsigmoid";
constexpr char kMish[] = "Mish";
constexpr char kSELU[] = "SELU";
constexpr char kLogSigmoid[] = "LogSigmoid";
constexpr char kSoftsign[] = "Softsign";
constexpr char kTanhshrink[] = "Tanhshrink";
constexpr char kSoftmax2d[] = "Softmax2d";

// Activations with float arguments kept as given (LeakyReLU's
// negative_slope, ELU's alpha, Softplus's beta and threshold, ...), then
// `inplace` where the class takes it (kInplace), in torch's order.
template <const char* kType, bool kInplace, const char*... kArgs>
absl::StatusOr<std::shared_ptr<Module>> BuildFloatArgActivation(
    const BoundArgs& args, BuildContext&, const std::string&) {
  std::shared_ptr<Module> m = NewStateless(kType, "activation");
  for (const char* name : {kArgs...}) {
    MODELSTATE_ASSIGN_OR_RETURN(double value, args.Float(name));
    m->SetPlainAttribute(name, value);
  }
  if constexpr (kInplace) {
    MODELSTATE_ASSIGN_OR_RETURN(bool inplace, args.Bool("inplace"));
    m->SetPlainAttribute("inplace", inplace);
  }
  return m;
}

constexpr char kLeakyReLU[] = "LeakyReLU";
constexpr char kNegativeSlope[] = "negative_slope";
constexpr char kELU[] = "ELU";
constexpr char kCELU[] = "CELU";
constexpr char kAlpha[] = "alpha";
constexpr char kSoftplus[] = "Softplus";
constexpr char kBeta[] = "beta";
constexpr char kThresholdArg[] = "threshold";
constexpr char kThreshold[] = "Threshold";
constexpr char kValue[] = "value";
constexpr char kSoftshrink[] = "Softshrink";
constexpr char kHardshrink[] = "Hardshrink";
constexpr char kLambd[] = "lambd";

// Hardtanh(min_val, max_val, inplace, min_value, max_value): the last two
// are deprecated spellings that win when given; torch asserts max_val >
// min_val. ReLU6(inplace) is Hardtanh(0., 6., inplace) under its own name.
template <bool kReLU6>
absl::StatusOr<std::shared_ptr<Module>> BuildHardtanh(const BoundArgs& args,
                                                      BuildContext&,
                                                      const std::string&) {
  double min_val = 0, max_val = 6;
  if constexpr (!kReLU6) {
    const char* min_name = args.IsNone("min_value") ? "min_val" : "min_value";
    const char* max_name = args.IsNone("max_value") ? "max_val" : "max_value";
    MODELSTATE_ASSIGN_OR_RETURN(min_val, args.Float(min_name));
    MODELSTATE_ASSIGN_OR_RETURN(max_val, args.Float(max_name));
    if (!(max_val > min_val)) {
      return absl::InvalidArgumentError(
          absl::StrCat("AssertionError: Hardtanh's max_val (", max_val,
                       ") must be greater than its min_val (", min_val, ")"));
    }
  }
  MODELSTATE_ASSIGN_OR_RETURN(bool inplace, args.Bool("inplace"));
  std::shared_ptr<Module> m =
      NewStateless(kReLU6 ? "ReLU6" : "Hardtanh", "activation");
  m->SetPlainAttribute("min_val", min_val);
  m->SetPlainAttribute("max_val", max_val);
  m->SetPlainAttribute("inplace", inplace);
  return m;
}

// PReLU.__init__: weight = Parameter(torch.empty(num_parameters)) filled
// with `init`.
absl::StatusOr<std::shared_ptr<Module>> BuildPReLU(const BoundArgs& args,
                                                   BuildContext& ctx,
                                                   const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t n, args.Int("num_parameters"));
  MODELSTATE_ASSIGN_OR_RETURN(double init, args.Float("init"));
  MODELSTATE_ASSIGN_OR_RETURN(FactoryKwargs f, args.Factory(ctx.options()));
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Trying to create tensor with negative dimension ", n, ": [", n, "]"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(Tensor w, ctx.NewTensor(f.dtype, {n}, f.device));
  MODELSTATE_RETURN_IF_ERROR(ConstantInit(w, init));
  // torch 1.13 keeps num_parameters only (2.x also keeps `init`).
  std::shared_ptr<Module> m = NewLayer("PReLU", "activation");
  m->AddClassAttributes({"__constants__"});
  m->SetPlainAttribute("num_parameters", n);
  MODELSTATE_RETURN_IF_ERROR(ctx.AddParameter(*m, path, "weight", w));
  return m;
}

absl::StatusOr<std::shared_ptr<Module>> BuildGELU(const BoundArgs& args,
                                                  BuildContext&,
                                                  const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(std::string approximate, args.Str("approximate"));
  if (approximate != "none" && approximate != "tanh") {
    return absl::InvalidArgumentError(
        absl::StrCat("approximate argument must be either none or tanh, got '",
                     approximate, "'"));
  }
  std::shared_ptr<Module> m = NewStateless("GELU", "activation");
  m->SetPlainAttribute("approximate", approximate);
  return m;
}

// Softmax(dim), LogSoftmax(dim), Softmin(dim) and GLU(dim): `dim` kept
// as given, None included.
template <const char* kType>
absl::StatusOr<std::shared_ptr<Module>> BuildDimActivation(
    const BoundArgs& args, BuildContext&, const std::string&) {
  AttrValue dim;
  if (!args.IsNone("dim")) {
    MODELSTATE_ASSIGN_OR_RETURN(int64_t d, args.Int("dim"));
    dim = d;
  }
  std::shared_ptr<Module> m = NewStateless(kType, "activation");
  m->SetPlainAttribute("dim", dim);
  return m;
}

// ---------------------------------------------------------------------------
// Forward.

template <typename T>
absl::StatusOr<Tensor> ActKernel(Act act, const Tensor& x, int threads) {
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(x.shape()));
  if (x.numel() > 0) std::memcpy(y.data, x.raw_data(), x.nbytes());
  ActInPlace(act, y.data, x.numel(), threads);
  return y.tensor;
}

template <typename T, Act kAct>
absl::StatusOr<Tensor> ActivationForward(const LayerCall& call, const Tensor& x,
                                         DType) {
  return ActKernel<T>(kAct, x, call.runner.threads());
}

template <typename T>
absl::StatusOr<Tensor> GeluForward(const LayerCall& call, const Tensor& x,
                                   DType) {
  MODELSTATE_ASSIGN_OR_RETURN(std::string approximate,
                              AttrStr(call.module, "approximate"));
  Act act = approximate == "tanh" ? Act::kGELUTanh : Act::kGELU;
  return ActKernel<T>(act, x, call.runner.threads());
}

constexpr char kSoftmax[] = "Softmax";
constexpr char kLogSoftmax[] = "LogSoftmax";
constexpr char kSoftmin[] = "Softmin";
constexpr char kGLU[] = "GLU";

// The element-wise activations ATen computes here (most with arguments).
enum class ArgAct {
  kLeakyReLU,
  kELU,
  kHardswish,
  kHardsigmoid,
  kMish,
  kSoftplus,
  kHardtanh,  // ReLU6 too
  kSELU,
  kCELU,
  kLogSigmoid,
  kSoftsign,
  kSoftshrink,
  kHardshrink,
  kTanhshrink,
  kThreshold
};

// The attributes holding `act`'s arguments a and b (nullptr: none).
std::pair<const char*, const char*> ArgActAttrs(ArgAct act) {
  switch (act) {
    case ArgAct::kLeakyReLU:
      return {"negative_slope", nullptr};
    case ArgAct::kELU:
    case ArgAct::kCELU:
      return {"alpha", nullptr};
    case ArgAct::kSoftplus:
      return {"beta", "threshold"};
    case ArgAct::kHardtanh:
      return {"min_val", "max_val"};
    case ArgAct::kSoftshrink:
    case ArgAct::kHardshrink:
      return {"lambd", nullptr};
    case ArgAct::kThreshold:
      return {"threshold", "value"};
    default:
      return {nullptr, nullptr};
  }
}

// The module's arguments of `act` as (a, b), checked as ATen checks them
// when the forward runs.
absl::StatusOr<std::pair<double, double>> ArgActParams(const Module& m,
                                                       ArgAct act) {
  const auto [a_name, b_name] = ArgActAttrs(act);
  double a = 0, b = 0;
  if (a_name != nullptr) {
    MODELSTATE_ASSIGN_OR_RETURN(a, AttrDouble(m, a_name));
  }
  if (b_name != nullptr) {
    MODELSTATE_ASSIGN_OR_RETURN(b, AttrDouble(m, b_name));
  }
  if (act == ArgAct::kCELU && a == 0) {
    return absl::InvalidArgumentError(
        "ZeroDivisionError: alpha cannot be 0 for CELU");
  }
  if (act == ArgAct::kSoftshrink && a < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lambda must be greater or equal to 0, but found to be ", a, "."));
  }
  return std::make_pair(a, b);
}

// SELU's constants (Klambauer et al.), as ATen has them.
constexpr double kSeluAlpha = 1.6732632423543772848170429916717;
constexpr double kSeluScale = 1.0507009873554804934193349852946;

// act(v) with arguments a and b, by ATen's formulas.
template <typename T>
T ApplyArgAct(ArgAct act, T v, T a, T b) {
  switch (act) {
    case ArgAct::kLeakyReLU:
      return v > T(0) ? v : v * a;
    case ArgAct::kELU:
      return v <= T(0) ? std::expm1(v) * a : v;
    case ArgAct::kHardswish:
      return v * std::min(std::max(v + T(3), T(0)), T(6)) / T(6);
    case ArgAct::kHardsigmoid:
      return std::min(std::max(v + T(3), T(0)), T(6)) / T(6);
    case ArgAct::kMish:
      return v * std::tanh(std::log1p(std::exp(v)));
    case ArgAct::kSoftplus:
      return v * a > b ? v : std::log1p(std::exp(v * a)) / a;
    case ArgAct::kHardtanh:
      return v < a ? a : (v > b ? b : v);
    case ArgAct::kSELU:
      return v <= T(0) ? std::expm1(v) * T(kSeluAlpha * kSeluScale)
                       : v * T(kSeluScale);
    case ArgAct::kCELU:
      return v <= T(0) ? std::expm1(v * (T(1) / a)) * a : v;
    case ArgAct::kLogSigmoid:
      return std::min(v, T(0)) - std::log1p(std::exp(-std::abs(v)));
    case ArgAct::kSoftsign:
      return v / (std::abs(v) + T(1));
    case ArgAct::kSoftshrink:
      return v > a ? v - a : (v < -a ? v + a : T(0));
    case ArgAct::kHardshrink:
      return v >= -a && v <= a ? T(0) : v;
    case ArgAct::kTanhshrink:
      return v - std::tanh(v);
    case ArgAct::kThreshold:
      return v <= a ? b : v;
  }
  return v;
}

template <typename T>
absl::StatusOr<Tensor> ArgActForward(const LayerCall& call, const Tensor& x,
                                     ArgAct act) {
  MODELSTATE_ASSIGN_OR_RETURN(auto params, ArgActParams(call.module, act));
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(x.shape()));
  const T* px = Data<T>(x);
  const T a = static_cast<T>(params.first), b = static_cast<T>(params.second);
  for (int64_t i = 0; i < x.numel(); ++i) {
    y.data[i] = ApplyArgAct<T>(act, px[i], a, b);
  }
  return y.tensor;
}

template <typename T, ArgAct kAct>
absl::StatusOr<Tensor> ArgActivationForward(const LayerCall& call,
                                            const Tensor& x, DType) {
  return ArgActForward<T>(call, x, kAct);
}

// PReLU: x for x > 0, else weight * x; one weight, or one per channel (dim
// 1, or the only one of a 1-D input).
template <typename T>
absl::StatusOr<Tensor> PReLUForward(const LayerCall& call, const Tensor& x,
                                    DType dtype) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t n,
                              AttrInt(call.module, "num_parameters"));
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor w,
      ShapedParam(call.module, "weight", dtype, {n}, Presence::kRequired));
  if (x.dim() == 0 && w.numel() != 1) {
    // ATen takes a scalar with a single weight only.
    return absl::InvalidArgumentError("Not allow zero-dim input tensor.");
  }
  const int64_t channels = x.dim() > 1 ? x.shape()[1] : 1;
  const int64_t inner = Prod(x.shape(), 2, x.shape().size());
  if (w.numel() != 1 && w.numel() != channels) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Mismatch of parameter numbers and input channel size. Found "
        "parameter numbers = ",
        w.numel(), " and channel size = ", channels, "."));
  }
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(x.shape()));
  const T* px = Data<T>(x);
  const T* pw = Data<T>(w);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const T slope = w.numel() == 1 ? pw[0] : pw[(i / inner) % channels];
    y.data[i] = px[i] > T(0) ? px[i] : slope * px[i];
  }
  return y.tensor;
}

// The softmax family: F.softmax, F.log_softmax, F.softmin (the softmax of
// -x) over the module's `dim`, and Softmax2d (softmax over dim -3 of a 3-D
// or 4-D input).
enum class SoftmaxKind { kSoftmax, kLog, kMin, k2d };

template <SoftmaxKind kKind>
absl::StatusOr<int64_t> SoftmaxDim(const Module& m, const Tensor& x) {
  if constexpr (kKind == SoftmaxKind::k2d) {
    if (x.dim() != 3 && x.dim() != 4) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AssertionError: Softmax2d requires a 3D or 4D tensor as input "
          "(got ",
          x.dim(), "D)"));
    }
    return x.dim() - 3;
  }
  int64_t dim;
  if (AttrIsNone(m, "dim")) {
    // PyTorch's _get_softmax_dim (legacy implicit dim).
    int64_t nd = x.dim();
    dim = (nd == 0 || nd == 1 || nd == 3) ? 0 : 1;
  } else {
    MODELSTATE_ASSIGN_OR_RETURN(dim, AttrInt(m, "dim"));
  }
  return WrapDim(dim, x.dim());
}

template <typename T, SoftmaxKind kKind>
absl::StatusOr<Tensor> SoftmaxForward(const LayerCall& call, const Tensor& x,
                                      DType) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t dim, SoftmaxDim<kKind>(call.module, x));
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(x.shape()));
  if (x.numel() == 0) return y.tensor;
  std::memcpy(y.data, x.raw_data(), x.nbytes());
  if constexpr (kKind == SoftmaxKind::kMin) {
    for (int64_t i = 0; i < x.numel(); ++i) y.data[i] = -y.data[i];
  }
  const int64_t size = x.dim() == 0 ? 1 : x.shape()[dim];
  const int64_t inner = Prod(x.shape(), dim + 1, x.shape().size());
  if constexpr (kKind == SoftmaxKind::kLog) {
    LogSoftmaxInPlace(y.data, x.numel() / (size * inner), size, inner);
  } else {
    SoftmaxInPlace(y.data, x.numel() / (size * inner), size, inner,
                   call.runner.threads());
  }
  return y.tensor;
}

template <SoftmaxKind kKind>
LayerForwardFn SoftmaxFn() {
  return &FloatForward<&SoftmaxForward<float, kKind>,
                       &SoftmaxForward<double, kKind>>;
}

// F.glu: the first half of `dim` times the sigmoid of the second half.
template <typename T>
absl::StatusOr<Tensor> GluForward(const LayerCall& call, const Tensor& x,
                                  DType) {
  if (x.dim() == 0) {
    return absl::InvalidArgumentError(
        "glu does not support scalars because halving size must be even");
  }
  MODELSTATE_ASSIGN_OR_RETURN(int64_t dim, AttrInt(call.module, "dim"));
  MODELSTATE_ASSIGN_OR_RETURN(dim, WrapDim(dim, x.dim()));
  const int64_t size = x.shape()[dim];
  if (size % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Halving dimension must be even, but dimension ", dim,
                     " is size ", size));
  }
  Shape shape = x.shape();
  shape[dim] = size / 2;
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(shape));
  const int64_t inner = Prod(x.shape(), dim + 1, x.shape().size());
  const int64_t half = size / 2 * inner;
  const int64_t outer = Prod(x.shape(), 0, dim);
  const T* px = Data<T>(x);
  for (int64_t o = 0; o < outer; ++o) {
    const T* first = px + o * 2 * half;
    for (int64_t i = 0; i < half; ++i) {
      const T gate = T(1) / (T(1) + std::exp(-first[half + i]));
      y.data[o * half + i] = first[i] * gate;
    }
  }
  return y.tensor;
}

template <ArgAct kAct>
LayerForwardFn ArgActFn() {
  return &FloatForward<&ArgActivationForward<float, kAct>,
                       &ArgActivationForward<double, kAct>>;
}

// The rarer activations (issue 18's last ones), kept apart so that each
// table stays short.
std::vector<LayerDef> RarerActivations() {
  return {
      {.type = "ReLU6",
       .qualified_name = "torch.nn.modules.activation.ReLU6",
       .signature = {{"inplace", B(false)}},
       .build = &BuildHardtanh<true>,
       .forward = ArgActFn<ArgAct::kHardtanh>()},
      {.type = "Hardtanh",
       .qualified_name = "torch.nn.modules.activation.Hardtanh",
       .signature = {{"min_val", F(-1.0)},
                     {"max_val", F(1.0)},
                     {"inplace", B(false)},
                     {"min_value", kNone},
                     {"max_value", kNone}},
       .build = &BuildHardtanh<false>,
       .forward = ArgActFn<ArgAct::kHardtanh>()},
      {.type = "SELU",
       .qualified_name = "torch.nn.modules.activation.SELU",
       .signature = {{"inplace", B(false)}},
       .build = &BuildInplaceActivation<kSELU>,
       .forward = ArgActFn<ArgAct::kSELU>()},
      {.type = "CELU",
       .qualified_name = "torch.nn.modules.activation.CELU",
       .signature = {{"alpha", F(1.0)}, {"inplace", B(false)}},
       .build = &BuildFloatArgActivation<kCELU, true, kAlpha>,
       .forward = ArgActFn<ArgAct::kCELU>()},
      {.type = "GLU",
       .qualified_name = "torch.nn.modules.activation.GLU",
       .signature = {{"dim", I(-1)}},
       .build = &BuildDimActivation<kGLU>,
       .forward = &FloatForward<&GluForward<float>, &GluForward<double>>},
      {.type = "LogSigmoid",
       .qualified_name = "torch.nn.modules.activation.LogSigmoid",
       .build = &BuildPlainActivation<kLogSigmoid>,
       .forward = ArgActFn<ArgAct::kLogSigmoid>()},
      {.type = "Softmin",
       .qualified_name = "torch.nn.modules.activation.Softmin",
       .signature = {{"dim", kNone}},
       .build = &BuildDimActivation<kSoftmin>,
       .forward = SoftmaxFn<SoftmaxKind::kMin>()},
      {.type = "Softsign",
       .qualified_name = "torch.nn.modules.activation.Softsign",
       .build = &BuildPlainActivation<kSoftsign>,
       .forward = ArgActFn<ArgAct::kSoftsign>()},
      {.type = "Softshrink",
       .qualified_name = "torch.nn.modules.activation.Softshrink",
       .signature = {{"lambd", F(0.5)}},
       .build = &BuildFloatArgActivation<kSoftshrink, false, kLambd>,
       .forward = ArgActFn<ArgAct::kSoftshrink>()},
      {.type = "Hardshrink",
       .qualified_name = "torch.nn.modules.activation.Hardshrink",
       .signature = {{"lambd", F(0.5)}},
       .build = &BuildFloatArgActivation<kHardshrink, false, kLambd>,
       .forward = ArgActFn<ArgAct::kHardshrink>()},
      {.type = "Tanhshrink",
       .qualified_name = "torch.nn.modules.activation.Tanhshrink",
       .build = &BuildPlainActivation<kTanhshrink>,
       .forward = ArgActFn<ArgAct::kTanhshrink>()},
      {.type = "Threshold",
       .qualified_name = "torch.nn.modules.activation.Threshold",
       .signature = {{"threshold", {}}, {"value", {}}, {"inplace", B(false)}},
       .build =
           &BuildFloatArgActivation<kThreshold, true, kThresholdArg, kValue>,
       .forward = ArgActFn<ArgAct::kThreshold>()},
      {.type = "Softmax2d",
       .qualified_name = "torch.nn.modules.activation.Softmax2d",
       .build = &BuildPlainActivation<kSoftmax2d>,
       .forward = SoftmaxFn<SoftmaxKind::k2d>()},
  };
}

}  // namespace

absl::StatusOr<Tensor> Activate(Act act, const Tensor& x, int threads) {
  return x.dtype() == DType::kFloat32 ? ActKernel<float>(act, x, threads)
                                      : ActKernel<double>(act, x, threads);
}

std::vector<LayerDef> ActivationFamily() {
  std::vector<LayerDef> defs = {
      {.type = "ReLU",
       .qualified_name = "torch.nn.modules.activation.ReLU",
       .signature = {{"inplace", B(false)}},
       .build = &BuildInplaceActivation<kReLU>,
       .forward = &FloatForward<&ActivationForward<float, Act::kReLU>,
                                &ActivationForward<double, Act::kReLU>>},
      {.type = "GELU",
       .qualified_name = "torch.nn.modules.activation.GELU",
       .signature = {{"approximate", S("none")}},
       .build = &BuildGELU,
       .forward = &FloatForward<&GeluForward<float>, &GeluForward<double>>},
      {.type = "SiLU",
       .qualified_name = "torch.nn.modules.activation.SiLU",
       .signature = {{"inplace", B(false)}},
       .build = &BuildInplaceActivation<kSiLU>,
       .forward = &FloatForward<&ActivationForward<float, Act::kSiLU>,
                                &ActivationForward<double, Act::kSiLU>>},
      {.type = "Tanh",
       .qualified_name = "torch.nn.modules.activation.Tanh",
       .build = &BuildPlainActivation<kTanh>,
       .forward = &FloatForward<&ActivationForward<float, Act::kTanh>,
                                &ActivationForward<double, Act::kTanh>>},
      {.type = "Sigmoid",
       .qualified_name = "torch.nn.modules.activation.Sigmoid",
       .build = &BuildPlainActivation<kSigmoid>,
       .forward = &FloatForward<&ActivationForward<float, Act::kSigmoid>,
                                &ActivationForward<double, Act::kSigmoid>>},
      {.type = "Softmax",
       .qualified_name = "torch.nn.modules.activation.Softmax",
       .signature = {{"dim", kNone}},
       .build = &BuildDimActivation<kSoftmax>,
       .forward = SoftmaxFn<SoftmaxKind::kSoftmax>()},
      {.type = "LogSoftmax",
       .qualified_name = "torch.nn.modules.activation.LogSoftmax",
       .signature = {{"dim", kNone}},
       .build = &BuildDimActivation<kLogSoftmax>,
       .forward = SoftmaxFn<SoftmaxKind::kLog>()},
      {.type = "LeakyReLU",
       .qualified_name = "torch.nn.modules.activation.LeakyReLU",
       .signature = {{"negative_slope", F(1e-2)}, {"inplace", B(false)}},
       .build = &BuildFloatArgActivation<kLeakyReLU, true, kNegativeSlope>,
       .forward = ArgActFn<ArgAct::kLeakyReLU>()},
      {.type = "ELU",
       .qualified_name = "torch.nn.modules.activation.ELU",
       .signature = {{"alpha", F(1.0)}, {"inplace", B(false)}},
       .build = &BuildFloatArgActivation<kELU, true, kAlpha>,
       .forward = ArgActFn<ArgAct::kELU>()},
      {.type = "Hardswish",
       .qualified_name = "torch.nn.modules.activation.Hardswish",
       .signature = {{"inplace", B(false)}},
       .build = &BuildInplaceActivation<kHardswish>,
       .forward = ArgActFn<ArgAct::kHardswish>()},
      {.type = "Hardsigmoid",
       .qualified_name = "torch.nn.modules.activation.Hardsigmoid",
       .signature = {{"inplace", B(false)}},
       .build = &BuildInplaceActivation<kHardsigmoid>,
       .forward = ArgActFn<ArgAct::kHardsigmoid>()},
      {.type = "Mish",
       .qualified_name = "torch.nn.modules.activation.Mish",
       .signature = {{"inplace", B(false)}},
       .build = &BuildInplaceActivation<kMish>,
       .forward = ArgActFn<ArgAct::kMish>()},
      {.type = "Softplus",
       .qualified_name = "torch.nn.modules.activation.Softplus",
       .signature = {{"beta", I(1)}, {"threshold", I(20)}},
       .build =
           &BuildFloatArgActivation<kSoftplus, false, kBeta, kThresholdArg>,
       .forward = ArgActFn<ArgAct::kSoftplus>()},
      {.type = "PReLU",
       .qualified_name = "torch.nn.modules.activation.PReLU",
       .signature = WithFactory({{"num_parameters", I(1)}, {"init", F(0.25)}}),
       .build = &BuildPReLU,
       .forward = &FloatForward<&PReLUForward<float>, &PReLUForward<double>>},
  };
  for (LayerDef& def : RarerActivations()) defs.push_back(std::move(def));
  return defs;
}

}  // namespace modelstate::internal
