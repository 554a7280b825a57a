// File: golden_models.h
// The module of every case in shared/golden/modules.json, as a ModuleSpec
// (make_golden.py builds the same modules in PyTorch).
#ifndef MODELSTATE_TESTS_TESTING_GOLDEN_MODELS_H_
#define MODELSTATE_TESTS_TESTING_GOLDEN_MODELS_H_

#include <map>
#include <string>

namespace modelstate::testing {

// Case name -> JSON spec (see spec_json.h).
inline const std::map<std::string, std::string>& GoldenModelSpecs() {
  static const auto* specs = new std::map<std::string, std::string>{
      {"Linear_5_5", R"({"type": "Linear", "args": [5, 5]})"},
      {"Linear_3_2_nobias",
       R"({"type": "Linear", "args": [3, 2], "kwargs": {"bias": false}})"},
      {"Conv2d_3_8_3", R"({"type": "Conv2d", "args": [3, 8, 3]})"},
      {"BatchNorm1d_4", R"({"type": "BatchNorm1d", "args": [4]})"},
      {"BatchNorm2d_5", R"({"type": "BatchNorm2d", "args": [5]})"},
      {"LayerNorm_6", R"({"type": "LayerNorm", "args": [6]})"},
      {"Embedding_10_3", R"({"type": "Embedding", "args": [10, 3]})"},
      {"Sequential_mlp", R"({"type": "Sequential", "children": [
          {"spec": {"type": "Linear", "args": [100, 200]}},
          {"spec": {"type": "ReLU"}},
          {"spec": {"type": "Linear", "args": [200, 10]}},
          {"spec": {"type": "Softmax", "kwargs": {"dim": 1}}}]})"},
      {"TinyModel", R"({"type": "TinyModel", "members": [
          {"module": {"name": "linear1", "spec": {"type": "Linear", "args": [100, 200]}}},
          {"module": {"name": "activation", "spec": {"type": "ReLU"}}},
          {"module": {"name": "linear2", "spec": {"type": "Linear", "args": [200, 10]}}},
          {"module": {"name": "softmax", "spec": {"type": "Softmax", "kwargs": {"dim": 1}}}}]})"},
      {"BufferModule", R"({"type": "BufferModule", "members": [
          {"buffer": {"name": "my_buffer", "shape": [1], "init": {"kind": "normal"}}},
          {"buffer": {"name": "my_nonpersistent_buffer", "shape": [3], "persistent": false}},
          {"parameter": {"name": "my_param", "shape": [2, 2], "init": {"kind": "normal"}}}]})"},
      {"TiedModel", R"({"type": "TiedModel", "members": [
          {"module": {"name": "embed", "spec": {"type": "Embedding", "args": [10, 4]}}},
          {"module": {"name": "proj", "spec": {"type": "Linear", "args": [4, 10], "kwargs": {"bias": false}}}}],
          "ties": [{"target": "proj.weight", "source": "embed.weight"}]})"},
      {"SharedSubmodule", R"({"type": "Sequential", "children": [
          {"spec": {"type": "Linear", "args": [2, 2]}},
          {"spec": {"ref": "0"}}]})"},
      {"Nested3", R"({"type": "Nested3", "members": [
          {"module": {"name": "middle", "spec": {"type": "Middle", "members": [
              {"module": {"name": "inner", "spec": {"type": "Inner", "members": [
                  {"module": {"name": "lin", "spec": {"type": "Linear", "args": [2, 2]}}},
                  {"buffer": {"name": "inner_buf", "shape": [1]}}]}}},
              {"parameter": {"name": "mid_param", "shape": [2]}}]}}},
          {"module": {"name": "head", "spec": {"type": "Linear", "args": [2, 1]}}},
          {"buffer": {"name": "outer_buf", "shape": [1]}}]})"},
      {"MixedDtypes", R"({"type": "MixedDtypes", "members": [
          {"parameter": {"name": "p64", "shape": [2], "dtype": "float64"}},
          {"parameter": {"name": "p_none", "none": true}},
          {"buffer": {"name": "b_int32", "shape": [3], "dtype": "int32"}},
          {"buffer": {"name": "b_bool", "shape": [2], "dtype": "bool"}},
          {"buffer": {"name": "b_none", "none": true}},
          {"buffer": {"name": "b_f32", "shape": [2]}}]})"},
      {"WithExtraState",
       R"({"type": "WithExtraState", "extra_state": true, "members": [
          {"parameter": {"name": "w", "shape": [1]}},
          {"module": {"name": "lin", "spec": {"type": "Linear", "args": [1, 1]}}},
          {"buffer": {"name": "b", "shape": [1]}}]})"},
  };
  return *specs;
}

}  // namespace modelstate::testing

#endif  // MODELSTATE_TESTS_TESTING_GOLDEN_MODELS_H_
