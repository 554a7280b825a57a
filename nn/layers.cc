// The library of built-in layers: PyTorch's constructor signatures (1.13,
// plus the 2.x additions noted), registration order, state_dict keys and
// default initialisation. Every tensor is initialised before it is
// registered, drawing random numbers in the order PyTorch's
// reset_parameters() does, so that registration hooks see (and may replace)
// the final value while the build stays bit-compatible with
// torch.manual_seed(seed).
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "core/init.h"
#include "nn/build_context.h"

namespace modelstate::internal {
namespace {

const SpecValue kNone = std::monostate();
SpecValue I(int64_t v) { return v; }
SpecValue F(double v) { return v; }
SpecValue B(bool v) { return v; }
SpecValue S(const char* v) { return std::string(v); }

// A built-in layer module with its plain attributes.
std::shared_ptr<Module> NewLayer(absl::string_view type,
                                 absl::string_view module_file) {
  std::shared_ptr<Module> m =
      Module::Create(std::string(type),
                     absl::StrCat("torch.nn.modules.", module_file, ".", type));
  m->set_fixed_shapes(true);
  return m;
}

absl::Status CheckPositive(absl::string_view what, int64_t value) {
  if (value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be non-negative, got ", value));
  }
  return absl::OkStatus();
}

struct LinearTensors {
  Tensor weight;
  Tensor bias;  // undefined without bias
};

// Linear's tensors, initialised like Linear.reset_parameters().
absl::StatusOr<LinearTensors> MakeLinearTensors(int64_t in, int64_t out,
                                                bool bias, DType dtype,
                                                Device device,
                                                BuildContext& ctx) {
  LinearTensors t;
  MODELSTATE_ASSIGN_OR_RETURN(t.weight,
                              ctx.NewTensor(dtype, {out, in}, device));
  MODELSTATE_RETURN_IF_ERROR(
      KaimingUniform(t.weight, std::sqrt(5.0), ctx.gen()));
  if (bias) {
    MODELSTATE_ASSIGN_OR_RETURN(t.bias, ctx.NewTensor(dtype, {out}, device));
    double bound = in > 0 ? 1.0 / std::sqrt(static_cast<double>(in)) : 0.0;
    MODELSTATE_RETURN_IF_ERROR(UniformInit(t.bias, -bound, bound, ctx.gen()));
  }
  return t;
}

absl::Status RegisterLinear(Module& m, const std::string& path, LinearTensors t,
                            BuildContext& ctx) {
  MODELSTATE_RETURN_IF_ERROR(ctx.AddParameter(m, path, "weight", t.weight));
  return ctx.AddParameter(m, path, "bias", t.bias);
}

std::shared_ptr<Module> NewLinearModule(absl::string_view type, int64_t in,
                                        int64_t out) {
  std::shared_ptr<Module> m = NewLayer(type, "linear");
  m->SetPlainAttribute("in_features", in);
  m->SetPlainAttribute("out_features", out);
  m->AddClassAttributes({"reset_parameters", "__constants__"});
  return m;
}

std::string ChildPath(const std::string& path, absl::string_view name) {
  return path.empty() ? std::string(name) : absl::StrCat(path, ".", name);
}

// ---------------------------------------------------------------------------

absl::StatusOr<std::shared_ptr<Module>> BuildIdentity(const BoundArgs&,
                                                      BuildContext&,
                                                      const std::string&) {
  return NewLayer("Identity", "linear");
}

// Linear(in, out, bias) at `path`, initialised and registered.
absl::StatusOr<std::shared_ptr<Module>> MakeLinear(int64_t in, int64_t out,
                                                   bool bias, DType dtype,
                                                   Device device,
                                                   BuildContext& ctx,
                                                   const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(
      LinearTensors t, MakeLinearTensors(in, out, bias, dtype, device, ctx));
  std::shared_ptr<Module> m = NewLinearModule("Linear", in, out);
  MODELSTATE_RETURN_IF_ERROR(RegisterLinear(*m, path, std::move(t), ctx));
  return m;
}

absl::StatusOr<std::shared_ptr<Module>> BuildLinear(const BoundArgs& args,
                                                    BuildContext& ctx,
                                                    const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t in, args.Int("in_features"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t out, args.Int("out_features"));
  MODELSTATE_ASSIGN_OR_RETURN(bool bias, args.Bool("bias"));
  MODELSTATE_ASSIGN_OR_RETURN(DType dtype,
                              args.FactoryDType(ctx.options().dtype));
  MODELSTATE_ASSIGN_OR_RETURN(Device device,
                              args.FactoryDevice(ctx.options().device));
  return MakeLinear(in, out, bias, dtype, device, ctx, path);
}

absl::StatusOr<std::shared_ptr<Module>> BuildBilinear(const BoundArgs& args,
                                                      BuildContext& ctx,
                                                      const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t in1, args.Int("in1_features"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t in2, args.Int("in2_features"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t out, args.Int("out_features"));
  MODELSTATE_ASSIGN_OR_RETURN(bool bias, args.Bool("bias"));
  MODELSTATE_ASSIGN_OR_RETURN(DType dtype,
                              args.FactoryDType(ctx.options().dtype));
  MODELSTATE_ASSIGN_OR_RETURN(Device device,
                              args.FactoryDevice(ctx.options().device));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor w,
                              ctx.NewTensor(dtype, {out, in1, in2}, device));
  Tensor b;
  if (bias) {
    MODELSTATE_ASSIGN_OR_RETURN(b, ctx.NewTensor(dtype, {out}, device));
  }
  // Bilinear.reset_parameters: bound = 1 / sqrt(weight.size(1)).
  double bound = 1.0 / std::sqrt(static_cast<double>(in1));
  MODELSTATE_RETURN_IF_ERROR(UniformInit(w, -bound, bound, ctx.gen()));
  if (bias)
    MODELSTATE_RETURN_IF_ERROR(UniformInit(b, -bound, bound, ctx.gen()));
  std::shared_ptr<Module> m = NewLayer("Bilinear", "linear");
  m->SetPlainAttribute("in1_features", in1);
  m->SetPlainAttribute("in2_features", in2);
  m->SetPlainAttribute("out_features", out);
  m->AddClassAttributes({"reset_parameters", "__constants__"});
  MODELSTATE_RETURN_IF_ERROR(ctx.AddParameter(*m, path, "weight", w));
  MODELSTATE_RETURN_IF_ERROR(ctx.AddParameter(*m, path, "bias", b));
  return m;
}

// _ConvNd for Conv1d, Conv2d and ConvTranspose2d.
absl::StatusOr<std::shared_ptr<Module>> BuildConv(
    const BoundArgs& args, BuildContext& ctx, const std::string& path,
    absl::string_view type, size_t dims, bool transposed) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t in, args.Int("in_channels"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t out, args.Int("out_channels"));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> kernel,
                              args.Ints("kernel_size", dims));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> stride,
                              args.Ints("stride", dims));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> dilation,
                              args.Ints("dilation", dims));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t groups, args.Int("groups"));
  MODELSTATE_ASSIGN_OR_RETURN(bool bias, args.Bool("bias"));
  MODELSTATE_ASSIGN_OR_RETURN(std::string padding_mode,
                              args.Str("padding_mode"));
  MODELSTATE_ASSIGN_OR_RETURN(DType dtype,
                              args.FactoryDType(ctx.options().dtype));
  MODELSTATE_ASSIGN_OR_RETURN(Device device,
                              args.FactoryDevice(ctx.options().device));
  AttrValue padding_attr;
  std::vector<int64_t> output_padding(dims, 0);
  if (transposed) {
    MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> padding,
                                args.Ints("padding", dims));
    padding_attr = padding;
    MODELSTATE_ASSIGN_OR_RETURN(output_padding,
                                args.Ints("output_padding", dims));
  } else {
    absl::StatusOr<std::string> padding_str = args.Str("padding");
    if (padding_str.ok()) {
      if (*padding_str != "same" && *padding_str != "valid") {
        return absl::InvalidArgumentError(
            absl::StrCat("Invalid padding string '", *padding_str,
                         "', should be one of {'valid', 'same'}"));
      }
      for (int64_t s : stride) {
        if (*padding_str == "same" && s != 1) {
          return absl::InvalidArgumentError(
              "padding='same' is not supported for strided convolutions");
        }
      }
      padding_attr = *padding_str;
    } else {
      MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> padding,
                                  args.Ints("padding", dims));
      padding_attr = padding;
    }
  }
  if (groups <= 0) {
    return absl::InvalidArgumentError("groups must be a positive integer");
  }
  if (in % groups != 0) {
    return absl::InvalidArgumentError(
        "in_channels must be divisible by groups");
  }
  if (out % groups != 0) {
    return absl::InvalidArgumentError(
        "out_channels must be divisible by groups");
  }
  static constexpr absl::string_view kModes[] = {"zeros", "reflect",
                                                 "replicate", "circular"};
  bool known_mode = false;
  for (absl::string_view mode : kModes) known_mode |= mode == padding_mode;
  if (!known_mode) {
    return absl::InvalidArgumentError(absl::StrCat(
        "padding_mode must be one of ['zeros', 'reflect', 'replicate', "
        "'circular'], but got padding_mode='",
        padding_mode, "'"));
  }
  if (transposed && padding_mode != "zeros") {
    return absl::InvalidArgumentError(
        absl::StrCat("Only \"zeros\" padding mode is supported for ", type));
  }
  Shape weight_shape =
      transposed ? Shape{in, out / groups} : Shape{out, in / groups};
  weight_shape.insert(weight_shape.end(), kernel.begin(), kernel.end());
  MODELSTATE_ASSIGN_OR_RETURN(Tensor w,
                              ctx.NewTensor(dtype, weight_shape, device));
  Tensor b;
  if (bias) {
    MODELSTATE_ASSIGN_OR_RETURN(b, ctx.NewTensor(dtype, {out}, device));
  }
  // _ConvNd.reset_parameters.
  MODELSTATE_RETURN_IF_ERROR(KaimingUniform(w, std::sqrt(5.0), ctx.gen()));
  if (bias) {
    MODELSTATE_ASSIGN_OR_RETURN(auto fans, FanInAndFanOut(w));
    if (fans.first != 0) {
      double bound = 1.0 / std::sqrt(static_cast<double>(fans.first));
      MODELSTATE_RETURN_IF_ERROR(UniformInit(b, -bound, bound, ctx.gen()));
    }
  }
  std::shared_ptr<Module> m = NewLayer(type, "conv");
  m->SetPlainAttribute("in_channels", in);
  m->SetPlainAttribute("out_channels", out);
  m->SetPlainAttribute("kernel_size", kernel);
  m->SetPlainAttribute("stride", stride);
  m->SetPlainAttribute("padding", padding_attr);
  m->SetPlainAttribute("dilation", dilation);
  m->SetPlainAttribute("transposed", transposed);
  m->SetPlainAttribute("output_padding", output_padding);
  m->SetPlainAttribute("groups", groups);
  m->SetPlainAttribute("padding_mode", padding_mode);
  m->AddClassAttributes({"reset_parameters", "__constants__"});
  MODELSTATE_RETURN_IF_ERROR(ctx.AddParameter(*m, path, "weight", w));
  MODELSTATE_RETURN_IF_ERROR(ctx.AddParameter(*m, path, "bias", b));
  return m;
}

