// The transformer family: TransformerEncoderLayer, TransformerDecoderLayer,
// the stacks TransformerEncoder and TransformerDecoder, and Transformer.
// Construction follows torch.nn.modules.transformer: a layer constructs and
// assigns its children in __init__'s order; a stack holds `num_layers`
// copies of its prototype layer (torch deep-copies one built layer, so every
// copy starts with the same values) in a ModuleList `layers`, and its
// optional `norm`; Transformer builds an encoder and a decoder stack with
// final LayerNorms and then re-draws every parameter of two or more
// dimensions with xavier_uniform_, in parameters() order.
//
// In a spec, a stack's module arguments are named children: `encoder_layer`
// (or `decoder_layer`) and `norm`; `args` and `kwargs` bind the rest
// (num_layers, enable_nested_tensor, mask_check).
//
// Forward calls the submodules (their hooks fire), with the activation
// applied as a function and the residual additions in between:
//   TransformerEncoderLayer: [src, src_mask?, src_key_padding_mask?]
//   TransformerEncoder:      [src, mask?, src_key_padding_mask?]
//   TransformerDecoderLayer, TransformerDecoder:
//     [tgt, memory, tgt_mask?, memory_mask?, tgt_key_padding_mask?,
//      memory_key_padding_mask?]
//   Transformer: [src, tgt, src_mask?, tgt_mask?, memory_mask?,
//     src_key_padding_mask?, tgt_key_padding_mask?,
//     memory_key_padding_mask?]
// each -> [output].
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "core/init.h"
#include "nn/layer_registry.h"
#include "nn/layers/activation.h"
#include "nn/layers/attention.h"
#include "nn/layers/build_util.h"
#include "nn/layers/dropout.h"
#include "nn/layers/forward_util.h"
#include "nn/layers/linear.h"
#include "nn/layers/normalization.h"

