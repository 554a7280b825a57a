// The embedding family: Embedding and EmbeddingBag. Construction follows
// torch.nn.modules.sparse (weight ~ N(0, 1), the padding_idx row zeroed);
// forward looks rows up (and EmbeddingBag reduces each bag by sum, mean or
// max), renormalising them in the weight first when max_norm is set, as
// F.embedding and F.embedding_bag do.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "core/init.h"
#include "nn/layer_registry.h"
#include "nn/layers/build_util.h"
#include "nn/layers/forward_util.h"
#include "nn/layers/param_check.h"

namespace modelstate::internal {
namespace {

// What Embedding and EmbeddingBag share: the table, its init and the
// lookup options.
struct TableConfig {
  int64_t n, d;
  AttrValue padding_attr;  // None or the wrapped index
  AttrValue max_norm;      // None or a float
  double norm_type;
  bool scale_grad_by_freq;
  bool sparse;
  FactoryKwargs factory;
};

absl::StatusOr<TableConfig> ReadTableConfig(const BoundArgs& args,
                                            const BuildOptions& build) {
  TableConfig c;
  MODELSTATE_ASSIGN_OR_RETURN(c.n, args.Int("num_embeddings"));
  MODELSTATE_ASSIGN_OR_RETURN(c.d, args.Int("embedding_dim"));
  MODELSTATE_ASSIGN_OR_RETURN(c.factory, args.Factory(build));
  if (!args.IsNone("padding_idx")) {
    MODELSTATE_ASSIGN_OR_RETURN(int64_t idx, args.Int("padding_idx"));
    if ((idx > 0 && idx >= c.n) || idx < -c.n) {
      return absl::InvalidArgumentError(
          "Padding_idx must be within num_embeddings");
    }
    c.padding_attr = idx < 0 ? idx + c.n : idx;
  }
  if (!args.IsNone("_weight")) {
    return absl::InvalidArgumentError(
        "_weight is not supported here; build the layer, then load the "
        "values with LoadStateDict");
  }
  if (!args.IsNone("max_norm")) {
    MODELSTATE_ASSIGN_OR_RETURN(double v, args.Float("max_norm"));
    c.max_norm = v;
  }
  MODELSTATE_ASSIGN_OR_RETURN(c.norm_type, args.Float("norm_type"));
  MODELSTATE_ASSIGN_OR_RETURN(c.scale_grad_by_freq,
                              args.Bool("scale_grad_by_freq"));
  MODELSTATE_ASSIGN_OR_RETURN(c.sparse, args.Bool("sparse"));
  return c;
}

// The table ~ N(0, 1) with the padding_idx row zeroed after the draw
// (reset_parameters, then _fill_padding_idx_with_zero), and the module
// holding its attributes; `weight` is registered by the caller.
absl::StatusOr<Tensor> MakeTable(const TableConfig& c, BuildContext& ctx) {
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor w, ctx.NewTensor(c.factory.dtype, {c.n, c.d}, c.factory.device));
  MODELSTATE_RETURN_IF_ERROR(NormalInit(w, 0.0, 1.0, ctx.gen()));
  if (std::holds_alternative<int64_t>(c.padding_attr) &&
      c.factory.device.has_storage() && c.d > 0) {
    const int64_t row = std::get<int64_t>(c.padding_attr);
    MODELSTATE_ASSIGN_OR_RETURN(void* data, w.MutableDataForOverwrite());
    for (int64_t j = 0; j < c.d; ++j) {
      WriteElementFromDouble(data, c.factory.dtype, row * c.d + j, 0.0);
    }
  }
  return w;
}

// The attributes in __init__'s order: Embedding sets padding_idx third,
// EmbeddingBag after scale_grad_by_freq.
void SetTableAttributes(const TableConfig& c, bool padding_early, Module& m) {
  m.SetPlainAttribute("num_embeddings", c.n);
  m.SetPlainAttribute("embedding_dim", c.d);
  if (padding_early) m.SetPlainAttribute("padding_idx", c.padding_attr);
  m.SetPlainAttribute("max_norm", c.max_norm);
  m.SetPlainAttribute("norm_type", c.norm_type);
  m.SetPlainAttribute("scale_grad_by_freq", c.scale_grad_by_freq);
  if (!padding_early) m.SetPlainAttribute("padding_idx", c.padding_attr);
}

absl::StatusOr<std::shared_ptr<Module>> BuildEmbedding(
    const BoundArgs& args, BuildContext& ctx, const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(TableConfig c,
                              ReadTableConfig(args, ctx.options()));
  MODELSTATE_ASSIGN_OR_RETURN(bool freeze, args.Bool("_freeze"));  // 2.x
  MODELSTATE_ASSIGN_OR_RETURN(Tensor w, MakeTable(c, ctx));
  std::shared_ptr<Module> m = NewLayer("Embedding", "sparse");
  SetTableAttributes(c, /*padding_early=*/true, *m);
  m->SetPlainAttribute("sparse", c.sparse);
  m->AddClassAttributes({"reset_parameters", "__constants__", "from_pretrained",
                         "_fill_padding_idx_with_zero"});
  MODELSTATE_RETURN_IF_ERROR(
      ctx.AddParameter(*m, path, "weight", w, /*requires_grad=*/!freeze));
  return m;
}

// EmbeddingBag.__init__ (torch keeps any `mode` string; forward rejects an
// unknown one).
absl::StatusOr<std::shared_ptr<Module>> BuildEmbeddingBag(
    const BoundArgs& args, BuildContext& ctx, const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(TableConfig c,
                              ReadTableConfig(args, ctx.options()));
  MODELSTATE_ASSIGN_OR_RETURN(std::string mode, args.Str("mode"));
  MODELSTATE_ASSIGN_OR_RETURN(bool last, args.Bool("include_last_offset"));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor w, MakeTable(c, ctx));
  std::shared_ptr<Module> m = NewLayer("EmbeddingBag", "sparse");
  SetTableAttributes(c, /*padding_early=*/false, *m);
  m->AddClassAttributes({"reset_parameters", "__constants__", "from_pretrained",
                         "_fill_padding_idx_with_zero"});
  MODELSTATE_RETURN_IF_ERROR(ctx.AddParameter(*m, path, "weight", w));
  m->SetPlainAttribute("mode", mode);
  m->SetPlainAttribute("sparse", c.sparse);
  m->SetPlainAttribute("include_last_offset", last);
  return m;
}