absl::StatusOr<std::shared_ptr<Module>> BuildConv1d(const BoundArgs& args,
                                                    BuildContext& ctx,
                                                    const std::string& path) {
  return BuildConv(args, ctx, path, "Conv1d", 1, false);
}
absl::StatusOr<std::shared_ptr<Module>> BuildConv2d(const BoundArgs& args,
                                                    BuildContext& ctx,
                                                    const std::string& path) {
  return BuildConv(args, ctx, path, "Conv2d", 2, false);
}
absl::StatusOr<std::shared_ptr<Module>> BuildConvTranspose2d(
    const BoundArgs& args, BuildContext& ctx, const std::string& path) {
  return BuildConv(args, ctx, path, "ConvTranspose2d", 2, true);
}

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

// _NormBase for BatchNorm1d / BatchNorm2d.
absl::StatusOr<std::shared_ptr<Module>> BuildBatchNorm(const BoundArgs& args,
                                                       BuildContext& ctx,
                                                       const std::string& path,
                                                       absl::string_view type) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t n, args.Int("num_features"));
  MODELSTATE_ASSIGN_OR_RETURN(double eps, args.Float("eps"));
  MODELSTATE_ASSIGN_OR_RETURN(bool affine, args.Bool("affine"));
  MODELSTATE_ASSIGN_OR_RETURN(bool track, args.Bool("track_running_stats"));
  MODELSTATE_ASSIGN_OR_RETURN(DType dtype,
                              args.FactoryDType(ctx.options().dtype));
  MODELSTATE_ASSIGN_OR_RETURN(Device device,
                              args.FactoryDevice(ctx.options().device));
  AttrValue momentum;
  if (!args.IsNone("momentum")) {
    MODELSTATE_ASSIGN_OR_RETURN(double mom, args.Float("momentum"));
    momentum = mom;
  }
  MODELSTATE_ASSIGN_OR_RETURN(
      AffineTensors affine_tensors,
      MakeAffine({n}, affine, affine, dtype, device, ctx));
  Tensor mean, var, count;
  if (track) {
    MODELSTATE_ASSIGN_OR_RETURN(mean, ctx.NewTensor(dtype, {n}, device));
    MODELSTATE_ASSIGN_OR_RETURN(var, ctx.NewTensor(dtype, {n}, device));
    // num_batches_tracked ignores the factory dtype.
    MODELSTATE_ASSIGN_OR_RETURN(count,
                                ctx.NewTensor(DType::kInt64, {}, device));
    MODELSTATE_RETURN_IF_ERROR(ConstantInit(mean, 0.0));
    MODELSTATE_RETURN_IF_ERROR(ConstantInit(var, 1.0));
    MODELSTATE_RETURN_IF_ERROR(ConstantInit(count, 0.0));
  }
  std::shared_ptr<Module> m = NewLayer(type, "batchnorm");
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

