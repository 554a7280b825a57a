// File: module_name.h
// How hosted modules are named: "namespace/name", each part 1-128 characters
// of [A-Za-z0-9_.-] (never "." or ".."), so that a name is also a safe pair
// of directory names in the data directory.
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(ModuleName name, ParseModuleName("team/mlp"));
//   name.full();  // "team/mlp"
#ifndef MODELSTATE_SERVICE_MODULE_NAME_H_
#define MODELSTATE_SERVICE_MODULE_NAME_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace modelstate {

// "namespace/name"; each part 1-128 characters of [A-Za-z0-9_.-].
struct ModuleName {
  std::string ns;
  std::string name;
  std::string full() const { return ns + "/" + name; }
  friend bool operator<(const ModuleName& a, const ModuleName& b) {
    return a.full() < b.full();
  }
};

// Whether `part` may be a namespace or a name.
bool IsValidModuleNamePart(absl::string_view part);

// Parses "namespace/name" or "name" (namespace "default"). INVALID_ARGUMENT
// naming the text otherwise.
absl::StatusOr<ModuleName> ParseModuleName(absl::string_view text);

}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_MODULE_NAME_H_
