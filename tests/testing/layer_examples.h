// File: layer_examples.h
// Test helper: for every layer type of the library, the spec JSON of one
// small instance built with its default keyword arguments, so tests that
// walk the whole library agree on what they build.
//
// Example:
//   for (const std::string& type : LayerTypes()) {
//     ModuleSpec spec = SpecFromJson(LayerExampleJson(type));
//   }
#ifndef MODELSTATE_TESTS_TESTING_LAYER_EXAMPLES_H_
#define MODELSTATE_TESTS_TESTING_LAYER_EXAMPLES_H_

#include <map>
#include <string>

#include "absl/strings/str_cat.h"

namespace modelstate::testing {

// Positional args per layer type; "" for the containers, which take none;
// the whole spec for the types built from named children (starts with
// '{').
inline const std::map<std::string, std::string>& LayerExampleArgs() {
  static const auto* args = new std::map<std::string, std::string>{
      {"Identity", "[]"},
      {"Linear", "[3, 2]"},
      {"Bilinear", "[3, 4, 2]"},
      {"Conv1d", "[2, 4, 3]"},
      {"Conv2d", "[2, 4, 3]"},
      {"ConvTranspose2d", "[2, 4, 3]"},
      {"BatchNorm1d", "[3]"},
      {"BatchNorm2d", "[3]"},
      {"LayerNorm", "[[2, 3]]"},
      {"GroupNorm", "[2, 4]"},
      {"Embedding", "[5, 3]"},
      {"Dropout", "[]"},
      {"ReLU", "[]"},
      {"GELU", "[]"},
      {"SiLU", "[]"},
      {"Tanh", "[]"},
      {"Sigmoid", "[]"},
      {"Softmax", "[]"},
      {"Flatten", "[]"},
      {"MaxPool2d", "[3, 2, 1]"},
      {"AdaptiveAvgPool2d", "[[1, 1]]"},
      {"MultiheadAttention", "[4, 2]"},
      {"TransformerEncoderLayer", "[4, 2, 8]"},
      {"RNN", "[3, 4]"},
      {"LSTM", "[3, 4]"},
      {"GRU", "[3, 4]"},
      {"RNNCell", "[3, 4]"},
      {"LSTMCell", "[3, 4]"},
      {"GRUCell", "[3, 4]"},
      {"TransformerDecoderLayer", "[4, 2, 8]"},
      {"TransformerEncoder",
       R"({"type": "TransformerEncoder", "args": [2], "children": [
           {"name": "encoder_layer",
            "spec": {"type": "TransformerEncoderLayer", "args": [4, 2, 8]}}]})"},
      {"TransformerDecoder",
       R"({"type": "TransformerDecoder", "args": [2], "children": [
           {"name": "decoder_layer",
            "spec": {"type": "TransformerDecoderLayer", "args": [4, 2, 8]}},
           {"name": "norm", "spec": {"type": "LayerNorm", "args": [4]}}]})"},
      {"Transformer", "[4, 2, 1, 1, 8]"},
      {"Conv3d", "[2, 4, 3]"},
      {"ConvTranspose1d", "[2, 4, 3]"},
      {"ConvTranspose3d", "[2, 4, 3]"},
      {"EmbeddingBag", "[5, 3]"},
      {"BatchNorm3d", "[3]"},
      {"InstanceNorm1d", "[3]"},
      {"InstanceNorm2d", "[3]"},
      {"InstanceNorm3d", "[3]"},
      {"PReLU", "[]"},
      {"LeakyReLU", "[]"},
      {"ELU", "[]"},
      {"Hardswish", "[]"},
      {"Hardsigmoid", "[]"},
      {"Mish", "[]"},
      {"Softplus", "[]"},
      {"LogSoftmax", "[]"},
      {"ZeroPad2d", "[1]"},
      {"ConstantPad1d", "[1, 0.5]"},
      {"ConstantPad2d", "[1, 0.5]"},
      {"ConstantPad3d", "[1, 0.5]"},
      {"ReflectionPad1d", "[1]"},
      {"ReflectionPad2d", "[1]"},
      {"ReflectionPad3d", "[1]"},
      {"ReplicationPad1d", "[1]"},
      {"ReplicationPad2d", "[1]"},
      {"ReplicationPad3d", "[1]"},
      {"MaxPool1d", "[2]"},
      {"MaxPool3d", "[2]"},
      {"AvgPool1d", "[2]"},
      {"AvgPool2d", "[2]"},
      {"AvgPool3d", "[2]"},
      {"AdaptiveAvgPool1d", "[1]"},
      {"AdaptiveAvgPool3d", "[1]"},
      {"AdaptiveMaxPool1d", "[1]"},
      {"AdaptiveMaxPool2d", "[1]"},
      {"AdaptiveMaxPool3d", "[1]"},
      {"Dropout1d", "[]"},
      {"Dropout2d", "[]"},
      {"Dropout3d", "[]"},
      {"AlphaDropout", "[]"},
      {"Unflatten", "[1, [2, 2]]"},
      {"PixelShuffle", "[2]"},
      {"PixelUnshuffle", "[2]"},
      {"Upsample", "[null, 2]"},
      {"UpsamplingNearest2d", "[4]"},
      {"UpsamplingBilinear2d", "[null, 2]"},
      {"ReLU6", "[]"},
      {"Hardtanh", "[]"},
      {"SELU", "[]"},
      {"CELU", "[]"},
      {"GLU", "[]"},
      {"LogSigmoid", "[]"},
      {"Softmin", "[]"},
      {"Softsign", "[]"},
      {"Softshrink", "[]"},
      {"Hardshrink", "[]"},
      {"Tanhshrink", "[]"},
      {"Threshold", "[0.1, 20]"},
      {"Softmax2d", "[]"},
      {"FeatureAlphaDropout", "[]"},
      {"ChannelShuffle", "[2]"},
      {"LocalResponseNorm", "[2]"},
      {"PairwiseDistance", "[]"},
      {"CosineSimilarity", "[]"},
      {"LPPool1d", "[2, 3]"},
      {"LPPool2d", "[2, 3]"},
      {"Fold", "[[4, 5], 2]"},
      {"Unfold", "[2]"},
      {"Sequential", ""},
      {"ModuleList", ""},
      {"ModuleDict", ""}};
  return *args;
}

// The spec JSON of the example instance of `type`; "" if the type has none
// (a layer added to the library but not here).
inline std::string LayerExampleJson(const std::string& type) {
  auto it = LayerExampleArgs().find(type);
  if (it == LayerExampleArgs().end()) return "";
  if (it->second.empty()) return absl::StrCat(R"({"type": ")", type, R"("})");
  if (it->second[0] == '{') return it->second;
  return absl::StrCat(R"({"type": ")", type, R"(", "args": )", it->second, "}");
}

}  // namespace modelstate::testing

#endif  // MODELSTATE_TESTS_TESTING_LAYER_EXAMPLES_H_