absl::StatusOr<std::shared_ptr<Module>> BuildBatchNorm1d(
    const BoundArgs& args, BuildContext& ctx, const std::string& path) {
  return BuildBatchNorm(args, ctx, path, "BatchNorm1d");
}
absl::StatusOr<std::shared_ptr<Module>> BuildBatchNorm2d(
    const BoundArgs& args, BuildContext& ctx, const std::string& path) {
  return BuildBatchNorm(args, ctx, path, "BatchNorm2d");
}

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

absl::StatusOr<std::shared_ptr<Module>> BuildLayerNorm(
    const BoundArgs& args, BuildContext& ctx, const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> shape,
                              args.Ints("normalized_shape", 0));
  MODELSTATE_ASSIGN_OR_RETURN(double eps, args.Float("eps"));
  MODELSTATE_ASSIGN_OR_RETURN(bool affine, args.Bool("elementwise_affine"));
  MODELSTATE_ASSIGN_OR_RETURN(bool bias, args.Bool("bias"));  // 2.1+
  MODELSTATE_ASSIGN_OR_RETURN(DType dtype,
                              args.FactoryDType(ctx.options().dtype));
  MODELSTATE_ASSIGN_OR_RETURN(Device device,
                              args.FactoryDevice(ctx.options().device));
  return MakeLayerNorm(shape, eps, affine, bias, dtype, device, ctx, path);
}

