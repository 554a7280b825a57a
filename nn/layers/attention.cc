// The attention family: MultiheadAttention. Construction follows
// torch.nn.modules.activation.MultiheadAttention (in_proj or separate
// q/k/v projections, out_proj as a NonDynamicallyQuantizableLinear,
// bias_k/bias_v, xavier init); forward follows
// F.multi_head_attention_forward: projections and the per-head products on
// OpenBLAS, masks merged as additive floats, weights averaged over heads.
#include "nn/layers/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "core/generator.h"
#include "core/init.h"
#include "nn/kernels/blas.h"
#include "nn/kernels/elementwise.h"
#include "nn/kernels/parallel.h"
#include "nn/kernels/vector_math.h"
#include "nn/layer_registry.h"
#include "nn/layers/build_util.h"
#include "nn/layers/forward_util.h"
#include "nn/layers/linear.h"
#include "nn/layers/param_check.h"

namespace modelstate::internal {
namespace {

absl::Status CheckNonNegative(absl::string_view what, int64_t value) {
  if (value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be non-negative, got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<Module>> MakeMultiheadAttention(
    const MhaConfig& c, BuildContext& ctx, const std::string& path) {
  MODELSTATE_RETURN_IF_ERROR(CheckNonNegative("embed_dim", c.embed_dim));
  // torch 1.13's __init__ computes embed_dim // num_heads, and its
  // _reset_parameters a xavier_uniform_ of a [0, 0] weight when embed_dim
  // is 0: both raise ZeroDivisionError from the constructor.
  if (c.num_heads == 0) {
    return absl::InvalidArgumentError(
        "MultiheadAttention: argument 'num_heads' must not be 0 (embed_dim "
        "// num_heads raises ZeroDivisionError: integer division or modulo "
        "by zero)");
  }
  if (c.embed_dim == 0) {
    return absl::InvalidArgumentError(
        "MultiheadAttention: argument 'embed_dim' must not be 0 "
        "(_reset_parameters' xavier_uniform_ raises ZeroDivisionError: float "
        "division by zero)");
  }
  if (c.num_heads <= 0 || c.embed_dim % c.num_heads != 0) {
    return absl::InvalidArgumentError(
        "embed_dim must be divisible by num_heads");
  }
  const int64_t e = c.embed_dim;
  const bool same = c.kdim == e && c.vdim == e;
  Tensor in_proj_weight, q, k, v, in_proj_bias, bias_k, bias_v;
  // Allocation follows __init__; random draws follow it too: out_proj's own
  // reset first (it is constructed inside __init__), then
  // _reset_parameters().
  if (same) {
    MODELSTATE_ASSIGN_OR_RETURN(in_proj_weight,
                                ctx.NewTensor(c.dtype, {3 * e, e}, c.device));
  } else {
    MODELSTATE_ASSIGN_OR_RETURN(q, ctx.NewTensor(c.dtype, {e, e}, c.device));
    MODELSTATE_ASSIGN_OR_RETURN(k,
                                ctx.NewTensor(c.dtype, {e, c.kdim}, c.device));
    MODELSTATE_ASSIGN_OR_RETURN(v,
                                ctx.NewTensor(c.dtype, {e, c.vdim}, c.device));
  }
  if (c.bias) {
    MODELSTATE_ASSIGN_OR_RETURN(in_proj_bias,
                                ctx.NewTensor(c.dtype, {3 * e}, c.device));
  }
  MODELSTATE_ASSIGN_OR_RETURN(
      LinearTensors out_proj,
      MakeLinearTensors(e, e, c.bias, c.dtype, c.device, ctx));
  if (c.add_bias_kv) {
    MODELSTATE_ASSIGN_OR_RETURN(bias_k,
                                ctx.NewTensor(c.dtype, {1, 1, e}, c.device));
    MODELSTATE_ASSIGN_OR_RETURN(bias_v,
                                ctx.NewTensor(c.dtype, {1, 1, e}, c.device));
  }
  if (same) {
    MODELSTATE_RETURN_IF_ERROR(XavierUniform(in_proj_weight, 1.0, ctx.gen()));
  } else {
    MODELSTATE_RETURN_IF_ERROR(XavierUniform(q, 1.0, ctx.gen()));
    MODELSTATE_RETURN_IF_ERROR(XavierUniform(k, 1.0, ctx.gen()));
    MODELSTATE_RETURN_IF_ERROR(XavierUniform(v, 1.0, ctx.gen()));
  }
  if (c.bias) {
    MODELSTATE_RETURN_IF_ERROR(ConstantInit(in_proj_bias, 0.0));
    MODELSTATE_RETURN_IF_ERROR(ConstantInit(out_proj.bias, 0.0));
  }
  if (c.add_bias_kv) {
    MODELSTATE_RETURN_IF_ERROR(XavierNormal(bias_k, 1.0, ctx.gen()));
    MODELSTATE_RETURN_IF_ERROR(XavierNormal(bias_v, 1.0, ctx.gen()));
  }

  std::shared_ptr<Module> m = NewLayer("MultiheadAttention", "activation");
  m->SetPlainAttribute("embed_dim", e);
  m->SetPlainAttribute("kdim", c.kdim);
  m->SetPlainAttribute("vdim", c.vdim);
  m->SetPlainAttribute("_qkv_same_embed_dim", same);
  m->SetPlainAttribute("num_heads", c.num_heads);
  m->SetPlainAttribute("dropout", c.dropout);
  m->SetPlainAttribute("batch_first", c.batch_first);
  m->SetPlainAttribute("head_dim", e / c.num_heads);
  m->AddClassAttributes(
      {"_reset_parameters", "__constants__", "merge_masks", "__setstate__"});
  if (same) {
    MODELSTATE_RETURN_IF_ERROR(
        ctx.AddParameter(*m, path, "in_proj_weight", in_proj_weight));
    MODELSTATE_RETURN_IF_ERROR(ctx.AddParameter(*m, path, "q_proj_weight", {}));
    MODELSTATE_RETURN_IF_ERROR(ctx.AddParameter(*m, path, "k_proj_weight", {}));
    MODELSTATE_RETURN_IF_ERROR(ctx.AddParameter(*m, path, "v_proj_weight", {}));
  } else {
    MODELSTATE_RETURN_IF_ERROR(ctx.AddParameter(*m, path, "q_proj_weight", q));
    MODELSTATE_RETURN_IF_ERROR(ctx.AddParameter(*m, path, "k_proj_weight", k));
    MODELSTATE_RETURN_IF_ERROR(ctx.AddParameter(*m, path, "v_proj_weight", v));
    MODELSTATE_RETURN_IF_ERROR(
        ctx.AddParameter(*m, path, "in_proj_weight", {}));
  }
  MODELSTATE_RETURN_IF_ERROR(
      ctx.AddParameter(*m, path, "in_proj_bias", in_proj_bias));
  std::string out_path = ChildPath(path, "out_proj");
  std::shared_ptr<Module> out =
      NewLinearModule("NonDynamicallyQuantizableLinear", e, e);
  MODELSTATE_RETURN_IF_ERROR(RegisterLinear(*out, out_path, out_proj, ctx));
  MODELSTATE_RETURN_IF_ERROR(ctx.AddModule(*m, path, "out_proj", out));
  if (c.add_bias_kv) {
    MODELSTATE_RETURN_IF_ERROR(ctx.AddParameter(*m, path, "bias_k", bias_k));
    MODELSTATE_RETURN_IF_ERROR(ctx.AddParameter(*m, path, "bias_v", bias_v));
  } else {
    // `self.bias_k = self.bias_v = None` on new names: plain attributes.
    m->SetPlainAttribute("bias_k", std::monostate());
    m->SetPlainAttribute("bias_v", std::monostate());
  }
  m->SetPlainAttribute("add_zero_attn", c.add_zero_attn);
  return m;
}

namespace {

absl::StatusOr<std::shared_ptr<Module>> BuildMultiheadAttention(
    const BoundArgs& args, BuildContext& ctx, const std::string& path) {
  MhaConfig c;
  MODELSTATE_ASSIGN_OR_RETURN(c.embed_dim, args.Int("embed_dim"));
  MODELSTATE_ASSIGN_OR_RETURN(c.num_heads, args.Int("num_heads"));
  MODELSTATE_ASSIGN_OR_RETURN(c.dropout, args.Float("dropout"));
  MODELSTATE_ASSIGN_OR_RETURN(c.bias, args.Bool("bias"));
  MODELSTATE_ASSIGN_OR_RETURN(c.add_bias_kv, args.Bool("add_bias_kv"));
  MODELSTATE_ASSIGN_OR_RETURN(c.add_zero_attn, args.Bool("add_zero_attn"));
  c.kdim = c.embed_dim;
  c.vdim = c.embed_dim;
  if (!args.IsNone("kdim")) {
    MODELSTATE_ASSIGN_OR_RETURN(c.kdim, args.Int("kdim"));
  }
  if (!args.IsNone("vdim")) {
    MODELSTATE_ASSIGN_OR_RETURN(c.vdim, args.Int("vdim"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(c.batch_first, args.Bool("batch_first"));
  MODELSTATE_ASSIGN_OR_RETURN(FactoryKwargs factory,
                              args.Factory(ctx.options()));
  c.dtype = factory.dtype;
  c.device = factory.device;
  return MakeMultiheadAttention(c, ctx, path);
}

// ---------------------------------------------------------------------------
// Forward.

// x [rows, in] * w[out, in]^T + b as a new [rows, out] buffer.
template <typename T>
std::vector<T> Project(const T* x, int64_t rows, int64_t in, const T* w,
                       int64_t out, const T* b) {
  std::vector<T> y(static_cast<size_t>(rows * out));
  LinearRows(x, rows, in, w, out, b, y.data());
  return y;
}

// A [L, N, E] (sequence first) tensor's data in [N, L, E] order: copied
// into `buffer`, or the data itself when it is in that order already
// (batch first, or a batch of one).
template <typename T>
const T* BatchMajor(const T* x, int64_t l, int64_t n, int64_t e,
                    bool batch_first, std::vector<T>& buffer) {
  if (batch_first || n == 1) return x;
  buffer.resize(static_cast<size_t>(l * n * e));
  for (int64_t li = 0; li < l; ++li) {
    for (int64_t ni = 0; ni < n; ++ni) {
      std::copy(x + (li * n + ni) * e, x + (li * n + ni + 1) * e,
                buffer.begin() + (ni * l + li) * e);
    }
  }
  return buffer.data();
}

// Turns a mask into the additive float mask PyTorch merges: a bool mask
// gives -inf where true, a float mask is used as is.
template <typename T>
absl::StatusOr<std::vector<T>> AdditiveMask(const Tensor& mask,
                                            absl::string_view name) {
  std::vector<T> out(static_cast<size_t>(mask.numel()));
  if (mask.dtype() == DType::kBool) {
    const uint8_t* p = mask.data<uint8_t>();
    for (int64_t i = 0; i < mask.numel(); ++i) {
      out[i] = p[i] ? -std::numeric_limits<T>::infinity() : T(0);
    }
  } else if (IsFloatingPoint(mask.dtype())) {
    MODELSTATE_ASSIGN_OR_RETURN(Tensor m, ToDType(mask, DTypeOf<T>()));
    std::copy(m.data<T>(), m.data<T>() + m.numel(), out.begin());
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "only bool and floating types of ", name, " are supported"));
  }
  return out;
}

// Attention under a mask that ends every query row in a run of -inf (a
// causal mask hides all keys after the query) need not score those keys:
// their weights are exp(-inf) = 0 exactly. For each of the `l` query rows of
// the [l, s] additive `mask`, the number of keys before that tail, or an
// empty vector when nothing can be skipped. A row masked entirely keeps all
// its keys (it must come out NaN, as in PyTorch). Skipping is exact only if
// no skipped score is +inf or NaN (inf + -inf is NaN), which holds when q
// and k are finite and no |q . k| * scale can overflow (the bound
// hd * max|q| * max|k| * scale below a float's range guarantees it), and if
// no skipped value row holds inf or NaN (0 * inf is NaN in the full
// product).
template <typename T>
std::vector<int64_t> KeysBeforeMaskedTail(const std::vector<T>& mask, int64_t l,
                                          int64_t s, const std::vector<T>& q,
                                          const std::vector<T>& k,
                                          const std::vector<T>& v, int64_t hd,
                                          T scale) {
  if (mask.empty() || l == 0 || s == 0) return {};
  std::vector<int64_t> keys(static_cast<size_t>(l));
  bool any_tail = false;
  for (int64_t li = 0; li < l; ++li) {
    const T* row = mask.data() + li * s;
    int64_t end = s;
    while (end > 0 && row[end - 1] == -std::numeric_limits<T>::infinity()) {
      --end;
    }
    if (end == 0) end = s;
    any_tail |= end < s;
    keys[li] = end;
  }
  if (!any_tail) return {};
  auto max_abs = [](const std::vector<T>& v) -> T {
    if constexpr (std::is_same_v<T, float>) {
      return MaxAbs(v.data(), static_cast<int64_t>(v.size()));
    } else {
      T m = 0;
      for (T x : v) {
        if (std::isnan(x)) return std::numeric_limits<T>::infinity();
        m = std::max(m, std::abs(x));
      }
      return m;
    }
  };
  const double bound = static_cast<double>(hd) * max_abs(q) * max_abs(k) *
                       static_cast<double>(scale);
  if (!(bound < 1e30) || !(max_abs(v) < std::numeric_limits<T>::max())) {
    return {};
  }
  return keys;
}

// A block of query rows [begin, end) and how many leading keys any of its
// rows can see.
struct RowBlock {
  int64_t begin, end, keys;
};

// Query rows go in blocks that each multiply only the keys some row of
// theirs can see (row_keys from KeysBeforeMaskedTail); one block of every
// key when no tail is masked off (row_keys empty).
std::vector<RowBlock> RowBlocks(const std::vector<int64_t>& row_keys, int64_t l,
                                int64_t s_total) {
  std::vector<RowBlock> blocks;
  if (row_keys.empty()) {
    blocks.push_back({0, l, s_total});
    return blocks;
  }
  constexpr int64_t kRowsPerBlock = 128;
  for (int64_t b = 0; b < l; b += kRowsPerBlock) {
    const int64_t end = std::min(l, b + kRowsPerBlock);
    blocks.push_back(
        {b, end,
         *std::max_element(row_keys.begin() + b, row_keys.begin() + end)});
  }
  return blocks;
}

// The extents of one attention call, over [N, L, E] buffers (batch first
// internally; unbatched inputs are N = 1).
struct MhaDims {
  bool batched;
  bool batch_first;
  int64_t n;      // batch
  int64_t l;      // query length
  int64_t s;      // key and value length
  int64_t e;      // embed_dim
  int64_t ke;     // key features
  int64_t ve;     // value features
  int64_t heads;  // num_heads
  int64_t hd;     // head_dim
};

// Checks query, key and value against each other and embed_dim, as
// F.multi_head_attention_forward does, and gives their extents.
absl::StatusOr<MhaDims> MhaShapes(const Tensor& query, const Tensor& key,
                                  const Tensor& value, int64_t e, int64_t heads,
                                  bool batch_first) {
  MhaDims d;
  d.e = e;
  d.heads = heads;
  d.hd = e / heads;
  d.batch_first = batch_first;
  // Unbatched inputs are [L, E]; work on [N=1, L, E] either way.
  d.batched = query.dim() == 3;
  if (query.dim() != 3 && query.dim() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "query should be unbatched 2D or batched 3D tensor but received ",
        query.dim(), "-D query tensor"));
  }
  const bool batched = d.batched;
  if (key.dim() != query.dim() || value.dim() != query.dim()) {
    return absl::InvalidArgumentError(
        absl::StrCat("For ", batched ? "batched (3-D)" : "unbatched (2-D)",
                     " `query`, expected `key` and `value` to be ",
                     batched ? "3-D" : "2-D", " but found ", key.dim(),
                     "-D and ", value.dim(), "-D tensors respectively"));
  }
  auto dims = [&](const Tensor& t, int64_t& len, int64_t& n, int64_t& feat) {
    if (!batched) {
      len = t.shape()[0];
      n = 1;
    } else if (batch_first) {
      n = t.shape()[0];
      len = t.shape()[1];
    } else {
      len = t.shape()[0];
      n = t.shape()[1];
    }
    feat = t.shape().back();
  };
  int64_t qe, nk, sv, nv;
  dims(query, d.l, d.n, qe);
  dims(key, d.s, nk, d.ke);
  dims(value, sv, nv, d.ve);
  if (qe != e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "was expecting embedding dimension of ", e, ", but got ", qe));
  }
  if (nk != d.n || nv != d.n || d.s != sv) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key shape ", TorchSizeString(key.shape()),
        " does not match value shape ", TorchSizeString(value.shape())));
  }
  MODELSTATE_RETURN_IF_ERROR(
      CheckBlasDims({d.n * d.l, d.n * d.s, e, d.ke, d.ve}));
  return d;
}

