// The upsampling family: Upsample, UpsamplingNearest2d and
// UpsamplingBilinear2d (torch.nn.modules.upsampling). Modules without state
// keeping torch 1.13's attributes as given (size as passed, scale_factor as
// a float or a tuple of floats); forward is F.interpolate: its Python checks
// and their texts, the output-size rule (floor(in * scale), or the given
// size), then ATen's CPU kernels' source-index formulas for the modes
// nearest, nearest-exact, (bi/tri)linear, bicubic and area.
//
// Every mode is separable: the output is computed one spatial dim at a
// time, each output element a weighted sum of "taps" of the input along that
// dim (nearest: one tap; linear: two; cubic: four, clamped at the edges;
// area: the adaptive-average window).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
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

// ---------------------------------------------------------------------------
// Construction.

// Upsample.__init__: name, size, scale_factor (float(s) if s else None, a
// tuple's elements as floats), mode, align_corners, recompute_scale_factor.
// Like torch, nothing is checked beyond the arguments' types: F.interpolate
// checks them on every forward.
absl::StatusOr<std::shared_ptr<Module>> MakeUpsample(const char* type,
                                                     const BoundArgs& args,
                                                     std::string mode,
                                                     AttrValue align_corners) {
  AttrValue size, scale;
  if (!args.IsNone("size")) {
    MODELSTATE_ASSIGN_OR_RETURN(size, args.IntOrTuple("size", INT64_MIN));
  }
  if (!args.IsNone("scale_factor")) {
    MODELSTATE_ASSIGN_OR_RETURN(scale, args.FloatOrTuple("scale_factor"));
    if (const double* s = std::get_if<double>(&scale); s && *s == 0.0) {
      scale = std::monostate();  // Python's `if scale_factor`.
    }
  }
  std::shared_ptr<Module> m = NewStateless(type, "upsampling");
  m->SetPlainAttribute("name", std::string(type));
  m->SetPlainAttribute("size", std::move(size));
  m->SetPlainAttribute("scale_factor", std::move(scale));
  m->SetPlainAttribute("mode", std::move(mode));
  m->SetPlainAttribute("align_corners", std::move(align_corners));
  AttrValue recompute;
  if (!args.IsNone("recompute_scale_factor")) {
    MODELSTATE_ASSIGN_OR_RETURN(recompute, args.Bool("recompute_scale_factor"));
  }
  m->SetPlainAttribute("recompute_scale_factor", std::move(recompute));
  return m;
}

absl::StatusOr<std::shared_ptr<Module>> BuildUpsample(const BoundArgs& args,
                                                      BuildContext&,
                                                      const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(std::string mode, args.Str("mode"));
  AttrValue align_corners;
  if (!args.IsNone("align_corners")) {
    MODELSTATE_ASSIGN_OR_RETURN(align_corners, args.Bool("align_corners"));
  }
  return MakeUpsample("Upsample", args, std::move(mode),
                      std::move(align_corners));
}

template <bool kBilinear>
absl::StatusOr<std::shared_ptr<Module>> BuildUpsampling2d(const BoundArgs& args,
                                                          BuildContext&,
                                                          const std::string&) {
  if (kBilinear) {
    return MakeUpsample("UpsamplingBilinear2d", args, "bilinear", true);
  }
  return MakeUpsample("UpsamplingNearest2d", args, "nearest", AttrValue());
}

// ---------------------------------------------------------------------------
// F.interpolate's plan: the output size and the scale the kernel is given
// for each spatial dim.

struct UpsamplePlan {
  std::string mode;
  bool align_corners = false;
  std::vector<int64_t> in;                   // spatial input sizes
  std::vector<int64_t> out;                  // spatial output sizes
  std::vector<std::optional<double>> scale;  // the kernel's scales
};