absl::StatusOr<std::shared_ptr<Module>> BuildGroupNorm(
    const BoundArgs& args, BuildContext& ctx, const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t groups, args.Int("num_groups"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t channels, args.Int("num_channels"));
  MODELSTATE_ASSIGN_OR_RETURN(double eps, args.Float("eps"));
  MODELSTATE_ASSIGN_OR_RETURN(bool affine, args.Bool("affine"));
  MODELSTATE_ASSIGN_OR_RETURN(DType dtype,
                              args.FactoryDType(ctx.options().dtype));
  MODELSTATE_ASSIGN_OR_RETURN(Device device,
                              args.FactoryDevice(ctx.options().device));
  if (groups == 0 || channels % groups != 0) {
    return absl::InvalidArgumentError(
        "num_channels must be divisible by num_groups");
  }
  MODELSTATE_ASSIGN_OR_RETURN(
      AffineTensors t,
      MakeAffine({channels}, affine, affine, dtype, device, ctx));
  std::shared_ptr<Module> m = NewLayer("GroupNorm", "normalization");
  m->SetPlainAttribute("num_groups", groups);
  m->SetPlainAttribute("num_channels", channels);
  m->SetPlainAttribute("eps", eps);
  m->SetPlainAttribute("affine", affine);
  m->AddClassAttributes({"reset_parameters", "__constants__"});
  MODELSTATE_RETURN_IF_ERROR(RegisterAffine(*m, path, std::move(t), ctx));
  return m;
}