// Query, keys and values after the input projections, [N, L or S, E] each.
template <typename T>
struct Projected {
  std::vector<T> q, k, v;
};

// The input projections: in_proj_weight's three blocks, or q/k/v_proj_weight
// when kdim or vdim differ from embed_dim.
template <typename T>
absl::StatusOr<Projected<T>> ProjectInputs(const Module& m, const MhaDims& d,
                                           const Tensor& query,
                                           const Tensor& key,
                                           const Tensor& value, DType dtype) {
  const int64_t n = d.n, l = d.l, s = d.s, e = d.e, ke = d.ke, ve = d.ve;
  const bool seq_first = d.batched && !d.batch_first;
  std::vector<T> q_buffer, k_buffer, v_buffer;
  const T* q_in = BatchMajor(Data<T>(query), l, n, e, !seq_first, q_buffer);
  const T* k_in = BatchMajor(Data<T>(key), s, n, ke, !seq_first, k_buffer);
  const T* v_in = BatchMajor(Data<T>(value), s, n, ve, !seq_first, v_buffer);

  // As F.multi_head_attention_forward: _qkv_same_embed_dim picks the packed
  // in_proj_weight or the three separate ones, each then required.
  MODELSTATE_ASSIGN_OR_RETURN(bool same, AttrBool(m, "_qkv_same_embed_dim"));
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor in_b,
      ShapedParam(m, "in_proj_bias", dtype, {3 * e}, Presence::kOptional));
  const T* bias = Data<T>(in_b);
  Projected<T> p;
  if (same) {
    MODELSTATE_ASSIGN_OR_RETURN(
        Tensor in_w, ShapedParam(m, "in_proj_weight", dtype, {3 * e, e},
                                 Presence::kRequired));
    if (ke != e || ve != e) {
      return absl::InvalidArgumentError(
          absl::StrCat("key and value must have embedding dimension ", e,
                       ", got ", ke, " and ", ve));
    }
    const T* w = Data<T>(in_w);
    p.q = Project(q_in, n * l, e, w, e, bias);
    p.k = Project(k_in, n * s, e, w + e * e, e, bias ? bias + e : nullptr);
    p.v = Project(v_in, n * s, e, w + 2 * e * e, e,
                  bias ? bias + 2 * e : nullptr);
    return p;
  }
  MODELSTATE_ASSIGN_OR_RETURN(int64_t kdim, AttrInt(m, "kdim"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t vdim, AttrInt(m, "vdim"));
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor qw,
      ShapedParam(m, "q_proj_weight", dtype, {e, e}, Presence::kRequired));
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor kw,
      ShapedParam(m, "k_proj_weight", dtype, {e, kdim}, Presence::kRequired));
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor vw,
      ShapedParam(m, "v_proj_weight", dtype, {e, vdim}, Presence::kRequired));
  if (ke != kw.shape()[1] || ve != vw.shape()[1]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key and value must have embedding dimensions ", kw.shape()[1], " and ",
        vw.shape()[1], ", got ", ke, " and ", ve));
  }
  p.q = Project(q_in, n * l, e, Data<T>(qw), e, bias);
  p.k = Project(k_in, n * s, ke, Data<T>(kw), e, bias ? bias + e : nullptr);
  p.v = Project(v_in, n * s, ve, Data<T>(vw), e, bias ? bias + 2 * e : nullptr);
  return p;
}

