// The recurrent family: RNN, LSTM and GRU (torch.nn.modules.rnn's
// RNNBase: num_layers, bias, batch_first, dropout between layers,
// bidirectional, LSTM's proj_size) and their cells RNNCell, LSTMCell and
// GRUCell. Construction registers each layer's and direction's weights in
// torch's order (weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0,
// weight_hr_l0, then ..._reverse) and draws every one from
// U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)) in that order, as
// reset_parameters() does. Forward runs nn/kernels/recurrent.h.
//
// Forward inputs and outputs, flattened (None = an undefined tensor):
//   RNN, GRU:  [input, h0?, lengths?]      -> [output, h_n]
//   LSTM:      [input, h0?, c0?, lengths?] -> [output, h_n, c_n]
//   RNNCell, GRUCell: [input, hx?]         -> [h']
//   LSTMCell:  [input, hx?, cx?]           -> [h', c']
// `lengths` (int64, one per batch row) runs each row for its own number of
// steps, as pack_padded_sequence(..., enforce_sorted=False) followed by
// pad_packed_sequence(..., total_length=L) does: outputs past a row's
// length are zero, and h_n / c_n are its state after its last valid step.
#include "nn/kernels/recurrent.h"

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
#include "nn/kernels/blas.h"
#include "nn/layer_registry.h"
#include "nn/layers/build_util.h"
#include "nn/layers/dropout.h"
#include "nn/layers/forward_util.h"
#include "nn/layers/param_check.h"