absl::StatusOr<std::shared_ptr<Module>> BuildEmbedding(
    const BoundArgs& args, BuildContext& ctx, const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t n, args.Int("num_embeddings"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t d, args.Int("embedding_dim"));
  MODELSTATE_ASSIGN_OR_RETURN(DType dtype,
                              args.FactoryDType(ctx.options().dtype));
  MODELSTATE_ASSIGN_OR_RETURN(Device device,
                              args.FactoryDevice(ctx.options().device));
  MODELSTATE_ASSIGN_OR_RETURN(bool freeze, args.Bool("_freeze"));  // 2.x
  AttrValue padding_attr;
  std::optional<int64_t> padding_idx;
  if (!args.IsNone("padding_idx")) {
    MODELSTATE_ASSIGN_OR_RETURN(int64_t idx, args.Int("padding_idx"));
    if (idx > 0 && idx >= n) {
      return absl::InvalidArgumentError(
          "Padding_idx must be within num_embeddings");
    }
    if (idx < 0) {
      if (idx < -n) {
        return absl::InvalidArgumentError(
            "Padding_idx must be within num_embeddings");
      }
      idx += n;
    }
    padding_idx = idx;
    padding_attr = idx;
  }
  if (!args.IsNone("_weight")) {
    return absl::InvalidArgumentError(
        "_weight is not supported here; build the layer, then load the "
        "values with LoadStateDict");
  }
  AttrValue max_norm;
  if (!args.IsNone("max_norm")) {
    MODELSTATE_ASSIGN_OR_RETURN(double v, args.Float("max_norm"));
    max_norm = v;
  }
  MODELSTATE_ASSIGN_OR_RETURN(double norm_type, args.Float("norm_type"));
  MODELSTATE_ASSIGN_OR_RETURN(bool scale, args.Bool("scale_grad_by_freq"));
  MODELSTATE_ASSIGN_OR_RETURN(bool sparse, args.Bool("sparse"));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor w, ctx.NewTensor(dtype, {n, d}, device));
  MODELSTATE_RETURN_IF_ERROR(NormalInit(w, 0.0, 1.0, ctx.gen()));
  if (padding_idx.has_value() && device.has_storage() && d > 0) {
    // _fill_padding_idx_with_zero: the row is zeroed after the draw.
    MODELSTATE_ASSIGN_OR_RETURN(void* data, w.MutableDataForOverwrite());
    for (int64_t j = 0; j < d; ++j) {
      WriteElementFromDouble(data, dtype, *padding_idx * d + j, 0.0);
    }
  }
  std::shared_ptr<Module> m = NewLayer("Embedding", "sparse");
  m->SetPlainAttribute("num_embeddings", n);
  m->SetPlainAttribute("embedding_dim", d);
  m->SetPlainAttribute("padding_idx", padding_attr);
  m->SetPlainAttribute("max_norm", max_norm);
  m->SetPlainAttribute("norm_type", norm_type);
  m->SetPlainAttribute("scale_grad_by_freq", scale);
  m->SetPlainAttribute("sparse", sparse);
  m->AddClassAttributes({"reset_parameters", "__constants__", "from_pretrained",
                         "_fill_padding_idx_with_zero"});
  MODELSTATE_RETURN_IF_ERROR(
      ctx.AddParameter(*m, path, "weight", w, /*requires_grad=*/!freeze));
  return m;
}

// Modules without state: activations, dropout, softmax, flatten.
std::shared_ptr<Module> NewStateless(absl::string_view type,
                                     absl::string_view file) {
  std::shared_ptr<Module> m = NewLayer(type, file);
  m->AddClassAttributes({"__constants__"});
  return m;
}

absl::StatusOr<std::shared_ptr<Module>> BuildDropout(const BoundArgs& args,
                                                     BuildContext&,
                                                     const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(double p, args.Float("p"));
  MODELSTATE_ASSIGN_OR_RETURN(bool inplace, args.Bool("inplace"));
  if (p < 0 || p > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dropout probability has to be between 0 and 1, but got ", p));
  }
  std::shared_ptr<Module> m = NewStateless("Dropout", "dropout");
  m->SetPlainAttribute("p", p);
  m->SetPlainAttribute("inplace", inplace);
  return m;
}

template <const char* kType>
absl::StatusOr<std::shared_ptr<Module>> BuildInplaceActivation(
    const BoundArgs& args, BuildContext&, const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(bool inplace, args.Bool("inplace"));
  std::shared_ptr<Module> m = NewStateless(kType, "activation");
  m->SetPlainAttribute("inplace", inplace);
  return m;
}

template <const char* kType>
absl::StatusOr<std::shared_ptr<Module>> BuildPlainActivation(
    const BoundArgs&, BuildContext&, const std::string&) {
  return NewStateless(kType, "activation");
}

constexpr char kReLU[] = "ReLU";
constexpr char kSiLU[] = "SiLU";
constexpr char kTanh[] = "Tanh";
constexpr char kSigmoid[] = "Sigmoid";

absl::StatusOr<std::shared_ptr<Module>> BuildGELU(const BoundArgs& args,
                                                  BuildContext&,
                                                  const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(std::string approximate, args.Str("approximate"));
  if (approximate != "none" && approximate != "tanh") {
    return absl::InvalidArgumentError(
        absl::StrCat("approximate argument must be either none or tanh, got '",
                     approximate, "'"));
  }
  std::shared_ptr<Module> m = NewStateless("GELU", "activation");
  m->SetPlainAttribute("approximate", approximate);
  return m;
}

absl::StatusOr<std::shared_ptr<Module>> BuildSoftmax(const BoundArgs& args,
                                                     BuildContext&,
                                                     const std::string&) {
  AttrValue dim;
  if (!args.IsNone("dim")) {
    MODELSTATE_ASSIGN_OR_RETURN(int64_t d, args.Int("dim"));
    dim = d;
  }
  std::shared_ptr<Module> m = NewStateless("Softmax", "activation");
  m->SetPlainAttribute("dim", dim);
  return m;
}

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