// The masks as additive floats: attn_mask [1 or N * heads, L, S] and
// key_padding_mask [N, S]; empty when not given.
template <typename T>
struct MhaMasks {
  std::vector<T> attn;
  int64_t attn_batches = 0;  // 1 or N * heads; 0 without attn_mask
  std::vector<T> padding;
};

template <typename T>
absl::StatusOr<MhaMasks<T>> MergeMasks(const Tensor& attn_mask,
                                       const Tensor& kpm, const MhaDims& d) {
  const int64_t n = d.n, l = d.l, s = d.s, heads = d.heads;
  MhaMasks<T> masks;
  if (attn_mask.defined()) {
    MODELSTATE_ASSIGN_OR_RETURN(masks.attn,
                                AdditiveMask<T>(attn_mask, "attn_mask"));
    if (attn_mask.dim() == 2) {
      if (attn_mask.shape() != Shape{l, s}) {
        return absl::InvalidArgumentError(
            absl::StrCat("The shape of the 2D attn_mask is ",
                         TorchSizeString(attn_mask.shape()),
                         ", but should be (", l, ", ", s, ")."));
      }
      masks.attn_batches = 1;
    } else if (attn_mask.dim() == 3) {
      if (attn_mask.shape() != Shape{n * heads, l, s}) {
        return absl::InvalidArgumentError(absl::StrCat(
            "The shape of the 3D attn_mask is ",
            TorchSizeString(attn_mask.shape()), ", but should be (", n * heads,
            ", ", l, ", ", s, ")."));
      }
      masks.attn_batches = n * heads;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "attn_mask's dimension ", attn_mask.dim(), " is not supported"));
    }
  }
  if (kpm.defined()) {
    Shape want = d.batched ? Shape{n, s} : Shape{s};
    if (kpm.shape() != want) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected shape of key_padding_mask to be ", Sizes(want),
                       ", but got ", Sizes(kpm.shape())));
    }
    MODELSTATE_ASSIGN_OR_RETURN(masks.padding,
                                AdditiveMask<T>(kpm, "key_padding_mask"));
  }
  return masks;
}