// Python's repr of a float ("2.0", "1.5", "1e-05").
std::string UpsamplePyFloat(double v) {
  char buf[32];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (std::isfinite(v) && s.find_first_of(".e") == std::string::npos) {
    s += ".0";
  }
  return s;
}

// A tuple as Python prints it: "(3,)", "(2.0, 1.5)".
template <typename V, typename Fmt>
std::string UpsamplePyTuple(const std::vector<V>& values, Fmt fmt) {
  std::vector<std::string> parts;
  for (const V& v : values) parts.push_back(fmt(v));
  if (parts.size() == 1) return absl::StrCat("(", parts[0], ",)");
  return absl::StrCat("(", absl::StrJoin(parts, ", "), ")");
}

std::string SpatialList(const Tensor& x) {
  std::vector<int64_t> dims;
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(x.shape()[d]);
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

constexpr char kFormatHint[] =
    "Please provide input tensor in (N, C, d1, d2, ...,dK) format and ";

// The output sizes and scales of interpolate's size / scale_factor block.
absl::Status PlanSizes(const Module& m, const Tensor& x, int dims,
                       bool recompute, UpsamplePlan& plan) {
  MODELSTATE_ASSIGN_OR_RETURN(const AttrValue* size, Attr(m, "size"));
  MODELSTATE_ASSIGN_OR_RETURN(const AttrValue* scale, Attr(m, "scale_factor"));
  const bool has_size = !std::holds_alternative<std::monostate>(*size);
  const bool has_scale = !std::holds_alternative<std::monostate>(*scale);
  const size_t n = dims < 0 ? 0 : static_cast<size_t>(dims);
  std::vector<double> scales;
  if (has_size && has_scale) {
    return absl::InvalidArgumentError(
        "only one of size or scale_factor should be defined");
  } else if (has_size) {
    if (const auto* t = std::get_if<std::vector<int64_t>>(size)) {
      if (t->size() != n) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Input and output must have the same number of spatial "
            "dimensions, but got input with spatial dimensions of ",
            SpatialList(x), " and output size of ",
            UpsamplePyTuple(*t, [](int64_t v) { return absl::StrCat(v); }),
            ". ", kFormatHint, "output size in (o1, o2, ...,oK) format."));
      }
      plan.out = *t;
    } else {
      MODELSTATE_ASSIGN_OR_RETURN(int64_t s, AttrInt(m, "size"));
      plan.out.assign(n, s);
    }
  } else if (has_scale) {
    if (const auto* t = std::get_if<std::vector<double>>(scale)) {
      if (t->size() != n) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Input and scale_factor must have the same number of spatial "
            "dimensions, but got input with spatial dimensions of ",
            SpatialList(x), " and scale_factor of shape ",
            UpsamplePyTuple(*t, &UpsamplePyFloat), ". ", kFormatHint,
            "scale_factor in (s1, s2, ...,sK) format."));
      }
      scales = *t;
    } else {
      MODELSTATE_ASSIGN_OR_RETURN(double s, AttrDouble(m, "scale_factor"));
      scales.assign(n, s);
    }
  } else {
    return absl::InvalidArgumentError(
        "either size or scale_factor should be defined");
  }
  if (recompute && has_size) {
    return absl::InvalidArgumentError(
        "recompute_scale_factor is not meaningful with an explicit size.");
  }
  // "area" always works from a size: recompute_scale_factor's path.
  recompute = recompute || (plan.mode == "area" && !has_size);
  for (size_t d = 0; d < n; ++d) {
    const int64_t in = x.shape()[d + 2];
    plan.in.push_back(in);
    if (has_size) {
      plan.scale.push_back(std::nullopt);
      continue;
    }
    // Python's int(math.floor(float(in) * s)) when recomputing, else ATen's
    // conversion of in * s to int64 (truncation); the kernel then gets the
    // scale, or none (in / out) when recomputing.
    const double o = static_cast<double>(in) * scales[d];
    plan.out.push_back(static_cast<int64_t>(recompute ? std::floor(o) : o));
    plan.scale.push_back(recompute ? std::nullopt
                                   : std::optional<double>(scales[d]));
  }
  return absl::OkStatus();
}

