// The normalisation family: BatchNorm1d/2d/3d, InstanceNorm1d/2d/3d,
// LayerNorm, GroupNorm and LocalResponseNorm (no state; it keeps size,
// alpha, beta and k). Construction follows torch.nn.modules.batchnorm,
// instancenorm and normalization (affine weight = ones, bias = zeros; running
// statistics as buffers); forward computes statistics in double and normalises
// in the compute type, updating BatchNorm's running statistics in training
// mode.
#include "nn/layers/normalization.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "core/init.h"
#include "nn/kernels/parallel.h"
#include "nn/layer_registry.h"
#include "nn/layers/build_util.h"
#include "nn/layers/forward_util.h"
#include "nn/layers/param_check.h"

namespace modelstate::internal {
namespace {

// ---------------------------------------------------------------------------
// Construction.

// The affine pair of the norm layers: weight = ones, bias = zeros
// (reset_parameters of LayerNorm, GroupNorm and _NormBase); either may be
// left out (undefined: registered as None).
struct AffineTensors {
  Tensor weight;
  Tensor bias;
};
absl::StatusOr<AffineTensors> MakeAffine(const Shape& shape, bool weight,
                                         bool bias, DType dtype, Device device,
                                         BuildContext& ctx) {
  AffineTensors t;
  if (weight) {
    MODELSTATE_ASSIGN_OR_RETURN(t.weight, ctx.NewTensor(dtype, shape, device));
    MODELSTATE_RETURN_IF_ERROR(ConstantInit(t.weight, 1.0));
  }
  if (bias) {
    MODELSTATE_ASSIGN_OR_RETURN(t.bias, ctx.NewTensor(dtype, shape, device));
    MODELSTATE_RETURN_IF_ERROR(ConstantInit(t.bias, 0.0));
  }
  return t;
}

absl::Status RegisterAffine(Module& m, const std::string& path, AffineTensors t,
                            BuildContext& ctx) {
  MODELSTATE_RETURN_IF_ERROR(ctx.AddParameter(m, path, "weight", t.weight));
  return ctx.AddParameter(m, path, "bias", t.bias);
}

// _NormBase for BatchNorm1d/2d/3d (module file "batchnorm") and
// InstanceNorm1d/2d/3d ("instancenorm"): the same arguments, entries and
// init, other defaults.
absl::StatusOr<std::shared_ptr<Module>> BuildNormBase(
    const BoundArgs& args, BuildContext& ctx, const std::string& path,
    absl::string_view type, absl::string_view module_file) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t n, args.Int("num_features"));
  MODELSTATE_ASSIGN_OR_RETURN(double eps, args.Float("eps"));
  MODELSTATE_ASSIGN_OR_RETURN(bool affine, args.Bool("affine"));
  MODELSTATE_ASSIGN_OR_RETURN(bool track, args.Bool("track_running_stats"));
  MODELSTATE_ASSIGN_OR_RETURN(FactoryKwargs factory,
                              args.Factory(ctx.options()));
  AttrValue momentum;
  if (!args.IsNone("momentum")) {
    MODELSTATE_ASSIGN_OR_RETURN(double mom, args.Float("momentum"));
    momentum = mom;
  }
  MODELSTATE_ASSIGN_OR_RETURN(
      AffineTensors affine_tensors,
      MakeAffine({n}, affine, affine, factory.dtype, factory.device, ctx));
  Tensor mean, var, count;
  if (track) {
    MODELSTATE_ASSIGN_OR_RETURN(
        mean, ctx.NewTensor(factory.dtype, {n}, factory.device));
    MODELSTATE_ASSIGN_OR_RETURN(
        var, ctx.NewTensor(factory.dtype, {n}, factory.device));
    // num_batches_tracked ignores the factory dtype.
    MODELSTATE_ASSIGN_OR_RETURN(
        count, ctx.NewTensor(DType::kInt64, {}, factory.device));
    MODELSTATE_RETURN_IF_ERROR(ConstantInit(mean, 0.0));
    MODELSTATE_RETURN_IF_ERROR(ConstantInit(var, 1.0));
    MODELSTATE_RETURN_IF_ERROR(ConstantInit(count, 0.0));
  }
  std::shared_ptr<Module> m = NewLayer(type, module_file);
  m->set_version(2);
  m->set_fills_num_batches_tracked(track);
  m->SetPlainAttribute("num_features", n);
  m->SetPlainAttribute("eps", eps);
  m->SetPlainAttribute("momentum", momentum);
  m->SetPlainAttribute("affine", affine);
  m->SetPlainAttribute("track_running_stats", track);
  m->AddClassAttributes({"reset_parameters", "reset_running_stats",
                         "__constants__", "_check_input_dim"});
  MODELSTATE_RETURN_IF_ERROR(
      RegisterAffine(*m, path, std::move(affine_tensors), ctx));
  MODELSTATE_RETURN_IF_ERROR(ctx.AddBuffer(*m, path, "running_mean", mean));
  MODELSTATE_RETURN_IF_ERROR(ctx.AddBuffer(*m, path, "running_var", var));
  MODELSTATE_RETURN_IF_ERROR(
      ctx.AddBuffer(*m, path, "num_batches_tracked", count));
  return m;
}