// bias_k / bias_v and add_zero_attn append a key and a value to each batch
// element (their mask columns stay unmasked). The number of keys after.
template <typename T>
absl::StatusOr<int64_t> AppendExtraKeys(const Module& m, const MhaDims& d,
                                        bool zero_attn, DType dtype,
                                        std::vector<T>& k, std::vector<T>& v) {
  const int64_t n = d.n, s = d.s, e = d.e;
  // F.multi_head_attention_forward takes both or neither (it asserts).
  const Presence extra =
      Entry(m, "bias_k").defined() || Entry(m, "bias_v").defined()
          ? Presence::kRequired
          : Presence::kOptional;
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor bk, ShapedParam(m, "bias_k", dtype, {1, 1, e}, extra));
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor bv, ShapedParam(m, "bias_v", dtype, {1, 1, e}, extra));
  int64_t s_total = s;
  if (bk.defined()) {
    std::vector<T> k2(static_cast<size_t>(n * (s + 1) * e));
    std::vector<T> v2(k2.size());
    for (int64_t ni = 0; ni < n; ++ni) {
      std::copy(k.begin() + ni * s * e, k.begin() + (ni + 1) * s * e,
                k2.begin() + ni * (s + 1) * e);
      std::copy(v.begin() + ni * s * e, v.begin() + (ni + 1) * s * e,
                v2.begin() + ni * (s + 1) * e);
      std::copy(Data<T>(bk), Data<T>(bk) + e,
                k2.begin() + (ni * (s + 1) + s) * e);
      std::copy(Data<T>(bv), Data<T>(bv) + e,
                v2.begin() + (ni * (s + 1) + s) * e);
    }
    k.swap(k2);
    v.swap(v2);
    s_total = s + 1;
  }
  if (zero_attn) {
    int64_t s2 = s_total + 1;
    std::vector<T> k2(static_cast<size_t>(n * s2 * e), T(0));
    std::vector<T> v2(k2.size(), T(0));
    for (int64_t ni = 0; ni < n; ++ni) {
      std::copy(k.begin() + ni * s_total * e,
                k.begin() + (ni + 1) * s_total * e, k2.begin() + ni * s2 * e);
      std::copy(v.begin() + ni * s_total * e,
                v.begin() + (ni + 1) * s_total * e, v2.begin() + ni * s2 * e);
    }
    k.swap(k2);
    v.swap(v2);
    s_total = s2;
  }
  return s_total;
}

