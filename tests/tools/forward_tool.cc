// Test tool for tests/python/forward_matches_torch.py: runs a module's
// forward the way the comparison needs it.
//
//   forward_tool --spec SPEC.json --state STATE.safetensors
//                --inputs INPUTS.safetensors --out OUT.safetensors
//                [--state_out STATE_OUT.safetensors] [--train] [--steps N]
//                [--dtype float32] [--threads N]
//
// Builds SPEC (the JSON spec format of tests/bench/models/*.json), loads
// STATE strictly (LoadStateDict), puts the module in train or eval mode and
// runs Forward N times (default 1) on the inputs input0, input1, ... (a
// missing index is None). Writes the last call's outputs as output0,
// output1, ... (None outputs are left out) and the final state_dict.
// Errors go to stderr with exit status 1.
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "core/safetensors.h"
#include "nlohmann/json.hpp"
#include "nn/forward.h"
#include "nn/module_spec.h"
#include "tests/testing/spec_json.h"

namespace modelstate {
namespace {

struct Args {
  std::string spec, state, inputs, out, state_out;
  std::string dtype = "float32";
  bool train = false;
  int steps = 1;
  int threads = 0;
};

absl::StatusOr<Args> ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> absl::StatusOr<std::string> {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(absl::StrCat(arg, " needs a value"));
      }
      return std::string(argv[++i]);
    };
    if (arg == "--train") {
      a.train = true;
      continue;
    }
    MODELSTATE_ASSIGN_OR_RETURN(std::string v, value());
    if (arg == "--spec") {
      a.spec = v;
    } else if (arg == "--state") {
      a.state = v;
    } else if (arg == "--inputs") {
      a.inputs = v;
    } else if (arg == "--out") {
      a.out = v;
    } else if (arg == "--state_out") {
      a.state_out = v;
    } else if (arg == "--dtype") {
      a.dtype = v;
    } else if (arg == "--steps" || arg == "--threads") {
      int n = 0;
      if (!absl::SimpleAtoi(v, &n) || n < 0) {
        return absl::InvalidArgumentError(absl::StrCat("bad ", arg, ": ", v));
      }
      (arg == "--steps" ? a.steps : a.threads) = n;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", arg));
    }
  }
  if (a.spec.empty() || a.inputs.empty() || a.out.empty()) {
    return absl::InvalidArgumentError("--spec, --inputs and --out are needed");
  }
  return a;
}

absl::Status Run(const Args& a) {
  std::ifstream spec_file(a.spec);
  if (!spec_file)
    return absl::NotFoundError(absl::StrCat("cannot read ", a.spec));
  std::stringstream text;
  text << spec_file.rdbuf();
  BuildOptions options;
  options.hooks = nullptr;
  MODELSTATE_ASSIGN_OR_RETURN(options.dtype, ParseDType(a.dtype));
  MODELSTATE_ASSIGN_OR_RETURN(
      BuildResult built,
      BuildModule(testing::SpecFromJson(text.str()), options));
  Module& root = *built.root;
  if (!a.state.empty()) {
    MODELSTATE_ASSIGN_OR_RETURN(StateDict sd, ReadSafetensorsFile(a.state));
    MODELSTATE_ASSIGN_OR_RETURN(LoadResult loaded, root.LoadStateDict(sd));
    (void)loaded;
  }
  root.Train(a.train);
  MODELSTATE_ASSIGN_OR_RETURN(StateDict in, ReadSafetensorsFile(a.inputs));
  std::vector<Tensor> inputs;
  for (const auto& item : in.tensors) {
    int index = 0;
    if (!absl::StartsWith(item.key, "input") ||
        !absl::SimpleAtoi(item.key.substr(5), &index) || index < 0 ||
        index > 64) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected input key ", item.key));
    }
    if (inputs.size() <= static_cast<size_t>(index)) inputs.resize(index + 1);
    inputs[index] = item.value;
  }
  ForwardOptions fo;
  fo.num_threads = a.threads;
  std::vector<Tensor> outputs;
  for (int step = 0; step < a.steps; ++step) {
    MODELSTATE_ASSIGN_OR_RETURN(outputs, Forward(root, inputs, fo));
  }
  StateDict out;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].defined()) {
      out.tensors.Set(absl::StrCat("output", i), outputs[i]);
    }
  }
  MODELSTATE_RETURN_IF_ERROR(WriteSafetensorsFile(a.out, out));
  if (!a.state_out.empty()) {
    MODELSTATE_RETURN_IF_ERROR(
        WriteSafetensorsFile(a.state_out, root.GetStateDict()));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace modelstate

int main(int argc, char** argv) {
  absl::StatusOr<modelstate::Args> args = modelstate::ParseArgs(argc, argv);
  absl::Status status = args.ok() ? modelstate::Run(*args) : args.status();
  if (!status.ok()) {
    std::cerr << status << std::endl;
    return 1;
  }
  return 0;
}
