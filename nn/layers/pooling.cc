// The pooling family: MaxPool1d/2d/3d, AvgPool1d/2d/3d,
// AdaptiveAvgPool1d/2d/3d, AdaptiveMaxPool1d/2d/3d and LPPool1d/2d. Modules
// without state (torch.nn.modules.pooling) that keep kernel_size, stride, ...
// as torch does (as given, or AvgPool1d's one-tuples). Every rank runs as a 3-d
// pooling whose leading window dims are 1, so one kernel per kind serves all
// three ranks; forward follows F.max_pool{1,2,3}d (ceil_mode, dilation,
// return_indices), F.avg_pool{1,2,3}d (count_include_pad, divisor_override) and
// the adaptive ones.
#include <algorithm>
#include <cmath>
#include <limits>
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

constexpr const char* kMaxPoolNames[] = {"", "MaxPool1d", "MaxPool2d",
                                         "MaxPool3d"};
constexpr const char* kAvgPoolNames[] = {"", "AvgPool1d", "AvgPool2d",
                                         "AvgPool3d"};
constexpr const char* kAdaptiveAvgNames[] = {
    "", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d"};
constexpr const char* kAdaptiveMaxNames[] = {
    "", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d"};

// ---------------------------------------------------------------------------
// Construction.

// _MaxPoolNd: every argument kept as given; stride defaults to kernel_size.
template <int kDims>
absl::StatusOr<std::shared_ptr<Module>> BuildMaxPool(const BoundArgs& args,
                                                     BuildContext&,
                                                     const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(AttrValue kernel,
                              args.IntOrTuple("kernel_size", 1));
  AttrValue stride = kernel;
  if (!args.IsNone("stride")) {
    MODELSTATE_ASSIGN_OR_RETURN(stride, args.IntOrTuple("stride", 1));
  }
  MODELSTATE_ASSIGN_OR_RETURN(AttrValue padding, args.IntOrTuple("padding", 0));
  MODELSTATE_ASSIGN_OR_RETURN(AttrValue dilation,
                              args.IntOrTuple("dilation", 1));
  MODELSTATE_ASSIGN_OR_RETURN(bool return_indices, args.Bool("return_indices"));
  MODELSTATE_ASSIGN_OR_RETURN(bool ceil_mode, args.Bool("ceil_mode"));
  std::shared_ptr<Module> m = NewStateless(kMaxPoolNames[kDims], "pooling");
  m->SetPlainAttribute("kernel_size", kernel);
  m->SetPlainAttribute("stride", stride);
  m->SetPlainAttribute("padding", padding);
  m->SetPlainAttribute("dilation", dilation);
  m->SetPlainAttribute("return_indices", return_indices);
  m->SetPlainAttribute("ceil_mode", ceil_mode);
  return m;
}

// AvgPool1d keeps _single(...) tuples; AvgPool2d/3d keep their arguments
// as given and have divisor_override (None or an int).
template <int kDims>
absl::StatusOr<std::shared_ptr<Module>> BuildAvgPool(const BoundArgs& args,
                                                     BuildContext&,
                                                     const std::string&) {
  AttrValue kernel, stride, padding;
  if (kDims == 1) {
    MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> k,
                                args.Ints("kernel_size", 1));
    kernel = k;
    stride = k;
    if (!args.IsNone("stride")) {
      MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> s,
                                  args.Ints("stride", 1));
      stride = s;
    }
    MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> p,
                                args.Ints("padding", 1));
    padding = p;
  } else {
    MODELSTATE_ASSIGN_OR_RETURN(kernel, args.IntOrTuple("kernel_size", 1));
    stride = kernel;
    if (!args.IsNone("stride")) {
      MODELSTATE_ASSIGN_OR_RETURN(stride, args.IntOrTuple("stride", 1));
    }
    MODELSTATE_ASSIGN_OR_RETURN(padding, args.IntOrTuple("padding", 0));
  }
  MODELSTATE_ASSIGN_OR_RETURN(bool ceil_mode, args.Bool("ceil_mode"));
  MODELSTATE_ASSIGN_OR_RETURN(bool count_include_pad,
                              args.Bool("count_include_pad"));
  std::shared_ptr<Module> m = NewStateless(kAvgPoolNames[kDims], "pooling");
  m->SetPlainAttribute("kernel_size", kernel);
  m->SetPlainAttribute("stride", stride);
  m->SetPlainAttribute("padding", padding);
  m->SetPlainAttribute("ceil_mode", ceil_mode);
  m->SetPlainAttribute("count_include_pad", count_include_pad);
  if (kDims > 1) {
    AttrValue divisor = std::monostate{};
    if (!args.IsNone("divisor_override")) {
      MODELSTATE_ASSIGN_OR_RETURN(int64_t d, args.Int("divisor_override"));
      divisor = d;
    }
    m->SetPlainAttribute("divisor_override", divisor);
  }
  return m;
}