template <const char* kType>
absl::StatusOr<std::shared_ptr<Module>> BuildBatchNorm(
    const BoundArgs& args, BuildContext& ctx, const std::string& path) {
  return BuildNormBase(args, ctx, path, kType, "batchnorm");
}

template <const char* kType>
absl::StatusOr<std::shared_ptr<Module>> BuildInstanceNorm(
    const BoundArgs& args, BuildContext& ctx, const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(
      std::shared_ptr<Module> m,
      BuildNormBase(args, ctx, path, kType, "instancenorm"));
  m->AddClassAttributes({"_get_no_batch_dim", "_handle_no_batch_input",
                         "_apply_instance_norm", "_load_from_state_dict"});
  return m;
}

constexpr char kBatchNorm1d[] = "BatchNorm1d";
constexpr char kBatchNorm2d[] = "BatchNorm2d";
constexpr char kBatchNorm3d[] = "BatchNorm3d";
constexpr char kInstanceNorm1d[] = "InstanceNorm1d";
constexpr char kInstanceNorm2d[] = "InstanceNorm2d";
constexpr char kInstanceNorm3d[] = "InstanceNorm3d";

}  // namespace

// LayerNorm(normalized_shape, eps, elementwise_affine, bias).
absl::StatusOr<std::shared_ptr<Module>> MakeLayerNorm(
    const std::vector<int64_t>& shape, double eps, bool affine, bool bias,
    DType dtype, Device device, BuildContext& ctx, const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(
      AffineTensors t,
      MakeAffine(shape, affine, affine && bias, dtype, device, ctx));
  std::shared_ptr<Module> m = NewLayer("LayerNorm", "normalization");
  m->SetPlainAttribute("normalized_shape", shape);
  m->SetPlainAttribute("eps", eps);
  m->SetPlainAttribute("elementwise_affine", affine);
  m->AddClassAttributes({"reset_parameters", "__constants__"});
  MODELSTATE_RETURN_IF_ERROR(RegisterAffine(*m, path, std::move(t), ctx));
  return m;
}

namespace {

absl::StatusOr<std::shared_ptr<Module>> BuildLayerNorm(
    const BoundArgs& args, BuildContext& ctx, const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> shape,
                              args.Ints("normalized_shape", 0));
  MODELSTATE_ASSIGN_OR_RETURN(double eps, args.Float("eps"));
  MODELSTATE_ASSIGN_OR_RETURN(bool affine, args.Bool("elementwise_affine"));
  MODELSTATE_ASSIGN_OR_RETURN(bool bias, args.Bool("bias"));  // 2.1+
  MODELSTATE_ASSIGN_OR_RETURN(FactoryKwargs factory,
                              args.Factory(ctx.options()));
  return MakeLayerNorm(shape, eps, affine, bias, factory.dtype, factory.device,
                       ctx, path);
}

absl::StatusOr<std::shared_ptr<Module>> BuildGroupNorm(
    const BoundArgs& args, BuildContext& ctx, const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t groups, args.Int("num_groups"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t channels, args.Int("num_channels"));
  MODELSTATE_ASSIGN_OR_RETURN(double eps, args.Float("eps"));
  MODELSTATE_ASSIGN_OR_RETURN(bool affine, args.Bool("affine"));
  MODELSTATE_ASSIGN_OR_RETURN(FactoryKwargs factory,
                              args.Factory(ctx.options()));
  if (groups == 0) {  // torch 1.13 fails on the modulo itself
    return absl::InvalidArgumentError(
        "GroupNorm: argument 'num_groups' must not be 0 (num_channels % "
        "num_groups raises ZeroDivisionError: integer modulo by zero)");
  }
  if (channels % groups != 0) {
    return absl::InvalidArgumentError(
        "num_channels must be divisible by num_groups");
  }
  MODELSTATE_ASSIGN_OR_RETURN(
      AffineTensors t, MakeAffine({channels}, affine, affine, factory.dtype,
                                  factory.device, ctx));
  std::shared_ptr<Module> m = NewLayer("GroupNorm", "normalization");
  m->SetPlainAttribute("num_groups", groups);
  m->SetPlainAttribute("num_channels", channels);
  m->SetPlainAttribute("eps", eps);
  m->SetPlainAttribute("affine", affine);
  m->AddClassAttributes({"reset_parameters", "__constants__"});
  MODELSTATE_RETURN_IF_ERROR(RegisterAffine(*m, path, std::move(t), ctx));
  return m;
}