namespace modelstate::internal {
namespace {

// ---------------------------------------------------------------------------
// Construction.

// RNNBase's constructor arguments.
struct RnnConfig {
  std::string mode;  // "RNN_TANH", "RNN_RELU", "LSTM", "GRU"
  int64_t input_size;
  int64_t hidden_size;
  int64_t num_layers;
  bool bias;
  bool batch_first;
  double dropout;
  bool bidirectional;
  int64_t proj_size;
  FactoryKwargs factory;
};

// RNNBase.__init__'s checks, in its order.
absl::Status CheckRnnConfig(const RnnConfig& c) {
  if (!(c.dropout >= 0 && c.dropout <= 1)) {
    return absl::InvalidArgumentError(
        "dropout should be a number in range [0, 1] representing the "
        "probability of an element being zeroed");
  }
  if (c.proj_size < 0) {
    return absl::InvalidArgumentError(
        "proj_size should be a positive integer or zero to disable "
        "projections");
  }
  if (c.proj_size >= c.hidden_size) {
    return absl::InvalidArgumentError(
        "proj_size has to be smaller than hidden_size");
  }
  return absl::OkStatus();
}

// The parameter names of one layer and direction, in registration order.
std::vector<std::string> RnnParamNames(int64_t layer, bool reverse, bool bias,
                                       bool proj) {
  const std::string suffix = absl::StrCat(layer, reverse ? "_reverse" : "");
  std::vector<std::string> names = {"weight_ih_l" + suffix,
                                    "weight_hh_l" + suffix};
  if (bias) {
    names.push_back("bias_ih_l" + suffix);
    names.push_back("bias_hh_l" + suffix);
  }
  if (proj) names.push_back("weight_hr_l" + suffix);
  return names;
}

// The registered parameters' shapes, in registration order (their names
// from RnnParamNames).
std::vector<Shape> RnnParamShapes(const RnnConfig& c, int64_t layer) {
  const int64_t gates = GateCount(c.mode == "LSTM"  ? Cell::kLstm
                                  : c.mode == "GRU" ? Cell::kGru
                                                    : Cell::kRnnTanh) *
                        c.hidden_size;
  const int64_t real_hidden = c.proj_size > 0 ? c.proj_size : c.hidden_size;
  const int64_t directions = c.bidirectional ? 2 : 1;
  const int64_t in = layer == 0 ? c.input_size : real_hidden * directions;
  std::vector<Shape> shapes = {{gates, in}, {gates, real_hidden}};
  if (c.bias) {
    shapes.push_back({gates});
    shapes.push_back({gates});
  }
  if (c.proj_size > 0) shapes.push_back({c.proj_size, c.hidden_size});
  return shapes;
}

// U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)) for each tensor in order
// (reset_parameters of RNNBase and RNNCellBase).
absl::Status ResetRecurrent(std::vector<Tensor>& tensors, int64_t hidden,
                            BuildContext& ctx) {
  const double stdv =
      hidden > 0 ? 1.0 / std::sqrt(static_cast<double>(hidden)) : 0.0;
  for (Tensor& t : tensors) {
    MODELSTATE_RETURN_IF_ERROR(UniformInit(t, -stdv, stdv, ctx.gen()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Module>> MakeRnn(absl::string_view type,
                                                const RnnConfig& c,
                                                BuildContext& ctx,
                                                const std::string& path) {
  MODELSTATE_RETURN_IF_ERROR(CheckRnnConfig(c));
  std::vector<std::string> names;
  std::vector<Tensor> tensors;
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    for (int direction = 0; direction < (c.bidirectional ? 2 : 1);
         ++direction) {
      std::vector<std::string> n =
          RnnParamNames(layer, direction == 1, c.bias, c.proj_size > 0);
      std::vector<Shape> shapes = RnnParamShapes(c, layer);
      for (size_t i = 0; i < n.size(); ++i) {
        MODELSTATE_ASSIGN_OR_RETURN(
            Tensor t,
            ctx.NewTensor(c.factory.dtype, shapes[i], c.factory.device));
        names.push_back(std::move(n[i]));
        tensors.push_back(std::move(t));
      }
    }
  }
  MODELSTATE_RETURN_IF_ERROR(ResetRecurrent(tensors, c.hidden_size, ctx));
  std::shared_ptr<Module> m = NewLayer(type, "rnn");
  if (type == "RNN") {
    // RNN.__init__ sets it before RNNBase.__init__ runs.
    m->SetPlainAttribute("nonlinearity",
                         std::string(c.mode == "RNN_RELU" ? "relu" : "tanh"));
  }
  m->SetPlainAttribute("mode", c.mode);
  m->SetPlainAttribute("input_size", c.input_size);
  m->SetPlainAttribute("hidden_size", c.hidden_size);
  m->SetPlainAttribute("num_layers", c.num_layers);
  m->SetPlainAttribute("bias", c.bias);
  m->SetPlainAttribute("batch_first", c.batch_first);
  m->SetPlainAttribute("dropout", c.dropout);
  m->SetPlainAttribute("bidirectional", c.bidirectional);
  m->SetPlainAttribute("proj_size", c.proj_size);
  m->AddClassAttributes(
      {"__constants__", "__jit_unused_properties__", "_flat_weights_names",
       "_all_weights", "_flat_weights", "all_weights", "flatten_parameters",
       "reset_parameters", "check_input", "get_expected_hidden_size",
       "check_hidden_size", "check_forward_args", "permute_hidden",
       "__setstate__", "_replicate_for_data_parallel"});
  if (c.mode == "LSTM") m->AddClassAttributes({"get_expected_cell_size"});
  for (size_t i = 0; i < names.size(); ++i) {
    MODELSTATE_RETURN_IF_ERROR(
        ctx.AddParameter(*m, path, std::move(names[i]), tensors[i]));
  }
  return m;
}

absl::StatusOr<RnnConfig> ReadRnnArgs(const BoundArgs& args,
                                      const BuildOptions& build) {
  RnnConfig c;
  MODELSTATE_ASSIGN_OR_RETURN(c.input_size, args.Int("input_size"));
  MODELSTATE_ASSIGN_OR_RETURN(c.hidden_size, args.Int("hidden_size"));
  // torch 1.13 fails on num_layers=0 in __init__ too (an IndexError).
  MODELSTATE_ASSIGN_OR_RETURN(c.num_layers, args.IntAtLeast("num_layers", 1));
  MODELSTATE_ASSIGN_OR_RETURN(c.bias, args.Bool("bias"));
  MODELSTATE_ASSIGN_OR_RETURN(c.batch_first, args.Bool("batch_first"));
  MODELSTATE_ASSIGN_OR_RETURN(c.dropout, args.Float("dropout"));
  MODELSTATE_ASSIGN_OR_RETURN(c.bidirectional, args.Bool("bidirectional"));
  c.proj_size = 0;
  if (!args.IsNone("proj_size")) {
    MODELSTATE_ASSIGN_OR_RETURN(c.proj_size, args.Int("proj_size"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(c.factory, args.Factory(build));
  return c;
}

// RNN and GRU take no proj_size (their signatures default it to None).
absl::Status NoProjSize(const BoundArgs& args) {
  if (!args.IsNone("proj_size")) {
    return absl::InvalidArgumentError(
        "proj_size argument is only supported for LSTM, not RNN or GRU");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Module>> BuildRNN(const BoundArgs& args,
                                                 BuildContext& ctx,
                                                 const std::string& path) {
  MODELSTATE_RETURN_IF_ERROR(NoProjSize(args));
  MODELSTATE_ASSIGN_OR_RETURN(std::string nonlinearity,
                              args.Str("nonlinearity"));
  if (nonlinearity != "tanh" && nonlinearity != "relu") {
    return absl::InvalidArgumentError(
        absl::StrCat("Unknown nonlinearity '", nonlinearity, "'"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(RnnConfig c, ReadRnnArgs(args, ctx.options()));
  c.mode = nonlinearity == "tanh" ? "RNN_TANH" : "RNN_RELU";
  return MakeRnn("RNN", c, ctx, path);
}

absl::StatusOr<std::shared_ptr<Module>> BuildLSTM(const BoundArgs& args,
                                                  BuildContext& ctx,
                                                  const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(RnnConfig c, ReadRnnArgs(args, ctx.options()));
  c.mode = "LSTM";
  return MakeRnn("LSTM", c, ctx, path);
}

absl::StatusOr<std::shared_ptr<Module>> BuildGRU(const BoundArgs& args,
                                                 BuildContext& ctx,
                                                 const std::string& path) {
  MODELSTATE_RETURN_IF_ERROR(NoProjSize(args));
  MODELSTATE_ASSIGN_OR_RETURN(RnnConfig c, ReadRnnArgs(args, ctx.options()));
  c.mode = "GRU";
  return MakeRnn("GRU", c, ctx, path);
}

// RNNCellBase: weight_ih, weight_hh, bias_ih, bias_hh (None without bias).
absl::StatusOr<std::shared_ptr<Module>> BuildCell(const BoundArgs& args,
                                                  BuildContext& ctx,
                                                  const std::string& path,
                                                  absl::string_view type,
                                                  Cell cell) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t input, args.Int("input_size"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t hidden, args.Int("hidden_size"));
  MODELSTATE_ASSIGN_OR_RETURN(bool bias, args.Bool("bias"));
  MODELSTATE_ASSIGN_OR_RETURN(FactoryKwargs f, args.Factory(ctx.options()));
  const int64_t gates = GateCount(cell) * hidden;
  std::vector<Tensor> tensors(bias ? 4 : 2);
  const Shape shapes[] = {{gates, input}, {gates, hidden}, {gates}, {gates}};
  for (size_t i = 0; i < tensors.size(); ++i) {
    MODELSTATE_ASSIGN_OR_RETURN(tensors[i],
                                ctx.NewTensor(f.dtype, shapes[i], f.device));
  }
  MODELSTATE_RETURN_IF_ERROR(ResetRecurrent(tensors, hidden, ctx));
  tensors.resize(4);  // None biases without bias.
  std::shared_ptr<Module> m = NewLayer(type, "rnn");
  m->SetPlainAttribute("input_size", input);
  m->SetPlainAttribute("hidden_size", hidden);
  m->SetPlainAttribute("bias", bias);
  m->AddClassAttributes({"__constants__", "reset_parameters"});
  const char* names[] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
  for (size_t i = 0; i < 4; ++i) {
    MODELSTATE_RETURN_IF_ERROR(
        ctx.AddParameter(*m, path, names[i], std::move(tensors[i])));
  }
  if (cell == Cell::kRnnTanh) {
    // RNNCell keeps any string; forward rejects an unknown one, as torch's.
    MODELSTATE_ASSIGN_OR_RETURN(std::string nonlinearity,
                                args.Str("nonlinearity"));
    m->SetPlainAttribute("nonlinearity", nonlinearity);
  }
  return m;
}

absl::StatusOr<std::shared_ptr<Module>> BuildRNNCell(const BoundArgs& args,
                                                     BuildContext& ctx,
                                                     const std::string& path) {
  return BuildCell(args, ctx, path, "RNNCell", Cell::kRnnTanh);
}
absl::StatusOr<std::shared_ptr<Module>> BuildLSTMCell(const BoundArgs& args,
                                                      BuildContext& ctx,
                                                      const std::string& path) {
  return BuildCell(args, ctx, path, "LSTMCell", Cell::kLstm);
}
absl::StatusOr<std::shared_ptr<Module>> BuildGRUCell(const BoundArgs& args,
                                                     BuildContext& ctx,
                                                     const std::string& path) {
  return BuildCell(args, ctx, path, "GRUCell", Cell::kGru);
}

// ---------------------------------------------------------------------------
// Forward.

// A python tuple as torch prints sizes in these messages: "(2, 3, 20)".
std::string Tuple(const Shape& shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "),
                      shape.size() == 1 ? ",)" : ")");
}

// [a, b, f] -> [b, a, f] into `dst`.
template <typename T>
void SwapLeadingDims(const T* src, int64_t a, int64_t b, int64_t f, T* dst) {
  for (int64_t i = 0; i < a; ++i) {
    for (int64_t j = 0; j < b; ++j) {
      std::copy(src + (i * b + j) * f, src + (i * b + j + 1) * f,
                dst + (j * a + i) * f);
    }
  }
}

// The weights of one layer and direction, ready for the kernel.
template <typename T>
struct DirectionWeights {
  Tensor w_ih, w_hh, b_ih, b_hh, w_hr;
  RecurrentWeights<T> View() const {
    return {Data<T>(w_ih), Data<T>(w_hh), Data<T>(b_ih), Data<T>(b_hh),
            Data<T>(w_hr)};
  }
};

template <typename T>
absl::StatusOr<DirectionWeights<T>> LoadDirection(const Module& m,
                                                  const RnnConfig& c,
                                                  int64_t layer, bool reverse,
                                                  DType dtype) {
  std::vector<std::string> names =
      RnnParamNames(layer, reverse, c.bias, c.proj_size > 0);
  std::vector<Shape> shapes = RnnParamShapes(c, layer);
  std::vector<Tensor> tensors;
  for (size_t i = 0; i < names.size(); ++i) {
    // Required, biases too: torch's _VF.rnn_* take the flat weights as a
    // list of tensors, where None is not allowed.
    MODELSTATE_ASSIGN_OR_RETURN(
        Tensor t,
        ShapedParam(m, names[i], dtype, shapes[i], Presence::kRequired));
    tensors.push_back(std::move(t));
  }
  DirectionWeights<T> w;
  w.w_ih = tensors[0];
  w.w_hh = tensors[1];
  if (c.bias) {
    w.b_ih = tensors[2];
    w.b_hh = tensors[3];
  }
  if (c.proj_size > 0) w.w_hr = tensors.back();
  return w;
}

absl::StatusOr<RnnConfig> ReadRnnAttrs(const Module& m) {
  RnnConfig c;
  MODELSTATE_ASSIGN_OR_RETURN(c.mode, AttrStr(m, "mode"));
  MODELSTATE_ASSIGN_OR_RETURN(c.input_size, AttrInt(m, "input_size"));
  MODELSTATE_ASSIGN_OR_RETURN(c.hidden_size, AttrInt(m, "hidden_size"));
  MODELSTATE_ASSIGN_OR_RETURN(c.num_layers, AttrInt(m, "num_layers"));
  MODELSTATE_RETURN_IF_ERROR(CheckAttrAtLeast(
      m, "num_layers", {c.num_layers}, 1, "num_layers must be at least 1"));
  MODELSTATE_ASSIGN_OR_RETURN(c.bias, AttrBool(m, "bias"));
  MODELSTATE_ASSIGN_OR_RETURN(c.batch_first, AttrBool(m, "batch_first"));
  MODELSTATE_ASSIGN_OR_RETURN(c.dropout, AttrDouble(m, "dropout"));
  MODELSTATE_ASSIGN_OR_RETURN(c.bidirectional, AttrBool(m, "bidirectional"));
  MODELSTATE_ASSIGN_OR_RETURN(c.proj_size, AttrInt(m, "proj_size"));
  if (c.mode != "RNN_TANH" && c.mode != "RNN_RELU" && c.mode != "LSTM" &&
      c.mode != "GRU") {
    return absl::FailedPreconditionError(
        absl::StrCat("Unrecognized RNN mode: ", c.mode));
  }
  return c;
}

// The sequence lengths of a packed batch: int64 or int32, one per row, each
// in [1, steps].
absl::StatusOr<std::vector<int64_t>> ReadLengths(const Tensor& t, int64_t batch,
                                                 int64_t steps) {
  if ((t.dtype() != DType::kInt64 && t.dtype() != DType::kInt32) ||
      t.dim() != 1 || t.shape()[0] != batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lengths must be a 1-D int64 tensor with one length per sequence of "
        "the batch (",
        batch, "), got ", t.TypeName(), Sizes(t.shape())));
  }
  std::vector<int64_t> lengths(static_cast<size_t>(batch));
  for (int64_t i = 0; i < batch; ++i) {
    lengths[i] = t.dtype() == DType::kInt64 ? t.data<int64_t>()[i]
                                            : t.data<int32_t>()[i];
    if (lengths[i] <= 0) {
      return absl::InvalidArgumentError(
          "Length of all samples has to be greater than 0, but found an "
          "element in 'lengths' that is <= 0");
    }
    if (lengths[i] > steps) {
      return absl::InvalidArgumentError(
          absl::StrCat("lengths[", i, "] is ", lengths[i],
                       ", longer than the input's ", steps, " steps"));
    }
  }
  return lengths;
}

// The inputs of RNN / LSTM / GRU after torch's checks.
struct SequenceInputs {
  bool batched;
  int64_t steps, batch;
  Tensor h0, c0;  // [layers * directions, batch, ...] or undefined
  std::vector<int64_t> lengths;
};

// torch's checks of the state tensors (RNNBase.forward, LSTM.forward).
absl::Status CheckHidden(const RnnConfig& c, const SequenceInputs& s,
                         bool lstm) {
  const Tensor &h0 = s.h0, &c0 = s.c0;
  if (lstm && h0.defined() != c0.defined()) {
    return absl::InvalidArgumentError(
        "LSTM takes both h0 and c0 (hx is a tuple), or neither");
  }
  if (!h0.defined()) return absl::OkStatus();
  const int64_t want = s.batched ? 3 : 2;
  if (lstm && (h0.dim() != want || c0.dim() != want)) {
    return absl::InvalidArgumentError(absl::StrCat(
        s.batched ? "For batched 3-D input, hx and cx should also be 3-D"
                  : "For unbatched 2-D input, hx and cx should also be 2-D",
        " but got (", h0.dim(), "-D, ", c0.dim(), "-D) tensors"));
  }
  if (!lstm && h0.dim() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        s.batched ? "For batched 3-D input, hx should also be 3-D"
                  : "For unbatched 2-D input, hx should also be 2-D",
        " but got ", h0.dim(), "-D tensor"));
  }
  const int64_t layers = c.num_layers * (c.bidirectional ? 2 : 1);
  const int64_t hout = c.proj_size > 0 ? c.proj_size : c.hidden_size;
  auto check = [&](const Tensor& t, int64_t size,
                   const char* label) -> absl::Status {
    Shape got = t.shape();
    if (!s.batched) got.insert(got.begin() + 1, 1);
    const Shape expected = {layers, s.batch, size};
    if (got != expected) {
      return absl::InvalidArgumentError(absl::StrCat("Expected hidden", label,
                                                     " size ", Tuple(expected),
                                                     ", got ", Sizes(got)));
    }
    return absl::OkStatus();
  };
  MODELSTATE_RETURN_IF_ERROR(check(h0, hout, lstm ? "[0]" : ""));
  if (lstm) MODELSTATE_RETURN_IF_ERROR(check(c0, c.hidden_size, "[1]"));
  return absl::OkStatus();
}

absl::StatusOr<SequenceInputs> CheckSequenceInputs(
    const RnnConfig& c, const std::vector<Tensor>& in) {
  const bool lstm = c.mode == "LSTM";
  const Tensor& x = in[0];
  SequenceInputs s;
  s.batched = x.dim() == 3;
  const int64_t dims = s.batched ? 3 : x.dim() + 1;
  if (dims != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("input must have 3 dimensions, got ", dims));
  }
  if (x.shape().back() != c.input_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("input.size(-1) must be equal to input_size. Expected ",
                     c.input_size, ", got ", x.shape().back()));
  }
  s.steps = !s.batched ? x.shape()[0] : x.shape()[c.batch_first ? 1 : 0];
  s.batch = !s.batched ? 1 : x.shape()[c.batch_first ? 0 : 1];
  const size_t lengths_at = lstm ? 3 : 2;
  s.h0 = in.size() > 1 ? in[1] : Tensor();
  if (lstm) s.c0 = in.size() > 2 ? in[2] : Tensor();
  MODELSTATE_RETURN_IF_ERROR(CheckHidden(c, s, lstm));
  if (s.steps == 0) {
    return absl::InvalidArgumentError(
        "Expected sequence length to be larger than 0 in RNN");
  }
  if (in.size() > lengths_at && in[lengths_at].defined()) {
    MODELSTATE_ASSIGN_OR_RETURN(s.lengths,
                                ReadLengths(in[lengths_at], s.batch, s.steps));
  }
  return s;
}

// The initial state [layers * directions, batch, size]: given, or zeros.
template <typename T>
std::vector<T> InitialState(const Tensor& given, int64_t count) {
  if (!given.defined()) return std::vector<T>(static_cast<size_t>(count));
  return std::vector<T>(Data<T>(given), Data<T>(given) + count);
}

template <typename T>
absl::StatusOr<Tensor> TensorFrom(const std::vector<T>& data, Shape shape) {
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> t, NewOut<T>(std::move(shape)));
  std::copy(data.begin(), data.end(), t.data);
  return t.tensor;
}

// Inputs: [input, h0?, (c0?,) lengths?]; outputs [output, h_n(, c_n)].
template <typename T>
absl::StatusOr<std::vector<Tensor>> SequenceForward(
    const LayerCall& call, const std::vector<Tensor>& in, DType dtype) {
  const Module& m = call.module;
  MODELSTATE_ASSIGN_OR_RETURN(RnnConfig c, ReadRnnAttrs(m));
  MODELSTATE_ASSIGN_OR_RETURN(SequenceInputs s, CheckSequenceInputs(c, in));
  const Cell cell = c.mode == "LSTM"       ? Cell::kLstm
                    : c.mode == "GRU"      ? Cell::kGru
                    : c.mode == "RNN_RELU" ? Cell::kRnnRelu
                                           : Cell::kRnnTanh;
  const int64_t dirs = c.bidirectional ? 2 : 1, n = s.batch, steps = s.steps;
  const int64_t hout = c.proj_size > 0 ? c.proj_size : c.hidden_size;
  const int64_t gates = GateCount(cell) * c.hidden_size;
  MODELSTATE_RETURN_IF_ERROR(CheckBlasDims(
      {steps * n, c.input_size, hout * dirs, gates, c.hidden_size}));
  // Time-major [steps, batch, features] throughout.
  std::vector<T> x(Data<T>(in[0]), Data<T>(in[0]) + in[0].numel());
  if (s.batched && c.batch_first) {
    SwapLeadingDims(Data<T>(in[0]), n, steps, c.input_size, x.data());
  }
  const int64_t states = c.num_layers * dirs;
  std::vector<T> h = InitialState<T>(s.h0, states * n * hout);
  std::vector<T> cs;
  if (cell == Cell::kLstm) {
    cs = InitialState<T>(s.c0, states * n * c.hidden_size);
  }
  const int64_t* lengths = s.lengths.empty() ? nullptr : s.lengths.data();
  int64_t features = c.input_size;
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    std::vector<T> out(static_cast<size_t>(steps * n * dirs * hout));
    for (int64_t d = 0; d < dirs; ++d) {
      MODELSTATE_ASSIGN_OR_RETURN(DirectionWeights<T> w,
                                  LoadDirection<T>(m, c, layer, d == 1, dtype));
      const RecurrentShape shape{cell,          steps,       n,     features,
                                 c.hidden_size, c.proj_size, d == 1};
      const int64_t state = layer * dirs + d;
      RunRecurrent(shape, w.View(), x.data(), lengths,
                   h.data() + state * n * hout,
                   cs.empty() ? nullptr : cs.data() + state * n * c.hidden_size,
                   out.data(), dirs * hout, d * hout);
    }
    if (m.is_training() && c.dropout > 0 && layer + 1 < c.num_layers) {
      DropoutInPlace(out.data(), static_cast<int64_t>(out.size()), c.dropout,
                     call.runner.gen());
    }
    x = std::move(out);
    features = dirs * hout;
  }
  Shape out_shape = {steps, n, features};
  if (s.batched && c.batch_first) {
    std::vector<T> swapped(x.size());
    SwapLeadingDims(x.data(), steps, n, features, swapped.data());
    x = std::move(swapped);
    out_shape = {n, steps, features};
  }
  if (!s.batched) out_shape = {steps, features};
  std::vector<Tensor> result;
  MODELSTATE_ASSIGN_OR_RETURN(Tensor y, TensorFrom(x, out_shape));
  result.push_back(y);
  const Shape h_shape =
      s.batched ? Shape{states, n, hout} : Shape{states, hout};
  MODELSTATE_ASSIGN_OR_RETURN(Tensor hn, TensorFrom(h, h_shape));
  result.push_back(hn);
  if (cell == Cell::kLstm) {
    const Shape c_shape = s.batched ? Shape{states, n, c.hidden_size}
                                    : Shape{states, c.hidden_size};
    MODELSTATE_ASSIGN_OR_RETURN(Tensor cn, TensorFrom(cs, c_shape));
    result.push_back(cn);
  }
  return result;
}

// _VF's checks of a cell's state (check_rnn_cell_forward_hidden).
absl::Status CheckCellState(const Tensor& t, int64_t batch, int64_t size,
                            bool batched, absl::string_view label) {
  if (t.dim() != (batched ? 2 : 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("hidden", label, " must be ", batched ? 2 : 1,
                     "-D like the input, got ", t.dim(), "-D"));
  }
  const int64_t rows = batched ? t.shape()[0] : 1;
  if (rows != batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("Input batch size ", batch, " doesn't match hidden", label,
                     " batch size ", rows));
  }
  if (t.shape().back() != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("hidden", label, " has inconsistent hidden_size: got ",
                     t.shape().back(), ", expected ", size));
  }
  return absl::OkStatus();
}

// Inputs [input, hx?] (LSTMCell: [input, hx?, cx?]); outputs [h'] or
// [h', c'].
template <typename T>
absl::StatusOr<std::vector<Tensor>> CellForward(const LayerCall& call,
                                                const std::vector<Tensor>& in,
                                                DType dtype) {
  const Module& m = call.module;
  const Tensor& x = in[0];
  if (x.dim() != 1 && x.dim() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(m.type_name(), ": Expected input to be 1-D or 2-D but ",
                     "received ", x.dim(), "-D tensor"));
  }
  Cell cell = m.type_name() == "LSTMCell"  ? Cell::kLstm
              : m.type_name() == "GRUCell" ? Cell::kGru
                                           : Cell::kRnnTanh;
  if (cell == Cell::kRnnTanh) {
    MODELSTATE_ASSIGN_OR_RETURN(std::string nl, AttrStr(m, "nonlinearity"));
    if (nl != "tanh" && nl != "relu") {
      return absl::InvalidArgumentError(
          absl::StrCat("Unknown nonlinearity: ", nl));
    }
    if (nl == "relu") cell = Cell::kRnnRelu;
  }
  const bool batched = x.dim() == 2;
  const int64_t n = batched ? x.shape()[0] : 1;
  MODELSTATE_ASSIGN_OR_RETURN(int64_t input_size, AttrInt(m, "input_size"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t hidden, AttrInt(m, "hidden_size"));
  if (x.shape().back() != input_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("input has inconsistent input_size: got ",
                     x.shape().back(), " expected ", input_size));
  }
  const bool lstm = cell == Cell::kLstm;
  const Tensor hx = in.size() > 1 ? in[1] : Tensor();
  const Tensor cx = lstm && in.size() > 2 ? in[2] : Tensor();
  if (lstm && hx.defined() != cx.defined()) {
    return absl::InvalidArgumentError(
        "LSTMCell takes both hx and cx (a tuple), or neither");
  }
  // ATen labels every cell state "hidden0", LSTMCell's cx included.
  for (const Tensor* state : {&hx, &cx}) {
    if (state->defined()) {
      MODELSTATE_RETURN_IF_ERROR(
          CheckCellState(*state, n, hidden, batched, "0"));
    }
  }
  const int64_t gates = GateCount(cell) * hidden;
  MODELSTATE_RETURN_IF_ERROR(CheckBlasDims({n, input_size, hidden, gates}));
  DirectionWeights<T> w;
  // The cells' biases may be None (_VF.*_cell take optional biases).
  MODELSTATE_ASSIGN_OR_RETURN(
      w.w_ih, ShapedParam(m, "weight_ih", dtype, {gates, input_size},
                          Presence::kRequired));
  MODELSTATE_ASSIGN_OR_RETURN(
      w.w_hh,
      ShapedParam(m, "weight_hh", dtype, {gates, hidden}, Presence::kRequired));
  MODELSTATE_ASSIGN_OR_RETURN(
      w.b_ih, ShapedParam(m, "bias_ih", dtype, {gates}, Presence::kOptional));
  MODELSTATE_ASSIGN_OR_RETURN(
      w.b_hh, ShapedParam(m, "bias_hh", dtype, {gates}, Presence::kOptional));
  std::vector<T> h = InitialState<T>(hx, n * hidden);
  std::vector<T> c = lstm ? InitialState<T>(cx, n * hidden) : std::vector<T>();
  std::vector<T> out(static_cast<size_t>(n * hidden));
  const RecurrentShape shape{cell, 1, n, input_size, hidden};
  RunRecurrent(shape, w.View(), Data<T>(x), nullptr, h.data(),
               lstm ? c.data() : nullptr, out.data(), hidden, 0);
  const Shape s = batched ? Shape{n, hidden} : Shape{hidden};
  std::vector<Tensor> result;
  MODELSTATE_ASSIGN_OR_RETURN(Tensor ht, TensorFrom(h, s));
  result.push_back(ht);
  if (lstm) {
    MODELSTATE_ASSIGN_OR_RETURN(Tensor ct, TensorFrom(c, s));
    result.push_back(ct);
  }
  return result;
}

