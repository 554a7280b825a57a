// The flatten family: Flatten. Forward returns a view of the input's bytes
// with dims start_dim..end_dim merged, as torch.flatten does; any dtype.
#include <memory>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "nn/layer_registry.h"
#include "nn/layers/build_util.h"
#include "nn/layers/forward_util.h"

namespace modelstate::internal {
namespace {

absl::StatusOr<std::shared_ptr<Module>> BuildFlatten(const BoundArgs& args,
                                                     BuildContext&,
                                                     const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t start, args.Int("start_dim"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t end, args.Int("end_dim"));
  std::shared_ptr<Module> m = NewStateless("Flatten", "flatten");
  m->SetPlainAttribute("start_dim", start);
  m->SetPlainAttribute("end_dim", end);
  return m;
}

absl::StatusOr<std::vector<Tensor>> FlattenForward(
    const LayerCall& call, const std::vector<Tensor>& in) {
  const Module& m = call.module;
  MODELSTATE_RETURN_IF_ERROR(CheckNumInputs(m, in, 1, 1));
  const Tensor& x = in[0];
  int64_t nd = x.dim();
  MODELSTATE_ASSIGN_OR_RETURN(int64_t s, AttrInt(m, "start_dim"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t e, AttrInt(m, "end_dim"));
  MODELSTATE_ASSIGN_OR_RETURN(s, WrapDim(s, nd));
  MODELSTATE_ASSIGN_OR_RETURN(e, WrapDim(e, nd));
  if (s > e) {
    return absl::InvalidArgumentError(
        "flatten() has invalid args: start_dim cannot come after end_dim");
  }
  Shape shape;
  if (nd == 0) {
    shape = {1};
  } else {
    for (int64_t i = 0; i < s; ++i) shape.push_back(x.shape()[i]);
    shape.push_back(Prod(x.shape(), s, e + 1));
    for (int64_t i = e + 1; i < nd; ++i) shape.push_back(x.shape()[i]);
  }
  // A view sharing the input's bytes, as torch.flatten returns.
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor y, Tensor::FromStorage(x.dtype(), shape, x.storage()));
  return std::vector<Tensor>{y};
}

}  // namespace

std::vector<LayerDef> FlattenFamily() {
  return {
      {.type = "Flatten",
       .qualified_name = "torch.nn.modules.flatten.Flatten",
       .signature = {{"start_dim", I(1)}, {"end_dim", I(-1)}},
       .build = &BuildFlatten,
       .forward = &FlattenForward},
  };
}

}  // namespace modelstate::internal