// ---------------------------------------------------------------------------
// Forward.

// y = (x - mean[c]) * invstd[c] * w[c] + b[c] over [n, c, inner].
template <typename T>
void Normalize(const T* x, int64_t n, int64_t c, int64_t inner,
               const std::vector<double>& mean,
               const std::vector<double>& invstd, const T* w, const T* b,
               T* y) {
  for (int64_t ni = 0; ni < n; ++ni) {
    for (int64_t ci = 0; ci < c; ++ci) {
      const double scale = invstd[ci] * (w ? static_cast<double>(w[ci]) : 1.0);
      const double shift =
          (b ? static_cast<double>(b[ci]) : 0.0) - mean[ci] * scale;
      const T* src = x + (ni * c + ci) * inner;
      T* dst = y + (ni * c + ci) * inner;
      const T s = static_cast<T>(scale), t = static_cast<T>(shift);
      for (int64_t i = 0; i < inner; ++i) dst[i] = src[i] * s + t;
    }
  }
}

// Batch statistics over [n, c, inner]: per channel the mean, the biased
// variance and 1 / sqrt(variance + eps), accumulated in double.
template <typename T>
void BatchStats(const T* px, int64_t n, int64_t c, int64_t inner, double eps,
                std::vector<double>& mean, std::vector<double>& var,
                std::vector<double>& invstd) {
  const int64_t per_channel = n * inner;
  for (int64_t ci = 0; ci < c; ++ci) {
    double sum = 0;
    for (int64_t ni = 0; ni < n; ++ni) {
      const T* src = px + (ni * c + ci) * inner;
      for (int64_t i = 0; i < inner; ++i) sum += src[i];
    }
    double mu = sum / static_cast<double>(per_channel);
    double sq = 0;
    for (int64_t ni = 0; ni < n; ++ni) {
      const T* src = px + (ni * c + ci) * inner;
      for (int64_t i = 0; i < inner; ++i) {
        double d = src[i] - mu;
        sq += d * d;
      }
    }
    mean[ci] = mu;
    var[ci] = sq / static_cast<double>(per_channel);
    invstd[ci] = 1.0 / std::sqrt(var[ci] + eps);
  }
}

// running = (1 - f) * running + f * batch, in place, the batch variance
// made unbiased over `per_channel` values. Either may be None: ATen updates
// each running statistic it is given.
absl::Status UpdateRunning(Tensor& running_mean, Tensor& running_var,
                           const std::vector<double>& mean,
                           const std::vector<double>& var, double factor,
                           int64_t per_channel) {
  const double unbias =
      static_cast<double>(per_channel) / static_cast<double>(per_channel - 1);
  auto update = [&](Tensor& running, const std::vector<double>& batch,
                    double scale) -> absl::Status {
    if (!running.defined()) return absl::OkStatus();
    const int64_t c = static_cast<int64_t>(batch.size());
    MODELSTATE_ASSIGN_OR_RETURN(Tensor old, ToDType(running, DType::kFloat64));
    std::vector<double> next(c);
    for (int64_t ci = 0; ci < c; ++ci) {
      next[ci] =
          (1 - factor) * old.data<double>()[ci] + factor * batch[ci] * scale;
    }
    MODELSTATE_ASSIGN_OR_RETURN(
        Tensor t, Tensor::FromDoubles(DType::kFloat64, {c}, next));
    return running.CopyFrom(t);
  };
  MODELSTATE_RETURN_IF_ERROR(update(running_mean, mean, 1.0));
  return update(running_var, var, unbias);
}

// What _BatchNorm.forward does in training mode with tracked statistics
// before F.batch_norm: num_batches_tracked += 1 (in place, when it is not
// None), whether or not the batch will move a running statistic. Returns the
// update's factor: momentum, or for momentum None 1 / num_batches_tracked
// (the cumulative average), 0 without a counter.
absl::StatusOr<double> CountBatch(const Module& m, Tensor& count) {
  if (count.defined()) {
    MODELSTATE_ASSIGN_OR_RETURN(
        Tensor next,
        Tensor::FromDoubles(
            count.dtype(), count.shape(),
            {ReadElementAsDouble(count.raw_data(), count.dtype(), 0) + 1}));
    MODELSTATE_RETURN_IF_ERROR(count.CopyFrom(next));
  }
  if (!AttrIsNone(m, "momentum")) return AttrDouble(m, "momentum");
  if (!count.defined()) return 0.0;
  return 1.0 / ReadElementAsDouble(count.raw_data(), count.dtype(), 0);
}