template <int kDims, bool kMax>
absl::StatusOr<std::shared_ptr<Module>> BuildAdaptivePool(const BoundArgs& args,
                                                          BuildContext&,
                                                          const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(AttrValue size,
                              args.IntOrTuple("output_size", 0));
  std::shared_ptr<Module> m = NewStateless(
      kMax ? kAdaptiveMaxNames[kDims] : kAdaptiveAvgNames[kDims], "pooling");
  m->SetPlainAttribute("output_size", size);
  if (kMax) {
    MODELSTATE_ASSIGN_OR_RETURN(bool return_indices,
                                args.Bool("return_indices"));
    m->SetPlainAttribute("return_indices", return_indices);
  }
  return m;
}

// ---------------------------------------------------------------------------
// Forward.

// One pooling over the last `dims` dims of an input, as a 3-d one: the
// leading window dims of a 1-d or 2-d pooling are 1 (kernel, stride and
// dilation 1, padding 0), so flat indices into a plane stay torch's.
struct PoolGeometry {
  int64_t planes = 1;
  int64_t in[3] = {1, 1, 1};
  int64_t out[3] = {1, 1, 1};
  int64_t k[3] = {1, 1, 1};
  int64_t st[3] = {1, 1, 1};
  int64_t pd[3] = {0, 0, 0};
  int64_t dl[3] = {1, 1, 1};
  int64_t InPlane() const { return in[0] * in[1] * in[2]; }
  int64_t OutPlane() const { return out[0] * out[1] * out[2]; }
};

int64_t PoolFloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0))) --q;
  return q;
}

// ATen's pooling_output_shape.
int64_t PoolOutputSize(int64_t in, int64_t k, int64_t pad, int64_t stride,
                       int64_t dilation, bool ceil_mode) {
  int64_t o = PoolFloorDiv(in + 2 * pad - dilation * (k - 1) - 1 +
                               (ceil_mode ? stride - 1 : 0),
                           stride) +
              1;
  if (ceil_mode && (o - 1) * stride >= in + pad) --o;
  return o;
}

absl::Status CheckPoolInputRank(const Tensor& x, int dims) {
  if (x.dim() == dims + 1 || x.dim() == dims + 2) {
    bool empty = false;
    for (int64_t d = 1; d < x.dim(); ++d) empty |= x.shape()[d] == 0;
    if (!empty) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "non-empty ", dims + 1, "D or ", dims + 2,
      "D (batch mode) tensor expected for input, but got: ", Sizes(x.shape())));
}

// The stride attribute, or kernel_size where it is None or empty (a module
// pulled from torch 1.13 may carry stride=[] for "the default").
absl::StatusOr<std::vector<int64_t>> PoolStride(const Module& m, int dims,
                                                const std::vector<int64_t>& k) {
  const AttrValue* sv = m.attributes().Find("stride");
  bool empty = sv == nullptr || std::holds_alternative<std::monostate>(*sv) ||
               (std::holds_alternative<std::vector<int64_t>>(*sv) &&
                std::get<std::vector<int64_t>>(*sv).empty());
  if (empty) return k;
  return AttrInts(m, "stride", dims);
}

