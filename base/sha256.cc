#include "base/sha256.h"

#include <openssl/evp.h>

#include <memory>
#include <string>

#include "base/log.h"

namespace modelstate {

struct Sha256::State {
  EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : state_(std::make_unique<State>()) {
  state_->ctx = EVP_MD_CTX_new();
  MODELSTATE_CHECK(state_->ctx != nullptr) << "EVP_MD_CTX_new failed";
  MODELSTATE_CHECK(EVP_DigestInit_ex(state_->ctx, EVP_sha256(), nullptr) == 1)
      << "EVP_DigestInit_ex failed";
}

Sha256::~Sha256() { EVP_MD_CTX_free(state_->ctx); }

void Sha256::Update(absl::string_view bytes) {
  MODELSTATE_CHECK(EVP_DigestUpdate(state_->ctx, bytes.data(), bytes.size()) ==
                   1)
      << "EVP_DigestUpdate failed";
}

std::string Sha256::FinishHex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  MODELSTATE_CHECK(EVP_DigestFinal_ex(state_->ctx, digest, &length) == 1)
      << "EVP_DigestFinal_ex failed";
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(length * 2);
  for (unsigned int i = 0; i < length; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 15]);
  }
  return out;
}

std::string Sha256Hex(absl::string_view bytes) {
  Sha256 h;
  h.Update(bytes);
  return h.FinishHex();
}

bool IsSha256Hex(absl::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace modelstate