// The entries of a _NormBase layer (BatchNorm, InstanceNorm), each optional
// as F.batch_norm / F.instance_norm take None for it, of the shapes
// num_features gives: weight, bias, running_mean, running_var [C] and
// num_batches_tracked [].
struct NormEntries {
  Tensor weight, bias, running_mean, running_var, count;
};

absl::StatusOr<NormEntries> ReadNormEntries(const Module& m, DType dtype) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t c, AttrInt(m, "num_features"));
  NormEntries e;
  MODELSTATE_ASSIGN_OR_RETURN(
      e.weight, ShapedParam(m, "weight", dtype, {c}, Presence::kOptional));
  MODELSTATE_ASSIGN_OR_RETURN(
      e.bias, ShapedParam(m, "bias", dtype, {c}, Presence::kOptional));
  MODELSTATE_ASSIGN_OR_RETURN(
      e.running_mean, ShapedEntry(m, "running_mean", {c}, Presence::kOptional));
  MODELSTATE_ASSIGN_OR_RETURN(
      e.running_var, ShapedEntry(m, "running_var", {c}, Presence::kOptional));
  MODELSTATE_ASSIGN_OR_RETURN(
      e.count, ShapedEntry(m, "num_batches_tracked", {}, Presence::kOptional));
  return e;
}

// Eval mode: the mean and 1 / sqrt(var + eps) of the running statistics.
absl::Status RunningStats(const Module& m, const Tensor& running_mean,
                          const Tensor& running_var, DType dtype, double eps,
                          std::vector<double>& mean,
                          std::vector<double>& invstd) {
  if (!running_mean.defined() || !running_var.defined()) {
    // ATen's batch_norm text; the module, not the input, is at fault.
    return absl::FailedPreconditionError(
        absl::StrCat(running_mean.defined() ? "running_var" : "running_mean",
                     " must be defined in evaluation mode"));
  }
  if (running_mean.dtype() != dtype || running_var.dtype() != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected scalar type ", ScalarTypeName(dtype),
                     " but found ", ScalarTypeName(running_mean.dtype()),
                     " (running_mean of ", m.type_name(), ")"));
  }
  for (size_t ci = 0; ci < mean.size(); ++ci) {
    mean[ci] =
        ReadElementAsDouble(running_mean.raw_data(), running_mean.dtype(), ci);
    double v =
        ReadElementAsDouble(running_var.raw_data(), running_var.dtype(), ci);
    invstd[ci] = 1.0 / std::sqrt(v + eps);
  }
  return absl::OkStatus();
}

// BatchNorm1d (2-D or 3-D input), BatchNorm2d (4-D) and BatchNorm3d (5-D).
template <typename T, int kDims>
absl::StatusOr<Tensor> BatchNormForward(const LayerCall& call, const Tensor& x,
                                        DType dtype) {
  const Module& m = call.module;
  if (kDims == 1 ? (x.dim() != 2 && x.dim() != 3) : x.dim() != kDims + 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected ", kDims == 1 ? "2D or 3D" : absl::StrCat(kDims + 2, "D"),
        " input (got ", x.dim(), "D input)"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(NormEntries entries, ReadNormEntries(m, dtype));
  const Tensor &w = entries.weight, &b = entries.bias;
  Tensor &running_mean = entries.running_mean,
         &running_var = entries.running_var, &count = entries.count;
  MODELSTATE_ASSIGN_OR_RETURN(double eps, AttrDouble(m, "eps"));
  MODELSTATE_ASSIGN_OR_RETURN(bool track, AttrBool(m, "track_running_stats"));
  const int64_t n = x.shape()[0], c = x.shape()[1];
  const int64_t inner = Prod(x.shape(), 2, x.shape().size());
  auto check_size = [&](const Tensor& t, const char* name) -> absl::Status {
    if (t.defined() && t.numel() != c) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " should contain ", c, " elements not ", t.numel()));
    }
    return absl::OkStatus();
  };
  MODELSTATE_RETURN_IF_ERROR(check_size(running_mean, "running_mean"));
  MODELSTATE_RETURN_IF_ERROR(check_size(running_var, "running_var"));
  MODELSTATE_RETURN_IF_ERROR(check_size(w, "weight"));
  MODELSTATE_RETURN_IF_ERROR(check_size(b, "bias"));

  // PyTorch's _BatchNorm.forward: batch statistics in training, or when
  // there are no running statistics to use; the running ones it has move in
  // training with track_running_stats. ATen refuses one value per channel
  // only: an empty batch gives an empty output and moves nothing but the
  // counter.
  const bool use_batch_stats =
      m.is_training() || (!running_mean.defined() && !running_var.defined());
  const bool learn = m.is_training() && track;
  const int64_t per_channel = n * inner;
  if (use_batch_stats && per_channel == 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Expected more than 1 value per channel when training, got input "
        "size ",
        TorchSizeString(x.shape())));
  }
  double factor = 0;
  if (learn) {
    MODELSTATE_ASSIGN_OR_RETURN(factor, CountBatch(m, count));
  }
  std::vector<double> mean(c), invstd(c);
  const T* px = Data<T>(x);
  if (per_channel == 0) {
    // Nothing to normalize or learn from.
  } else if (use_batch_stats) {
    std::vector<double> var(c);
    BatchStats(px, n, c, inner, eps, mean, var, invstd);
    if (learn) {
      MODELSTATE_RETURN_IF_ERROR(UpdateRunning(running_mean, running_var, mean,
                                               var, factor, per_channel));
    }
  } else {
    MODELSTATE_RETURN_IF_ERROR(
        RunningStats(m, running_mean, running_var, dtype, eps, mean, invstd));
  }
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(x.shape()));
  Normalize(px, n, c, inner, mean, invstd, Data<T>(w), Data<T>(b), y.data);
  return y.tensor;
}

