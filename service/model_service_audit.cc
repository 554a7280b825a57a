// ModelService's verifiable-log methods: checkpoints, inclusion and
// consistency proofs, witness cosignatures. Kept apart from
// model_service.cc, whose methods are about modules.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "base/attestation.h"
#include "base/dsse.h"
#include "base/status_macros.h"
#include "core/state_digest.h"
#include "service/attestation.h"
#include "service/audit_tree.h"
#include "service/model_service.h"

namespace modelstate {

absl::Status ModelService::HasCheckpoints() const {
  MODELSTATE_RETURN_IF_ERROR(HasAudit());
  if (options_.checkpoints != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "this server signs no audit checkpoints");
}

absl::Status ModelService::AllowAuditRead(const Caller& caller,
                                          absl::string_view rpc,
                                          bool witness_too) {
  if (witness_too && caller.principal.AllowsAnywhere(Permission::kWitness)) {
    return absl::OkStatus();
  }
  return gate_.AllowSomewhere(caller, rpc, Permission::kAudit);
}

void ModelService::BeginAuditCall(const Caller& caller) {
  if (audit_ != nullptr) audit_->BeginCall(caller.ctx.call_id);
}

std::vector<uint64_t> ModelService::EndAuditCall(const Caller& caller) {
  // Collected as they were appended rather than queried afterwards: a
  // query by correlation id would also find a concurrent call's records
  // when two clients send the same x-request-id, and a query has a page
  // size a large build's records outgrow.
  if (audit_ == nullptr) return {};
  return audit_->EndCall(caller.ctx.call_id);
}

absl::StatusOr<AuditCheckpoint> ModelService::GetCheckpoint(
    const Caller& caller, bool fresh) {
  MODELSTATE_RETURN_IF_ERROR(AllowAuditRead(caller, "GetCheckpoint", true));
  MODELSTATE_RETURN_IF_ERROR(HasCheckpoints());
  AuditCheckpoint out;
  if (fresh) {
    MODELSTATE_ASSIGN_OR_RETURN(out.note, options_.checkpoints->SignNow());
  } else {
    out.note = options_.checkpoints->Latest();
  }
  out.verifier_key = options_.checkpoints->verifier_key();
  return out;
}

absl::StatusOr<AuditInclusion> ModelService::GetInclusionProof(
    const Caller& caller, uint64_t seq, uint64_t tree_size) {
  MODELSTATE_RETURN_IF_ERROR(
      AllowAuditRead(caller, "GetInclusionProof", false));
  MODELSTATE_RETURN_IF_ERROR(HasCheckpoints());
  AuditInclusion out;
  out.seq = seq;
  out.tree_size = tree_size != 0
                      ? tree_size
                      : options_.checkpoints->LatestCheckpoint().size;
  MODELSTATE_ASSIGN_OR_RETURN(out.proof,
                              audit_->InclusionProof(seq, out.tree_size));
  MODELSTATE_ASSIGN_OR_RETURN(AuditRecord record, audit_->Get(seq));
  const std::string line = AuditLog::Serialize(record);
  out.leaf_hash = AuditLeafHash(line);
  if (AuditRecordVisible(caller.principal.NamespacesFor(Permission::kAudit),
                         record)) {
    out.record_line = line;
  }
  return out;
}

absl::StatusOr<std::vector<MerkleHash>> ModelService::GetConsistencyProof(
    const Caller& caller, uint64_t old_size, uint64_t new_size) {
  MODELSTATE_RETURN_IF_ERROR(
      AllowAuditRead(caller, "GetConsistencyProof", true));
  MODELSTATE_RETURN_IF_ERROR(HasCheckpoints());
  return audit_->ConsistencyProof(old_size, new_size);
}

absl::StatusOr<std::string> ModelService::AddCosignature(
    const Caller& caller, const std::string& note) {
  MODELSTATE_RETURN_IF_ERROR(
      gate_.AllowSomewhere(caller, "AddCosignature", Permission::kWitness));
  MODELSTATE_RETURN_IF_ERROR(HasCheckpoints());
  return options_.checkpoints->AddCosignature(note);
}

absl::StatusOr<ModuleAttestation> ModelService::AttestModule(
    const Caller& caller, const ModuleName& module) {
  MODELSTATE_RETURN_IF_ERROR(
      gate_.Allow(caller, "AttestModule", Permission::kRead, module));
  MODELSTATE_RETURN_IF_ERROR(
      gate_.Allow(caller, "AttestModule", Permission::kAudit, module));
  MODELSTATE_RETURN_IF_ERROR(HasCheckpoints());
  MODELSTATE_ASSIGN_OR_RETURN(StateDictSnapshot snapshot,
                              store_->Snapshot(module, SnapshotFilter{}));
  std::vector<AuditRecord> records;
  AuditQuery query;
  query.ns = module.ns;
  query.module = module.name;
  query.limit = AuditQuery::kMaxLimit;
  while (true) {
    MODELSTATE_ASSIGN_OR_RETURN(std::vector<AuditRecord> page,
                                audit_->Query(query));
    if (page.empty()) break;
    query.after_seq = page.back().seq;
    for (AuditRecord& r : page) records.push_back(std::move(r));
  }
  AttestationFacts facts;
  facts.module = module.full();
  facts.state = &snapshot.state;
  facts.records = RecordsThatShaped(records);
  // Signed after the records were read, so that it covers all of them.
  MODELSTATE_ASSIGN_OR_RETURN(facts.checkpoint_note,
                              options_.checkpoints->SignNow());
  facts.verifier_key = options_.checkpoints->verifier_key();
  MODELSTATE_ASSIGN_OR_RETURN(InTotoStatement statement,
                              ModuleStatement(facts));
  MODELSTATE_ASSIGN_OR_RETURN(std::string payload,
                              InTotoStatementToJson(statement));
  MODELSTATE_ASSIGN_OR_RETURN(DsseEnvelope envelope,
                              SignDsse(kInTotoPayloadType, std::move(payload),
                                       options_.checkpoints->key()));
  ModuleAttestation out;
  out.envelope_json = DsseToJson(envelope);
  out.verifier_key = std::move(facts.verifier_key);
  out.checkpoint = std::move(facts.checkpoint_note);
  // One response carries it, and the statement grows with the records it
  // cites: past the limit gRPC itself would refuse to send it, with an
  // error that names no limit of ours. Each field's tag and length take
  // at most 11 bytes more.
  const uint64_t bytes = out.envelope_json.size() + out.verifier_key.size() +
                         out.checkpoint.size() + 3 * 11;
  if (bytes > limits().max_message_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "attestation: ", bytes, " bytes (it cites ", facts.records.size(),
        " audit records), over the max_message_bytes limit of ",
        limits().max_message_bytes, " (one response carries it)"));
  }
  return out;
}

