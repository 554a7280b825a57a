// Test tool for tests/python/safetensors_interop.py, which checks modelstate's
// safetensors files against an independent reader and writer and PyTorch.
//
//   safetensors_tool write-sample OUT   writes SampleStateDict() to OUT
//   safetensors_tool dump IN            prints IN as JSON, in file (data)
//   order:
//     {"metadata": [[k, v], ...],
//      "tensors": [{"key", "dtype" (safetensors name), "shape", "sha256"}]}
//   safetensors_tool copy IN OUT        reads IN and writes it again to OUT
//
// Errors go to stdout as {"error": "..."} with exit status 1.
#include <cstring>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "core/safetensors.h"
#include "nlohmann/json.hpp"

namespace modelstate {
namespace {

// The sample's values; safetensors_interop.py holds the same table.
absl::StatusOr<StateDict> SampleStateDict() {
  struct Item {
    const char* key;
    DType dtype;
    Shape shape;
    std::vector<double> values;
  };
  const std::vector<Item> items = {
      {"layer.weight",
       DType::kFloat32,
       {2, 3},
       {0.5, -1.25, 3.0, 0.001, -0.0, 65504.0}},
      {"layer.bias", DType::kFloat64, {3}, {1.0 / 3.0, -2.5, 1e100}},
      {"half", DType::kFloat16, {4}, {1.0, -2.0, 0.333251953125, 65504.0}},
      {"brain", DType::kBFloat16, {2, 2}, {1.0, -3.5, 0.0078125, 256.0}},
      {"i8", DType::kInt8, {3}, {-128, 0, 127}},
      {"i16", DType::kInt16, {2}, {-32768, 12345}},
      {"i32", DType::kInt32, {2}, {-7, 2147483647}},
      {"i64", DType::kInt64, {2}, {-9007199254740992.0, 42}},
      {"u8", DType::kUInt8, {3}, {0, 200, 255}},
      {"mask", DType::kBool, {2, 2}, {1, 0, 0, 1}},
      {"scalar", DType::kFloat32, {}, {2.5}},
      {"empty", DType::kFloat32, {0, 3}, {}},
      {"a.last", DType::kInt64, {1}, {-1}},
  };
  StateDict sd;
  for (const Item& item : items) {
    MODELSTATE_ASSIGN_OR_RETURN(
        Tensor t, Tensor::FromDoubles(item.dtype, item.shape, item.values));
    sd.tensors.Set(item.key, std::move(t));
  }
  return sd;
}

const std::vector<std::pair<std::string, std::string>> kSampleMetadata = {
    {"format", "pt"}, {"writer", "modelstate"}};

absl::StatusOr<nlohmann::json> Dump(const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(SafetensorsHeader header,
                              ReadSafetensorsHeader(path));
  MODELSTATE_ASSIGN_OR_RETURN(StateDict sd, ReadSafetensorsFile(path));
  nlohmann::json out;
  out["metadata"] = nlohmann::json::array();
  for (const auto& [key, value] : header.metadata) {
    out["metadata"].push_back({key, value});
  }
  out["tensors"] = nlohmann::json::array();
  for (const auto& item : sd.tensors) {
    const Tensor& t = item.value;
    out["tensors"].push_back(
        {{"key", item.key},
         {"dtype", std::string(SafetensorsDTypeName(t.dtype()))},
         {"shape", t.shape()},
         {"sha256", Sha256Hex(absl::string_view(
                        static_cast<const char*>(t.raw_data()), t.nbytes()))}});
  }
  return out;
}

absl::Status Run(const std::vector<std::string>& args) {
  if (args.size() == 2 && args[0] == "write-sample") {
    MODELSTATE_ASSIGN_OR_RETURN(StateDict sd, SampleStateDict());
    return WriteSafetensorsFile(args[1], sd, kSampleMetadata);
  }
  if (args.size() == 2 && args[0] == "dump") {
    MODELSTATE_ASSIGN_OR_RETURN(nlohmann::json out, Dump(args[1]));
    std::cout << out.dump() << std::endl;
    return absl::OkStatus();
  }
  if (args.size() == 3 && args[0] == "copy") {
    MODELSTATE_ASSIGN_OR_RETURN(SafetensorsHeader header,
                                ReadSafetensorsHeader(args[1]));
    MODELSTATE_ASSIGN_OR_RETURN(StateDict sd, ReadSafetensorsFile(args[1]));
    return WriteSafetensorsFile(args[2], sd, header.metadata);
  }
  return absl::InvalidArgumentError(
      "usage: safetensors_tool write-sample OUT | dump IN | copy IN OUT");
}

}  // namespace
}  // namespace modelstate

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  absl::Status status = modelstate::Run(args);
  if (!status.ok()) {
    std::cout << nlohmann::json{{"error", status.ToString()}}.dump()
              << std::endl;
    return 1;
  }
  return 0;
}