// F.instance_norm: per (sample, channel) statistics when training or
// without running statistics (the running ones, when tracked, move by the
// batch mean of the per-instance updates), else the running statistics.
// Input [N, C, *] with kDims spatial dims, or [C, *] unbatched.
template <typename T, int kDims>
absl::StatusOr<Tensor> InstanceNormForward(const LayerCall& call,
                                           const Tensor& x, DType dtype) {
  const Module& m = call.module;
  if (x.dim() != kDims + 1 && x.dim() != kDims + 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", kDims + 1, "D or ", kDims + 2,
                     "D input (got ", x.dim(), "D input)"));
  }
  const bool batched = x.dim() == kDims + 2;
  MODELSTATE_ASSIGN_OR_RETURN(NormEntries entries, ReadNormEntries(m, dtype));
  const Tensor &w = entries.weight, &b = entries.bias;
  Tensor &running_mean = entries.running_mean,
         &running_var = entries.running_var;
  MODELSTATE_ASSIGN_OR_RETURN(double eps, AttrDouble(m, "eps"));
  MODELSTATE_ASSIGN_OR_RETURN(bool track, AttrBool(m, "track_running_stats"));
  const int64_t n = batched ? x.shape()[0] : 1;
  const int64_t c = x.shape()[batched ? 1 : 0];
  const int64_t inner = Prod(x.shape(), batched ? 2 : 1, x.shape().size());
  // F.instance_norm passes the running statistics only outside training or
  // when tracked; ATen then checks each tensor it has, in batch_norm's order,
  // against the batch's channels repeated per sample.
  const bool pass_running = !m.is_training() || track;
  const std::pair<const char*, const Tensor*> checked[] = {
      {"running_mean", pass_running ? &running_mean : nullptr},
      {"running_var", pass_running ? &running_var : nullptr},
      {"weight", &w},
      {"bias", &b}};
  for (const auto& [name, t] : checked) {
    if (t != nullptr && t->defined() && t->numel() != c) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " should contain ", n * c, " elements not ", n * t->numel()));
    }
  }
  const bool use_input_stats = m.is_training() || !track;
  if (use_input_stats && inner == 1) {
    Shape shown = x.shape();
    if (!batched) shown.insert(shown.begin(), 1);
    return absl::InvalidArgumentError(absl::StrCat(
        "Expected more than 1 spatial element when training, got input size ",
        TorchSizeString(shown)));
  }
  const T* px = Data<T>(x);
  std::vector<double> mean(n * c), var(n * c), invstd(n * c);
  if (use_input_stats) {
    // An empty input, as in ATen, has nothing to normalize or learn from.
    if (x.numel() > 0) BatchStats(px, 1, n * c, inner, eps, mean, var, invstd);
    if (x.numel() > 0 && pass_running &&
        (running_mean.defined() || running_var.defined())) {
      MODELSTATE_ASSIGN_OR_RETURN(double momentum, AttrDouble(m, "momentum"));
      std::vector<double> batch_mean(c), batch_var(c);
      for (int64_t i = 0; i < n * c; ++i) {
        batch_mean[i % c] += mean[i] / static_cast<double>(n);
        batch_var[i % c] += var[i] / static_cast<double>(n);
      }
      MODELSTATE_RETURN_IF_ERROR(UpdateRunning(
          running_mean, running_var, batch_mean, batch_var, momentum, inner));
    }
  } else {
    if (!running_mean.defined() || !running_var.defined()) {
      // ATen's instance_norm text.
      return absl::FailedPreconditionError(absl::StrCat(
          "Expected running_mean and running_var to be defined when "
          "use_input_stats is false (",
          m.type_name(), ".",
          running_mean.defined() ? "running_var" : "running_mean",
          " is None)"));
    }
    std::vector<double> cm(c), ci(c);
    MODELSTATE_RETURN_IF_ERROR(
        RunningStats(m, running_mean, running_var, dtype, eps, cm, ci));
    for (int64_t i = 0; i < n * c; ++i) {
      mean[i] = cm[i % c];
      invstd[i] = ci[i % c];
    }
  }
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(x.shape()));
  std::vector<double> one_mean(c), one_invstd(c);
  for (int64_t ni = 0; ni < n; ++ni) {
    std::copy(mean.begin() + ni * c, mean.begin() + (ni + 1) * c,
              one_mean.begin());
    std::copy(invstd.begin() + ni * c, invstd.begin() + (ni + 1) * c,
              one_invstd.begin());
    Normalize(px + ni * c * inner, 1, c, inner, one_mean, one_invstd,
              Data<T>(w), Data<T>(b), y.data + ni * c * inner);
  }
  return y.tensor;
}

