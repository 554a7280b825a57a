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

// Positional args per layer type; "" for the containers, which take none.
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
  return absl::StrCat(R"({"type": ")", type, R"(", "args": )", it->second, "}");
}

}  // namespace modelstate::testing

#endif  // MODELSTATE_TESTS_TESTING_LAYER_EXAMPLES_H_
