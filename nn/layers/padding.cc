// The padding family: ZeroPad2d, ConstantPad1d/2d/3d, ReflectionPad1d/2d/3d
// and ReplicationPad1d/2d/3d (torch.nn.modules.padding). Modules without
// state that keep `padding` as a tuple of 2, 4 or 6 ints (an int is
// repeated) and ConstantPad's `value`; forward is F.pad, which the
// convolutions' padding_mode also uses (padding.h).
#include "nn/layers/padding.h"

#include <algorithm>
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

// One padded dim: its input size and the amounts before and after it.
struct PadDim {
  int64_t size = 1, before = 0, after = 0;
  int64_t Out() const { return size + before + after; }
};

// The input index output index `i` reads, or -1 for the constant.
int64_t SourceIndex(PadMode mode, int64_t i, const PadDim& d) {
  int64_t s = i - d.before;
  if (s >= 0 && s < d.size) return s;
  switch (mode) {
    case PadMode::kConstant:
      return -1;
    case PadMode::kReflect:
      return s < 0 ? -s : 2 * (d.size - 1) - s;
    case PadMode::kReplicate:
      return s < 0 ? 0 : d.size - 1;
    case PadMode::kCircular:
      return ((s % d.size) + d.size) % d.size;
  }
  return -1;
}

template <typename T>
absl::StatusOr<Tensor> PadKernel(const Tensor& x, const PadDim dims[3],
                                 size_t padded, PadMode mode, double value) {
  Shape out_shape = x.shape();
  for (size_t k = 0; k < padded; ++k) {
    out_shape[out_shape.size() - padded + k] = dims[3 - padded + k].Out();
  }
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(out_shape));
  const int64_t planes = Prod(x.shape(), 0, x.shape().size() - padded);
  const int64_t in_plane = dims[0].size * dims[1].size * dims[2].size;
  const T fill = static_cast<T>(value);
  const T* px = Data<T>(x);
  T* dst = y.data;
  for (int64_t p = 0; p < planes; ++p) {
    const T* src = px + p * in_plane;
    for (int64_t a = 0; a < dims[0].Out(); ++a) {
      const int64_t sa = SourceIndex(mode, a, dims[0]);
      for (int64_t i = 0; i < dims[1].Out(); ++i) {
        const int64_t si = SourceIndex(mode, i, dims[1]);
        for (int64_t j = 0; j < dims[2].Out(); ++j) {
          const int64_t sj = SourceIndex(mode, j, dims[2]);
          *dst++ = (sa < 0 || si < 0 || sj < 0)
                       ? fill
                       : src[(sa * dims[1].size + si) * dims[2].size + sj];
        }
      }
    }
  }
  return y.tensor;
}

}  // namespace

absl::StatusOr<PadMode> ParsePadMode(absl::string_view name) {
  if (name == "constant" || name == "zeros") return PadMode::kConstant;
  if (name == "reflect") return PadMode::kReflect;
  if (name == "replicate") return PadMode::kReplicate;
  if (name == "circular") return PadMode::kCircular;
  return absl::InvalidArgumentError(
      absl::StrCat("Unrecognised padding mode ", name));
}

absl::StatusOr<Tensor> PadLastDims(const Tensor& x,
                                   const std::vector<int64_t>& pad,
                                   PadMode mode, double value) {
  const size_t padded = pad.size() / 2;
  if (pad.size() % 2 != 0 || padded > 3 ||
      static_cast<size_t>(x.dim()) < padded) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Padding length must be divisible by 2 and at most twice the "
        "number of dimensions of the input; pad length is ",
        pad.size(), " while the input has ", x.dim(), " dimensions."));
  }
  if (std::all_of(pad.begin(), pad.end(), [](int64_t p) { return p == 0; })) {
    return x;
  }
  PadDim dims[3];
  for (size_t k = 0; k < padded; ++k) {
    // pad[2k], pad[2k + 1] pad dim -1 - k; dims[] is (D, H, W).
    PadDim& d = dims[2 - k];
    const int64_t at = x.dim() - 1 - static_cast<int64_t>(k);
    d = {x.shape()[at], pad[2 * k], pad[2 * k + 1]};
    if (d.Out() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("The input size ", d.size, ", plus negative padding ",
                       d.before, " and ", d.after,
                       " resulted in a negative output size, which is "
                       "invalid. Check dimension ",
                       at, " of your input."));
    }
    if (mode == PadMode::kReflect &&
        (d.before >= d.size || d.after >= d.size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Argument #4: Padding size should be less than the corresponding "
          "input dimension, but got: padding (",
          d.before, ", ", d.after, ") at dimension ", at, " of input ",
          Sizes(x.shape())));
    }
    if (mode == PadMode::kCircular && (d.before > d.size || d.after > d.size)) {
      return absl::InvalidArgumentError(
          "Padding value causes wrapping around more than once.");
    }
    if (mode != PadMode::kConstant && d.size == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Expected non-empty input dimensions for padding, but got ",
          Sizes(x.shape())));
    }
  }
  return x.dtype() == DType::kFloat32
             ? PadKernel<float>(x, dims, padded, mode, value)
             : PadKernel<double>(x, dims, padded, mode, value);
}