absl::StatusOr<PoolGeometry> CheckedPoolGeometry(
    const Tensor& x, int dims, const std::vector<int64_t>& k,
    const std::vector<int64_t>& st, const std::vector<int64_t>& pd,
    const std::vector<int64_t>& dl, bool with_dilation, bool ceil_mode);

// Reads kernel_size, stride, padding (and dilation when `with_dilation`),
// checks them with the input as ATen's pool shape checks do and sizes the
// output.
absl::StatusOr<PoolGeometry> WindowGeometry(const Module& m, const Tensor& x,
                                            int dims, bool with_dilation,
                                            bool ceil_mode) {
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> k,
                              AttrInts(m, "kernel_size", dims));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> st, PoolStride(m, dims, k));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> pd,
                              AttrInts(m, "padding", dims));
  std::vector<int64_t> dl(dims, 1);
  if (with_dilation) {
    MODELSTATE_ASSIGN_OR_RETURN(dl, AttrInts(m, "dilation", dims));
  }
  return CheckedPoolGeometry(x, dims, k, st, pd, dl, with_dilation, ceil_mode);
}

// The geometry of a window pooling with these arguments, checked with the
// input as ATen's pool shape checks do (`with_dilation`: max pooling's
// texts).
absl::StatusOr<PoolGeometry> CheckedPoolGeometry(
    const Tensor& x, int dims, const std::vector<int64_t>& k,
    const std::vector<int64_t>& st, const std::vector<int64_t>& pd,
    const std::vector<int64_t>& dl, bool with_dilation, bool ceil_mode) {
  MODELSTATE_RETURN_IF_ERROR(CheckPoolInputRank(x, dims));
  PoolGeometry g;
  g.planes = Prod(x.shape(), 0, x.dim() - dims);
  for (int d = 0; d < dims; ++d) {
    const int a = 3 - dims + d;
    if (k[d] <= 0 || st[d] <= 0 || dl[d] <= 0) {
      return absl::InvalidArgumentError(
          "kernel_size, stride and dilation should be greater than zero, "
          "but got kernel_size=" +
          absl::StrJoin(k, ",") + " stride=" + absl::StrJoin(st, ",") +
          " dilation=" + absl::StrJoin(dl, ","));
    }
    if (pd[d] < 0 || pd[d] > k[d] / 2) {
      // ATen 1.13's texts: max_pool1d has its own; the other poolings,
      // dilated or not, share one.
      if (dims == 1 && with_dilation) {
        return absl::InvalidArgumentError(absl::StrCat(
            "max_pool1d() padding should be at most half of kernel size, but "
            "got padding=",
            pd[d], " and kernel_size=", k[d]));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "pad should be at most half of kernel size, but got pad=", pd[d],
          " and kernel_size=", k[d]));
    }
    g.in[a] = x.shape()[x.dim() - dims + d];
    g.k[a] = k[d];
    g.st[a] = st[d];
    g.pd[a] = pd[d];
    g.dl[a] = dl[d];
    g.out[a] = PoolOutputSize(g.in[a], k[d], pd[d], st[d], dl[d], ceil_mode);
  }
  if (g.out[0] < 1 || g.out[1] < 1 || g.out[2] < 1) {
    std::vector<int64_t> in(g.in + 3 - dims, g.in + 3);
    std::vector<int64_t> out(g.out + 3 - dims, g.out + 3);
    const int64_t c = x.shape()[x.dim() - dims - 1];
    return absl::InvalidArgumentError(
        absl::StrCat("Given input size: (", c, "x", absl::StrJoin(in, "x"),
                     "). Calculated output size: (", c, "x",
                     absl::StrJoin(out, "x"), "). Output size is too small"));
  }
  return g;
}

