// File: build_context.h
// Private to nn's builder and layer families: constructor-argument binding
// with Python's rules and error texts, the state one build carries
// (generator, factory dtype/device, limits, the registration record), and
// the spec walk that the families' builders call back into.
//
// Example (a family's build function):
//   absl::StatusOr<std::shared_ptr<Module>> BuildThing(
//       const BoundArgs& args, BuildContext& ctx, const std::string& path) {
//     MODELSTATE_ASSIGN_OR_RETURN(int64_t n, args.Int("num_features"));
//     MODELSTATE_ASSIGN_OR_RETURN(Tensor w, ctx.NewTensor(
//         ctx.options().dtype, {n}, ctx.options().device));
//     std::shared_ptr<Module> m = Module::Create("Thing");
//     MODELSTATE_RETURN_IF_ERROR(ctx.AddParameter(*m, path, "weight", w));
//     return m;
//   }
#ifndef MODELSTATE_NN_BUILD_CONTEXT_H_
#define MODELSTATE_NN_BUILD_CONTEXT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/generator.h"
#include "core/module.h"
#include "nn/module_spec.h"

namespace modelstate::internal {

// One parameter of a constructor's signature; required when it has no
// default.
struct ArgDef {
  absl::string_view name;
  std::optional<SpecValue> default_value;
};

// Where a layer's tensors are created: torch's factory kwargs.
struct FactoryKwargs {
  DType dtype = DType::kFloat32;
  Device device = Device::Cpu();
};

// Constructor arguments bound to a signature. Accessors return
// INVALID_ARGUMENT naming the argument when its value has the wrong type.
class BoundArgs {
 public:
  BoundArgs(std::string type,
            absl::flat_hash_map<std::string, SpecValue> values)
      : type_(std::move(type)), values_(std::move(values)) {}

  bool IsNone(absl::string_view name) const;
  absl::StatusOr<int64_t> Int(absl::string_view name) const;
  // Int, at least `min` (INVALID_ARGUMENT "<type>: argument 'num_layers'
  // must be at least 1, got 0").
  absl::StatusOr<int64_t> IntAtLeast(absl::string_view name, int64_t min) const;
  absl::StatusOr<double> Float(absl::string_view name) const;
  absl::StatusOr<bool> Bool(absl::string_view name) const;
  absl::StatusOr<std::string> Str(absl::string_view name) const;
  // An int or a tuple of ints; an int is repeated `n` times (PyTorch's
  // _pair/_single); a tuple must have `n` elements (n == 0: any length).
  absl::StatusOr<std::vector<int64_t>> Ints(absl::string_view name,
                                            size_t n) const;
  // Ints, each element at least `min` (INVALID_ARGUMENT "<type>: argument
  // 'stride' must be at least 1, got 0", the pooling layers' text).
  absl::StatusOr<std::vector<int64_t>> IntsAtLeast(absl::string_view name,
                                                   size_t n, int64_t min) const;
  // An int or a tuple of ints kept as given (a pooling layer stores its
  // kernel_size as passed), each element at least `min`.
  absl::StatusOr<AttrValue> IntOrTuple(absl::string_view name,
                                       int64_t min) const;
  // A float or a tuple of floats (ints become floats), as torch's Upsample
  // keeps its scale_factor.
  absl::StatusOr<AttrValue> FloatOrTuple(absl::string_view name) const;
  // The factory kwargs `dtype` and `device` when the signature has them
  // (checked in that order), else the build's.
  absl::StatusOr<FactoryKwargs> Factory(const BuildOptions& build) const;

 private:
  absl::StatusOr<DType> FactoryDType(DType build_dtype) const;
  absl::StatusOr<Device> FactoryDevice(Device build_device) const;
  const SpecValue* Find(absl::string_view name) const;
  absl::Status WrongType(absl::string_view name, absl::string_view expected,
                         const SpecValue& got) const;

  std::string type_;
  absl::flat_hash_map<std::string, SpecValue> values_;
};

// Binds positional and keyword arguments like a Python call of
// `<type>.__init__(self, ...)`, with Python 3.11's error texts.
absl::StatusOr<BoundArgs> BindArgs(
    absl::string_view type, const std::vector<ArgDef>& signature,
    const std::vector<SpecValue>& args,
    const std::vector<std::pair<std::string, SpecValue>>& kwargs);

// The state of one build. Thread-compatible.
class BuildContext {
 public:
  explicit BuildContext(const BuildOptions& options);

  Generator& gen() { return gen_; }
  const BuildOptions& options() const { return options_; }
  std::vector<RegistrationRecord>& records() { return records_; }

  // An uninitialised tensor on `device` (no storage on meta), counted
  // against the byte limits.
  absl::StatusOr<Tensor> NewTensor(DType dtype, Shape shape, Device device);

  // Register into `module` (whose path in the tree is `path`) through the
  // hooks, recording the registration. A parameter is made from `data`.
  absl::Status AddParameter(Module& module, const std::string& path,
                            std::string name, Tensor data,
                            bool requires_grad = true);
  absl::Status AddBuffer(Module& module, const std::string& path,
                         std::string name, Tensor tensor,
                         bool persistent = true);
  absl::Status AddModule(Module& module, const std::string& path,
                         std::string name, std::shared_ptr<Module> child);

  // Depth bookkeeping for BuildLimits::max_depth.
  absl::Status Enter();
  void Leave() { --depth_; }

  // Values that AddParameter registers instead of the data it is given, by
  // the parameter's full key ("decoder.layers.0.linear1.weight"): for a
  // layer whose init runs after its children are built (Transformer's
  // _reset_parameters), so that hooks still see final values. Not owned;
  // null for none. Returns the previous map.
  const absl::flat_hash_map<std::string, Tensor>* set_presets(
      const absl::flat_hash_map<std::string, Tensor>* presets) {
    std::swap(presets, presets_);
    return presets;
  }

 private:
  absl::Status CountEntry();
  RegistrationContext Context(const std::string& path);

  const BuildOptions options_;
  Generator gen_;
  std::vector<RegistrationRecord> records_;
  const absl::flat_hash_map<std::string, Tensor>* presets_ = nullptr;
  uint64_t total_bytes_ = 0;
  int64_t entries_ = 0;
  int depth_ = 0;
};

// Builds any spec (library layer, container or custom module) whose module
// path in the tree is `path` and whose location in the spec is `spec_path`.
absl::StatusOr<std::shared_ptr<Module>> BuildSpec(const ModuleSpec& spec,
                                                  const std::string& path,
                                                  const std::string& spec_path,
                                                  BuildContext& ctx);

// A custom module's tensor from its spec, on the build's device.
absl::StatusOr<Tensor> MakeCustomTensor(const TensorSpec& spec,
                                        BuildContext& ctx);

// "path.name", or "name" at the root.
std::string ChildPath(const std::string& path, absl::string_view name);

// `status` with "<spec_path> (<type>): " before its message; OK stays OK.
absl::Status WithSpecPath(const absl::Status& status,
                          const std::string& spec_path, absl::string_view type);

// The module a 'ref' spec names: the submodule at spec.ref below `scope`.
// INVALID_ARGUMENT if the spec has other fields or names nothing.
absl::StatusOr<std::shared_ptr<Module>> ResolveRef(const ModuleSpec& spec,
                                                   const Module& scope);

}  // namespace modelstate::internal

#endif  // MODELSTATE_NN_BUILD_CONTEXT_H_