std::vector<ArgDef> RnnSignature(bool lstm) {
  // RNN and GRU reject proj_size; None marks it as not given.
  std::vector<ArgDef> args = WithFactory({{"input_size", {}},
                                          {"hidden_size", {}},
                                          {"num_layers", I(1)},
                                          {"bias", B(true)},
                                          {"batch_first", B(false)},
                                          {"dropout", F(0.0)},
                                          {"bidirectional", B(false)},
                                          {"proj_size", lstm ? I(0) : kNone}});
  return args;
}

std::vector<ArgDef> CellSignature(bool nonlinearity) {
  std::vector<ArgDef> args = {
      {"input_size", {}}, {"hidden_size", {}}, {"bias", B(true)}};
  if (nonlinearity) args.push_back({"nonlinearity", S("tanh")});
  return WithFactory(std::move(args));
}

template <FloatInputs kInputs>
LayerForwardFn SequenceFn() {
  return &FloatForward<&SequenceForward<float>, &SequenceForward<double>,
                       kInputs>;
}

template <FloatInputs kInputs>
LayerForwardFn CellFn() {
  return &FloatForward<&CellForward<float>, &CellForward<double>, kInputs>;
}

}  // namespace

std::vector<LayerDef> RecurrentFamily() {
  std::vector<ArgDef> rnn = RnnSignature(false);
  // RNN's nonlinearity is a keyword argument RNN.__init__ pops first.
  rnn.push_back({"nonlinearity", S("tanh")});
  return {
      {.type = "RNN",
       .qualified_name = "torch.nn.modules.rnn.RNN",
       .signature = rnn,
       .build = &BuildRNN,
       .forward = SequenceFn<FloatInputs{1, 3}>()},
      {.type = "LSTM",
       .qualified_name = "torch.nn.modules.rnn.LSTM",
       .signature = RnnSignature(true),
       .build = &BuildLSTM,
       .forward = SequenceFn<FloatInputs{1, 4}>()},
      {.type = "GRU",
       .qualified_name = "torch.nn.modules.rnn.GRU",
       .signature = RnnSignature(false),
       .build = &BuildGRU,
       .forward = SequenceFn<FloatInputs{1, 3}>()},
      {.type = "RNNCell",
       .qualified_name = "torch.nn.modules.rnn.RNNCell",
       .signature = CellSignature(true),
       .build = &BuildRNNCell,
       .forward = CellFn<FloatInputs{1, 2}>()},
      {.type = "LSTMCell",
       .qualified_name = "torch.nn.modules.rnn.LSTMCell",
       .signature = CellSignature(false),
       .build = &BuildLSTMCell,
       .forward = CellFn<FloatInputs{1, 3}>()},
      {.type = "GRUCell",
       .qualified_name = "torch.nn.modules.rnn.GRUCell",
       .signature = CellSignature(false),
       .build = &BuildGRUCell,
       .forward = CellFn<FloatInputs{1, 2}>()},
  };
}

}  // namespace modelstate::internal