Shape PooledShape(const Tensor& x, const PoolGeometry& g, int dims) {
  Shape shape = x.shape();
  for (int d = 0; d < dims; ++d) {
    shape[shape.size() - dims + d] = g.out[3 - dims + d];
  }
  return shape;
}

// Runs `at_output(src, idx, o)` for each output element o of each plane:
// src is the plane's input, idx the element's (d, h, w) in the output.
template <typename T, typename Fn>
void ForEachPoolOutput(const T* px, const PoolGeometry& g, Fn at_output) {
  const int64_t in_plane = g.InPlane(), out_plane = g.OutPlane();
  for (int64_t p = 0; p < g.planes; ++p) {
    const T* src = px + p * in_plane;
    int64_t o = p * out_plane;
    for (int64_t i = 0; i < g.out[0]; ++i) {
      for (int64_t j = 0; j < g.out[1]; ++j) {
        for (int64_t l = 0; l < g.out[2]; ++l, ++o) {
          const int64_t idx[3] = {i, j, l};
          at_output(src, idx, o);
        }
      }
    }
  }
}

// The maximum of each window of each plane into y, and where it is (a flat
// index into the plane) into `indices` unless null. A NaN wins its window,
// as in ATen. [lo, hi) per dim: the window's bounds for output o.
struct PoolMaxCandidate {
  template <typename T>
  void Offer(T v, int64_t at) {
    if (best_at >= 0 && std::isnan(static_cast<double>(best))) return;
    if (best_at < 0 || v > best || std::isnan(v)) {
      best = static_cast<double>(v);
      best_at = at;
    }
  }
  double best = -std::numeric_limits<double>::infinity();
  int64_t best_at = -1;
};

template <typename T>
void MaxPoolKernel(const T* px, const PoolGeometry& g, T* y, int64_t* indices) {
  ForEachPoolOutput(px, g, [&](const T* src, const int64_t* idx, int64_t o) {
    PoolMaxCandidate c;
    for (int64_t a = 0; a < g.k[0]; ++a) {
      int64_t di = idx[0] * g.st[0] - g.pd[0] + a * g.dl[0];
      if (di < 0 || di >= g.in[0]) continue;
      for (int64_t b = 0; b < g.k[1]; ++b) {
        int64_t hi = idx[1] * g.st[1] - g.pd[1] + b * g.dl[1];
        if (hi < 0 || hi >= g.in[1]) continue;
        for (int64_t e = 0; e < g.k[2]; ++e) {
          int64_t wi = idx[2] * g.st[2] - g.pd[2] + e * g.dl[2];
          if (wi < 0 || wi >= g.in[2]) continue;
          int64_t at = (di * g.in[1] + hi) * g.in[2] + wi;
          c.Offer(src[at], at);
        }
      }
    }
    y[o] = static_cast<T>(c.best);
    if (indices) indices[o] = c.best_at;
  });
}

// The output and, when the module returns them, the indices tensor that a
// max pooling fills.
template <typename T>
struct PoolMaxOutputs {
  Out<T> y;
  Tensor indices;
  int64_t* pi = nullptr;
  std::vector<Tensor> Tensors() const {
    std::vector<Tensor> out = {y.tensor};
    if (indices.defined()) out.push_back(indices);
    return out;
  }
};

template <typename T>
absl::StatusOr<PoolMaxOutputs<T>> NewPoolMaxOutputs(const Module& m,
                                                    Shape shape) {
  MODELSTATE_ASSIGN_OR_RETURN(bool return_indices,
                              AttrBool(m, "return_indices"));
  PoolMaxOutputs<T> out;
  MODELSTATE_ASSIGN_OR_RETURN(out.y, NewOut<T>(shape));
  if (return_indices) {
    MODELSTATE_ASSIGN_OR_RETURN(out.indices,
                                Tensor::Empty(DType::kInt64, shape));
    MODELSTATE_ASSIGN_OR_RETURN(void* raw,
                                out.indices.MutableDataForOverwrite());
    out.pi = static_cast<int64_t*>(raw);
  }
  return out;
}