namespace modelstate::internal {
namespace {

// ---------------------------------------------------------------------------
// Construction.

// The constructor arguments the encoder and decoder layers share.
struct LayerConfig {
  int64_t d_model;
  int64_t nhead;
  int64_t dim_feedforward;
  double dropout;
  std::string activation;
  double layer_norm_eps;
  bool batch_first;
  bool norm_first;
  bool bias;  // PyTorch 2.1's
  FactoryKwargs factory;
};

absl::StatusOr<LayerConfig> ReadLayerConfig(const BoundArgs& args,
                                            const BuildOptions& build) {
  LayerConfig c;
  MODELSTATE_ASSIGN_OR_RETURN(c.d_model, args.Int("d_model"));
  MODELSTATE_ASSIGN_OR_RETURN(c.nhead, args.Int("nhead"));
  MODELSTATE_ASSIGN_OR_RETURN(c.dim_feedforward, args.Int("dim_feedforward"));
  MODELSTATE_ASSIGN_OR_RETURN(c.dropout, args.Float("dropout"));
  MODELSTATE_ASSIGN_OR_RETURN(c.activation, args.Str("activation"));
  MODELSTATE_ASSIGN_OR_RETURN(c.layer_norm_eps, args.Float("layer_norm_eps"));
  MODELSTATE_ASSIGN_OR_RETURN(c.batch_first, args.Bool("batch_first"));
  MODELSTATE_ASSIGN_OR_RETURN(c.norm_first, args.Bool("norm_first"));
  MODELSTATE_ASSIGN_OR_RETURN(c.bias, args.Bool("bias"));
  MODELSTATE_ASSIGN_OR_RETURN(c.factory, args.Factory(build));
  if (c.activation != "relu" && c.activation != "gelu") {
    return absl::InvalidArgumentError(
        absl::StrCat("activation should be relu/gelu, not ", c.activation));
  }
  if (c.dropout < 0 || c.dropout > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dropout probability has to be between 0 and 1, but got ", c.dropout));
  }
  return c;
}

// TransformerEncoderLayer (decoder = false) or TransformerDecoderLayer.
absl::StatusOr<std::shared_ptr<Module>> MakeTransformerLayer(
    const LayerConfig& c, bool decoder, BuildContext& ctx,
    const std::string& path) {
  std::shared_ptr<Module> m =
      NewLayer(decoder ? "TransformerDecoderLayer" : "TransformerEncoderLayer",
               "transformer");
  m->AddClassAttributes(
      {"__constants__", "__setstate__", "_sa_block", "_ff_block"});
  if (decoder) m->AddClassAttributes({"_mha_block"});
  const DType dtype = c.factory.dtype;
  const Device device = c.factory.device;
  // Children are constructed and assigned one at a time, as in __init__.
  auto add_attention = [&](const char* name) -> absl::Status {
    MhaConfig mha{c.d_model, c.nhead,   c.dropout,     c.bias, false, false,
                  c.d_model, c.d_model, c.batch_first, dtype,  device};
    MODELSTATE_ASSIGN_OR_RETURN(
        std::shared_ptr<Module> attn,
        MakeMultiheadAttention(mha, ctx, ChildPath(path, name)));
    return ctx.AddModule(*m, path, name, attn);
  };
  auto add_linear = [&](const char* name, int64_t in,
                        int64_t out) -> absl::Status {
    MODELSTATE_ASSIGN_OR_RETURN(
        std::shared_ptr<Module> lin,
        MakeLinear(in, out, c.bias, dtype, device, ctx, ChildPath(path, name)));
    return ctx.AddModule(*m, path, name, lin);
  };
  auto add_dropout = [&](const char* name) -> absl::Status {
    return ctx.AddModule(*m, path, name, NewDropout(c.dropout, false));
  };
  auto add_norm = [&](const char* name) -> absl::Status {
    MODELSTATE_ASSIGN_OR_RETURN(
        std::shared_ptr<Module> norm,
        MakeLayerNorm({c.d_model}, c.layer_norm_eps, /*affine=*/true, c.bias,
                      dtype, device, ctx, ChildPath(path, name)));
    return ctx.AddModule(*m, path, name, norm);
  };
  MODELSTATE_RETURN_IF_ERROR(add_attention("self_attn"));
  if (decoder) MODELSTATE_RETURN_IF_ERROR(add_attention("multihead_attn"));
  MODELSTATE_RETURN_IF_ERROR(
      add_linear("linear1", c.d_model, c.dim_feedforward));
  MODELSTATE_RETURN_IF_ERROR(add_dropout("dropout"));
  MODELSTATE_RETURN_IF_ERROR(
      add_linear("linear2", c.dim_feedforward, c.d_model));
  m->SetPlainAttribute("norm_first", c.norm_first);
  const int blocks = decoder ? 3 : 2;  // attention(s), then feed-forward
  for (int i = 1; i <= blocks; ++i) {
    MODELSTATE_RETURN_IF_ERROR(add_norm(absl::StrCat("norm", i).c_str()));
  }
  for (int i = 1; i <= blocks; ++i) {
    MODELSTATE_RETURN_IF_ERROR(add_dropout(absl::StrCat("dropout", i).c_str()));
  }
  // A string activation is a function, not a submodule.
  m->SetPlainAttribute("activation", c.activation);
  if (!decoder) m->SetPlainAttribute("batch_first", c.batch_first);
  return m;
}

absl::StatusOr<std::shared_ptr<Module>> BuildEncoderLayer(
    const BoundArgs& args, BuildContext& ctx, const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(LayerConfig c,
                              ReadLayerConfig(args, ctx.options()));
  return MakeTransformerLayer(c, /*decoder=*/false, ctx, path);
}

absl::StatusOr<std::shared_ptr<Module>> BuildDecoderLayer(
    const BoundArgs& args, BuildContext& ctx, const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(LayerConfig c,
                              ReadLayerConfig(args, ctx.options()));
  return MakeTransformerLayer(c, /*decoder=*/true, ctx, path);
}

// Builds a module at `path` through `ctx`.
using SubBuild = absl::FunctionRef<absl::StatusOr<std::shared_ptr<Module>>(
    BuildContext& ctx, const std::string& path)>;

// A stack's options besides its modules.
struct StackConfig {
  bool decoder = false;
  int64_t num_layers = 0;
  bool enable_nested_tensor = true;  // encoder only
  bool mask_check = true;            // encoder only
};

// A context without hooks or records, drawing from `gen`'s state: for
// values torch draws for modules that end up outside the tree.
BuildOptions ScratchOptions(const BuildContext& ctx) {
  BuildOptions options = ctx.options();
  options.hooks = nullptr;
  options.root_path = "";
  return options;
}

// TransformerEncoder / TransformerDecoder: `layer` builds the prototype,
// `norm` (optional) the final norm. Every copy in `layers` is built from
// the generator state the prototype was drawn from, so each holds the
// prototype's values and goes through the hooks at its own path.
absl::StatusOr<std::shared_ptr<Module>> MakeStack(
    const StackConfig& s, SubBuild layer, const std::optional<SubBuild>& norm,
    BuildContext& ctx, const std::string& path) {
  const std::string layers_path = ChildPath(path, "layers");
  const Generator before = ctx.gen();
  std::vector<std::shared_ptr<Module>> copies;
  if (s.num_layers == 0) {
    // torch still builds (and draws) the prototype it copies no times.
    BuildContext scratch(ScratchOptions(ctx));
    scratch.gen() = before;
    MODELSTATE_RETURN_IF_ERROR(layer(scratch, "").status());
    ctx.gen() = scratch.gen();
  }
  Generator after = before;
  for (int64_t i = 0; i < s.num_layers; ++i) {
    ctx.gen() = before;
    MODELSTATE_ASSIGN_OR_RETURN(
        std::shared_ptr<Module> copy,
        layer(ctx, ChildPath(layers_path, absl::StrCat(i))));
    copies.push_back(std::move(copy));
    after = ctx.gen();
  }
  if (s.num_layers > 0) ctx.gen() = after;
  std::shared_ptr<Module> norm_module;
  if (norm.has_value()) {
    MODELSTATE_ASSIGN_OR_RETURN(norm_module,
                                (*norm)(ctx, ChildPath(path, "norm")));
  }
  std::shared_ptr<Module> layers =
      Module::Create("ModuleList", "torch.nn.modules.container.ModuleList");
  for (size_t i = 0; i < copies.size(); ++i) {
    MODELSTATE_RETURN_IF_ERROR(
        ctx.AddModule(*layers, layers_path, absl::StrCat(i), copies[i]));
  }
  std::shared_ptr<Module> m = NewLayer(
      s.decoder ? "TransformerDecoder" : "TransformerEncoder", "transformer");
  m->AddClassAttributes({"__constants__"});
  MODELSTATE_RETURN_IF_ERROR(ctx.AddModule(*m, path, "layers", layers));
  m->SetPlainAttribute("num_layers", s.num_layers);
  if (norm_module != nullptr) {
    MODELSTATE_RETURN_IF_ERROR(ctx.AddModule(*m, path, "norm", norm_module));
  } else {
    // `self.norm = None` on a new name: a plain attribute.
    m->SetPlainAttribute("norm", std::monostate());
  }
  if (!s.decoder) {
    m->SetPlainAttribute("enable_nested_tensor", s.enable_nested_tensor);
    m->SetPlainAttribute("mask_check", s.mask_check);
  }
  return m;
}

// The named children of a stack's spec that stand for its module
// arguments: `layer_arg` (required) and `norm`.
struct StackChildren {
  const ModuleSpec* layer = nullptr;
  std::string layer_spec_path;
  const ModuleSpec* norm = nullptr;
  std::string norm_spec_path;
};

absl::StatusOr<StackChildren> ReadStackChildren(const ModuleSpec& spec,
                                                absl::string_view layer_arg,
                                                const std::string& spec_path) {
  const std::string fn = absl::StrCat(spec.type, ".__init__()");
  if (!spec.members.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec_path, " (", spec.type, "): a ", spec.type,
                     " takes its modules as named children ('", layer_arg,
                     "', 'norm'), not members"));
  }
  StackChildren out;
  for (size_t i = 0; i < spec.children.size(); ++i) {
    const ModuleChild& child = spec.children[i];
    const std::string where = absl::StrCat(spec_path, ".children[", i, "]");
    const bool is_layer = child.name == layer_arg;
    if (!is_layer && child.name != "norm") {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", fn, " got an unexpected keyword argument '", child.name,
          "' (its module arguments are '", layer_arg, "' and 'norm')"));
    }
    if ((is_layer ? out.layer : out.norm) != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", fn, " got multiple values for argument '",
                       child.name, "'"));
    }
    if (!child.spec.ref.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", spec.type,
                       " builds its own modules; a 'ref' cannot "
                       "stand for one"));
    }
    (is_layer ? out.layer : out.norm) = &child.spec;
    (is_layer ? out.layer_spec_path : out.norm_spec_path) = where;
  }
  if (out.layer == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec_path, " (", spec.type, "): ", fn,
        " missing 1 required positional argument: '", layer_arg, "'"));
  }
  return out;
}