// `indices` (int64 or int32) as int64, each checked against the table's
// `num` rows; `arg` and `op` name them in ATen's messages.
absl::StatusOr<std::vector<int64_t>> ReadIndices(const Tensor& indices,
                                                 int64_t num,
                                                 absl::string_view arg,
                                                 absl::string_view op) {
  if (indices.dtype() != DType::kInt64 && indices.dtype() != DType::kInt32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Expected tensor for argument #1 '", arg,
        "' to have one of the following scalar types: Long, Int; but got ",
        indices.TypeName(), " instead (while checking arguments for ", op,
        ")"));
  }
  const int64_t count = indices.numel();
  std::vector<int64_t> idx(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    idx[i] = indices.dtype() == DType::kInt64
                 ? indices.data<int64_t>()[i]
                 : static_cast<int64_t>(indices.data<int32_t>()[i]);
    if (num >= 0 && (idx[i] < 0 || idx[i] >= num)) {
      return absl::InvalidArgumentError("index out of range in self");
    }
  }
  return idx;
}

// embedding_renorm_: rows looked up whose norm exceeds max_norm are scaled
// down in the weight itself, before the lookup (when max_norm is set).
absl::Status Renorm(const Module& m, Tensor& weight,
                    const std::vector<int64_t>& idx) {
  if (AttrIsNone(m, "max_norm")) return absl::OkStatus();
  const int64_t dim = weight.shape()[1];
  MODELSTATE_ASSIGN_OR_RETURN(double max_norm, AttrDouble(m, "max_norm"));
  MODELSTATE_ASSIGN_OR_RETURN(double p, AttrDouble(m, "norm_type"));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor w64,
                              weight.To(Device::Cpu(), DType::kFloat64));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor w64_own, w64.Clone());
  MODELSTATE_ASSIGN_OR_RETURN(void* raw, w64_own.MutableDataForOverwrite());
  double* pw = static_cast<double*>(raw);
  bool changed = false;
  absl::flat_hash_set<int64_t> seen;
  for (int64_t row : idx) {
    if (!seen.insert(row).second) continue;
    double* r = pw + row * dim;
    const double norm = VectorNorm(r, dim, p);
    if (norm > max_norm) {
      double scale = max_norm / (norm + 1e-7);
      for (int64_t j = 0; j < dim; ++j) r[j] *= scale;
      changed = true;
    }
  }
  if (changed) MODELSTATE_RETURN_IF_ERROR(weight.CopyFrom(w64_own));
  return absl::OkStatus();
}

// The table (any dtype: rows are copied or read as doubles). As in
// F.embedding, its own [num_embeddings, embedding_dim] rules; indices are
// checked against it.
absl::StatusOr<Tensor> Table(const Module& m) {
  return RankedEntry(m, "weight", 2);
}