absl::StatusOr<std::shared_ptr<Module>> BuildMaxPool2d(const BoundArgs& args,
                                                       BuildContext&,
                                                       const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(AttrValue kernel,
                              args.IntOrTuple("kernel_size", 1));
  // PyTorch: stride = stride if (stride is not None) else kernel_size.
  AttrValue stride = kernel;
  if (!args.IsNone("stride")) {
    MODELSTATE_ASSIGN_OR_RETURN(stride, args.IntOrTuple("stride", 1));
  }
  MODELSTATE_ASSIGN_OR_RETURN(AttrValue padding, args.IntOrTuple("padding", 0));
  MODELSTATE_ASSIGN_OR_RETURN(AttrValue dilation,
                              args.IntOrTuple("dilation", 1));
  MODELSTATE_ASSIGN_OR_RETURN(bool return_indices, args.Bool("return_indices"));
  MODELSTATE_ASSIGN_OR_RETURN(bool ceil_mode, args.Bool("ceil_mode"));
  std::shared_ptr<Module> m = NewStateless("MaxPool2d", "pooling");
  m->SetPlainAttribute("kernel_size", kernel);
  m->SetPlainAttribute("stride", stride);
  m->SetPlainAttribute("padding", padding);
  m->SetPlainAttribute("dilation", dilation);
  m->SetPlainAttribute("return_indices", return_indices);
  m->SetPlainAttribute("ceil_mode", ceil_mode);
  return m;
}

absl::StatusOr<std::shared_ptr<Module>> BuildAdaptiveAvgPool2d(
    const BoundArgs& args, BuildContext&, const std::string&) {
  MODELSTATE_ASSIGN_OR_RETURN(AttrValue size,
                              args.IntOrTuple("output_size", 0));
  std::shared_ptr<Module> m = NewStateless("AdaptiveAvgPool2d", "pooling");
  m->SetPlainAttribute("output_size", size);
  return m;
}

struct MhaConfig {
  int64_t embed_dim;
  int64_t num_heads;
  double dropout;
  bool bias;
  bool add_bias_kv;
  bool add_zero_attn;
  int64_t kdim;
  int64_t vdim;
  bool batch_first;
  DType dtype;
  Device device;
};

absl::StatusOr<std::shared_ptr<Module>> MakeMultiheadAttention(
    const MhaConfig& c, BuildContext& ctx, const std::string& path) {
  MODELSTATE_RETURN_IF_ERROR(CheckPositive("embed_dim", c.embed_dim));
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
  MODELSTATE_ASSIGN_OR_RETURN(c.dtype, args.FactoryDType(ctx.options().dtype));
  MODELSTATE_ASSIGN_OR_RETURN(c.device,
                              args.FactoryDevice(ctx.options().device));
  return MakeMultiheadAttention(c, ctx, path);
}