// How the attention core runs.
struct AttendOptions {
  int64_t s_total;    // keys after AppendExtraKeys
  bool need_weights;  // accumulate the weights over heads
  double dropout_p;   // applied to the weights when > 0
  Generator* gen;     // for dropout
  int threads;
};

// The attention core, per (batch, head): scores = q k^T / sqrt(hd) + masks,
// softmax, dropout, times v, into attn_out [N, L, E] (heads are column
// blocks). With need_weights, the softmaxed scores summed over heads into
// weights_sum [N, L, S_total].
template <typename T>
void Attend(const MhaDims& d, const Projected<T>& p, const MhaMasks<T>& masks,
            const AttendOptions& o, std::vector<T>& attn_out,
            std::vector<T>& weights_sum) {
  const int64_t n = d.n, l = d.l, s = d.s, e = d.e, heads = d.heads, hd = d.hd,
                s_total = o.s_total;
  attn_out.assign(static_cast<size_t>(n * l * e), T(0));
  if (o.need_weights)
    weights_sum.assign(static_cast<size_t>(n * l * s_total), T(0));
  const bool drop = o.dropout_p > 0;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hd)));
  const std::vector<int64_t> row_keys =
      o.need_weights || drop || !masks.padding.empty() ||
              masks.attn_batches != 1 || s_total != s
          ? std::vector<int64_t>()
          : KeysBeforeMaskedTail(masks.attn, l, s, p.q, p.k, p.v, hd, scale);
  const std::vector<RowBlock> blocks = RowBlocks(row_keys, l, s_total);
  std::vector<int64_t> block_of_row(static_cast<size_t>(l));
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    std::fill(block_of_row.begin() + blocks[bi].begin,
              block_of_row.begin() + blocks[bi].end, static_cast<int64_t>(bi));
  }
  std::vector<T> scores(static_cast<size_t>(l * s_total));
  for (int64_t ni = 0; ni < n; ++ni) {
    for (int64_t h = 0; h < heads; ++h) {
      const T* qh = p.q.data() + ni * l * e + h * hd;
      const T* kh = p.k.data() + ni * s_total * e + h * hd;
      const T* vh = p.v.data() + ni * s_total * e + h * hd;
      for (const RowBlock& b : blocks) {
        Gemm(false, true, b.end - b.begin, b.keys, hd, scale, qh + b.begin * e,
             e, kh, e, T(0), scores.data() + b.begin * s_total, s_total);
      }
      const T* mask_rows =
          masks.attn.empty()
              ? nullptr
              : masks.attn.data() +
                    (masks.attn_batches == 1 ? 0 : ni * heads + h) * l * s;
      const T* pad_row =
          masks.padding.empty() ? nullptr : masks.padding.data() + ni * s;
      ParallelFor(l, o.threads, s_total * 3, [&](int64_t begin, int64_t end) {
        for (int64_t li = begin; li < end; ++li) {
          const int64_t keys = blocks[block_of_row[li]].keys;
          T* row = scores.data() + li * s_total;
          // The extra keys of bias_k / add_zero_attn get no mask.
          const int64_t masked = std::min(keys, s);
          if (mask_rows != nullptr) {
            const T* mask_row = mask_rows + li * s;
            for (int64_t si = 0; si < masked; ++si) row[si] += mask_row[si];
          }
          if (pad_row != nullptr) {
            for (int64_t si = 0; si < masked; ++si) row[si] += pad_row[si];
          }
          SoftmaxRow(row, keys);
        }
      });
      if (o.need_weights) {
        T* ws = weights_sum.data() + ni * l * s_total;
        for (int64_t i = 0; i < l * s_total; ++i) ws[i] += scores[i];
      }
      if (drop) {
        const double keep = 1.0 - o.dropout_p;
        const T inv = o.dropout_p >= 1 ? T(0) : static_cast<T>(1.0 / keep);
        Generator& g = *o.gen;
        for (int64_t i = 0; i < l * s_total; ++i) {
          double u = static_cast<double>(g.Random()) * (1.0 / 4294967296.0);
          scores[i] = u < keep ? scores[i] * inv : T(0);
        }
      }
      for (const RowBlock& b : blocks) {
        Gemm(false, false, b.end - b.begin, hd, b.keys, T(1),
             scores.data() + b.begin * s_total, s_total, vh, e, T(0),
             attn_out.data() + (ni * l + b.begin) * e + h * hd, e);
      }
    }
  }
}