template <typename T, int kDims>
absl::StatusOr<std::vector<Tensor>> MaxPoolForward(const LayerCall& call,
                                                   const Tensor& x, DType) {
  const Module& m = call.module;
  MODELSTATE_ASSIGN_OR_RETURN(bool ceil_mode, AttrBool(m, "ceil_mode"));
  MODELSTATE_ASSIGN_OR_RETURN(PoolGeometry g,
                              WindowGeometry(m, x, kDims, true, ceil_mode));
  MODELSTATE_ASSIGN_OR_RETURN(
      PoolMaxOutputs<T> out, NewPoolMaxOutputs<T>(m, PooledShape(x, g, kDims)));
  MaxPoolKernel(Data<T>(x), g, out.y.data, out.pi);
  return out.Tensors();
}

// F.avg_pool: the window's sum over the divisor_override, or over the
// window's size counting padding (count_include_pad; the part of the window
// past the padding never counts) or not.
template <typename T>
void AvgPoolKernel(const T* px, const PoolGeometry& g, bool count_include_pad,
                   int64_t divisor_override, T* y) {
  ForEachPoolOutput(px, g, [&](const T* src, const int64_t* idx, int64_t o) {
    int64_t lo[3], hi[3];
    int64_t padded = 1, inside = 1;
    for (int a = 0; a < 3; ++a) {
      lo[a] = idx[a] * g.st[a] - g.pd[a];
      hi[a] = std::min(lo[a] + g.k[a], g.in[a] + g.pd[a]);
      padded *= hi[a] - lo[a];
      lo[a] = std::max<int64_t>(lo[a], 0);
      hi[a] = std::min(hi[a], g.in[a]);
      inside *= std::max<int64_t>(hi[a] - lo[a], 0);
    }
    T sum = 0;
    for (int64_t a = lo[0]; a < hi[0]; ++a) {
      for (int64_t b = lo[1]; b < hi[1]; ++b) {
        for (int64_t c = lo[2]; c < hi[2]; ++c) {
          sum += src[(a * g.in[1] + b) * g.in[2] + c];
        }
      }
    }
    const int64_t divisor = divisor_override != 0 ? divisor_override
                            : count_include_pad   ? padded
                                                  : inside;
    y[o] = sum / static_cast<T>(divisor);
  });
}

template <typename T, int kDims>
absl::StatusOr<Tensor> AvgPoolForward(const LayerCall& call, const Tensor& x,
                                      DType) {
  const Module& m = call.module;
  MODELSTATE_ASSIGN_OR_RETURN(bool ceil_mode, AttrBool(m, "ceil_mode"));
  MODELSTATE_ASSIGN_OR_RETURN(bool count_include_pad,
                              AttrBool(m, "count_include_pad"));
  int64_t divisor = 0;
  if (kDims > 1 && !AttrIsNone(m, "divisor_override")) {
    MODELSTATE_ASSIGN_OR_RETURN(divisor, AttrInt(m, "divisor_override"));
    if (divisor == 0) {
      return absl::InvalidArgumentError("divisor must be not zero");
    }
  }
  MODELSTATE_ASSIGN_OR_RETURN(PoolGeometry g,
                              WindowGeometry(m, x, kDims, false, ceil_mode));
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(PooledShape(x, g, kDims)));
  AvgPoolKernel(Data<T>(x), g, count_include_pad, divisor, y.data);
  return y.tensor;
}