// Which input ranks a mode runs on (0: any of 3-d, 4-d, 5-d); -1 for a mode
// interpolate does not know.
int ModeRank(const std::string& mode) {
  if (mode == "nearest" || mode == "nearest-exact" || mode == "area") return 0;
  if (mode == "linear") return 3;
  if (mode == "bilinear" || mode == "bicubic") return 4;
  if (mode == "trilinear") return 5;
  return -1;
}

absl::Status CheckModeRank(const std::string& mode, int64_t rank) {
  const int want = ModeRank(mode);
  if (want == 0 && rank >= 3 && rank <= 5) return absl::OkStatus();
  if (want == rank) return absl::OkStatus();
  if (want > 0 && mode != "bicubic" && rank >= 3 && rank <= 5) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Got ", rank, "D input, but ", mode, " mode needs ", want, "D input"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "Input Error: Only 3D, 4D and 5D input Tensors supported (got ", rank,
      "D) for the modes: nearest | linear | bilinear | bicubic | trilinear | "
      "area | nearest-exact (got ",
      mode, ")"));
}

// ATen's checks of the upsample kernels (all modes but area).
absl::Status CheckKernelSizes(const Tensor& x, const UpsamplePlan& plan) {
  bool positive = true;
  for (size_t d = 0; d < plan.in.size(); ++d) {
    positive = positive && plan.in[d] > 0 && plan.out[d] > 0;
  }
  if (!positive) {
    static constexpr const char* kNames[3][3] = {
        {"W"}, {"H", "W"}, {"D", "H", "W"}};
    const size_t n = plan.in.size();
    std::vector<std::string> in, out;
    for (size_t d = 0; d < n; ++d) {
      in.push_back(absl::StrCat(kNames[n - 1][d], ": ", plan.in[d]));
      out.push_back(absl::StrCat(kNames[n - 1][d], ": ", plan.out[d]));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "Input and output sizes should be greater than 0, but got input (",
        absl::StrJoin(in, ", "), n == 1 ? ") and output (" : ") output (",
        absl::StrJoin(out, ", "), ")"));
  }
  if (x.numel() == 0 && Prod(x.shape(), 1, x.dim()) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Non-empty ", x.dim(),
                     "D data tensor expected but got a tensor with sizes ",
                     Sizes(x.shape())));
  }
  return absl::OkStatus();
}

// adaptive_avg_pool2d/3d's checks, which "area" runs into (a 1-d input is
// pooled as [N, C, 1, W]).
absl::Status CheckAreaSizes(const Tensor& x, const UpsamplePlan& plan) {
  const size_t n = plan.in.size();
  const char* op = n == 3 ? "adaptive_avg_pool3d" : "adaptive_avg_pool2d";
  std::vector<int64_t> out = plan.out;
  Shape shown = x.shape();
  if (n == 1) {
    out.insert(out.begin(), 1);
    shown.insert(shown.begin() + 2, 1);
  }
  for (int64_t o : out) {
    if (o >= 0) continue;
    std::string sizes = absl::StrJoin(out, ", ");
    if (out.size() == 3) {
      sizes = absl::StrCat(out[0], ", ", out[1], ",", out[2]);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": elements of output_size must be greater than or equal to 0 ",
        "but received {", sizes, "}"));
  }
  for (size_t d = 2; d < shown.size(); ++d) {
    if (shown[d] != 0) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        op,
        "(): Expected input to have non-zero size for non-batch dimensions, "
        "but input has sizes ",
        Sizes(shown), " with dimension ", d, " being empty"));
  }
  return absl::OkStatus();
}

