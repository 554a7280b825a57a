// File: module_spec.h
// A declarative description of a module tree, and the builder that turns it
// into Modules: built-in layers (PyTorch's constructor arguments, state_dict
// keys and default initialisation), containers, and custom modules assembled
// entry by entry. Registration hooks fire in PyTorch's construction order
// (SEMANTICS H6). The gRPC API and JSON spec files map one to one onto these
// structs.
//
// Example:
//   ModuleSpec mlp = ModuleSpec::Layer("Sequential");
//   mlp.children.push_back({"", ModuleSpec::Layer("Linear", {784, 256})});
//   mlp.children.push_back({"", ModuleSpec::Layer("ReLU")});
//   BuildOptions options;
//   options.seed = 0;
//   MODELSTATE_ASSIGN_OR_RETURN(BuildResult built, BuildModule(mlp, options));
//   StateDict sd = built.root->GetStateDict();   // "0.weight", "0.bias"
#ifndef MODELSTATE_NN_MODULE_SPEC_H_
#define MODELSTATE_NN_MODULE_SPEC_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/hooks.h"
#include "core/module.h"
#include "core/tensor.h"

namespace modelstate {

// A constructor argument: None, bool, int, float, str, a tuple of ints, or a
// tuple of floats (Upsample's scale_factor=(1.5, 2.0)).
using SpecValue =
    std::variant<std::monostate, bool, int64_t, double, std::string,
                 std::vector<int64_t>, std::vector<double>>;

// How a custom module's tensor is initialised.
struct InitSpec {
  enum class Kind : uint8_t {
    kZeros = 0,
    kOnes,
    kConstant,        // a
    kUniform,         // U(a, b)
    kNormal,          // N(mean a, std b)
    kKaimingUniform,  // kaiming_uniform_(a=a); default for parameters
    kXavierUniform,   // gain a
    kXavierNormal,    // gain a
    kEmpty,           // torch.empty: uninitialised (zero-filled here)
  };
  Kind kind = Kind::kZeros;
  double a = 0.0;
  double b = 1.0;
  // Draw from Generator(*seed) instead of the build's generator.
  std::optional<uint64_t> seed;
};

// The rule's name in spec files and records: "zeros", "kaiming_uniform", ...
absl::string_view InitKindName(InitSpec::Kind kind);

// A tensor of a custom module: shape, dtype and either an init rule or
// explicit values.
struct TensorSpec {
  std::optional<DType> dtype;  // Default: the build's dtype.
  Shape shape;
  InitSpec init;
  Tensor data;  // If defined: these values (shape and dtype from it).
};

// One entry of a custom module, registered in list order (the order of
// PyTorch's __init__).
struct MemberSpec {
  EntryKind kind = EntryKind::kParameter;
  std::string name;
  bool is_none = false;       // Register None (an unregistration event).
  TensorSpec tensor;          // kParameter, kBuffer
  bool requires_grad = true;  // kParameter
  bool persistent = true;     // kBuffer
  std::shared_ptr<const struct ModuleSpec> module;  // kModule
};

// Weight tying: after a custom module's members are registered, the entry at
// `target` (a dotted path below the module, e.g. "proj.weight") is
// registered as the very tensor object at `source` ("embed.weight"), as
// PyTorch's `self.proj.weight = self.embed.weight` does.
struct TieSpec {
  std::string target;
  std::string source;
};

struct ModuleChild;

// A module to build.
struct ModuleSpec {
  // A library type ("Linear", "Sequential", ...; see LayerTypes()), or the
  // class name of a custom module. Any other type is INVALID_ARGUMENT: a
  // custom module has members (ties, an extra state) or says `custom`.
  std::string type;
  // A custom module even without members, or under a library type's name.
  bool custom = false;
  // Constructor arguments, bound like Python: positional, then keyword.
  std::vector<SpecValue> args;
  std::vector<std::pair<std::string, SpecValue>> kwargs;
  // Sequential / ModuleList / ModuleDict children, in order. Names may be
  // empty for Sequential and ModuleList ("0", "1", ... are used).
  std::vector<ModuleChild> children;
  // Custom modules: entries in registration order.
  std::vector<MemberSpec> members;
  // Custom modules: hold an opaque extra state saved as "_extra_state".
  bool has_extra_state = false;
  // Custom modules: ties applied after the members, in order.
  std::vector<TieSpec> ties;
  // Instead of building a new module, reuse the module already built at
  // this path: a sibling's name inside a container, or a dotted path below
  // the enclosing custom module (PyTorch: `Sequential(l, l)`). Every other
  // field must be empty.
  std::string ref;

  static ModuleSpec Layer(
      std::string type, std::vector<SpecValue> args = {},
      std::vector<std::pair<std::string, SpecValue>> kwargs = {});
};

// A container's child: its name ("" for positional) and spec.
struct ModuleChild {
  std::string name;
  ModuleSpec spec;
};

// Limits a build must respect (RESOURCE_EXHAUSTED names the one exceeded).
struct BuildLimits {
  int max_depth = 64;                      // Nesting of modules.
  int64_t max_entries = 1'000'000;         // Parameters + buffers + modules.
  uint64_t max_tensor_bytes = UINT64_MAX;  // One tensor.
  uint64_t max_total_bytes = UINT64_MAX;   // All tensors with storage.
};

struct BuildOptions {
  uint64_t seed = 0;              // torch.manual_seed(seed)
  Device device = Device::Cpu();  // cpu or meta
  DType dtype = DType::kFloat32;  // factory dtype (floating point)
  // In-process hooks that decide each registration; nullptr for none.
  const HookRegistry* hooks = &HookRegistry::Global();
  BuildLimits limits;
  // The path the built module will have in its tree (events report paths
  // below it); "" for a new root.
  std::string root_path;
};

struct BuildResult {
  std::shared_ptr<Module> root;
  // Every registration, in construction order (SEMANTICS H6).
  std::vector<RegistrationRecord> records;
};

// Builds `spec`. INVALID_ARGUMENT naming the spec field (e.g.
// "spec.children[1].args: Linear.__init__() missing 1 required positional
// argument: 'out_features'") for bad specs; RESOURCE_EXHAUSTED for limits;
// FAILED_PRECONDITION for an unavailable device.
absl::StatusOr<BuildResult> BuildModule(const ModuleSpec& spec,
                                        const BuildOptions& options);

// RESOURCE_EXHAUSTED when a tree whose path-by-path traversals walk
// `entries` entries (TraversalEntries) exceeds limits.max_entries.
absl::Status CheckTraversalEntries(uint64_t entries, const BuildLimits& limits);

// Creates one tensor from `spec` as a custom module's member would be
// (drawing from Generator(seed) unless spec.init.seed is set), on `device`
// with `default_dtype` when spec.dtype is unset. Errors as BuildModule.
absl::StatusOr<Tensor> CreateTensor(const TensorSpec& spec, uint64_t seed,
                                    DType default_dtype, Device device,
                                    const BuildLimits& limits);

// Names of the built-in layer and container types.
std::vector<std::string> LayerTypes();
bool IsLayerType(absl::string_view type);

}  // namespace modelstate

#endif  // MODELSTATE_NN_MODULE_SPEC_H_