// F.embedding, with embedding_renorm_ first when max_norm is set.
absl::StatusOr<Tensor> Embed(const Module& m, const Tensor& indices) {
  MODELSTATE_ASSIGN_OR_RETURN(Tensor weight, Table(m));
  const int64_t dim = weight.shape()[1];
  const int64_t count = indices.numel();
  MODELSTATE_ASSIGN_OR_RETURN(
      std::vector<int64_t> idx,
      ReadIndices(indices, weight.shape()[0], "indices", "embedding"));
  MODELSTATE_RETURN_IF_ERROR(Renorm(m, weight, idx));
  Shape shape = indices.shape();
  shape.push_back(dim);
  MODELSTATE_ASSIGN_OR_RETURN(Tensor y, Tensor::Empty(weight.dtype(), shape));
  MODELSTATE_ASSIGN_OR_RETURN(void* out, y.MutableDataForOverwrite());
  const size_t row_bytes =
      static_cast<size_t>(dim) * ElementSize(weight.dtype());
  const char* src = static_cast<const char*>(weight.raw_data());
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(static_cast<char*>(out) + i * row_bytes,
                src + idx[i] * row_bytes, row_bytes);
  }
  return y;
}

// Inputs: [indices (int64 or int32)], of any shape.
absl::StatusOr<std::vector<Tensor>> EmbeddingForward(
    const LayerCall& call, const std::vector<Tensor>& in) {
  MODELSTATE_RETURN_IF_ERROR(CheckNumInputs(call.module, in, 1, 1));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor y, Embed(call.module, in[0]));
  return std::vector<Tensor>{y};
}

// The bags of an EmbeddingBag call: [begin, end) ranges into the flat
// indices, per F.embedding_bag's rules for 2-D input (fixed-length rows)
// and 1-D input with offsets.
absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> Bags(
    const Tensor& input, const Tensor& offsets, bool include_last_offset) {
  std::vector<std::pair<int64_t, int64_t>> bags;
  const int64_t count = input.numel();
  if (input.dim() == 2) {
    if (offsets.defined()) {
      return absl::InvalidArgumentError(
          "if input is 2D, then offsets has to be None, as input is treated "
          "is a mini-batch of fixed length sequences. However, found offsets "
          "of type <class 'torch.Tensor'>");
    }
    const int64_t rows = input.shape()[0], len = input.shape()[1];
    for (int64_t r = 0; r < rows; ++r) bags.push_back({r * len, (r + 1) * len});
    return bags;
  }
  if (input.dim() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("input has to be 1D or 2D Tensor, but got Tensor of "
                     "dimension ",
                     input.dim()));
  }
  if (!offsets.defined()) {
    return absl::InvalidArgumentError(
        "offsets has to be a 1D Tensor but got None");
  }
  if (offsets.dim() != 1) {
    return absl::InvalidArgumentError("offsets has to be a 1D Tensor");
  }
  MODELSTATE_ASSIGN_OR_RETURN(
      std::vector<int64_t> off,
      ReadIndices(offsets, -1, "offsets", "embedding_bag"));
  if (include_last_offset && off.empty()) {
    return absl::InvalidArgumentError(
        "include_last_offset: number of offset should be at least 1");
  }
  if (!off.empty() && off[0] != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "offsets[0] has to be 0, i.e., the first sequence in the mini-batch "
        "has to start from position 0. However, got ",
        off[0]));
  }
  if (!off.empty() && off.back() > count) {
    return absl::InvalidArgumentError(
        absl::StrCat("offsets[-1] can not be greater than input's length (",
                     count, "), but got offsets[-1] of ", off.back()));
  }
  // torch checks only the first and the last offset and reads past the
  // input for the others; each bag must lie inside the input.
  for (size_t i = 1; i < off.size(); ++i) {
    if (off[i] > count) {
      return absl::InvalidArgumentError(absl::StrCat(
          "offsets[", i, "] can not be greater than input's length (", count,
          "), but got offsets[", i, "] of ", off[i]));
    }
    if (off[i] < off[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "offsets has to be non-decreasing, but got offsets[", i, "] of ",
          off[i], " after offsets[", i - 1, "] of ", off[i - 1]));
    }
  }
  const size_t n = include_last_offset ? off.size() - 1 : off.size();
  for (size_t b = 0; b < n; ++b) {
    const int64_t end = b + 1 < off.size() ? off[b + 1] : count;
    bags.push_back({off[b], end});
  }
  return bags;
}

