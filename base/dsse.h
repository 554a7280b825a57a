// File: dsse.h
// DSSE, the Dead Simple Signing Envelope (github.com/secure-systems-lab/dsse,
// protocol v1): a payload, its type, and signatures over the
// pre-authentication encoding PAE(type, payload), so that a signature made
// for one payload type never verifies as another. in-toto attestations and
// OpenSSF model-signing bundles carry their statements in one. Signatures
// here are Ed25519 (base/signed_note.h's keys).
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(Ed25519PrivateKey key,
//                               Ed25519PrivateKey::LoadOrCreate(key_path));
//   MODELSTATE_ASSIGN_OR_RETURN(
//       DsseEnvelope envelope,
//       SignDsse(kInTotoPayloadType, statement_json, key));
//   std::string json = DsseToJson(envelope);  // write it out
//   // Elsewhere, with only the public key:
//   MODELSTATE_ASSIGN_OR_RETURN(DsseEnvelope read, DsseFromJson(json));
//   MODELSTATE_RETURN_IF_ERROR(VerifyDsse(read, key.public_key()));
#ifndef MODELSTATE_BASE_DSSE_H_
#define MODELSTATE_BASE_DSSE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/signed_note.h"

namespace modelstate {

// The payload type of an in-toto Statement (in-toto attestation spec v1).
inline constexpr absl::string_view kInTotoPayloadType =
    "application/vnd.in-toto+json";

// "DSSEv1" SP LEN(type) SP type SP LEN(payload) SP payload, lengths in
// decimal bytes: what every signature covers.
std::string DssePae(absl::string_view payload_type, absl::string_view payload);

struct DsseSignature {
  // A hint naming the key (not authenticated); DsseKeyId for ours.
  std::string keyid;
  std::string sig;  // raw signature bytes (base64 only in JSON)
};

struct DsseEnvelope {
  std::string payload_type;
  std::string payload;  // raw bytes (base64 only in JSON)
  std::vector<DsseSignature> signatures;
};

// The key ID this library puts in the envelopes it signs: lowercase hex of
// SHA-256 over the 32-byte Ed25519 public key.
std::string DsseKeyId(absl::string_view public_key);

// An envelope of `payload` with one Ed25519 signature by `key`.
absl::StatusOr<DsseEnvelope> SignDsse(absl::string_view payload_type,
                                      std::string payload,
                                      const Ed25519PrivateKey& key);

// OK if one of the envelope's signatures whose keyid is empty or names
// `public_key` (DsseKeyId) verifies under it; INVALID_ARGUMENT otherwise,
// saying whether there was no signature, none by this key, or only bad ones.
absl::Status VerifyDsse(const DsseEnvelope& envelope,
                        absl::string_view public_key);

// The envelope in DSSE's JSON form: {"payload": base64, "payloadType": ...,
// "signatures": [{"keyid": ..., "sig": base64}]} (standard base64, padded).
std::string DsseToJson(const DsseEnvelope& envelope);
// Reads that form (either base64 alphabet, as the spec allows);
// INVALID_ARGUMENT naming the field that is missing or malformed.
absl::StatusOr<DsseEnvelope> DsseFromJson(absl::string_view json);

}  // namespace modelstate

#endif  // MODELSTATE_BASE_DSSE_H_