// Adaptive pooling: output_size (an int, or a tuple whose None elements
// keep the input's size) and the input's dims. Window o of n over `in`
// spans [floor(o * in / n), ceil((o + 1) * in / n)).
absl::StatusOr<PoolGeometry> AdaptiveGeometry(const Module& m, const Tensor& x,
                                              int dims, absl::string_view op) {
  MODELSTATE_ASSIGN_OR_RETURN(const AttrValue* v, Attr(m, "output_size"));
  std::vector<int64_t> size;
  if (const auto* list = std::get_if<std::vector<int64_t>>(v);
      list != nullptr && list->size() == static_cast<size_t>(dims)) {
    size = *list;
  } else {
    MODELSTATE_ASSIGN_OR_RETURN(size, AttrInts(m, "output_size", dims));
  }
  if (x.dim() != dims + 1 && x.dim() != dims + 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, "(): Expected ", dims + 1, "D or ", dims + 2,
                     "D tensor, but got ", Sizes(x.shape())));
  }
  PoolGeometry g;
  g.planes = Prod(x.shape(), 0, x.dim() - dims);
  for (int d = 0; d < dims; ++d) {
    const int a = 3 - dims + d;
    g.in[a] = x.shape()[x.dim() - dims + d];
    g.out[a] = size[d] < 0 ? g.in[a] : size[d];
    if (g.in[a] == 0) {
      // ATen runs the 1-d pools as 2-d ones on [..., 1, L]: its text names
      // that op and shape.
      Shape shown = x.shape();
      std::string name(op);
      int64_t empty_dim = x.dim() - dims + d;
      if (dims == 1) {
        shown.insert(shown.end() - 1, 1);
        name[name.size() - 2] = '2';  // "..._pool1d" -> "..._pool2d"
        empty_dim = x.dim();
      }
      return absl::InvalidArgumentError(absl::StrCat(
          name,
          "(): Expected input to have non-zero size for non-batch "
          "dimensions, but input has sizes ",
          Sizes(shown), " with dimension ", empty_dim, " being empty"));
    }
  }
  return g;
}

int64_t AdaptiveStart(int64_t o, int64_t in, int64_t out) {
  return (o * in) / out;
}
int64_t AdaptiveEnd(int64_t o, int64_t in, int64_t out) {
  return ((o + 1) * in + out - 1) / out;
}

// Runs `window(src, lo, hi, o)` for output element o of each plane.
template <typename T, typename Fn>
void ForEachAdaptiveWindow(const T* px, const PoolGeometry& g, Fn window) {
  ForEachPoolOutput(px, g, [&](const T* src, const int64_t* idx, int64_t o) {
    int64_t lo[3], hi[3];
    for (int a = 0; a < 3; ++a) {
      lo[a] = AdaptiveStart(idx[a], g.in[a], g.out[a]);
      hi[a] = AdaptiveEnd(idx[a], g.in[a], g.out[a]);
    }
    window(src, lo, hi, o);
  });
}

template <typename T, int kDims>
absl::StatusOr<Tensor> AdaptiveAvgPoolForward(const LayerCall& call,
                                              const Tensor& x, DType) {
  MODELSTATE_ASSIGN_OR_RETURN(
      PoolGeometry g, AdaptiveGeometry(call.module, x, kDims,
                                       kDims == 1   ? "adaptive_avg_pool1d"
                                       : kDims == 2 ? "adaptive_avg_pool2d"
                                                    : "adaptive_avg_pool3d"));
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(PooledShape(x, g, kDims)));
  ForEachAdaptiveWindow(
      Data<T>(x), g,
      [&](const T* src, const int64_t* lo, const int64_t* hi, int64_t o) {
        T sum = 0;
        for (int64_t a = lo[0]; a < hi[0]; ++a) {
          for (int64_t b = lo[1]; b < hi[1]; ++b) {
            for (int64_t c = lo[2]; c < hi[2]; ++c) {
              sum += src[(a * g.in[1] + b) * g.in[2] + c];
            }
          }
        }
        y.data[o] = sum / static_cast<T>((hi[0] - lo[0]) * (hi[1] - lo[1]) *
                                         (hi[2] - lo[2]));
      });
  return y.tensor;
}

