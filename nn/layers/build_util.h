// File: build_util.h
// Private to the layer families: what their build functions and signature
// tables share. Shorthands for default argument values, the factory kwargs
// (device, dtype) that most signatures end with, and new layer modules with
// torch's qualified names.
//
// Example:
//   std::vector<ArgDef> signature =
//       WithFactory({{"in_features", {}}, {"bias", B(true)}});
//   std::shared_ptr<Module> m = NewLayer("Linear", "linear");
//   // m->qualified_name() == "torch.nn.modules.linear.Linear"
#ifndef MODELSTATE_NN_LAYERS_BUILD_UTIL_H_
#define MODELSTATE_NN_LAYERS_BUILD_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/module.h"
#include "nn/build_context.h"
#include "nn/module_spec.h"

namespace modelstate::internal {

// Default values in signature tables: None, int, float, bool, str.
inline constexpr std::monostate kNone{};
inline SpecValue I(int64_t v) { return v; }
inline SpecValue F(double v) { return v; }
inline SpecValue B(bool v) { return v; }
inline SpecValue S(const char* v) { return std::string(v); }

// `args` followed by the factory kwargs `device=None, dtype=None`.
std::vector<ArgDef> WithFactory(std::vector<ArgDef> args);

// A built-in layer module: type `type`, qualified name
// "torch.nn.modules.<module_file>.<type>", fixed shapes.
std::shared_ptr<Module> NewLayer(absl::string_view type,
                                 absl::string_view module_file);

// A layer without state (activations, dropout, softmax, flatten, pooling):
// NewLayer with the class attribute `__constants__`.
std::shared_ptr<Module> NewStateless(absl::string_view type,
                                     absl::string_view module_file);

}  // namespace modelstate::internal

#endif  // MODELSTATE_NN_LAYERS_BUILD_UTIL_H_
