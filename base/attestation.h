// File: attestation.h
// The statement formats that attestations are made of, independent of what
// they attest: in-toto Statement v1 (github.com/in-toto/attestation,
// spec/v1) with SHA-256 resource descriptors, and OpenSSF Model Signing
// v1.0 (OMS): a statement whose predicate lists each file's SHA-256 and
// whose one subject is the SHA-256 over those digests, signed in a DSSE
// envelope (base/dsse.h) inside a sigstore bundle with a key hint instead
// of a certificate ("key-based" signing). Hashing of many buffers is spread
// over threads, since a model's tensors are hundreds of MiB.
//
// Example:
//   InTotoStatement s;
//   s.subjects.push_back({"0.weight", Sha256Hex(bytes), R"({"dtype":"f32"})"});
//   s.predicate_type = std::string(kSlsaProvenanceV1);
//   s.predicate_json = R"({"buildDefinition":{}})";
//   MODELSTATE_ASSIGN_OR_RETURN(std::string json, InTotoStatementToJson(s));
//   // OMS for a file:
//   MODELSTATE_ASSIGN_OR_RETURN(
//       std::string bundle,
//       SignOmsBundle("mlp", {{"mlp.safetensors", file_sha256, ""}}, key));
//   MODELSTATE_ASSIGN_OR_RETURN(std::vector<AttestedResource> files,
//                               VerifyOmsBundle(bundle, key.public_key()));
#ifndef MODELSTATE_BASE_ATTESTATION_H_
#define MODELSTATE_BASE_ATTESTATION_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/dsse.h"
#include "base/signed_note.h"

namespace modelstate {

inline constexpr absl::string_view kInTotoStatementType =
    "https://in-toto.io/Statement/v1";
inline constexpr absl::string_view kSlsaProvenanceV1 =
    "https://slsa.dev/provenance/v1";
inline constexpr absl::string_view kOmsPredicateType =
    "https://model_signing/signature/v1.0";
inline constexpr absl::string_view kSigstoreBundleMediaType =
    "application/vnd.dev.sigstore.bundle.v0.3+json";

// Lowercase hex SHA-256 of each buffer, in order. The buffers are spread
// over at most `threads` threads (largest first, each to the least loaded
// thread), so one call hashes at about `threads` times one core's speed.
std::vector<std::string> Sha256HexAll(
    absl::Span<const absl::string_view> buffers, int threads);

// SHA-256 (hex) over the raw 32-byte digests, given in hex, concatenated in
// the given order: OMS's subject digest. INVALID_ARGUMENT naming the
// position of a digest that is not 64 lowercase hex digits.
absl::StatusOr<std::string> Sha256OfDigests(
    absl::Span<const std::string> hex_digests);

// The deepest nesting of JSON arrays and objects the readers below (and
// base/attestation_predicate.h) accept. nlohmann/json copies and dumps a
// value recursively, so a file nested 100000 deep would overflow the stack
// of whoever reads it, before any signature is checked; what the server
// writes nests a few dozen levels (a spec in a build record at most 64).
inline constexpr int kMaxStatementJsonDepth = 128;
// Whether `json` nests arrays and objects more than `max_depth` deep,
// counting brackets outside strings (the text need not be valid JSON).
bool JsonNestedDeeperThan(absl::string_view json, int max_depth);

// An in-toto ResourceDescriptor identified by its SHA-256.
struct AttestedResource {
  std::string name;
  std::string sha256;            // lowercase hex
  std::string annotations_json;  // a JSON object's text; "" for none
};

// An in-toto Statement v1.
struct InTotoStatement {
  std::vector<AttestedResource> subjects;
  std::string predicate_type;
  std::string predicate_json;  // a JSON object's text
};

// The statement as JSON, members in the spec's order ("_type", "subject",
// "predicateType", "predicate"). INVALID_ARGUMENT if the predicate or an
// annotation is not a JSON object, or a digest is not SHA-256 hex.
absl::StatusOr<std::string> InTotoStatementToJson(const InTotoStatement& s);
// Reads a statement; INVALID_ARGUMENT naming the field that is missing or
// malformed (another "_type", a subject without a sha256 digest, ...).
absl::StatusOr<InTotoStatement> InTotoStatementFromJson(absl::string_view json);

// OMS v1.0's statement for `files` (serialization method "files"): the
// resources sorted by name, the subject `model_name` with the SHA-256 over
// their digests in that order.
absl::StatusOr<InTotoStatement> OmsStatement(
    absl::string_view model_name, std::vector<AttestedResource> files);
// That statement, signed with `key` in DSSE, as a sigstore bundle v0.3:
// {"mediaType", "verificationMaterial": {"publicKey": {"hint": key ID},
// "tlogEntries": []}, "dsseEnvelope": {...}}.
absl::StatusOr<std::string> SignOmsBundle(absl::string_view model_name,
                                          std::vector<AttestedResource> files,
                                          const Ed25519PrivateKey& key);
// Checks a bundle: its DSSE signature under `public_key`, the payload type
// (in-toto's), the predicate type, the serialization method, and that the
// subject is the digest of the listed resources. Returns the resources.
// INVALID_ARGUMENT naming what failed.
absl::StatusOr<std::vector<AttestedResource>> VerifyOmsBundle(
    absl::string_view bundle_json, absl::string_view public_key);

}  // namespace modelstate

#endif  // MODELSTATE_BASE_ATTESTATION_H_
