// The dropout family: Dropout. In eval mode its inputs pass through
// untouched; in training mode each element is kept with probability 1 - p
// and scaled by 1 / (1 - p). Masks come from ForwardOptions' generator:
// deterministic for a seed, but not the masks torch draws.
#include "nn/layers/dropout.h"

#include <algorithm>
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

absl::StatusOr<std::shared_ptr<Module>> BuildDropout(const BoundArgs& args,
                                                     BuildContext&,
                                                     const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(double p, args.Float("p"));
  MODELSTATE_ASSIGN_OR_RETURN(bool inplace, args.Bool("inplace"));
  if (p < 0 || p > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dropout probability has to be between 0 and 1, but got ", p));
  }
  return NewDropout(p, inplace);
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

absl::StatusOr<std::vector<Tensor>> DropoutForward(
    const LayerCall& call, const std::vector<Tensor>& in) {
  // Eval mode: the inputs come back as given, unchecked.
  if (!call.module.is_training()) return in;
  return FloatForward<&DropoutKernel<float>, &DropoutKernel<double>>(call, in);
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
      {.type = "Dropout",
       .qualified_name = "torch.nn.modules.dropout.Dropout",
       .signature = {{"p", F(0.5)}, {"inplace", B(false)}},
       .build = &BuildDropout,
       .forward = &DropoutForward},
  };
}

}  // namespace modelstate::internal
