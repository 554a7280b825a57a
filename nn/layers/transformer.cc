// The transformer family: TransformerEncoderLayer. Construction follows
// torch.nn.modules.transformer (self_attn, linear1, dropout, linear2, norm1,
// norm2, dropout1, dropout2 constructed and assigned in __init__'s order);
// forward calls those submodules (their hooks fire), with the activation
// applied as a function and the residual additions in between.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
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
  MODELSTATE_ASSIGN_OR_RETURN(FactoryKwargs factory,
                              args.Factory(ctx.options()));
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
  MhaConfig mha{d_model,     nhead,         dropout,       bias,
                false,       false,         d_model,       d_model,
                batch_first, factory.dtype, factory.device};
  std::string sa_path = ChildPath(path, "self_attn");
  MODELSTATE_ASSIGN_OR_RETURN(std::shared_ptr<Module> self_attn,
                              MakeMultiheadAttention(mha, ctx, sa_path));
  MODELSTATE_RETURN_IF_ERROR(ctx.AddModule(*m, path, "self_attn", self_attn));

  auto add_linear = [&](const char* name, int64_t in,
                        int64_t out) -> absl::Status {
    MODELSTATE_ASSIGN_OR_RETURN(
        std::shared_ptr<Module> lin,
        MakeLinear(in, out, bias, factory.dtype, factory.device, ctx,
                   ChildPath(path, name)));
    return ctx.AddModule(*m, path, name, lin);
  };
  auto add_dropout = [&](const char* name) -> absl::Status {
    return ctx.AddModule(*m, path, name, NewDropout(dropout, false));
  };
  auto add_norm = [&](const char* name) -> absl::Status {
    MODELSTATE_ASSIGN_OR_RETURN(
        std::shared_ptr<Module> norm,
        MakeLayerNorm({d_model}, eps, /*affine=*/true, bias, factory.dtype,
                      factory.device, ctx, ChildPath(path, name)));
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

// Inputs: [src, src_mask?, src_key_padding_mask?]; outputs: [out].
absl::StatusOr<std::vector<Tensor>> TransformerEncoderLayerForward(
    const LayerCall& call, const std::vector<Tensor>& in) {
  Module& m = call.module;
  ForwardRunner& runner = call.runner;
  MODELSTATE_RETURN_IF_ERROR(CheckNumInputs(m, in, 1, 3));
  MODELSTATE_RETURN_IF_ERROR(CheckFloatingInput(in[0], m.type_name()));
  MODELSTATE_ASSIGN_OR_RETURN(bool norm_first, AttrBool(m, "norm_first"));
  MODELSTATE_ASSIGN_OR_RETURN(std::string activation, AttrStr(m, "activation"));
  const Tensor src_mask = in.size() > 1 ? in[1] : Tensor();
  const Tensor kpm = in.size() > 2 ? in[2] : Tensor();
  const std::shared_ptr<Module>* sa = m.children().Find("self_attn");
  if (sa == nullptr || *sa == nullptr) {
    return absl::FailedPreconditionError(
        "'TransformerEncoderLayer' object has no submodule 'self_attn'");
  }
  auto sa_block = [&](const Tensor& x) -> absl::StatusOr<Tensor> {
    CallFlags no_weights;
    no_weights.need_weights = false;
    MODELSTATE_ASSIGN_OR_RETURN(
        std::vector<Tensor> r,
        runner.Call(**sa, {x, x, x, kpm, src_mask}, no_weights));
    return runner.CallChild(m, "dropout1", {r[0]});
  };
  auto ff_block = [&](const Tensor& x) -> absl::StatusOr<Tensor> {
    MODELSTATE_ASSIGN_OR_RETURN(Tensor h, runner.CallChild(m, "linear1", {x}));
    // The activation is a function here, not a module: no hooks.
    MODELSTATE_ASSIGN_OR_RETURN(Tensor hw, ToCompute(h));
    Act act = activation == "gelu" ? Act::kGELU : Act::kReLU;
    MODELSTATE_ASSIGN_OR_RETURN(Tensor a, Activate(act, hw, runner.threads()));
    MODELSTATE_ASSIGN_OR_RETURN(h, ToDType(a, h.dtype()));
    MODELSTATE_ASSIGN_OR_RETURN(h, runner.CallChild(m, "dropout", {h}));
    MODELSTATE_ASSIGN_OR_RETURN(h, runner.CallChild(m, "linear2", {h}));
    return runner.CallChild(m, "dropout2", {h});
  };
  Tensor x = in[0];
  if (norm_first) {
    MODELSTATE_ASSIGN_OR_RETURN(Tensor n1, runner.CallChild(m, "norm1", {x}));
    MODELSTATE_ASSIGN_OR_RETURN(Tensor a, sa_block(n1));
    MODELSTATE_ASSIGN_OR_RETURN(x, Add(x, a));
    MODELSTATE_ASSIGN_OR_RETURN(Tensor n2, runner.CallChild(m, "norm2", {x}));
    MODELSTATE_ASSIGN_OR_RETURN(Tensor f, ff_block(n2));
    MODELSTATE_ASSIGN_OR_RETURN(x, Add(x, f));
  } else {
    MODELSTATE_ASSIGN_OR_RETURN(Tensor a, sa_block(x));
    MODELSTATE_ASSIGN_OR_RETURN(Tensor r1, Add(x, a));
    MODELSTATE_ASSIGN_OR_RETURN(x, runner.CallChild(m, "norm1", {r1}));
    MODELSTATE_ASSIGN_OR_RETURN(Tensor f, ff_block(x));
    MODELSTATE_ASSIGN_OR_RETURN(Tensor r2, Add(x, f));
    MODELSTATE_ASSIGN_OR_RETURN(x, runner.CallChild(m, "norm2", {r2}));
  }
  return std::vector<Tensor>{x};
}

}  // namespace

std::vector<LayerDef> TransformerFamily() {
  return {
      // TransformerEncoderLayer's `bias` is PyTorch 2.1's (after norm_first).
      {.type = "TransformerEncoderLayer",
       .qualified_name = "torch.nn.modules.transformer.TransformerEncoderLayer",
       .signature = WithFactory({{"d_model", {}},
                                 {"nhead", {}},
                                 {"dim_feedforward", I(2048)},
                                 {"dropout", F(0.1)},
                                 {"activation", S("relu")},
                                 {"layer_norm_eps", F(1e-5)},
                                 {"batch_first", B(false)},
                                 {"norm_first", B(false)},
                                 {"bias", B(true)}}),
       .build = &BuildTransformerEncoderLayer,
       .forward = &TransformerEncoderLayerForward},
  };
}

}  // namespace modelstate::internal
