// The activation family: ReLU, GELU, SiLU, Tanh, Sigmoid, Softmax,
// LogSoftmax, LeakyReLU, ELU, Hardswish, Hardsigmoid, Mish, Softplus and
// PReLU (torch.nn.modules.activation). All but PReLU are without state;
// PReLU holds a learnable slope `weight` ([num_parameters], filled with
// `init`). Forward runs the element-wise kernels of
// nn/kernels/elementwise.h, and here the ones with arguments (a slope, an
// alpha, a beta), in the compute type with ATen's formulas.
#include "nn/layers/activation.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "core/init.h"
#include "nn/layer_registry.h"
#include "nn/layers/build_util.h"
#include "nn/layers/forward_util.h"

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

// LeakyReLU(negative_slope, inplace) and ELU(alpha, inplace): one float
// argument, kept as given.
template <const char* kType, const char* kArg>
absl::StatusOr<std::shared_ptr<Module>> BuildSlopeActivation(
    const BoundArgs& args, BuildContext&, const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(double value, args.Float(kArg));
  MODELSTATE_ASSIGN_OR_RETURN(bool inplace, args.Bool("inplace"));
  std::shared_ptr<Module> m = NewStateless(kType, "activation");
  m->SetPlainAttribute(kArg, value);
  m->SetPlainAttribute("inplace", inplace);
  return m;
}

constexpr char kLeakyReLU[] = "LeakyReLU";
constexpr char kNegativeSlope[] = "negative_slope";
constexpr char kELU[] = "ELU";
constexpr char kAlpha[] = "alpha";

