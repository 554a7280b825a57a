// File: attestation.h
// What AttestModule signs: an in-toto Statement v1 about one hosted module.
// Its subjects are the module's state_dict entries (name, SHA-256 of the
// raw little-endian bytes, dtype and shape), in state_dict order. Its
// predicate is SLSA Provenance v1 built from the audit records of the
// module's current life: buildDefinition (the build's type, seed, dtype and
// device; the later changes, cluster moves included; each load with the
// digest the log recorded), runDetails (this server's version, the log's
// identity, who did what), and as byproducts
// the signed checkpoint that covers those records and, for each record, its
// seq, type and RFC 6962 leaf hash, so that anyone holding the log's key
// can check each record's inclusion.
//
// Example:
//   AttestationFacts facts;
//   facts.module = "team/mlp";
//   facts.state = &snapshot.state;
//   facts.records = RecordsThatShaped(module_records);
//   facts.checkpoint_note = signer->Latest();
//   facts.verifier_key = signer->verifier_key();
//   MODELSTATE_ASSIGN_OR_RETURN(InTotoStatement statement,
//                               ModuleStatement(facts));
#ifndef MODELSTATE_SERVICE_ATTESTATION_H_
#define MODELSTATE_SERVICE_ATTESTATION_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/attestation.h"
#include "core/module.h"
#include "service/audit_log.h"

namespace modelstate {

// The server's version, as attestations name it.
inline constexpr absl::string_view kModelstateVersion = "0.16.0";
// The SLSA buildType of a module built on modelstate.
inline constexpr absl::string_view kModelstateBuildType =
    "https://modelstate.dev/attestation/build/v1";
// The byproducts' names.
inline constexpr absl::string_view kCheckpointByproduct = "audit-checkpoint";
inline constexpr absl::string_view kRecordsByproduct = "audit-records";

// Of one module's records (all with its namespace and name, in seq order),
// those of its current life that shaped it: everything after its last
// successful delete (a "recovered" one too, or from a "recovered" build
// on: a change the log recorded only at the next start), except refused
// calls ("denied") and changes that
// failed (outcome "error") whole. A failed non-atomic load and a failed
// forward (one that may write buffers) are kept: they may have changed the
// module before they failed.
std::vector<AuditRecord> RecordsThatShaped(
    absl::Span<const AuditRecord> module_records);

struct AttestationFacts {
  std::string module;                // "<namespace>/<name>"
  const StateDict* state = nullptr;  // not owned
  std::vector<AuditRecord> records;  // RecordsThatShaped's
  // A signed checkpoint covering every record, and the log's verifier key.
  std::string checkpoint_note;
  std::string verifier_key;
  int hash_threads = 2;
};

// The statement (SLSA Provenance v1 predicate). Errors: StateDictSubjects'
// (core/state_digest.h).
absl::StatusOr<InTotoStatement> ModuleStatement(const AttestationFacts& facts);

}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_ATTESTATION_H_
