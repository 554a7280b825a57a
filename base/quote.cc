#include "base/quote.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace modelstate {

std::string Quote(absl::string_view value, char quote) {
  const absl::string_view q(&quote, 1);
  if (value.size() <= kMaxQuotedBytes) return absl::StrCat(q, value, q);
  size_t cut = kMaxQuotedBytes;
  // Back off from the middle of a UTF-8 character (continuation bytes are
  // 10xxxxxx), so that the message stays valid UTF-8 where the value was.
  while (cut > 0 && (static_cast<unsigned char>(value[cut]) & 0xC0) == 0x80) {
    --cut;
  }
  return absl::StrCat(q, value.substr(0, cut), "\u2026", q, " (", value.size(),
                      " bytes)");
}

}  // namespace modelstate
