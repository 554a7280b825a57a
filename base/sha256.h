// File: sha256.h
// SHA-256 digests (OpenSSL's libcrypto underneath), for content hashes of
// tensors and the audit log's hash chain.
//
// Example:
//   Sha256 h;
//   h.Update("abc");
//   std::string hex = h.FinishHex();   // "ba7816bf..."
#ifndef MODELSTATE_BASE_SHA256_H_
#define MODELSTATE_BASE_SHA256_H_

#include <memory>
#include <string>

#include "absl/strings/string_view.h"

namespace modelstate {

// Incremental SHA-256. Thread-compatible.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(absl::string_view bytes);
  // The digest as 64 lowercase hex characters. The object must not be used
  // afterwards.
  std::string FinishHex();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// SHA-256 of `bytes` as lowercase hex.
std::string Sha256Hex(absl::string_view bytes);

// Whether `s` has the form Sha256Hex returns: 64 lowercase hex digits.
bool IsSha256Hex(absl::string_view s);

}  // namespace modelstate

#endif  // MODELSTATE_BASE_SHA256_H_
