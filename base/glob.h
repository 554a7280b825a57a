// File: glob.h
// The one glob matcher of modelstate: '*' matches any run of characters
// (including none) and '?' any single character; every other character
// matches itself. State_dict key filters, subscriber filters and client
// policies all use it, so a pattern means the same everywhere.
//
// Example:
//   MODELSTATE_RETURN_IF_ERROR(CheckGlob(request.key_glob, "key_glob"));
//   if (GlobMatch("layer?.*.weight", "layer1.0.weight")) { ... }
#ifndef MODELSTATE_BASE_GLOB_H_
#define MODELSTATE_BASE_GLOB_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace modelstate {

// True if `text` matches `glob` as a whole.
bool GlobMatch(absl::string_view glob, absl::string_view text);

// INVALID_ARGUMENT naming `field` if `glob` uses '[', ']' or '\': fnmatch's
// character classes and escapes are not supported here, and would silently
// match nothing.
absl::Status CheckGlob(absl::string_view glob, absl::string_view field);

}  // namespace modelstate

#endif  // MODELSTATE_BASE_GLOB_H_