// interpolate(input, size, scale_factor, mode, align_corners,
// recompute_scale_factor): its checks in its order, then the kernel's.
absl::StatusOr<UpsamplePlan> PlanUpsample(const Module& m, const Tensor& x) {
  UpsamplePlan plan;
  MODELSTATE_ASSIGN_OR_RETURN(plan.mode, AttrStr(m, "mode"));
  const bool point_mode = plan.mode == "nearest" || plan.mode == "area" ||
                          plan.mode == "nearest-exact";
  if (!AttrIsNone(m, "align_corners")) {
    if (point_mode) {
      return absl::InvalidArgumentError(
          "align_corners option can only be set with the interpolating "
          "modes: linear | bilinear | bicubic | trilinear");
    }
    MODELSTATE_ASSIGN_OR_RETURN(plan.align_corners,
                                AttrBool(m, "align_corners"));
  }
  bool recompute = false;
  if (!AttrIsNone(m, "recompute_scale_factor")) {
    MODELSTATE_ASSIGN_OR_RETURN(recompute,
                                AttrBool(m, "recompute_scale_factor"));
  }
  const int dims = static_cast<int>(x.dim()) - 2;
  MODELSTATE_RETURN_IF_ERROR(PlanSizes(m, x, dims, recompute, plan));
  MODELSTATE_RETURN_IF_ERROR(CheckModeRank(plan.mode, x.dim()));
  if (plan.mode == "area") {
    MODELSTATE_RETURN_IF_ERROR(CheckAreaSizes(x, plan));
  } else {
    MODELSTATE_RETURN_IF_ERROR(CheckKernelSizes(x, plan));
  }
  return plan;
}

// ---------------------------------------------------------------------------
// Source indices and weights along one dim, with ATen's formulas
// (UpSample.h: compute_scales_value, area_pixel_compute_scale,
// area_pixel_compute_source_index), in the input's type T.

// Taps of every output element o: index[begin[o] .. begin[o + 1]) with
// their weights.
template <typename T>
struct Taps {
  std::vector<int64_t> begin = {0};
  std::vector<int64_t> index;
  std::vector<T> weight;

  void Add(int64_t i, T w) {
    index.push_back(i);
    weight.push_back(w);
  }
  void Close() { begin.push_back(static_cast<int64_t>(index.size())); }
};

template <typename T>
T ScalesValue(std::optional<double> scale, int64_t in, int64_t out) {
  return scale.has_value() && *scale > 0.0
             ? static_cast<T>(1.0 / *scale)
             : static_cast<T>(in) / static_cast<T>(out);
}

template <typename T>
T PixelScale(int64_t in, int64_t out, bool align_corners,
             std::optional<double> scale) {
  if (align_corners) {
    return out > 1 ? static_cast<T>(in - 1) / static_cast<T>(out - 1) : T(0);
  }
  return ScalesValue<T>(scale, in, out);
}

template <typename T>
T InterpolationSource(T scale, int64_t o, bool align_corners, bool cubic) {
  if (align_corners) return scale * static_cast<T>(o);
  const T src = static_cast<T>(scale * (o + 0.5) - 0.5);
  return (!cubic && src < 0) ? T(0) : src;
}

// nearest: floor(o * scale); nearest-exact: floor((o + 0.5) * scale), both
// clamped to the last input element.
template <typename T>
Taps<T> NearestTaps(int64_t in, int64_t out, std::optional<double> scale,
                    bool exact) {
  Taps<T> taps;
  const T s = ScalesValue<T>(scale, in, out);
  for (int64_t o = 0; o < out; ++o) {
    const T real = exact ? InterpolationSource<T>(s, o, false, false) + T(0.5)
                         : InterpolationSource<T>(s, o, true, false);
    const int64_t i =
        static_cast<int64_t>(std::floor(static_cast<float>(real)));
    taps.Add(std::min(i, in - 1), T(1));
    taps.Close();
  }
  return taps;
}