// out_proj applied to attn_out [N, L, E] through its tensors, not called as
// a module (as in F.multi_head_attention_forward: its hooks do not fire),
// in the input's layout.
template <typename T>
absl::StatusOr<Tensor> ProjectOutput(const Module& m, const MhaDims& d,
                                     const std::vector<T>& attn_out,
                                     DType dtype) {
  const int64_t n = d.n, l = d.l, e = d.e;
  const std::shared_ptr<Module>* out_proj = m.children().Find("out_proj");
  if (out_proj == nullptr || *out_proj == nullptr) {
    return absl::FailedPreconditionError(
        "'MultiheadAttention' object has no submodule 'out_proj'");
  }
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor ow,
      ShapedParam(**out_proj, "weight", dtype, {e, e}, Presence::kRequired,
                  "MultiheadAttention.out_proj"));
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor ob,
      ShapedParam(**out_proj, "bias", dtype, {e}, Presence::kOptional,
                  "MultiheadAttention.out_proj"));
  Shape out_shape = !d.batched      ? Shape{l, e}
                    : d.batch_first ? Shape{n, l, e}
                                    : Shape{l, n, e};
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(out_shape));
  const bool seq_first = d.batched && !d.batch_first;
  if (seq_first && n > 1) {
    std::vector<T> proj =
        Project(attn_out.data(), n * l, e, Data<T>(ow), e, Data<T>(ob));
    for (int64_t ni = 0; ni < n; ++ni) {
      for (int64_t li = 0; li < l; ++li) {
        std::copy(proj.begin() + (ni * l + li) * e,
                  proj.begin() + (ni * l + li + 1) * e,
                  y.data + (li * n + ni) * e);
      }
    }
  } else {
    LinearRows(attn_out.data(), n * l, e, Data<T>(ow), e, Data<T>(ob), y.data);
  }
  return y.tensor;
}

