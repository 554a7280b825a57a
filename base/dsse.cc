#include "base/dsse.h"

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace modelstate {
namespace {

// A JSON string member of `object`, or INVALID_ARGUMENT naming `field`.
absl::StatusOr<std::string> StringMember(const nlohmann::json& object,
                                         const char* key,
                                         absl::string_view field) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DSSE envelope: ", field, " is missing or not a string"));
  }
  return it->get<std::string>();
}

// Standard or URL-safe base64 (DSSE accepts both), or INVALID_ARGUMENT.
absl::StatusOr<std::string> DecodeBase64(absl::string_view text,
                                         absl::string_view field) {
  std::string bytes;
  if (absl::Base64Unescape(text, &bytes) ||
      absl::WebSafeBase64Unescape(text, &bytes)) {
    return bytes;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("DSSE envelope: ", field, " is not base64"));
}

}  // namespace

std::string DssePae(absl::string_view payload_type, absl::string_view payload) {
  return absl::StrCat("DSSEv1 ", payload_type.size(), " ", payload_type, " ",
                      payload.size(), " ", payload);
}

std::string DsseKeyId(absl::string_view public_key) {
  Sha256 hash;
  hash.Update(public_key);
  return hash.FinishHex();
}

absl::StatusOr<DsseEnvelope> SignDsse(absl::string_view payload_type,
                                      std::string payload,
                                      const Ed25519PrivateKey& key) {
  DsseEnvelope envelope;
  envelope.payload_type = std::string(payload_type);
  envelope.payload = std::move(payload);
  MODELSTATE_ASSIGN_OR_RETURN(
      std::string sig, key.Sign(DssePae(payload_type, envelope.payload)));
  envelope.signatures.push_back(
      DsseSignature{DsseKeyId(key.public_key()), std::move(sig)});
  return envelope;
}

absl::Status VerifyDsse(const DsseEnvelope& envelope,
                        absl::string_view public_key) {
  if (envelope.signatures.empty()) {
    return absl::InvalidArgumentError("DSSE envelope has no signature");
  }
  const std::string keyid = DsseKeyId(public_key);
  const std::string pae = DssePae(envelope.payload_type, envelope.payload);
  bool by_this_key = false;
  for (const DsseSignature& signature : envelope.signatures) {
    if (!signature.keyid.empty() && signature.keyid != keyid) continue;
    by_this_key = true;
    if (VerifyEd25519(public_key, pae, signature.sig)) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      by_this_key
          ? absl::StrCat("DSSE envelope: the signature by key ", keyid,
                         " does not verify (payload, payloadType or "
                         "signature altered, or another key)")
          : absl::StrCat("DSSE envelope has no signature by key ", keyid));
}

std::string DsseToJson(const DsseEnvelope& envelope) {
  nlohmann::json signatures = nlohmann::json::array();
  for (const DsseSignature& signature : envelope.signatures) {
    signatures.push_back({{"keyid", signature.keyid},
                          {"sig", absl::Base64Escape(signature.sig)}});
  }
  nlohmann::json json = {{"payload", absl::Base64Escape(envelope.payload)},
                         {"payloadType", envelope.payload_type},
                         {"signatures", std::move(signatures)}};
  return json.dump(2) + "\n";
}

absl::StatusOr<DsseEnvelope> DsseFromJson(absl::string_view text) {
  nlohmann::json json = nlohmann::json::parse(text, nullptr,
                                              /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError("DSSE envelope is not a JSON object");
  }
  DsseEnvelope envelope;
  MODELSTATE_ASSIGN_OR_RETURN(envelope.payload_type,
                              StringMember(json, "payloadType", "payloadType"));
  MODELSTATE_ASSIGN_OR_RETURN(std::string payload,
                              StringMember(json, "payload", "payload"));
  MODELSTATE_ASSIGN_OR_RETURN(envelope.payload,
                              DecodeBase64(payload, "payload"));
  auto signatures = json.find("signatures");
  if (signatures == json.end() || !signatures->is_array()) {
    return absl::InvalidArgumentError(
        "DSSE envelope: signatures is missing or not an array");
  }
  for (size_t i = 0; i < signatures->size(); ++i) {
    const nlohmann::json& entry = (*signatures)[i];
    std::string field = absl::StrCat("signatures[", i, "]");
    if (!entry.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("DSSE envelope: ", field, " is not an object"));
    }
    DsseSignature signature;
    if (entry.contains("keyid")) {
      MODELSTATE_ASSIGN_OR_RETURN(
          signature.keyid, StringMember(entry, "keyid", field + ".keyid"));
    }
    MODELSTATE_ASSIGN_OR_RETURN(std::string sig,
                                StringMember(entry, "sig", field + ".sig"));
    MODELSTATE_ASSIGN_OR_RETURN(signature.sig,
                                DecodeBase64(sig, field + ".sig"));
    envelope.signatures.push_back(std::move(signature));
  }
  return envelope;
}

}  // namespace modelstate