// Inputs: [input, offsets?, per_sample_weights?]; outputs: [bags,
// embedding_dim] in the weight's dtype (reduced in double).
absl::StatusOr<std::vector<Tensor>> EmbeddingBagForward(
    const LayerCall& call, const std::vector<Tensor>& in) {
  const Module& m = call.module;
  MODELSTATE_RETURN_IF_ERROR(CheckNumInputs(m, in, 1, 3));
  const Tensor& input = in[0];
  const Tensor offsets = in.size() > 1 ? in[1] : Tensor();
  const Tensor psw = in.size() > 2 ? in[2] : Tensor();
  MODELSTATE_ASSIGN_OR_RETURN(Tensor weight, Table(m));
  MODELSTATE_RETURN_IF_ERROR(CheckCpu(psw));
  MODELSTATE_ASSIGN_OR_RETURN(std::string mode, AttrStr(m, "mode"));
  MODELSTATE_ASSIGN_OR_RETURN(bool last, AttrBool(m, "include_last_offset"));
  if (psw.defined() && psw.shape() != input.shape()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "embedding_bag: If per_sample_weights (", TorchSizeString(psw.shape()),
        ") is not None, then it must have the same shape as the input (",
        TorchSizeString(input.shape()), ")"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(auto bags, Bags(input, offsets, last));
  if (mode != "sum" && mode != "mean" && mode != "max") {
    return absl::InvalidArgumentError("mode has to be one of sum, mean or max");
  }
  const int64_t dim = weight.shape()[1];
  MODELSTATE_ASSIGN_OR_RETURN(
      std::vector<int64_t> idx,
      ReadIndices(input, weight.shape()[0], "indices", "embedding_bag"));
  MODELSTATE_RETURN_IF_ERROR(Renorm(m, weight, idx));
  if (psw.defined() && mode != "sum") {
    return absl::InvalidArgumentError(absl::StrCat(
        "embedding_bag: per_sample_weights was not None. per_sample_weights "
        "is only supported for mode='sum' (got mode='",
        mode, "'). Please open a feature request on GitHub."));
  }
  if (psw.defined() && psw.dtype() != weight.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected scalar type ", ScalarTypeName(weight.dtype()), " but found ",
        ScalarTypeName(psw.dtype()), " (per_sample_weights)"));
  }
  const int64_t padding = AttrIsNone(m, "padding_idx")
                              ? -1
                              : AttrInt(m, "padding_idx").value_or(-1);
  const int64_t nbags = static_cast<int64_t>(bags.size());
  MODELSTATE_ASSIGN_OR_RETURN(Tensor y,
                              Tensor::Empty(weight.dtype(), {nbags, dim}));
  MODELSTATE_ASSIGN_OR_RETURN(void* out, y.MutableDataForOverwrite());
  const void* pw = weight.raw_data();
  std::vector<double> acc(static_cast<size_t>(dim));
  for (int64_t b = 0; b < nbags; ++b) {
    std::fill(acc.begin(), acc.end(), 0.0);
    int64_t used = 0;
    for (int64_t i = bags[b].first; i < bags[b].second; ++i) {
      if (idx[i] == padding) continue;
      const double scale =
          psw.defined() ? ReadElementAsDouble(psw.raw_data(), psw.dtype(), i)
                        : 1.0;
      for (int64_t j = 0; j < dim; ++j) {
        const double v =
            ReadElementAsDouble(pw, weight.dtype(), idx[i] * dim + j);
        acc[j] = mode != "max" ? acc[j] + v * scale
                 : used == 0   ? v
                               : std::max(acc[j], v);
      }
      ++used;
    }
    for (int64_t j = 0; j < dim; ++j) {
      const double v = mode == "mean" && used > 0
                           ? acc[j] / static_cast<double>(used)
                           : acc[j];
      WriteElementFromDouble(out, weight.dtype(), b * dim + j, v);
    }
  }
  return std::vector<Tensor>{y};
}

}  // namespace

std::vector<LayerDef> EmbeddingFamily() {
  return {
      // Embedding's `_freeze` is PyTorch 2.x's (after _weight).
      {.type = "Embedding",
       .qualified_name = "torch.nn.modules.sparse.Embedding",
       .signature = {{"num_embeddings", {}},
                     {"embedding_dim", {}},
                     {"padding_idx", kNone},
                     {"max_norm", kNone},
                     {"norm_type", F(2.0)},
                     {"scale_grad_by_freq", B(false)},
                     {"sparse", B(false)},
                     {"_weight", kNone},
                     {"_freeze", B(false)},
                     {"device", kNone},
                     {"dtype", kNone}},
       .build = &BuildEmbedding,
       .forward = &EmbeddingForward},
      {.type = "EmbeddingBag",
       .qualified_name = "torch.nn.modules.sparse.EmbeddingBag",
       .signature = WithFactory({{"num_embeddings", {}},
                                 {"embedding_dim", {}},
                                 {"max_norm", kNone},
                                 {"norm_type", F(2.0)},
                                 {"scale_grad_by_freq", B(false)},
                                 {"mode", S("mean")},
                                 {"sparse", B(false)},
                                 {"_weight", kNone},
                                 {"include_last_offset", B(false)},
                                 {"padding_idx", kNone}}),
       .build = &BuildEmbeddingBag,
       .forward = &EmbeddingBagForward},
  };
}

}  // namespace modelstate::internal
