// The distance family: CosineSimilarity(dim, eps) and PairwiseDistance(p,
// eps, keepdim) (torch.nn.modules.distance). Modules without state; their
// forward takes two inputs, broadcast against each other as ATen does, and
// reduces one dim: CosineSimilarity's `dim`, PairwiseDistance's last.
#include <algorithm>
#include <cmath>
#include <limits>
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

absl::StatusOr<std::shared_ptr<Module>> BuildCosineSimilarity(
    const BoundArgs& args, BuildContext&, const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t dim, args.Int("dim"));
  MODELSTATE_ASSIGN_OR_RETURN(double eps, args.Float("eps"));
  std::shared_ptr<Module> m = NewStateless("CosineSimilarity", "distance");
  m->SetPlainAttribute("dim", dim);
  m->SetPlainAttribute("eps", eps);
  return m;
}

// torch keeps `p` as `norm`.
absl::StatusOr<std::shared_ptr<Module>> BuildPairwiseDistance(
    const BoundArgs& args, BuildContext&, const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(double p, args.Float("p"));
  MODELSTATE_ASSIGN_OR_RETURN(double eps, args.Float("eps"));
  MODELSTATE_ASSIGN_OR_RETURN(bool keepdim, args.Bool("keepdim"));
  std::shared_ptr<Module> m = NewStateless("PairwiseDistance", "distance");
  m->SetPlainAttribute("norm", p);
  m->SetPlainAttribute("eps", eps);
  m->SetPlainAttribute("keepdim", keepdim);
  return m;
}

// Two inputs broadcast to one shape: each input's element strides over that
// shape (0 along a broadcast dim).
struct DistanceOperands {
  Shape shape;
  std::vector<int64_t> stride1, stride2;
};

// Strides of `s` right-aligned to `nd` dims, 0 where `s` is broadcast.
std::vector<int64_t> DistanceStrides(const Shape& s, size_t nd) {
  std::vector<int64_t> strides(nd, 0);
  int64_t step = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    const size_t d = s.size() - 1 - i;
    if (s[d] != 1) strides[nd - 1 - i] = step;
    step *= s[d];
  }
  return strides;
}

// ATen's infer_size with its text.
absl::StatusOr<DistanceOperands> BroadcastOperands(const Tensor& a,
                                                   const Tensor& b) {
  const size_t na = a.shape().size(), nb = b.shape().size();
  const size_t nd = std::max(na, nb);
  DistanceOperands ops;
  ops.shape.assign(nd, 1);
  for (size_t i = 0; i < nd; ++i) {
    const int64_t sa = i < na ? a.shape()[na - 1 - i] : 1;
    const int64_t sb = i < nb ? b.shape()[nb - 1 - i] : 1;
    if (sa != sb && sa != 1 && sb != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "The size of tensor a (", sa, ") must match the size of tensor b (",
          sb, ") at non-singleton dimension ", nd - 1 - i));
    }
    ops.shape[nd - 1 - i] = sa == 1 ? sb : sa;
  }
  ops.stride1 = DistanceStrides(a.shape(), nd);
  ops.stride2 = DistanceStrides(b.shape(), nd);
  return ops;
}

// Calls fn(offset1, offset2, out_index) for every position of `ops.shape`
// without dim `dim` (out_index counts them in order), where offsetN is
// input N's element at that position with `dim` at 0.
template <typename Fn>
void ForEachReducedPosition(const DistanceOperands& ops, size_t dim, Fn fn) {
  const size_t nd = ops.shape.size();
  std::vector<int64_t> index(nd, 0);
  int64_t count = 1;
  for (size_t d = 0; d < nd; ++d) {
    if (d != dim) count *= ops.shape[d];
  }
  for (int64_t out = 0; out < count; ++out) {
    int64_t o1 = 0, o2 = 0;
    for (size_t d = 0; d < nd; ++d) {
      o1 += index[d] * ops.stride1[d];
      o2 += index[d] * ops.stride2[d];
    }
    fn(o1, o2, out);
    for (size_t d = nd; d-- > 0;) {
      if (d == dim) continue;
      if (++index[d] < ops.shape[d]) break;
      index[d] = 0;
    }
  }
}