// Two taps at floor(src) and the next element (the same one at the end);
// an output as long as its input is a copy, whatever the scale.
template <typename T>
Taps<T> LinearTaps(int64_t in, int64_t out, std::optional<double> scale,
                   bool align_corners) {
  Taps<T> taps;
  const T ratio = PixelScale<T>(in, out, align_corners, scale);
  for (int64_t o = 0; o < out; ++o) {
    if (in == out) {
      taps.Add(o, T(1));
    } else {
      const T real = InterpolationSource<T>(ratio, o, align_corners, false);
      const int64_t i0 = std::min(static_cast<int64_t>(real), in - 1);
      const int64_t i1 = i0 + (i0 < in - 1 ? 1 : 0);
      const T lambda1 = real - static_cast<T>(i0);
      taps.Add(i0, T(1) - lambda1);
      taps.Add(i1, lambda1);
    }
    taps.Close();
  }
  return taps;
}

// Keys' cubic convolution with A = -0.75 (ATen's
// get_cubic_upsample_coefficients), on the four elements around floor(src),
// indices clamped into the input.
template <typename T>
Taps<T> CubicTaps(int64_t in, int64_t out, std::optional<double> scale,
                  bool align_corners) {
  const T a = T(-0.75);
  auto near = [a](T x) { return ((a + 2) * x - (a + 3)) * x * x + 1; };
  auto far = [a](T x) { return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a; };
  Taps<T> taps;
  const T ratio = PixelScale<T>(in, out, align_corners, scale);
  for (int64_t o = 0; o < out; ++o) {
    const T real = InterpolationSource<T>(ratio, o, align_corners, true);
    const int64_t i = static_cast<int64_t>(std::floor(real));
    const T t = real - static_cast<T>(i);
    const T w[4] = {far(t + T(1)), near(t), near(T(1) - t), far(T(2) - t)};
    for (int64_t k = 0; k < 4; ++k) {
      taps.Add(std::clamp<int64_t>(i - 1 + k, 0, in - 1), w[k]);
    }
    taps.Close();
  }
  return taps;
}

// The adaptive-average window [floor(o * in / out), ceil((o + 1) * in /
// out)).
template <typename T>
Taps<T> AreaTaps(int64_t in, int64_t out) {
  Taps<T> taps;
  for (int64_t o = 0; o < out; ++o) {
    const int64_t lo = (o * in) / out;
    const int64_t hi = ((o + 1) * in + out - 1) / out;
    for (int64_t i = lo; i < hi; ++i) {
      taps.Add(i, T(1) / static_cast<T>(hi - lo));
    }
    taps.Close();
  }
  return taps;
}

// A table grows with its output extent alone: for an input of one row it
// takes several times the output's bytes (a [1, 1, 2] input resized to 3e9
// once asked for about 100 GB). It is held to the limit of a tensor
// (ScopedTensorBytesLimit) before it is built: at most 4 taps per output
// (area: the input once, plus one per output), each an index and a weight,
// and vectors that may double their capacity.
template <typename T>
absl::Status CheckTapsBytes(int64_t in, int64_t out) {
  const uint64_t limit = ScopedTensorBytesLimit::Current();
  const double bytes = 2.0 * ((5.0 * out + in) * (sizeof(int64_t) + sizeof(T)) +
                              (out + 1.0) * sizeof(int64_t));
  if (limit == 0 || bytes <= static_cast<double>(limit)) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "Upsample to a size of ", out, " needs an interpolation table of up to ",
      static_cast<uint64_t>(bytes),
      " bytes, over the max_tensor_bytes limit of ", limit));
}

template <typename T>
Taps<T> TapsFor(const UpsamplePlan& plan, size_t d) {
  const int64_t in = plan.in[d], out = plan.out[d];
  const std::optional<double> scale = plan.scale[d];
  const std::string& mode = plan.mode;
  if (mode == "nearest") return NearestTaps<T>(in, out, scale, false);
  if (mode == "nearest-exact") return NearestTaps<T>(in, out, scale, true);
  if (mode == "area") return AreaTaps<T>(in, out);
  if (mode == "bicubic")
    return CubicTaps<T>(in, out, scale, plan.align_corners);
  return LinearTaps<T>(in, out, scale, plan.align_corners);
}