// Inputs: [query, key, value, key_padding_mask?, attn_mask?]; outputs
// [attn_output, attn_weights averaged over heads (None without
// need_weights)].
template <typename T>
absl::StatusOr<std::vector<Tensor>> MultiheadAttentionForward(
    const LayerCall& call, const std::vector<Tensor>& in, DType dtype) {
  const Module& m = call.module;
  MODELSTATE_ASSIGN_OR_RETURN(int64_t e, AttrInt(m, "embed_dim"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t heads, AttrInt(m, "num_heads"));
  // The build refuses these; a module restored with them must not divide
  // by zero.
  MODELSTATE_RETURN_IF_ERROR(CheckAttrAtLeast(
      m, "num_heads", {heads}, 1, "embed_dim must be divisible by num_heads"));
  if (e % heads != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("MultiheadAttention.num_heads is ", heads,
                     ": embed_dim must be divisible by num_heads"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(double dropout_p, AttrDouble(m, "dropout"));
  MODELSTATE_ASSIGN_OR_RETURN(bool batch_first, AttrBool(m, "batch_first"));
  MODELSTATE_ASSIGN_OR_RETURN(bool zero_attn, AttrBool(m, "add_zero_attn"));
  for (size_t i = 0; i < 3; ++i) {
    if (in[i].dtype() != in[0].dtype()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expected query, key and value to have the same dtype, but got ",
          ScalarTypeName(in[0].dtype()), ", ", ScalarTypeName(in[1].dtype()),
          " and ", ScalarTypeName(in[2].dtype())));
    }
  }
  const Tensor kpm = in.size() > 3 ? in[3] : Tensor();
  const Tensor attn_mask = in.size() > 4 ? in[4] : Tensor();
  MODELSTATE_ASSIGN_OR_RETURN(
      MhaDims d, MhaShapes(in[0], in[1], in[2], e, heads, batch_first));
  MODELSTATE_ASSIGN_OR_RETURN(
      Projected<T> p, ProjectInputs<T>(m, d, in[0], in[1], in[2], dtype));
  MODELSTATE_ASSIGN_OR_RETURN(MhaMasks<T> masks,
                              MergeMasks<T>(attn_mask, kpm, d));
  AttendOptions o;
  MODELSTATE_ASSIGN_OR_RETURN(
      o.s_total, AppendExtraKeys(m, d, zero_attn, dtype, p.k, p.v));
  o.need_weights = call.flags.need_weights;
  o.dropout_p = m.is_training() ? dropout_p : 0.0;
  o.gen = &call.runner.gen();
  o.threads = call.runner.threads();
  std::vector<T> attn_out, weights_sum;
  Attend(d, p, masks, o, attn_out, weights_sum);
  MODELSTATE_ASSIGN_OR_RETURN(Tensor y, ProjectOutput(m, d, attn_out, dtype));
  std::vector<Tensor> out = {y, Tensor()};
  if (o.need_weights) {
    Shape ws = d.batched ? Shape{d.n, d.l, o.s_total} : Shape{d.l, o.s_total};
    MODELSTATE_ASSIGN_OR_RETURN(Out<T> wt, NewOut<T>(ws));
    const T inv_heads = T(1) / static_cast<T>(heads);
    for (size_t i = 0; i < weights_sum.size(); ++i) {
      wt.data[i] = weights_sum[i] * inv_heads;
    }
    out[1] = wt.tensor;
  }
  return out;
}

}  // namespace

std::vector<LayerDef> AttentionFamily() {
  return {
      {.type = "MultiheadAttention",
       .qualified_name = "torch.nn.modules.activation.MultiheadAttention",
       .signature = WithFactory({{"embed_dim", {}},
                                 {"num_heads", {}},
                                 {"dropout", F(0.0)},
                                 {"bias", B(true)},
                                 {"add_bias_kv", B(false)},
                                 {"add_zero_attn", B(false)},
                                 {"kdim", kNone},
                                 {"vdim", kNone},
                                 {"batch_first", B(false)}}),
       .build = &BuildMultiheadAttention,
       .forward = &FloatForward<&MultiheadAttentionForward<float>,
                                &MultiheadAttentionForward<double>,
                                FloatInputs{
                                    .min = 3, .max = 5, .mixed_dtypes = true}>},
  };
}

}  // namespace modelstate::internal