absl::StatusOr<std::shared_ptr<Module>> BuildTransformerEncoderLayer(
    const BoundArgs& args, BuildContext& ctx, const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t d_model, args.Int("d_model"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t nhead, args.Int("nhead"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t dff, args.Int("dim_feedforward"));
  MODELSTATE_ASSIGN_OR_RETURN(double dropout, args.Float("dropout"));
  MODELSTATE_ASSIGN_OR_RETURN(std::string activation, args.Str("activation"));
  MODELSTATE_ASSIGN_OR_RETURN(double eps, args.Float("layer_norm_eps"));
  MODELSTATE_ASSIGN_OR_RETURN(bool batch_first, args.Bool("batch_first"));
  MODELSTATE_ASSIGN_OR_RETURN(bool norm_first, args.Bool("norm_first"));
  MODELSTATE_ASSIGN_OR_RETURN(bool bias, args.Bool("bias"));  // 2.1+
  MODELSTATE_ASSIGN_OR_RETURN(DType dtype,
                              args.FactoryDType(ctx.options().dtype));
  MODELSTATE_ASSIGN_OR_RETURN(Device device,
                              args.FactoryDevice(ctx.options().device));
  if (activation != "relu" && activation != "gelu") {
    return absl::InvalidArgumentError(
        absl::StrCat("activation should be relu/gelu, not ", activation));
  }
  if (dropout < 0 || dropout > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dropout probability has to be between 0 and 1, but got ", dropout));
  }
  std::shared_ptr<Module> m =
      NewLayer("TransformerEncoderLayer", "transformer");
  m->AddClassAttributes(
      {"__constants__", "__setstate__", "_sa_block", "_ff_block"});
  // Children are constructed and assigned one at a time, as in __init__.
  MhaConfig mha{d_model, nhead,   dropout,     bias,  false, false,
                d_model, d_model, batch_first, dtype, device};
  std::string sa_path = ChildPath(path, "self_attn");
  MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<Module> self_attn,
                              MakeMultiheadAttention(mha, ctx, sa_path));
  MODELSTATE_RETURN_IF_ERROR(ctx.AddModule(*m, path, "self_attn", self_attn));

  auto add_linear = [&](const char* name, int64_t in,
                        int64_t out) -> absl::Status {
    MODELSTATE_ASSIGN_OR_RETURN(
        std::shared_ptr<Module> lin,
        MakeLinear(in, out, bias, dtype, device, ctx, ChildPath(path, name)));
    return ctx.AddModule(*m, path, name, lin);
  };
  auto add_dropout = [&](const char* name) -> absl::Status {
    std::shared_ptr<Module> d = NewStateless("Dropout", "dropout");
    d->SetPlainAttribute("p", dropout);
    d->SetPlainAttribute("inplace", false);
    return ctx.AddModule(*m, path, name, d);
  };
  auto add_norm = [&](const char* name) -> absl::Status {
    MODELSTATE_ASSIGN_OR_RETURN(
        std::shared_ptr<Module> norm,
        MakeLayerNorm({d_model}, eps, /*affine=*/true, bias, dtype, device, ctx,
                      ChildPath(path, name)));
    return ctx.AddModule(*m, path, name, norm);
  };
  MODELSTATE_RETURN_IF_ERROR(add_linear("linear1", d_model, dff));
  MODELSTATE_RETURN_IF_ERROR(add_dropout("dropout"));
  MODELSTATE_RETURN_IF_ERROR(add_linear("linear2", dff, d_model));
  m->SetPlainAttribute("norm_first", norm_first);
  MODELSTATE_RETURN_IF_ERROR(add_norm("norm1"));
  MODELSTATE_RETURN_IF_ERROR(add_norm("norm2"));
  MODELSTATE_RETURN_IF_ERROR(add_dropout("dropout1"));
  MODELSTATE_RETURN_IF_ERROR(add_dropout("dropout2"));
  // A string activation is a function, not a submodule.
  m->SetPlainAttribute("activation", activation);
  m->SetPlainAttribute("batch_first", batch_first);
  return m;
}

std::vector<ArgDef> WithFactory(std::vector<ArgDef> args) {
  args.push_back({"device", kNone});
  args.push_back({"dtype", kNone});
  return args;
}