// TransformerEncoder and TransformerDecoder from a spec.
absl::StatusOr<std::shared_ptr<Module>> BuildStackSpec(
    const ModuleSpec& spec, const std::string& path,
    const std::string& spec_path, BuildContext& ctx) {
  const bool decoder = spec.type == "TransformerDecoder";
  MODELSTATE_ASSIGN_OR_RETURN(
      StackChildren children,
      ReadStackChildren(spec, decoder ? "decoder_layer" : "encoder_layer",
                        spec_path));
  std::vector<ArgDef> signature = {{"num_layers", {}}};
  if (!decoder) {
    signature.push_back({"enable_nested_tensor", B(true)});
    signature.push_back({"mask_check", B(true)});
  }
  absl::StatusOr<BoundArgs> args =
      BindArgs(spec.type, signature, spec.args, spec.kwargs);
  if (!args.ok()) return WithSpecPath(args.status(), spec_path, spec.type);
  StackConfig s{.decoder = decoder};
  absl::Status read = [&]() -> absl::Status {
    MODELSTATE_ASSIGN_OR_RETURN(s.num_layers, args->Int("num_layers"));
    if (decoder) return absl::OkStatus();
    MODELSTATE_ASSIGN_OR_RETURN(s.enable_nested_tensor,
                                args->Bool("enable_nested_tensor"));
    MODELSTATE_ASSIGN_OR_RETURN(s.mask_check, args->Bool("mask_check"));
    return absl::OkStatus();
  }();
  if (!read.ok()) return WithSpecPath(read, spec_path, spec.type);
  auto layer = [&](BuildContext& c, const std::string& p) {
    return BuildSpec(*children.layer, p, children.layer_spec_path, c);
  };
  auto norm = [&](BuildContext& c, const std::string& p) {
    return BuildSpec(*children.norm, p, children.norm_spec_path, c);
  };
  std::optional<SubBuild> norm_fn;
  if (children.norm != nullptr) norm_fn.emplace(norm);
  if (s.num_layers < 0) {
    return WithSpecPath(
        absl::InvalidArgumentError(absl::StrCat(
            "num_layers must be non-negative, got ", s.num_layers)),
        spec_path, spec.type);
  }
  return MakeStack(s, layer, norm_fn, ctx, path);
}