absl::StatusOr<std::shared_ptr<Module>> BuildSoftplus(const BoundArgs& args,
                                                      BuildContext&,
                                                      const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(double beta, args.Float("beta"));
  MODELSTATE_ASSIGN_OR_RETURN(double threshold, args.Float("threshold"));
  std::shared_ptr<Module> m = NewStateless("Softplus", "activation");
  m->SetPlainAttribute("beta", beta);
  m->SetPlainAttribute("threshold", threshold);
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

// Softmax(dim) and LogSoftmax(dim).
template <const char* kType>
absl::StatusOr<std::shared_ptr<Module>> BuildSoftmax(const BoundArgs& args,
                                                     BuildContext&,
                                                     const std::string&) {
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

// The element-wise activations with arguments, as ATen computes them.
enum class ArgAct {
  kLeakyReLU,
  kELU,
  kHardswish,
  kHardsigmoid,
  kMish,
  kSoftplus
};

template <typename T>
absl::StatusOr<Tensor> ArgActForward(const LayerCall& call, const Tensor& x,
                                     ArgAct act) {
  const Module& m = call.module;
  double a = 0, b = 0;
  if (act == ArgAct::kLeakyReLU) {
    MODELSTATE_ASSIGN_OR_RETURN(a, AttrDouble(m, "negative_slope"));
  } else if (act == ArgAct::kELU) {
    MODELSTATE_ASSIGN_OR_RETURN(a, AttrDouble(m, "alpha"));
  } else if (act == ArgAct::kSoftplus) {
    MODELSTATE_ASSIGN_OR_RETURN(a, AttrDouble(m, "beta"));
    MODELSTATE_ASSIGN_OR_RETURN(b, AttrDouble(m, "threshold"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(x.shape()));
  const T* px = Data<T>(x);
  const T ta = static_cast<T>(a), tb = static_cast<T>(b);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const T v = px[i];
    T r = v;
    switch (act) {
      case ArgAct::kLeakyReLU:
        r = v > T(0) ? v : v * ta;
        break;
      case ArgAct::kELU:
        r = v <= T(0) ? std::expm1(v) * ta : v;
        break;
      case ArgAct::kHardswish:
        r = v * std::min(std::max(v + T(3), T(0)), T(6)) / T(6);
        break;
      case ArgAct::kHardsigmoid:
        r = std::min(std::max(v + T(3), T(0)), T(6)) / T(6);
        break;
      case ArgAct::kMish:
        r = v * std::tanh(std::log1p(std::exp(v)));
        break;
      case ArgAct::kSoftplus:
        r = v * ta > tb ? v : std::log1p(std::exp(v * ta)) / ta;
        break;
    }
    y.data[i] = r;
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
  MODELSTATE_ASSIGN_OR_RETURN(Tensor w, Param(call.module, "weight", dtype));
  if (!w.defined()) {
    return absl::FailedPreconditionError("PReLU.weight is None");
  }
  if (x.dim() == 0) {
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

// Softmax (kLog false) and LogSoftmax over the module's `dim`.
template <typename T, bool kLog>
absl::StatusOr<Tensor> SoftmaxForward(const LayerCall& call, const Tensor& x,
                                      DType) {
  const Module& m = call.module;
  int64_t dim;
  if (AttrIsNone(m, "dim")) {
    // PyTorch's _get_softmax_dim (legacy implicit dim).
    int64_t nd = x.dim();
    dim = (nd == 0 || nd == 1 || nd == 3) ? 0 : 1;
  } else {
    MODELSTATE_ASSIGN_OR_RETURN(dim, AttrInt(m, "dim"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(dim, WrapDim(dim, x.dim()));
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(x.shape()));
  if (x.numel() == 0) return y.tensor;
  std::memcpy(y.data, x.raw_data(), x.nbytes());
  const int64_t size = x.dim() == 0 ? 1 : x.shape()[dim];
  const int64_t inner = Prod(x.shape(), dim + 1, x.shape().size());
  if constexpr (kLog) {
    LogSoftmaxInPlace(y.data, x.numel() / (size * inner), size, inner);
  } else {
    SoftmaxInPlace(y.data, x.numel() / (size * inner), size, inner,
                   call.runner.threads());
  }
  return y.tensor;
}

template <ArgAct kAct>
LayerForwardFn ArgActFn() {
  return &FloatForward<&ArgActivationForward<float, kAct>,
                       &ArgActivationForward<double, kAct>>;
}

}  // namespace

absl::StatusOr<Tensor> Activate(Act act, const Tensor& x, int threads) {
  return x.dtype() == DType::kFloat32 ? ActKernel<float>(act, x, threads)
                                      : ActKernel<double>(act, x, threads);
}

std::vector<LayerDef> ActivationFamily() {
  return {
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
       .build = &BuildSoftmax<kSoftmax>,
       .forward = &FloatForward<&SoftmaxForward<float, false>,
                                &SoftmaxForward<double, false>>},
      {.type = "LogSoftmax",
       .qualified_name = "torch.nn.modules.activation.LogSoftmax",
       .signature = {{"dim", kNone}},
       .build = &BuildSoftmax<kLogSoftmax>,
       .forward = &FloatForward<&SoftmaxForward<float, true>,
                                &SoftmaxForward<double, true>>},
      {.type = "LeakyReLU",
       .qualified_name = "torch.nn.modules.activation.LeakyReLU",
       .signature = {{"negative_slope", F(1e-2)}, {"inplace", B(false)}},
       .build = &BuildSlopeActivation<kLeakyReLU, kNegativeSlope>,
       .forward = ArgActFn<ArgAct::kLeakyReLU>()},
      {.type = "ELU",
       .qualified_name = "torch.nn.modules.activation.ELU",
       .signature = {{"alpha", F(1.0)}, {"inplace", B(false)}},
       .build = &BuildSlopeActivation<kELU, kAlpha>,
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
       .build = &BuildSoftplus,
       .forward = ArgActFn<ArgAct::kSoftplus>()},
      {.type = "PReLU",
       .qualified_name = "torch.nn.modules.activation.PReLU",
       .signature = WithFactory({{"num_parameters", I(1)}, {"init", F(0.25)}}),
       .build = &BuildPReLU,
       .forward = &FloatForward<&PReLUForward<float>, &PReLUForward<double>>},
  };
}

}  // namespace modelstate::internal