template <typename T>
absl::StatusOr<Tensor> LayerNormForward(const LayerCall& call, const Tensor& x,
                                        DType dtype) {
  const Module& m = call.module;
  MODELSTATE_ASSIGN_OR_RETURN(const AttrValue* shape_attr,
                              Attr(m, "normalized_shape"));
  std::vector<int64_t> norm_shape;
  if (const auto* v = std::get_if<std::vector<int64_t>>(shape_attr)) {
    norm_shape = *v;
  } else if (const auto* i = std::get_if<int64_t>(shape_attr)) {
    norm_shape = {*i};
  }
  const Shape affine_shape(norm_shape.begin(), norm_shape.end());
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor w,
      ShapedParam(m, "weight", dtype, affine_shape, Presence::kOptional));
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor b,
      ShapedParam(m, "bias", dtype, affine_shape, Presence::kOptional));
  MODELSTATE_ASSIGN_OR_RETURN(double eps, AttrDouble(m, "eps"));
  const size_t k = norm_shape.size();
  bool ok = x.shape().size() >= k;
  for (size_t i = 0; ok && i < k; ++i) {
    ok = x.shape()[x.shape().size() - k + i] == norm_shape[i];
  }
  if (!ok) {
    Shape star = norm_shape;
    return absl::InvalidArgumentError(
        absl::StrCat("Given normalized_shape=", Sizes(norm_shape),
                     ", expected input with shape [*", k == 0 ? "" : ", ",
                     absl::StrJoin(norm_shape, ", "),
                     "], but got input of size", Sizes(x.shape())));
  }
  const int64_t inner = Prod(norm_shape, 0, k);
  const int64_t rows = inner == 0 ? 0 : x.numel() / inner;
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(x.shape()));
  const T* px = Data<T>(x);
  const T* pw = Data<T>(w);
  const T* pb = Data<T>(b);
  ParallelFor(
      rows, call.runner.threads(), inner * 4, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const T* src = px + r * inner;
          T* dst = y.data + r * inner;
          double sum = 0;
          for (int64_t i = 0; i < inner; ++i) sum += src[i];
          const double mu = sum / static_cast<double>(inner);
          double sq = 0;
          for (int64_t i = 0; i < inner; ++i) {
            double d = src[i] - mu;
            sq += d * d;
          }
          const T rstd = static_cast<T>(1.0 / std::sqrt(sq / inner + eps));
          const T tmu = static_cast<T>(mu);
          for (int64_t i = 0; i < inner; ++i) {
            T v = (src[i] - tmu) * rstd;
            if (pw) v *= pw[i];
            if (pb) v += pb[i];
            dst[i] = v;
          }
        }
      });
  return y.tensor;
}

