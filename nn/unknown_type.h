// File: unknown_type.h
// Private to nn's builder: the error for a spec whose type is neither a
// library layer nor an explicit custom module. A spec used to build an
// empty custom module from any type name it did not know, so a typo
// ("Linaer") or a torch.nn layer the library lacks ("PReLU") silently gave
// a module without state; now it is INVALID_ARGUMENT naming the field, with
// the closest library type and, for torch.nn's own names, why modelstate
// leaves the layer out.
//
// Example:
//   if (!IsCustomSpec(spec)) return UnknownTypeError(spec.type, spec_path);
//   // "spec.type: unknown layer type 'Linaer'; did you mean 'Linear'? ..."
#ifndef MODELSTATE_NN_UNKNOWN_TYPE_H_
#define MODELSTATE_NN_UNKNOWN_TYPE_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nn/module_spec.h"

namespace modelstate::internal {

// Whether a spec that names no library type asks for a custom module: it
// says `custom`, or has what only custom modules have (members, ties, an
// extra state).
bool IsCustomSpec(const ModuleSpec& spec);

// The library type closest to `type` (case-insensitive edit distance with
// transpositions, within a third of the name's length), if any.
std::optional<std::string> ClosestLayerType(absl::string_view type);

// INVALID_ARGUMENT for a spec at `spec_path` of unknown `type`: the closest
// library type, or why a torch.nn layer is not in the library, and how to
// ask for a custom module.
absl::Status UnknownTypeError(absl::string_view type,
                              const std::string& spec_path);

}  // namespace modelstate::internal

#endif  // MODELSTATE_NN_UNKNOWN_TYPE_H_
