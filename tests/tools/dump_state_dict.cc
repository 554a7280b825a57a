// Test tool: builds module specs and prints their state as JSON, so that
// tests/python/layers_match_torch.py can compare them with real PyTorch.
//
// stdin:  [{"spec": {...}, "seed": 0, "dtype": "float32"}, ...]
// stdout: [{"state_dict": [{"key", "dtype", "shape", "hex"}],
//           "metadata": {path: version}, "named_modules": [[path, type]]}
//          or {"error": "..."}, ...]
#include <iostream>
#include <iterator>
#include <string>

#include "nlohmann/json.hpp"
#include "nn/module_spec.h"
#include "tests/testing/spec_json.h"

namespace {

std::string Hex(const modelstate::Tensor& t) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  const auto* bytes = static_cast<const unsigned char*>(t.raw_data());
  for (size_t i = 0; i < t.nbytes(); ++i) {
    out.push_back(kDigits[bytes[i] >> 4]);
    out.push_back(kDigits[bytes[i] & 15]);
  }
  return out;
}

nlohmann::json Dump(const nlohmann::json& request) {
  modelstate::BuildOptions options;
  options.hooks = nullptr;
  options.seed = request.value("seed", 0);
  absl::StatusOr<modelstate::DType> dtype =
      modelstate::ParseDType(request.value("dtype", "float32"));
  if (!dtype.ok()) return {{"error", std::string(dtype.status().message())}};
  options.dtype = *dtype;
  absl::StatusOr<modelstate::BuildResult> built = modelstate::BuildModule(
      modelstate::testing::SpecFromJsonValue(request["spec"]), options);
  if (!built.ok()) return {{"error", std::string(built.status().message())}};
  nlohmann::json out;
  modelstate::StateDict sd = built->root->GetStateDict();
  out["state_dict"] = nlohmann::json::array();
  for (const auto& item : sd.tensors) {
    out["state_dict"].push_back(
        {{"key", item.key},
         {"dtype", modelstate::DTypeName(item.value.dtype())},
         {"shape", item.value.shape()},
         {"hex", Hex(item.value)}});
  }
  out["metadata"] = nlohmann::json::object();
  for (const auto& item : *sd.metadata) out["metadata"][item.key] = item.value;
  out["named_modules"] = nlohmann::json::array();
  for (const auto& [path, m] : built->root->NamedModules()) {
    out["named_modules"].push_back({path, m->type_name()});
  }
  out["requires_grad"] = nlohmann::json::object();
  for (const auto& [name, p] : built->root->NamedParameters()) {
    out["requires_grad"][name] = p.requires_grad();
  }
  return out;
}

}  // namespace

int main() {
  std::string input((std::istreambuf_iterator<char>(std::cin)),
                    std::istreambuf_iterator<char>());
  nlohmann::json requests = nlohmann::json::parse(input);
  nlohmann::json results = nlohmann::json::array();
  for (const nlohmann::json& request : requests)
    results.push_back(Dump(request));
  std::cout << results.dump() << std::endl;
  return 0;
}