// Transformer's encoder and decoder (before _reset_parameters).
absl::StatusOr<std::shared_ptr<Module>> MakeTransformerTree(
    const LayerConfig& c, int64_t encoder_layers, int64_t decoder_layers,
    BuildContext& ctx, const std::string& path) {
  std::shared_ptr<Module> m = NewLayer("Transformer", "transformer");
  m->AddClassAttributes(
      {"generate_square_subsequent_mask", "_reset_parameters"});
  for (bool decoder : {false, true}) {
    const char* name = decoder ? "decoder" : "encoder";
    auto layer = [&](BuildContext& x, const std::string& p) {
      return MakeTransformerLayer(c, decoder, x, p);
    };
    auto norm = [&](BuildContext& x, const std::string& p) {
      return MakeLayerNorm({c.d_model}, c.layer_norm_eps, true, c.bias,
                           c.factory.dtype, c.factory.device, x, p);
    };
    StackConfig s{.decoder = decoder,
                  .num_layers = decoder ? decoder_layers : encoder_layers};
    MODELSTATE_ASSIGN_OR_RETURN(
        std::shared_ptr<Module> stack,
        MakeStack(s, layer, SubBuild(norm), ctx, ChildPath(path, name)));
    MODELSTATE_RETURN_IF_ERROR(ctx.AddModule(*m, path, name, stack));
  }
  m->SetPlainAttribute("d_model", c.d_model);
  m->SetPlainAttribute("nhead", c.nhead);
  m->SetPlainAttribute("batch_first", c.batch_first);
  return m;
}

absl::StatusOr<std::shared_ptr<Module>> BuildTransformer(
    const BoundArgs& args, BuildContext& ctx, const std::string& path) {
  for (const char* custom : {"custom_encoder", "custom_decoder"}) {
    if (!args.IsNone(custom)) {
      return absl::InvalidArgumentError(
          absl::StrCat(custom,
                       " takes a module: build the model as a custom module "
                       "holding your encoder and decoder instead"));
    }
  }
  MODELSTATE_ASSIGN_OR_RETURN(LayerConfig c,
                              ReadLayerConfig(args, ctx.options()));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t enc, args.Int("num_encoder_layers"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t dec, args.Int("num_decoder_layers"));
  if (!c.factory.device.has_storage()) {
    return MakeTransformerTree(c, enc, dec, ctx, path);
  }
  // _reset_parameters re-draws the matrices after every layer is built; a
  // draft without hooks computes the final values, which the real build
  // then registers in place of its own draws.
  const Generator start = ctx.gen();
  BuildContext draft_ctx(ScratchOptions(ctx));
  draft_ctx.gen() = start;
  MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<Module> draft,
                              MakeTransformerTree(c, enc, dec, draft_ctx, ""));
  absl::flat_hash_map<std::string, Tensor> presets;
  for (auto& [name, p] : draft->NamedParameters()) {
    if (p.dim() <= 1) continue;
    MODELSTATE_RETURN_IF_ERROR(XavierUniform(p, 1.0, draft_ctx.gen()));
    presets.emplace(ChildPath(path, name), p);
  }
  draft.reset();
  const Generator end = draft_ctx.gen();
  ctx.gen() = start;
  const auto* outer = ctx.set_presets(&presets);
  absl::StatusOr<std::shared_ptr<Module>> built =
      MakeTransformerTree(c, enc, dec, ctx, path);
  ctx.set_presets(outer);
  ctx.gen() = end;
  return built;
}

// ---------------------------------------------------------------------------
// Forward.

// a + b for tensors of one shape (the residual connections).
template <typename T>
absl::StatusOr<Tensor> AddKernel(const Tensor& a, const Tensor& b) {
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(a.shape()));
  const T* pa = Data<T>(a);
  const T* pb = Data<T>(b);
  for (int64_t i = 0; i < a.numel(); ++i) y.data[i] = pa[i] + pb[i];
  return y.tensor;
}