template <typename T>
absl::StatusOr<Tensor> GroupNormForward(const LayerCall& call, const Tensor& x,
                                        DType dtype) {
  const Module& m = call.module;
  MODELSTATE_ASSIGN_OR_RETURN(int64_t groups, AttrInt(m, "num_groups"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t channels, AttrInt(m, "num_channels"));
  // The build refuses these; a module restored with them must not divide
  // by zero.
  MODELSTATE_RETURN_IF_ERROR(CheckAttrAtLeast(
      m, "num_groups", {groups}, 1, "num_groups must be a positive integer"));
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor w,
      ShapedParam(m, "weight", dtype, {channels}, Presence::kOptional));
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor b, ShapedParam(m, "bias", dtype, {channels}, Presence::kOptional));
  MODELSTATE_ASSIGN_OR_RETURN(double eps, AttrDouble(m, "eps"));
  if (x.dim() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Expected at least 2 dimensions for input tensor but received ",
        x.dim()));
  }
  const int64_t n = x.shape()[0], c = x.shape()[1];
  if (c % groups != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Expected number of channels in input to be divisible by num_groups, "
        "but got input of shape ",
        Sizes(x.shape()), " and num_groups=", groups));
  }
  if (c != channels) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Expected weight to be a vector of size equal to the number of "
        "channels in input, but got weight of shape [",
        channels, "] and input of shape ", Sizes(x.shape())));
  }
  const int64_t inner = Prod(x.shape(), 2, x.shape().size());
  const int64_t cpg = c / groups, span = cpg * inner;
  std::vector<double> mean(c), invstd(c);
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(x.shape()));
  const T* px = Data<T>(x);
  for (int64_t ni = 0; ni < n; ++ni) {
    for (int64_t g = 0; g < groups; ++g) {
      const T* src = px + (ni * c + g * cpg) * inner;
      double sum = 0;
      for (int64_t i = 0; i < span; ++i) sum += src[i];
      const double mu = span > 0 ? sum / static_cast<double>(span) : 0.0;
      double sq = 0;
      for (int64_t i = 0; i < span; ++i) {
        double d = src[i] - mu;
        sq += d * d;
      }
      const double rstd =
          1.0 /
          std::sqrt((span > 0 ? sq / static_cast<double>(span) : 0.0) + eps);
      for (int64_t ci = g * cpg; ci < (g + 1) * cpg; ++ci) {
        mean[ci] = mu;
        invstd[ci] = rstd;
      }
    }
    Normalize(px + ni * c * inner, 1, c, inner, mean, invstd, Data<T>(w),
              Data<T>(b), y.data + ni * c * inner);
  }
  return y.tensor;
}

// ---------------------------------------------------------------------------
// LocalResponseNorm.

absl::StatusOr<std::shared_ptr<Module>> BuildLocalResponseNorm(
    const BoundArgs& args, BuildContext&, const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t size, args.Int("size"));
  std::shared_ptr<Module> m =
      NewStateless("LocalResponseNorm", "normalization");
  m->SetPlainAttribute("size", size);
  for (const char* name : {"alpha", "beta", "k"}) {
    MODELSTATE_ASSIGN_OR_RETURN(double value, args.Float(name));
    m->SetPlainAttribute(name, value);
  }
  return m;
}

// F.local_response_norm: x / (k + alpha * mean(x^2 over the `size`
// channels c - size/2 .. c + (size-1)/2, zeros past the ends))^beta, the
// mean always dividing by `size` (avg_pool's count_include_pad).
template <typename T>
absl::StatusOr<Tensor> LocalResponseNormForward(const LayerCall& call,
                                                const Tensor& x, DType) {
  const Module& m = call.module;
  MODELSTATE_ASSIGN_OR_RETURN(int64_t size, AttrInt(m, "size"));
  MODELSTATE_ASSIGN_OR_RETURN(double alpha, AttrDouble(m, "alpha"));
  MODELSTATE_ASSIGN_OR_RETURN(double beta, AttrDouble(m, "beta"));
  MODELSTATE_ASSIGN_OR_RETURN(double k, AttrDouble(m, "k"));
  if (x.dim() < 3) {
    // torch's text, with the indentation its line continuation keeps.
    return absl::InvalidArgumentError(absl::StrCat(
        "Expected 3D or higher dimensionality ", std::string(25, ' '),
        "input (got ", x.dim(), " dimensions)"));
  }
  if (x.numel() == 0) return x;
  if (size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel size should be greater than zero, but got ",
                     x.dim() == 3 ? "kH: " : "kT: ", size,
                     x.dim() == 3 ? " kW: 1" : " kH: 1 kW: 1"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(x.shape()));
  const int64_t channels = x.shape()[1];
  const int64_t inner = Prod(x.shape(), 2, x.dim());
  const T* px = Data<T>(x);
  for (int64_t n = 0; n < x.shape()[0]; ++n) {
    const T* src = px + n * channels * inner;
    T* dst = y.data + n * channels * inner;
    for (int64_t c = 0; c < channels; ++c) {
      const int64_t lo = std::max<int64_t>(0, c - size / 2);
      const int64_t hi = std::min(channels - 1, c + (size - 1) / 2);
      for (int64_t i = 0; i < inner; ++i) {
        double sum = 0;
        for (int64_t j = lo; j <= hi; ++j) {
          const double v = src[j * inner + i];
          sum += v * v;
        }
        const double div = std::pow(sum / size * alpha + k, beta);
        dst[c * inner + i] = static_cast<T>(src[c * inner + i] / div);
      }
    }
  }
  return y.tensor;
}

}  // namespace