// F.cosine_similarity: sum(x1 * x2) / (max(|x1|, eps) * max(|x2|, eps))
// over `dim` of the broadcast inputs.
template <typename T>
absl::StatusOr<Tensor> CosineSimilarityForward(const LayerCall& call,
                                               const std::vector<Tensor>& in,
                                               DType) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t dim, AttrInt(call.module, "dim"));
  MODELSTATE_ASSIGN_OR_RETURN(double eps, AttrDouble(call.module, "eps"));
  MODELSTATE_ASSIGN_OR_RETURN(DistanceOperands ops,
                              BroadcastOperands(in[0], in[1]));
  MODELSTATE_ASSIGN_OR_RETURN(dim, WrapDim(dim, ops.shape.size()));
  Shape out_shape = ops.shape;
  const int64_t n = ops.shape.empty() ? 1 : ops.shape[dim];
  if (!out_shape.empty()) out_shape.erase(out_shape.begin() + dim);
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(out_shape));
  const T* a = Data<T>(in[0]);
  const T* b = Data<T>(in[1]);
  const int64_t s1 = ops.shape.empty() ? 0 : ops.stride1[dim];
  const int64_t s2 = ops.shape.empty() ? 0 : ops.stride2[dim];
  ForEachReducedPosition(ops, dim, [&](int64_t o1, int64_t o2, int64_t out) {
    double dot = 0, n1 = 0, n2 = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double u = a[o1 + i * s1], v = b[o2 + i * s2];
      dot += u * v;
      n1 += u * u;
      n2 += v * v;
    }
    const double denom =
        std::max(std::sqrt(n1), eps) * std::max(std::sqrt(n2), eps);
    y.data[out] = static_cast<T>(dot / denom);
  });
  return y.tensor;
}

// F.pairwise_distance: torch.norm(x1 - x2 + eps, p) over the last dim of
// the broadcast inputs (kept as size 1 with keepdim). The difference is
// taken in the compute type, as ATen does.
template <typename T>
absl::StatusOr<Tensor> PairwiseDistanceForward(const LayerCall& call,
                                               const std::vector<Tensor>& in,
                                               DType) {
  MODELSTATE_ASSIGN_OR_RETURN(double p, AttrDouble(call.module, "norm"));
  MODELSTATE_ASSIGN_OR_RETURN(double eps, AttrDouble(call.module, "eps"));
  MODELSTATE_ASSIGN_OR_RETURN(bool keepdim, AttrBool(call.module, "keepdim"));
  MODELSTATE_ASSIGN_OR_RETURN(DistanceOperands ops,
                              BroadcastOperands(in[0], in[1]));
  const bool scalar = ops.shape.empty();
  const size_t dim = scalar ? 0 : ops.shape.size() - 1;
  const int64_t n = scalar ? 1 : ops.shape[dim];
  Shape out_shape = ops.shape;
  if (!scalar && keepdim) out_shape[dim] = 1;
  if (!scalar && !keepdim) out_shape.pop_back();
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(out_shape));
  const T* a = Data<T>(in[0]);
  const T* b = Data<T>(in[1]);
  const int64_t s1 = scalar ? 0 : ops.stride1[dim];
  const int64_t s2 = scalar ? 0 : ops.stride2[dim];
  std::vector<double> diff(n);
  ForEachReducedPosition(ops, dim, [&](int64_t o1, int64_t o2, int64_t out) {
    for (int64_t i = 0; i < n; ++i) {
      diff[i] = a[o1 + i * s1] - b[o2 + i * s2] + static_cast<T>(eps);
    }
    y.data[out] = static_cast<T>(VectorNorm(diff.data(), n, p));
  });
  return y.tensor;
}

constexpr FloatInputs kDistanceInputs{.min = 2, .max = 2};

}  // namespace

std::vector<LayerDef> DistanceFamily() {
  return {
      {.type = "PairwiseDistance",
       .qualified_name = "torch.nn.modules.distance.PairwiseDistance",
       .signature = {{"p", F(2.0)}, {"eps", F(1e-6)}, {"keepdim", B(false)}},
       .build = &BuildPairwiseDistance,
       .forward =
           &FloatForward<&PairwiseDistanceForward<float>,
                         &PairwiseDistanceForward<double>, kDistanceInputs>},
      {.type = "CosineSimilarity",
       .qualified_name = "torch.nn.modules.distance.CosineSimilarity",
       .signature = {{"dim", I(1)}, {"eps", F(1e-8)}},
       .build = &BuildCosineSimilarity,
       .forward =
           &FloatForward<&CosineSimilarityForward<float>,
                         &CosineSimilarityForward<double>, kDistanceInputs>},
  };
}

}  // namespace modelstate::internal