template <typename T, int kDims>
absl::StatusOr<std::vector<Tensor>> AdaptiveMaxPoolForward(
    const LayerCall& call, const Tensor& x, DType) {
  const Module& m = call.module;
  MODELSTATE_ASSIGN_OR_RETURN(
      PoolGeometry g, AdaptiveGeometry(m, x, kDims,
                                       kDims == 1   ? "adaptive_max_pool1d"
                                       : kDims == 2 ? "adaptive_max_pool2d"
                                                    : "adaptive_max_pool3d"));
  MODELSTATE_ASSIGN_OR_RETURN(
      PoolMaxOutputs<T> out, NewPoolMaxOutputs<T>(m, PooledShape(x, g, kDims)));
  ForEachAdaptiveWindow(
      Data<T>(x), g,
      [&](const T* src, const int64_t* lo, const int64_t* hi, int64_t o) {
        PoolMaxCandidate c;
        for (int64_t a = lo[0]; a < hi[0]; ++a) {
          for (int64_t b = lo[1]; b < hi[1]; ++b) {
            for (int64_t e = lo[2]; e < hi[2]; ++e) {
              int64_t at = (a * g.in[1] + b) * g.in[2] + e;
              c.Offer(src[at], at);
            }
          }
        }
        out.y.data[o] = static_cast<T>(c.best);
        if (out.pi) out.pi[o] = c.best_at;
      });
  return out.Tensors();
}

