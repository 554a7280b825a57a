#include "base/glob.h"

#include "absl/strings/str_cat.h"

namespace modelstate {

bool GlobMatch(absl::string_view glob, absl::string_view text) {
  // Iterative matching with one backtrack point for the last '*'.
  size_t g = 0, t = 0, star = absl::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (g < glob.size() && (glob[g] == '?' || glob[g] == text[t])) {
      ++g;
      ++t;
    } else if (g < glob.size() && glob[g] == '*') {
      star = g++;
      mark = t;
    } else if (star != absl::string_view::npos) {
      g = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (g < glob.size() && glob[g] == '*') ++g;
  return g == glob.size();
}

absl::Status CheckGlob(absl::string_view glob, absl::string_view field) {
  size_t bad = glob.find_first_of("[]\\");
  if (bad == absl::string_view::npos) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": '", glob, "' uses '", glob.substr(bad, 1),
                   "'; only the wildcards * and ? are supported"));
}

}  // namespace modelstate
