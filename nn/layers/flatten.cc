// The flatten family: Flatten and Unflatten. Forward returns a view of the
// input's bytes with dims start_dim..end_dim merged (torch.flatten) or dim
// split into unflattened_size (Tensor.unflatten); any dtype. Unflatten's
// named-tensor form (a str dim) is not supported: specs carry no names.
#include <algorithm>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

absl::StatusOr<std::shared_ptr<Module>> BuildUnflatten(const BoundArgs& args,
                                                       BuildContext&,
                                                       const std::string&) {
  if (args.Str("dim").ok()) {
    return absl::InvalidArgumentError(
        "Unflatten: a named dim (str) needs named tensors, which specs "
        "cannot carry; give dim as an int");
  }
  MODELSTATE_ASSIGN_OR_RETURN(int64_t dim, args.Int("dim"));
  MODELSTATE_ASSIGN_OR_RETURN(AttrValue sizes,
                              args.IntOrTuple("unflattened_size", -1));
  if (std::holds_alternative<int64_t>(sizes)) {
    return absl::InvalidArgumentError(
        "unflattened_size must be a tuple of ints, but found type int");
  }
  std::shared_ptr<Module> m = NewStateless("Unflatten", "flatten");
  m->SetPlainAttribute("dim", dim);
  m->SetPlainAttribute("unflattened_size", sizes);
  return m;
}

// Tensor.unflatten's sizes for dim's `size`: at most one -1, inferred.
absl::StatusOr<std::vector<int64_t>> UnflattenSizes(std::vector<int64_t> sizes,
                                                    int64_t dim, int64_t size) {
  if (sizes.empty()) {
    return absl::InvalidArgumentError("unflatten: sizes must be non-empty");
  }
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == -1 && infer < 0) {
      infer = static_cast<int64_t>(i);
    } else if (sizes[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid shape dimension ", sizes[i]));
    } else {
      known *= sizes[i];
    }
  }
  if (infer >= 0 && known != 0 && size % known == 0) {
    sizes[infer] = size / known;
    known *= sizes[infer];
  }
  if (known != size || (infer >= 0 && known == 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unflatten: Provided sizes [", absl::StrJoin(sizes, ", "),
                     "] don't multiply up to the size of dim ", dim, " (", size,
                     ") in the input tensor"));
  }
  return sizes;
}

absl::StatusOr<std::vector<Tensor>> UnflattenForward(
    const LayerCall& call, const std::vector<Tensor>& in) {
  const Module& m = call.module;
  MODELSTATE_RETURN_IF_ERROR(CheckNumInputs(m, in, 1, 1));
  const Tensor& x = in[0];
  MODELSTATE_ASSIGN_OR_RETURN(int64_t d, AttrInt(m, "dim"));
  MODELSTATE_ASSIGN_OR_RETURN(d, WrapDim(d, std::max<int64_t>(x.dim(), 1)));
  MODELSTATE_ASSIGN_OR_RETURN(const AttrValue* v, Attr(m, "unflattened_size"));
  const auto* list = std::get_if<std::vector<int64_t>>(v);
  if (list == nullptr) {
    return absl::InvalidArgumentError(
        "Unflatten: unflattened_size must be a tuple of ints");
  }
  const std::vector<int64_t>& given = *list;
  const int64_t size = x.dim() == 0 ? 1 : x.shape()[d];
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> sizes,
                              UnflattenSizes(given, d, size));
  Shape shape;
  for (int64_t i = 0; i < d; ++i) shape.push_back(x.shape()[i]);
  for (int64_t s : sizes) shape.push_back(s);
  for (int64_t i = d + 1; i < x.dim(); ++i) shape.push_back(x.shape()[i]);
  // A view sharing the input's bytes, as Tensor.unflatten returns.
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
      {.type = "Unflatten",
       .qualified_name = "torch.nn.modules.flatten.Unflatten",
       .signature = {{"dim", {}}, {"unflattened_size", {}}},
       .build = &BuildUnflatten,
       .forward = &UnflattenForward},
  };
}

}  // namespace modelstate::internal
