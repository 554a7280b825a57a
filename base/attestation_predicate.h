// File: attestation_predicate.h
// Reads what a verifier needs from the SLSA Provenance v1 predicate of a
// module attestation (service/attestation.h writes it): the signed
// checkpoint, the audit records it cites (seq, leaf hash) and the seq of
// the build record. The predicate is read as untrusted input even under a
// good signature (a server bug, a stolen key): members are reached through
// type checks alone, so that no shape of JSON throws or reads out of bounds
// (tests/fuzz/predicate_fuzz.cc holds it to that).
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(CitedRecords cited,
//                               ReadCitedRecords(statement.predicate_json));
//   for (const auto& [seq, leaf_hex] : cited.records) { ... }
#ifndef MODELSTATE_BASE_ATTESTATION_PREDICATE_H_
#define MODELSTATE_BASE_ATTESTATION_PREDICATE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace modelstate {

// The byproducts that tie an attestation to the log (service/attestation.h
// names them on the server's side).
inline constexpr absl::string_view kCheckpointByproductName =
    "audit-checkpoint";
inline constexpr absl::string_view kRecordsByproductName = "audit-records";

// What the predicate cites.
struct CitedRecords {
  // The signed checkpoint note (base64-decoded; its signature unchecked).
  std::string checkpoint_note;
  // (seq, leaf hash in lowercase hex), in the predicate's order: at least
  // one, each seq >= 1 and given once.
  std::vector<std::pair<uint64_t, std::string>> records;
  // buildDefinition.externalParameters.build.seq: the build record, one of
  // `records`. Unset for a module that came by a cluster move and was never
  // built on this replica; its life then begins at the first cited record.
  std::optional<uint64_t> build_seq;
};

// The byproducts' checkpoint and records, each given once, at least one
// record, and the build record among them. INVALID_ARGUMENT naming the
// field that is missing or malformed.
absl::StatusOr<CitedRecords> ReadCitedRecords(absl::string_view predicate_json);

// The module the predicate attests (buildDefinition.externalParameters.
// module), or "" when it names none.
std::string AttestedModuleOf(absl::string_view predicate_json);

}  // namespace modelstate

#endif  // MODELSTATE_BASE_ATTESTATION_PREDICATE_H_