std::vector<LayerDef> NormalizationFamily() {
  std::vector<ArgDef> bn = WithFactory({{"num_features", {}},
                                        {"eps", F(1e-5)},
                                        {"momentum", F(0.1)},
                                        {"affine", B(true)},
                                        {"track_running_stats", B(true)}});
  // _InstanceNorm: the same arguments, without affine or statistics.
  std::vector<ArgDef> instance =
      WithFactory({{"num_features", {}},
                   {"eps", F(1e-5)},
                   {"momentum", F(0.1)},
                   {"affine", B(false)},
                   {"track_running_stats", B(false)}});
  return {
      {.type = "BatchNorm1d",
       .qualified_name = "torch.nn.modules.batchnorm.BatchNorm1d",
       .signature = bn,
       .build = &BuildBatchNorm<kBatchNorm1d>,
       .forward = &FloatForward<&BatchNormForward<float, 1>,
                                &BatchNormForward<double, 1>>},
      {.type = "BatchNorm2d",
       .qualified_name = "torch.nn.modules.batchnorm.BatchNorm2d",
       .signature = bn,
       .build = &BuildBatchNorm<kBatchNorm2d>,
       .forward = &FloatForward<&BatchNormForward<float, 2>,
                                &BatchNormForward<double, 2>>},
      {.type = "BatchNorm3d",
       .qualified_name = "torch.nn.modules.batchnorm.BatchNorm3d",
       .signature = bn,
       .build = &BuildBatchNorm<kBatchNorm3d>,
       .forward = &FloatForward<&BatchNormForward<float, 3>,
                                &BatchNormForward<double, 3>>},
      {.type = "InstanceNorm1d",
       .qualified_name = "torch.nn.modules.instancenorm.InstanceNorm1d",
       .signature = instance,
       .build = &BuildInstanceNorm<kInstanceNorm1d>,
       .forward = &FloatForward<&InstanceNormForward<float, 1>,
                                &InstanceNormForward<double, 1>>},
      {.type = "InstanceNorm2d",
       .qualified_name = "torch.nn.modules.instancenorm.InstanceNorm2d",
       .signature = instance,
       .build = &BuildInstanceNorm<kInstanceNorm2d>,
       .forward = &FloatForward<&InstanceNormForward<float, 2>,
                                &InstanceNormForward<double, 2>>},
      {.type = "InstanceNorm3d",
       .qualified_name = "torch.nn.modules.instancenorm.InstanceNorm3d",
       .signature = instance,
       .build = &BuildInstanceNorm<kInstanceNorm3d>,
       .forward = &FloatForward<&InstanceNormForward<float, 3>,
                                &InstanceNormForward<double, 3>>},
      // LayerNorm's `bias` argument is PyTorch 2.1's (after
      // elementwise_affine).
      {.type = "LayerNorm",
       .qualified_name = "torch.nn.modules.normalization.LayerNorm",
       .signature = {{"normalized_shape", {}},
                     {"eps", F(1e-5)},
                     {"elementwise_affine", B(true)},
                     {"bias", B(true)},
                     {"device", kNone},
                     {"dtype", kNone}},
       .build = &BuildLayerNorm,
       .forward =
           &FloatForward<&LayerNormForward<float>, &LayerNormForward<double>>},
      {.type = "GroupNorm",
       .qualified_name = "torch.nn.modules.normalization.GroupNorm",
       .signature = WithFactory({{"num_groups", {}},
                                 {"num_channels", {}},
                                 {"eps", F(1e-5)},
                                 {"affine", B(true)}}),
       .build = &BuildGroupNorm,
       .forward =
           &FloatForward<&GroupNormForward<float>, &GroupNormForward<double>>},
      {.type = "LocalResponseNorm",
       .qualified_name = "torch.nn.modules.normalization.LocalResponseNorm",
       .signature =
           {{"size", {}}, {"alpha", F(1e-4)}, {"beta", F(0.75)}, {"k", F(1.0)}},
       .build = &BuildLocalResponseNorm,
       .forward = &FloatForward<&LocalResponseNormForward<float>,
                                &LocalResponseNormForward<double>>},
  };
}

}  // namespace modelstate::internal