absl::StatusOr<Tensor> Add(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) {
    return absl::InvalidArgumentError(
        absl::StrCat("The size of tensor a ", Sizes(a.shape()),
                     " must match the size of tensor b ", Sizes(b.shape())));
  }
  MODELSTATE_ASSIGN_OR_RETURN(Tensor wa, ToCompute(a));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor wb, ToCompute(b));
  absl::StatusOr<Tensor> sum = wa.dtype() == DType::kFloat32
                                   ? AddKernel<float>(wa, wb)
                                   : AddKernel<double>(wa, wb);
  if (!sum.ok()) return sum.status();
  return ToDType(*sum, a.dtype());
}

// The blocks of the encoder and decoder layers, calling their submodules.
class LayerBlocks {
 public:
  explicit LayerBlocks(const LayerCall& call)
      : m_(call.module), runner_(call.runner) {}

  // attn(x, kv, kv) through dropout: _sa_block (kv = x) and _mha_block.
  absl::StatusOr<Tensor> Attention(absl::string_view attn,
                                   absl::string_view dropout, const Tensor& x,
                                   const Tensor& kv, const Tensor& mask,
                                   const Tensor& kpm) {
    const std::shared_ptr<Module>* a = m_.children().Find(attn);
    if (a == nullptr || *a == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "'", m_.type_name(), "' object has no submodule '", attn, "'"));
    }
    CallFlags no_weights;
    no_weights.need_weights = false;
    MODELSTATE_ASSIGN_OR_RETURN(
        std::vector<Tensor> r,
        runner_.Call(**a, {x, kv, kv, kpm, mask}, no_weights));
    if (r.empty()) {
      // The submodule may have been replaced by one that returns nothing.
      return absl::FailedPreconditionError(
          absl::StrCat(m_.type_name(), ".", attn, " returned no outputs"));
    }
    return runner_.CallChild(m_, dropout, {r[0]});
  }

  // linear2(dropout(activation(linear1(x)))) through `dropout`.
  absl::StatusOr<Tensor> FeedForward(const Tensor& x,
                                     absl::string_view dropout) {
    MODELSTATE_ASSIGN_OR_RETURN(std::string activation,
                                AttrStr(m_, "activation"));
    MODELSTATE_ASSIGN_OR_RETURN(Tensor h,
                                runner_.CallChild(m_, "linear1", {x}));
    // The activation is a function here, not a module: no hooks.
    MODELSTATE_ASSIGN_OR_RETURN(Tensor hw, ToCompute(h));
    Act act = activation == "gelu" ? Act::kGELU : Act::kReLU;
    MODELSTATE_ASSIGN_OR_RETURN(Tensor a, Activate(act, hw, runner_.threads()));
    MODELSTATE_ASSIGN_OR_RETURN(h, ToDType(a, h.dtype()));
    MODELSTATE_ASSIGN_OR_RETURN(h, runner_.CallChild(m_, "dropout", {h}));
    MODELSTATE_ASSIGN_OR_RETURN(h, runner_.CallChild(m_, "linear2", {h}));
    return runner_.CallChild(m_, dropout, {h});
  }

  absl::StatusOr<Tensor> Norm(absl::string_view norm, const Tensor& x) {
    return runner_.CallChild(m_, norm, {x});
  }

 private:
  Module& m_;
  ForwardRunner& runner_;
};

// One residual step: norm_first: x + block(norm(x)); else
// norm(x + block(x)).
absl::StatusOr<Tensor> Residual(
    LayerBlocks& b, bool norm_first, absl::string_view norm, const Tensor& x,
    absl::FunctionRef<absl::StatusOr<Tensor>(const Tensor&)> block) {
  if (norm_first) {
    MODELSTATE_ASSIGN_OR_RETURN(Tensor n, b.Norm(norm, x));
    MODELSTATE_ASSIGN_OR_RETURN(Tensor y, block(n));
    return Add(x, y);
  }
  MODELSTATE_ASSIGN_OR_RETURN(Tensor y, block(x));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor r, Add(x, y));
  return b.Norm(norm, r);
}

// Inputs: [src, src_mask?, src_key_padding_mask?]; outputs: [out].
absl::StatusOr<std::vector<Tensor>> EncoderLayerForward(
    const LayerCall& call, const std::vector<Tensor>& in) {
  Module& m = call.module;
  MODELSTATE_RETURN_IF_ERROR(CheckNumInputs(m, in, 1, 3));
  MODELSTATE_RETURN_IF_ERROR(CheckFloatingInput(in[0], m.type_name()));
  MODELSTATE_ASSIGN_OR_RETURN(bool norm_first, AttrBool(m, "norm_first"));
  const Tensor mask = in.size() > 1 ? in[1] : Tensor();
  const Tensor kpm = in.size() > 2 ? in[2] : Tensor();
  LayerBlocks b(call);
  Tensor x = in[0];
  MODELSTATE_ASSIGN_OR_RETURN(
      x, Residual(b, norm_first, "norm1", x, [&](const Tensor& h) {
        return b.Attention("self_attn", "dropout1", h, h, mask, kpm);
      }));
  MODELSTATE_ASSIGN_OR_RETURN(
      x, Residual(b, norm_first, "norm2", x, [&](const Tensor& h) {
        return b.FeedForward(h, "dropout2");
      }));
  return std::vector<Tensor>{x};
}

