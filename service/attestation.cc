#include "service/attestation.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/checkpoint.h"
#include "base/merkle.h"
#include "base/status_macros.h"
#include "core/state_digest.h"
#include "nlohmann/json.hpp"
#include "service/audit_tree.h"

namespace modelstate {
namespace {

using AttestJson = nlohmann::ordered_json;

std::string AttestTime(absl::Time t) {
  return absl::FormatTime(absl::RFC3339_full, t, absl::UTCTimeZone());
}

AttestJson RecordDetails(const AuditRecord& r) {
  AttestJson details = AttestJson::parse(r.details_json, nullptr, false);
  return details.is_object() ? details : AttestJson::object();
}

// What one record says, as the records byproduct lists it.
AttestJson RecordSummary(const AuditRecord& r) {
  const AttestJson details = RecordDetails(r);
  AttestJson out = {
      {"seq", r.seq},
      {"type", r.type},
      {"leaf_hash", MerkleHashHex(AuditLeafHash(AuditLog::Serialize(r)))}};
  if (!r.outcome.empty()) out["outcome"] = r.outcome;
  if (!r.identity.empty()) out["identity"] = r.identity;
  for (const char* key : {"event_id", "subscriber", "path", "name", "kind"}) {
    if (details.contains(key)) out[key] = details[key];
  }
  return out;
}

// buildDefinition: the build's parameters, the later changes, and each
// load as a dependency with the digest its record holds.
AttestJson BuildDefinition(const AttestationFacts& facts) {
  AttestJson external = {{"module", facts.module}};
  AttestJson changes = AttestJson::array();
  AttestJson loads = AttestJson::array();
  for (const AuditRecord& r : facts.records) {
    AttestJson details = RecordDetails(r);
    // A failed change listed because it may have applied in part.
    if (r.outcome == "error") details["outcome"] = r.outcome;
    if (r.type == "build") {
      AttestJson build = AttestJson::object();
      for (const char* key : {"type", "spec", "spec_sha256", "seed", "dtype",
                              "device", "all_or_nothing"}) {
        if (details.contains(key)) build[key] = details[key];
      }
      build["seq"] = r.seq;
      external["build"] = std::move(build);
    } else if (r.type == "load_state_dict") {
      AttestJson load = {{"name", absl::StrCat("load_state_dict@", r.seq)},
                         {"uri", absl::StrCat("urn:modelstate:audit:", r.seq)}};
      if (details.contains("sha256") && details["sha256"].is_string()) {
        load["digest"] = {{"sha256", details["sha256"]}};
        details.erase("sha256");
      }
      details["seq"] = r.seq;
      load["annotations"] = std::move(details);
      loads.push_back(std::move(load));
    } else if (r.type == "register" || r.type == "move" ||
               r.type == "set_training" || r.type == "forward" ||
               r.type == "move_out" || r.type == "move_in") {
      // A cluster move: between a move_out and the move_in that brought
      // the module back, it was shaped on another replica, whose records
      // (a load, a registration) are in that replica's log, not cited
      // here. The moves are listed, naming the replicas, so that the
      // statement never passes that span off as no change.
      details["seq"] = r.seq;
      details["type"] = r.type;
      changes.push_back(std::move(details));
    }
  }
  external["changes"] = std::move(changes);
  return {{"buildType", kModelstateBuildType},
          {"externalParameters", std::move(external)},
          {"resolvedDependencies", std::move(loads)}};
}

// runDetails: this server, who took part, and the byproducts that tie the
// records to the log.
absl::StatusOr<AttestJson> RunDetails(const AttestationFacts& facts) {
  AttestJson summaries = AttestJson::array();
  std::vector<std::string> leaf_hashes;
  std::set<std::string> identities;
  std::set<std::string> subscribers;
  for (const AuditRecord& r : facts.records) {
    AttestJson summary = RecordSummary(r);
    leaf_hashes.push_back(summary["leaf_hash"].get<std::string>());
    if (!r.identity.empty()) identities.insert(r.identity);
    if (summary.contains("subscriber")) {
      subscribers.insert(summary["subscriber"].get<std::string>());
    }
    summaries.push_back(std::move(summary));
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::string records_digest,
                              Sha256OfDigests(leaf_hashes));
  AttestJson checkpoint = {
      {"name", kCheckpointByproduct},
      {"mediaType", "text/plain; charset=utf-8"},
      {"content", absl::Base64Escape(facts.checkpoint_note)},
      {"annotations", {{"verifier_key", facts.verifier_key}}}};
  if (absl::StatusOr<SignedNote> note = ParseSignedNote(facts.checkpoint_note);
      note.ok()) {
    if (absl::StatusOr<Checkpoint> c = ParseCheckpoint(note->text); c.ok()) {
      checkpoint["annotations"]["origin"] = c->origin;
      checkpoint["annotations"]["tree_size"] = c->size;
    }
  }
  AttestJson records = {{"name", kRecordsByproduct},
                        {"digest", {{"sha256", records_digest}}},
                        {"annotations", {{"records", std::move(summaries)}}}};
  AttestJson metadata = AttestJson::object();
  if (!facts.records.empty()) {
    metadata["invocationId"] = facts.records.front().correlation_id;
    metadata["startedOn"] = AttestTime(facts.records.front().time);
    metadata["finishedOn"] = AttestTime(facts.records.back().time);
  }
  return AttestJson{
      {"builder",
       {{"id", absl::StrCat("urn:modelstate:log:", facts.verifier_key)},
        {"version", {{"modelstate", kModelstateVersion}}}}},
      {"metadata", std::move(metadata)},
      {"byproducts",
       {std::move(checkpoint),
        std::move(records),
        {{"name", "participants"},
         {"uri", "urn:modelstate:participants"},
         {"annotations",
          {{"identities", identities}, {"subscribers", subscribers}}}}}}};
}

// Whether a change that failed may still have changed the module: a
// non-atomic load keeps the entries it copied before the error (PyTorch's
// partial behaviour), and a training-mode forward keeps the buffer updates
// of the layers that ran before the one that failed (a forward is recorded
// only when it may change the module). Other changes fail whole.
bool FailedYetMayHaveChanged(const AuditRecord& r) {
  if (r.type == "forward") return true;
  if (r.type != "load_state_dict") return false;
  const AttestJson details = RecordDetails(r);
  auto atomic = details.find("atomic");
  return atomic != details.end() && atomic->is_boolean() &&
         !atomic->get<bool>();
}

// The change a "recovered" record names (details.change), or "".
std::string RecoveredChange(const AuditRecord& r) {
  const AttestJson details = RecordDetails(r);
  auto change = details.find("change");
  return change != details.end() && change->is_string()
             ? change->get<std::string>()
             : "";
}

}  // namespace

std::vector<AuditRecord> RecordsThatShaped(
    absl::Span<const AuditRecord> module_records) {
  size_t start = 0;
  for (size_t i = 0; i < module_records.size(); ++i) {
    const AuditRecord& r = module_records[i];
    if (r.outcome != "ok") continue;
    if (r.type == "delete") start = i + 1;
    // A change saved and then recorded only at the next start
    // (service/audit_events.h): a recovered delete ends a life as a
    // recorded one does, and a recovered build begins one. Without this
    // the statement would cite the earlier life's build as this one's.
    if (r.type == "recovered") {
      const std::string change = RecoveredChange(r);
      if (change == "delete") start = i + 1;
      if (change == "build") start = i;
    }
  }
  std::vector<AuditRecord> out;
  for (size_t i = start; i < module_records.size(); ++i) {
    const AuditRecord& r = module_records[i];
    if (r.type == "denied") continue;
    if (r.outcome == "error" && !FailedYetMayHaveChanged(r)) continue;
    out.push_back(r);
  }
  return out;
}

absl::StatusOr<InTotoStatement> ModuleStatement(const AttestationFacts& facts) {
  InTotoStatement statement;
  MODELSTATE_ASSIGN_OR_RETURN(
      statement.subjects, StateDictSubjects(*facts.state, facts.hash_threads));
  statement.predicate_type = std::string(kSlsaProvenanceV1);
  MODELSTATE_ASSIGN_OR_RETURN(AttestJson run, RunDetails(facts));
  statement.predicate_json = AttestJson{
      {"buildDefinition", BuildDefinition(facts)},
      {"runDetails",
       std::move(run)}}.dump();
  return statement;
}

}  // namespace modelstate