// LPPool1d/2d(norm_type, kernel_size, stride=None, ceil_mode=False):
// every argument kept as given (stride None stays None).
template <int kDims>
absl::StatusOr<std::shared_ptr<Module>> BuildLPPool(const BoundArgs& args,
                                                    BuildContext&,
                                                    const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(double norm_type, args.Float("norm_type"));
  if (norm_type == 0) {
    // torch 1.13 builds it and every forward raises ZeroDivisionError.
    return absl::InvalidArgumentError(
        absl::StrCat(kDims == 1 ? "LPPool1d" : "LPPool2d",
                     ": argument 'norm_type' must not be 0 (forward computes "
                     "x ** (1 / norm_type): float division by zero)"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(AttrValue kernel,
                              args.IntOrTuple("kernel_size", 1));
  AttrValue stride = std::monostate{};
  if (!args.IsNone("stride")) {
    MODELSTATE_ASSIGN_OR_RETURN(stride, args.IntOrTuple("stride", 1));
  }
  MODELSTATE_ASSIGN_OR_RETURN(bool ceil_mode, args.Bool("ceil_mode"));
  std::shared_ptr<Module> m =
      NewStateless(kDims == 1 ? "LPPool1d" : "LPPool2d", "pooling");
  m->SetPlainAttribute("norm_type", norm_type);
  m->SetPlainAttribute("kernel_size", kernel);
  m->SetPlainAttribute("stride", stride);
  m->SetPlainAttribute("ceil_mode", ceil_mode);
  return m;
}

// F.lp_pool1d/2d: (avg_pool(x^p, no padding) * window size)^(1/p), the
// average dividing by the part of a ceil_mode window inside the input.
template <typename T, int kDims>
absl::StatusOr<Tensor> LPPoolForward(const LayerCall& call, const Tensor& x,
                                     DType) {
  const Module& m = call.module;
  MODELSTATE_ASSIGN_OR_RETURN(double p, AttrDouble(m, "norm_type"));
  if (p == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(m.type_name(), ".norm_type is 0: float division by zero"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(bool ceil_mode, AttrBool(m, "ceil_mode"));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> k,
                              AttrInts(m, "kernel_size", kDims));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> st, PoolStride(m, kDims, k));
  MODELSTATE_ASSIGN_OR_RETURN(
      PoolGeometry g,
      CheckedPoolGeometry(x, kDims, k, st, std::vector<int64_t>(kDims, 0),
                          std::vector<int64_t>(kDims, 1), false, ceil_mode));
  std::vector<T> powered(x.numel());
  const T* px = Data<T>(x);
  for (int64_t i = 0; i < x.numel(); ++i) {
    powered[i] = std::pow(px[i], static_cast<T>(p));
  }
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(PooledShape(x, g, kDims)));
  AvgPoolKernel(powered.data(), g, true, 0, y.data);
  const T window = static_cast<T>(Prod(Shape(k.begin(), k.end()), 0, kDims));
  for (int64_t i = 0; i < y.tensor.numel(); ++i) {
    y.data[i] = std::pow(y.data[i] * window, static_cast<T>(1.0 / p));
  }
  return y.tensor;
}

std::string PoolingName(absl::string_view type) {
  return absl::StrCat("torch.nn.modules.pooling.", type);
}

template <int kDims>
void AddPoolingDims(std::vector<LayerDef>& defs) {
  static const std::string max_name = PoolingName(kMaxPoolNames[kDims]);
  static const std::string avg_name = PoolingName(kAvgPoolNames[kDims]);
  static const std::string aavg_name = PoolingName(kAdaptiveAvgNames[kDims]);
  static const std::string amax_name = PoolingName(kAdaptiveMaxNames[kDims]);
  std::vector<ArgDef> avg_args = {{"kernel_size", {}},
                                  {"stride", kNone},
                                  {"padding", I(0)},
                                  {"ceil_mode", B(false)},
                                  {"count_include_pad", B(true)}};
  if (kDims > 1) avg_args.push_back({"divisor_override", kNone});
  defs.push_back({.type = kMaxPoolNames[kDims],
                  .qualified_name = max_name,
                  .signature = {{"kernel_size", {}},
                                {"stride", kNone},
                                {"padding", I(0)},
                                {"dilation", I(1)},
                                {"return_indices", B(false)},
                                {"ceil_mode", B(false)}},
                  .build = &BuildMaxPool<kDims>,
                  .forward = &FloatForward<&MaxPoolForward<float, kDims>,
                                           &MaxPoolForward<double, kDims>>});
  defs.push_back({.type = kAvgPoolNames[kDims],
                  .qualified_name = avg_name,
                  .signature = avg_args,
                  .build = &BuildAvgPool<kDims>,
                  .forward = &FloatForward<&AvgPoolForward<float, kDims>,
                                           &AvgPoolForward<double, kDims>>});
  defs.push_back(
      {.type = kAdaptiveAvgNames[kDims],
       .qualified_name = aavg_name,
       .signature = {{"output_size", {}}},
       .build = &BuildAdaptivePool<kDims, false>,
       .forward = &FloatForward<&AdaptiveAvgPoolForward<float, kDims>,
                                &AdaptiveAvgPoolForward<double, kDims>>});
  defs.push_back(
      {.type = kAdaptiveMaxNames[kDims],
       .qualified_name = amax_name,
       .signature = {{"output_size", {}}, {"return_indices", B(false)}},
       .build = &BuildAdaptivePool<kDims, true>,
       .forward = &FloatForward<&AdaptiveMaxPoolForward<float, kDims>,
                                &AdaptiveMaxPoolForward<double, kDims>>});
}

}  // namespace

std::vector<LayerDef> PoolingFamily() {
  std::vector<LayerDef> defs;
  AddPoolingDims<2>(defs);  // MaxPool2d and AdaptiveAvgPool2d came first.
  AddPoolingDims<1>(defs);
  AddPoolingDims<3>(defs);
  for (int dims : {1, 2}) {
    defs.push_back(
        {.type = dims == 1 ? "LPPool1d" : "LPPool2d",
         .qualified_name = dims == 1 ? "torch.nn.modules.pooling.LPPool1d"
                                     : "torch.nn.modules.pooling.LPPool2d",
         .signature = {{"norm_type", {}},
                       {"kernel_size", {}},
                       {"stride", kNone},
                       {"ceil_mode", B(false)}},
         .build = dims == 1 ? &BuildLPPool<1> : &BuildLPPool<2>,
         .forward = dims == 1 ? &FloatForward<&LPPoolForward<float, 1>,
                                              &LPPoolForward<double, 1>>
                              : &FloatForward<&LPPoolForward<float, 2>,
                                              &LPPoolForward<double, 2>>});
  }
  return defs;
}

}  // namespace modelstate::internal