// Inputs: [tgt, memory, tgt_mask?, memory_mask?, tgt_key_padding_mask?,
// memory_key_padding_mask?]; outputs: [out].
absl::StatusOr<std::vector<Tensor>> DecoderLayerForward(
    const LayerCall& call, const std::vector<Tensor>& in) {
  Module& m = call.module;
  MODELSTATE_RETURN_IF_ERROR(CheckNumInputs(m, in, 2, 6));
  MODELSTATE_RETURN_IF_ERROR(CheckFloatingInput(in[0], m.type_name()));
  MODELSTATE_ASSIGN_OR_RETURN(bool norm_first, AttrBool(m, "norm_first"));
  auto opt = [&in](size_t i) { return in.size() > i ? in[i] : Tensor(); };
  const Tensor memory = in[1];
  LayerBlocks b(call);
  Tensor x = in[0];
  MODELSTATE_ASSIGN_OR_RETURN(
      x, Residual(b, norm_first, "norm1", x, [&](const Tensor& h) {
        return b.Attention("self_attn", "dropout1", h, h, opt(2), opt(4));
      }));
  MODELSTATE_ASSIGN_OR_RETURN(
      x, Residual(b, norm_first, "norm2", x, [&](const Tensor& h) {
        return b.Attention("multihead_attn", "dropout2", h, memory, opt(3),
                           opt(5));
      }));
  MODELSTATE_ASSIGN_OR_RETURN(
      x, Residual(b, norm_first, "norm3", x, [&](const Tensor& h) {
        return b.FeedForward(h, "dropout3");
      }));
  return std::vector<Tensor>{x};
}

// A stack's `layers`, in order.
absl::StatusOr<std::vector<Module*>> StackLayers(const Module& m) {
  const std::shared_ptr<Module>* layers = m.children().Find("layers");
  if (layers == nullptr || *layers == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", m.type_name(), "' object has no submodule 'layers'"));
  }
  std::vector<Module*> out;
  for (const auto& item : (*layers)->children()) {
    if (item.value == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(m.type_name(), " layer '", item.key, "' is None"));
    }
    out.push_back(item.value.get());
  }
  return out;
}

// The rows of a [N, S] key padding mask that are padded (mask true, or
// non-zero for a float mask) only in a tail: their unpadded lengths, or
// nothing when some row has padding before a real token.
std::optional<std::vector<int64_t>> LeftAlignedLengths(const Tensor& kpm) {
  if (kpm.dim() != 2) return std::nullopt;
  const int64_t n = kpm.shape()[0], s = kpm.shape()[1];
  std::vector<int64_t> lengths(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    int64_t len = 0;
    bool padded = false;
    for (int64_t j = 0; j < s; ++j) {
      const bool pad =
          ReadElementAsDouble(kpm.raw_data(), kpm.dtype(), r * s + j) != 0;
      if (!pad && padded) return std::nullopt;
      padded |= pad;
      if (!pad) ++len;
    }
    lengths[r] = len;
  }
  return lengths;
}