namespace {

// _ConstantPadNd, _ReflectionPadNd and _ReplicationPadNd: `padding` as
// 2 * kDims ints; ConstantPad also keeps `value` (ZeroPad2d's is 0.0).
template <const char* kType, int kDims, PadMode kMode>
absl::StatusOr<std::shared_ptr<Module>> BuildPad(const BoundArgs& args,
                                                 BuildContext&,
                                                 const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> padding,
                              args.Ints("padding", 2 * kDims));
  std::shared_ptr<Module> m = NewStateless(kType, "padding");
  m->SetPlainAttribute("padding", padding);
  if (kMode == PadMode::kConstant) {
    double value = 0.0;
    if (absl::string_view(kType) != "ZeroPad2d") {
      MODELSTATE_ASSIGN_OR_RETURN(value, args.Float("value"));
    }
    m->SetPlainAttribute("value", value);
  }
  return m;
}

template <typename T, int kDims, PadMode kMode>
absl::StatusOr<Tensor> PadForward(const LayerCall& call, const Tensor& x,
                                  DType) {
  const Module& m = call.module;
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> padding,
                              AttrInts(m, "padding", 2 * kDims));
  double value = 0.0;
  if (kMode == PadMode::kConstant) {
    MODELSTATE_ASSIGN_OR_RETURN(value, AttrDouble(m, "value"));
  } else if (x.dim() != kDims + 1 && x.dim() != kDims + 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Expected ", kDims + 1, "D or ", kDims + 2,
        "D (batch mode) tensor with possibly 0 batch size and other "
        "non-zero dimensions for input, but got: ",
        Sizes(x.shape())));
  }
  return PadLastDims(x, padding, kMode, value);
}

// `qualified` is a string literal (the entry keeps a view of it).
template <const char* kType, int kDims, PadMode kMode>
LayerDef PadDef(absl::string_view qualified) {
  std::vector<ArgDef> signature = {{"padding", {}}};
  if (kMode == PadMode::kConstant && absl::string_view(kType) != "ZeroPad2d") {
    signature.push_back({"value", {}});
  }
  return {.type = kType,
          .qualified_name = qualified,
          .signature = std::move(signature),
          .build = &BuildPad<kType, kDims, kMode>,
          .forward = &FloatForward<&PadForward<float, kDims, kMode>,
                                   &PadForward<double, kDims, kMode>>};
}

constexpr char kZeroPad2d[] = "ZeroPad2d";
constexpr char kConstantPad1d[] = "ConstantPad1d";
constexpr char kConstantPad2d[] = "ConstantPad2d";
constexpr char kConstantPad3d[] = "ConstantPad3d";
constexpr char kReflectionPad1d[] = "ReflectionPad1d";
constexpr char kReflectionPad2d[] = "ReflectionPad2d";
constexpr char kReflectionPad3d[] = "ReflectionPad3d";
constexpr char kReplicationPad1d[] = "ReplicationPad1d";
constexpr char kReplicationPad2d[] = "ReplicationPad2d";
constexpr char kReplicationPad3d[] = "ReplicationPad3d";

}  // namespace

std::vector<LayerDef> PaddingFamily() {
  constexpr PadMode kC = PadMode::kConstant, kR = PadMode::kReflect,
                    kP = PadMode::kReplicate;
  return {
      PadDef<kZeroPad2d, 2, kC>("torch.nn.modules.padding.ZeroPad2d"),
      PadDef<kConstantPad1d, 1, kC>("torch.nn.modules.padding.ConstantPad1d"),
      PadDef<kConstantPad2d, 2, kC>("torch.nn.modules.padding.ConstantPad2d"),
      PadDef<kConstantPad3d, 3, kC>("torch.nn.modules.padding.ConstantPad3d"),
      PadDef<kReflectionPad1d, 1, kR>(
          "torch.nn.modules.padding.ReflectionPad1d"),
      PadDef<kReflectionPad2d, 2, kR>(
          "torch.nn.modules.padding.ReflectionPad2d"),
      PadDef<kReflectionPad3d, 3, kR>(
          "torch.nn.modules.padding.ReflectionPad3d"),
      PadDef<kReplicationPad1d, 1, kP>(
          "torch.nn.modules.padding.ReplicationPad1d"),
      PadDef<kReplicationPad2d, 2, kP>(
          "torch.nn.modules.padding.ReplicationPad2d"),
      PadDef<kReplicationPad3d, 3, kP>(
          "torch.nn.modules.padding.ReplicationPad3d"),
  };
}

}  // namespace modelstate::internal
