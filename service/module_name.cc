#include "service/module_name.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/quote.h"

namespace modelstate {

bool IsValidModuleNamePart(absl::string_view part) {
  // "." and ".." would be directory names with a meaning of their own.
  if (part.empty() || part.size() > 128 || part == "." || part == "..") {
    return false;
  }
  for (char c : part) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

absl::StatusOr<ModuleName> ParseModuleName(absl::string_view text) {
  ModuleName name;
  size_t slash = text.find('/');
  if (slash == absl::string_view::npos) {
    name.ns = "default";
    name.name = std::string(text);
  } else {
    name.ns = std::string(text.substr(0, slash));
    name.name = std::string(text.substr(slash + 1));
  }
  if (!IsValidModuleNamePart(name.ns) || !IsValidModuleNamePart(name.name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "module: ", Quote(text),
        " is not a valid module name (namespace/name, each 1-128 characters "
        "of [A-Za-z0-9_.-])"));
  }
  return name;
}

}  // namespace modelstate