// Whether torch 1.13's TransformerEncoder takes its nested-tensor path for
// this call (no autograd, as a modelstate forward): its output is then
// zero at padded positions and only as long as the longest sequence.
absl::StatusOr<bool> NestedFastPath(const Module& m, const Module& first,
                                    const Tensor& src, const Tensor& mask,
                                    const Tensor& kpm) {
  if (first.type_name() != "TransformerEncoderLayer" || first.is_training() ||
      src.dim() != 3 || mask.defined() || !kpm.defined()) {
    return false;
  }
  MODELSTATE_ASSIGN_OR_RETURN(bool nested, AttrBool(m, "enable_nested_tensor"));
  MODELSTATE_ASSIGN_OR_RETURN(bool norm_first, AttrBool(first, "norm_first"));
  const std::shared_ptr<Module>* sa = first.children().Find("self_attn");
  const std::shared_ptr<Module>* n1 = first.children().Find("norm1");
  const std::shared_ptr<Module>* n2 = first.children().Find("norm2");
  if (!nested || norm_first || sa == nullptr || *sa == nullptr ||
      n1 == nullptr || *n1 == nullptr || n2 == nullptr || *n2 == nullptr) {
    return false;
  }
  MODELSTATE_ASSIGN_OR_RETURN(bool batch_first, AttrBool(**sa, "batch_first"));
  MODELSTATE_ASSIGN_OR_RETURN(bool same, AttrBool(**sa, "_qkv_same_embed_dim"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t heads, AttrInt(**sa, "num_heads"));
  MODELSTATE_ASSIGN_OR_RETURN(double eps1, AttrDouble(**n1, "eps"));
  MODELSTATE_ASSIGN_OR_RETURN(double eps2, AttrDouble(**n2, "eps"));
  return batch_first && same && heads % 2 == 0 && eps1 == eps2;
}

// x [N, S, E] with the padded tail of each row zeroed and cut to the
// longest row, as to_padded_tensor(0.) gives the nested result back.
template <typename T>
absl::StatusOr<Tensor> ZeroPadded(const Tensor& x,
                                  const std::vector<int64_t>& lengths) {
  const int64_t n = x.shape()[0], s = x.shape()[1], e = x.shape()[2];
  const int64_t longest =
      lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>({n, longest, e}));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t t = 0; t < longest; ++t) {
      const T* src = Data<T>(x) + (r * s + t) * e;
      T* dst = y.data + (r * longest + t) * e;
      if (t < lengths[r]) {
        std::copy(src, src + e, dst);
      } else {
        std::fill(dst, dst + e, T(0));
      }
    }
  }
  return y.tensor;
}

absl::StatusOr<Tensor> ApplyNested(const Tensor& x,
                                   const std::vector<int64_t>& lengths) {
  MODELSTATE_ASSIGN_OR_RETURN(Tensor wide, ToCompute(x));
  absl::StatusOr<Tensor> y = wide.dtype() == DType::kFloat32
                                 ? ZeroPadded<float>(wide, lengths)
                                 : ZeroPadded<double>(wide, lengths);
  if (!y.ok()) return y.status();
  return ToDType(*y, x.dtype());
}

// The stack's final norm, if it has one.
absl::StatusOr<Tensor> StackNorm(const LayerCall& call, const Tensor& x) {
  const std::shared_ptr<Module>* norm = call.module.children().Find("norm");
  if (norm == nullptr || *norm == nullptr) return x;
  return call.runner.CallChild(call.module, "norm", {x});
}

// Inputs: [src, mask?, src_key_padding_mask?]; outputs: [out].
absl::StatusOr<std::vector<Tensor>> EncoderForward(
    const LayerCall& call, const std::vector<Tensor>& in) {
  Module& m = call.module;
  MODELSTATE_RETURN_IF_ERROR(CheckNumInputs(m, in, 1, 3));
  MODELSTATE_RETURN_IF_ERROR(CheckFloatingInput(in[0], m.type_name()));
  const Tensor mask = in.size() > 1 ? in[1] : Tensor();
  const Tensor kpm = in.size() > 2 ? in[2] : Tensor();
  if (kpm.defined() && kpm.dtype() != DType::kBool &&
      !IsFloatingPoint(kpm.dtype())) {
    return absl::InvalidArgumentError(
        "only bool and floating types of key_padding_mask are supported");
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<Module*> layers, StackLayers(m));
  std::optional<std::vector<int64_t>> nested;
  if (!layers.empty()) {
    MODELSTATE_ASSIGN_OR_RETURN(
        bool fast, NestedFastPath(m, *layers[0], in[0], mask, kpm));
    // A mask that is not left-aligned takes the padded path (torch's
    // mask_check; without it torch nests such a mask anyway, which is left
    // out here).
    if (fast) nested = LeftAlignedLengths(kpm);
  }
  Tensor x = in[0];
  for (Module* layer : layers) {
    MODELSTATE_ASSIGN_OR_RETURN(std::vector<Tensor> out,
                                call.runner.Call(*layer, {x, mask, kpm}));
    if (out.empty()) {
      return absl::InvalidArgumentError("an encoder layer returned nothing");
    }
    x = out[0];
  }
  if (nested.has_value()) {
    MODELSTATE_ASSIGN_OR_RETURN(x, ApplyNested(x, *nested));
  }
  MODELSTATE_ASSIGN_OR_RETURN(x, StackNorm(call, x));
  return std::vector<Tensor>{x};
}

// Inputs: [tgt, memory, tgt_mask?, memory_mask?, tgt_key_padding_mask?,
// memory_key_padding_mask?]; outputs: [out].
absl::StatusOr<std::vector<Tensor>> DecoderForward(
    const LayerCall& call, const std::vector<Tensor>& in) {
  Module& m = call.module;
  MODELSTATE_RETURN_IF_ERROR(CheckNumInputs(m, in, 2, 6));
  MODELSTATE_RETURN_IF_ERROR(CheckFloatingInput(in[0], m.type_name()));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<Module*> layers, StackLayers(m));
  std::vector<Tensor> args = in;
  args.resize(6);
  for (Module* layer : layers) {
    MODELSTATE_ASSIGN_OR_RETURN(std::vector<Tensor> out,
                                call.runner.Call(*layer, args));
    if (out.empty()) {
      return absl::InvalidArgumentError("a decoder layer returned nothing");
    }
    args[0] = out[0];
  }
  MODELSTATE_ASSIGN_OR_RETURN(Tensor x, StackNorm(call, args[0]));
  return std::vector<Tensor>{x};
}