std::vector<LayerDef> MakeLayers() {
  std::vector<LayerDef> layers;
  layers.push_back({"Identity",
                    "torch.nn.modules.linear.Identity",
                    {},
                    &BuildIdentity,
                    /*accepts_anything=*/true});
  layers.push_back(
      {"Linear", "torch.nn.modules.linear.Linear",
       WithFactory(
           {{"in_features", {}}, {"out_features", {}}, {"bias", B(true)}}),
       &BuildLinear});
  layers.push_back({"Bilinear", "torch.nn.modules.linear.Bilinear",
                    WithFactory({{"in1_features", {}},
                                 {"in2_features", {}},
                                 {"out_features", {}},
                                 {"bias", B(true)}}),
                    &BuildBilinear});
  std::vector<ArgDef> conv = WithFactory({{"in_channels", {}},
                                          {"out_channels", {}},
                                          {"kernel_size", {}},
                                          {"stride", I(1)},
                                          {"padding", I(0)},
                                          {"dilation", I(1)},
                                          {"groups", I(1)},
                                          {"bias", B(true)},
                                          {"padding_mode", S("zeros")}});
  layers.push_back(
      {"Conv1d", "torch.nn.modules.conv.Conv1d", conv, &BuildConv1d});
  layers.push_back(
      {"Conv2d", "torch.nn.modules.conv.Conv2d", conv, &BuildConv2d});
  layers.push_back({"ConvTranspose2d", "torch.nn.modules.conv.ConvTranspose2d",
                    WithFactory({{"in_channels", {}},
                                 {"out_channels", {}},
                                 {"kernel_size", {}},
                                 {"stride", I(1)},
                                 {"padding", I(0)},
                                 {"output_padding", I(0)},
                                 {"groups", I(1)},
                                 {"bias", B(true)},
                                 {"dilation", I(1)},
                                 {"padding_mode", S("zeros")}}),
                    &BuildConvTranspose2d});
  std::vector<ArgDef> bn = WithFactory({{"num_features", {}},
                                        {"eps", F(1e-5)},
                                        {"momentum", F(0.1)},
                                        {"affine", B(true)},
                                        {"track_running_stats", B(true)}});
  layers.push_back({"BatchNorm1d", "torch.nn.modules.batchnorm.BatchNorm1d", bn,
                    &BuildBatchNorm1d});
  layers.push_back({"BatchNorm2d", "torch.nn.modules.batchnorm.BatchNorm2d", bn,
                    &BuildBatchNorm2d});
  // LayerNorm's `bias` argument is PyTorch 2.1's (after elementwise_affine).
  layers.push_back({"LayerNorm",
                    "torch.nn.modules.normalization.LayerNorm",
                    {{"normalized_shape", {}},
                     {"eps", F(1e-5)},
                     {"elementwise_affine", B(true)},
                     {"bias", B(true)},
                     {"device", kNone},
                     {"dtype", kNone}},
                    &BuildLayerNorm});
  layers.push_back({"GroupNorm", "torch.nn.modules.normalization.GroupNorm",
                    WithFactory({{"num_groups", {}},
                                 {"num_channels", {}},
                                 {"eps", F(1e-5)},
                                 {"affine", B(true)}}),
                    &BuildGroupNorm});
  // Embedding's `_freeze` is PyTorch 2.x's (after _weight).
  layers.push_back({"Embedding",
                    "torch.nn.modules.sparse.Embedding",
                    {{"num_embeddings", {}},
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
                    &BuildEmbedding});
  layers.push_back({"Dropout",
                    "torch.nn.modules.dropout.Dropout",
                    {{"p", F(0.5)}, {"inplace", B(false)}},
                    &BuildDropout});
  layers.push_back({"ReLU",
                    "torch.nn.modules.activation.ReLU",
                    {{"inplace", B(false)}},
                    &BuildInplaceActivation<kReLU>});
  layers.push_back({"GELU",
                    "torch.nn.modules.activation.GELU",
                    {{"approximate", S("none")}},
                    &BuildGELU});
  layers.push_back({"SiLU",
                    "torch.nn.modules.activation.SiLU",
                    {{"inplace", B(false)}},
                    &BuildInplaceActivation<kSiLU>});
  layers.push_back({"Tanh",
                    "torch.nn.modules.activation.Tanh",
                    {},
                    &BuildPlainActivation<kTanh>});
  layers.push_back({"Sigmoid",
                    "torch.nn.modules.activation.Sigmoid",
                    {},
                    &BuildPlainActivation<kSigmoid>});
  layers.push_back({"Softmax",
                    "torch.nn.modules.activation.Softmax",
                    {{"dim", kNone}},
                    &BuildSoftmax});
  layers.push_back({"Flatten",
                    "torch.nn.modules.flatten.Flatten",
                    {{"start_dim", I(1)}, {"end_dim", I(-1)}},
                    &BuildFlatten});
  layers.push_back({"MaxPool2d",
                    "torch.nn.modules.pooling.MaxPool2d",
                    {{"kernel_size", {}},
                     {"stride", kNone},
                     {"padding", I(0)},
                     {"dilation", I(1)},
                     {"return_indices", B(false)},
                     {"ceil_mode", B(false)}},
                    &BuildMaxPool2d});
  layers.push_back({"AdaptiveAvgPool2d",
                    "torch.nn.modules.pooling.AdaptiveAvgPool2d",
                    {{"output_size", {}}},
                    &BuildAdaptiveAvgPool2d});
  layers.push_back({"MultiheadAttention",
                    "torch.nn.modules.activation.MultiheadAttention",
                    WithFactory({{"embed_dim", {}},
                                 {"num_heads", {}},
                                 {"dropout", F(0.0)},
                                 {"bias", B(true)},
                                 {"add_bias_kv", B(false)},
                                 {"add_zero_attn", B(false)},
                                 {"kdim", kNone},
                                 {"vdim", kNone},
                                 {"batch_first", B(false)}}),
                    &BuildMultiheadAttention});
  // TransformerEncoderLayer's `bias` is PyTorch 2.1's (after norm_first).
  layers.push_back({"TransformerEncoderLayer",
                    "torch.nn.modules.transformer.TransformerEncoderLayer",
                    WithFactory({{"d_model", {}},
                                 {"nhead", {}},
                                 {"dim_feedforward", I(2048)},
                                 {"dropout", F(0.1)},
                                 {"activation", S("relu")},
                                 {"layer_norm_eps", F(1e-5)},
                                 {"batch_first", B(false)},
                                 {"norm_first", B(false)},
                                 {"bias", B(true)}}),
                    &BuildTransformerEncoderLayer});
  return layers;
}

}  // namespace

const std::vector<LayerDef>& AllLayers() {
  static const auto* layers = new std::vector<LayerDef>(MakeLayers());
  return *layers;
}

const LayerDef* FindLayer(absl::string_view type) {
  for (const LayerDef& def : AllLayers()) {
    if (def.type == type) return &def;
  }
  return nullptr;
}

}  // namespace modelstate::internal
