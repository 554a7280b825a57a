// File: quote.h
// Text a client sent, as an error message shows it: quoted, and cut to a
// bounded length. A status message travels back in gRPC's grpc-message
// header, and clients refuse headers over 8 KiB by default (they then see
// RESOURCE_EXHAUSTED instead of the error), so a value the client chose is
// never echoed whole.
//
// Example:
//   return absl::InvalidArgumentError(absl::StrCat(
//       "module: ", Quote(text), " is not a valid module name"));
//   // module: 'team/m!' is not a valid module name
//   // module: 'aaa…aaa…' (204800 bytes) is not a valid module name
#ifndef MODELSTATE_BASE_QUOTE_H_
#define MODELSTATE_BASE_QUOTE_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace modelstate {

// The most bytes of a value Quote shows.
inline constexpr size_t kMaxQuotedBytes = 128;

// `value` between two `quote`s when it is at most kMaxQuotedBytes long;
// otherwise its first bytes (up to kMaxQuotedBytes, not splitting a UTF-8
// character), an ellipsis inside the quotes, and its size:
// 'abc…' (204800 bytes).
std::string Quote(absl::string_view value, char quote = '\'');

}  // namespace modelstate

#endif  // MODELSTATE_BASE_QUOTE_H_