// Inputs: [src, tgt, src_mask?, tgt_mask?, memory_mask?,
// src_key_padding_mask?, tgt_key_padding_mask?, memory_key_padding_mask?];
// outputs: [out].
absl::StatusOr<std::vector<Tensor>> TransformerForward(
    const LayerCall& call, const std::vector<Tensor>& in) {
  Module& m = call.module;
  MODELSTATE_RETURN_IF_ERROR(CheckNumInputs(m, in, 2, 8));
  MODELSTATE_RETURN_IF_ERROR(CheckFloatingInput(in[0], m.type_name()));
  MODELSTATE_RETURN_IF_ERROR(CheckFloatingInput(in[1], m.type_name()));
  auto opt = [&in](size_t i) { return in.size() > i ? in[i] : Tensor(); };
  const Tensor &src = in[0], &tgt = in[1];
  MODELSTATE_ASSIGN_OR_RETURN(bool batch_first, AttrBool(m, "batch_first"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t d_model, AttrInt(m, "d_model"));
  const bool batched = src.dim() == 3;
  if (batched && tgt.dim() >= 2 &&
      src.shape()[batch_first ? 0 : 1] != tgt.shape()[batch_first ? 0 : 1]) {
    return absl::InvalidArgumentError(
        "the batch number of src and tgt must be equal");
  }
  if (src.dim() == 0 || tgt.dim() == 0 || src.shape().back() != d_model ||
      tgt.shape().back() != d_model) {
    return absl::InvalidArgumentError(
        "the feature number of src and tgt must be equal to d_model");
  }
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor memory,
      call.runner.CallChild(m, "encoder", {src, opt(2), opt(5)}));
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor out,
      call.runner.CallChild(m, "decoder",
                            {tgt, memory, opt(3), opt(4), opt(6), opt(7)}));
  return std::vector<Tensor>{out};
}

// TransformerEncoderLayer's and TransformerDecoderLayer's arguments; `bias`
// is PyTorch 2.1's (after norm_first).
std::vector<ArgDef> LayerSignature() {
  return WithFactory({{"d_model", {}},
                      {"nhead", {}},
                      {"dim_feedforward", I(2048)},
                      {"dropout", F(0.1)},
                      {"activation", S("relu")},
                      {"layer_norm_eps", F(1e-5)},
                      {"batch_first", B(false)},
                      {"norm_first", B(false)},
                      {"bias", B(true)}});
}

}  // namespace

std::vector<LayerDef> TransformerFamily() {
  return {
      {.type = "TransformerEncoderLayer",
       .qualified_name = "torch.nn.modules.transformer.TransformerEncoderLayer",
       .signature = LayerSignature(),
       .build = &BuildEncoderLayer,
       .forward = &EncoderLayerForward},
      {.type = "TransformerDecoderLayer",
       .qualified_name = "torch.nn.modules.transformer.TransformerDecoderLayer",
       .signature = LayerSignature(),
       .build = &BuildDecoderLayer,
       .forward = &DecoderLayerForward},
      {.type = "TransformerEncoder",
       .qualified_name = "torch.nn.modules.transformer.TransformerEncoder",
       .build_container = &BuildStackSpec,
       .forward = &EncoderForward},
      {.type = "TransformerDecoder",
       .qualified_name = "torch.nn.modules.transformer.TransformerDecoder",
       .build_container = &BuildStackSpec,
       .forward = &DecoderForward},
      // Transformer's `bias` is PyTorch 2.1's (after norm_first).
      {.type = "Transformer",
       .qualified_name = "torch.nn.modules.transformer.Transformer",
       .signature = WithFactory({{"d_model", I(512)},
                                 {"nhead", I(8)},
                                 {"num_encoder_layers", I(6)},
                                 {"num_decoder_layers", I(6)},
                                 {"dim_feedforward", I(2048)},
                                 {"dropout", F(0.1)},
                                 {"activation", S("relu")},
                                 {"custom_encoder", kNone},
                                 {"custom_decoder", kNone},
                                 {"layer_norm_eps", F(1e-5)},
                                 {"batch_first", B(false)},
                                 {"norm_first", B(false)},
                                 {"bias", B(true)}}),
       .build = &BuildTransformer,
       .forward = &TransformerForward},
  };
}

}  // namespace modelstate::internal