absl::StatusOr<SignedStateFile> ModelService::SignStateFile(
    const Caller& caller, GetStateDictArgs args, absl::string_view file_name) {
  MODELSTATE_RETURN_IF_ERROR(
      gate_.Allow(caller, "SignStateFile", Permission::kAudit, args.module));
  MODELSTATE_RETURN_IF_ERROR(HasCheckpoints());
  if (file_name.empty() || file_name.size() > 255 ||
      absl::c_any_of(file_name, [](char c) {
        return c == '/' || static_cast<unsigned char>(c) < 0x20;
      })) {
    return absl::InvalidArgumentError(
        "file_name: must be a file's name (1 to 255 bytes, no '/' or control "
        "characters)");
  }
  const ModuleName module = args.module;
  // GetStateDict's checks, snapshot and reader: the same bytes it sends.
  MODELSTATE_ASSIGN_OR_RETURN(StateDictDownload download,
                              GetStateDict(caller, std::move(args)));
  SignedStateFile out;
  MODELSTATE_ASSIGN_OR_RETURN(out.file, StateFileSha256(*download.reader));
  MODELSTATE_ASSIGN_OR_RETURN(
      out.bundle_json,
      SignOmsBundle(module.full(),
                    {{std::string(file_name), out.file.sha256, ""}},
                    options_.checkpoints->key()));
  out.verifier_key = options_.checkpoints->verifier_key();
  return out;
}

}  // namespace modelstate