// Resamples dim `axis` of the contiguous `src` (shape `shape`) with `taps`.
template <typename T>
void ResampleAxis(const T* src, const Shape& shape, size_t axis,
                  const Taps<T>& taps, T* dst) {
  const int64_t outer = Prod(shape, 0, axis);
  const int64_t in = shape[axis];
  const int64_t inner = Prod(shape, axis + 1, shape.size());
  const int64_t out = static_cast<int64_t>(taps.begin.size()) - 1;
  for (int64_t b = 0; b < outer; ++b) {
    const T* plane = src + b * in * inner;
    for (int64_t o = 0; o < out; ++o) {
      T* row = dst + (b * out + o) * inner;
      std::fill(row, row + inner, T(0));
      for (int64_t k = taps.begin[o]; k < taps.begin[o + 1]; ++k) {
        const T* from = plane + taps.index[k] * inner;
        const T w = taps.weight[k];
        for (int64_t j = 0; j < inner; ++j) row[j] += w * from[j];
      }
    }
  }
}

template <typename T>
absl::StatusOr<Tensor> UpsampleForward(const LayerCall& call, const Tensor& x,
                                       DType) {
  MODELSTATE_ASSIGN_OR_RETURN(UpsamplePlan plan, PlanUpsample(call.module, x));
  // Bicubic copies when no size changes, whatever the scale (ATen's
  // special case; linear modes do so per dim in their taps).
  bool same = true;
  for (size_t d = 0; d < plan.in.size(); ++d) {
    same = same && plan.in[d] == plan.out[d];
  }
  Tensor cur = x;
  Shape shape = x.shape();
  for (size_t d = 0; d < plan.in.size(); ++d) {
    const size_t axis = d + 2;
    shape[axis] = plan.out[d];
    MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(shape));
    MODELSTATE_RETURN_IF_ERROR(CheckTapsBytes<T>(plan.in[d], plan.out[d]));
    Taps<T> taps;
    if (same && plan.mode == "bicubic") {
      taps = LinearTaps<T>(plan.in[d], plan.out[d], std::nullopt, false);
    } else {
      taps = TapsFor<T>(plan, d);
    }
    Shape in_shape = shape;
    in_shape[axis] = plan.in[d];
    ResampleAxis(Data<T>(cur), in_shape, axis, taps, y.data);
    cur = y.tensor;
  }
  return cur;
}

}  // namespace

std::vector<LayerDef> UpsamplingFamily() {
  const std::vector<ArgDef> two_d = {{"size", kNone}, {"scale_factor", kNone}};
  constexpr auto kForward =
      &FloatForward<&UpsampleForward<float>, &UpsampleForward<double>>;
  return {
      {.type = "Upsample",
       .qualified_name = "torch.nn.modules.upsampling.Upsample",
       .signature = {{"size", kNone},
                     {"scale_factor", kNone},
                     {"mode", S("nearest")},
                     {"align_corners", kNone},
                     {"recompute_scale_factor", kNone}},
       .build = &BuildUpsample,
       .forward = kForward},
      {.type = "UpsamplingNearest2d",
       .qualified_name = "torch.nn.modules.upsampling.UpsamplingNearest2d",
       .signature = two_d,
       .build = &BuildUpsampling2d<false>,
       .forward = kForward},
      {.type = "UpsamplingBilinear2d",
       .qualified_name = "torch.nn.modules.upsampling.UpsamplingBilinear2d",
       .signature = two_d,
       .build = &BuildUpsampling2d<true>,
       .forward = kForward},
  };
}

}  // namespace modelstate::internal
