// The activation family: ReLU, GELU, SiLU, Tanh, Sigmoid and Softmax.
// Modules without state (torch.nn.modules.activation); forward runs the
// element-wise kernels of nn/kernels/elementwise.h.
#include "nn/layers/activation.h"

#include <cstring>
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

absl::StatusOr<std::shared_ptr<Module>> BuildSoftmax(const BoundArgs& args,
                                                     BuildContext&,
                                                     const std::string&) {
  AttrValue dim;
  if (!args.IsNone("dim")) {
    MODELSTATE_ASSIGN_OR_RETURN(int64_t d, args.Int("dim"));
    dim = d;
  }
  std::shared_ptr<Module> m = NewStateless("Softmax", "activation");
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

template <typename T>
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
  SoftmaxInPlace(y.data, x.numel() / (size * inner), size, inner,
                 call.runner.threads());
  return y.tensor;
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
       .build = &BuildSoftmax,
       .forward =
           &FloatForward<&SoftmaxForward<float>, &SoftmaxForward<double>>},
  };
}

}  // namespace modelstate::internal
