// audit checkpoint | key | prove | consistency, and audit verify of a local
// log against a signed checkpoint: every proof is checked here, against a
// checkpoint whose signature was checked with the log's verifier key.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/checkpoint.h"
#include "base/merkle.h"
#include "base/signed_note.h"
#include "base/status_macros.h"
#include "client/cli/audit.h"
#include "modelstate/v1/model_state_service.pb.h"
#include "service/audit_log.h"
#include "service/audit_tree.h"

namespace modelstate::cli {
namespace {

// A checkpoint whose signature by the log's key has been checked.
struct TrustedCheckpoint {
  Checkpoint checkpoint;
  std::string note;
  std::string key;  // the verifier key it was checked with
};

// --key's verifier key: the text itself, or a file holding it.
absl::StatusOr<std::string> VerifierKeyText(const std::string& key_or_file) {
  std::string text(absl::StripAsciiWhitespace(key_or_file));
  if (ParseVerifierKey(text).ok()) return text;
  MODELSTATE_ASSIGN_OR_RETURN(std::string file, ReadInputFile(key_or_file));
  return std::string(absl::StripAsciiWhitespace(file));
}

absl::StatusOr<Checkpoint> OpenWithKey(const std::string& note,
                                       const std::string& key) {
  absl::StatusOr<Ed25519NoteVerifier> verifier =
      Ed25519NoteVerifier::Parse(key);
  if (!verifier.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--key: ", verifier.status().message()));
  }
  const NoteVerifier* verifiers[] = {&*verifier};
  absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpoint(note, verifiers);
  if (!opened.ok()) {
    return absl::Status(
        opened.status().code(),
        absl::StrCat("checkpoint: not signed by ", verifier->name(), ": ",
                     opened.status().message()));
  }
  return opened->checkpoint;
}

// --checkpoint's note, or the server's latest; checked with --key, or with
// the key the server names (said on stderr: that proves less).
absl::StatusOr<TrustedCheckpoint> GetTrustedCheckpoint(Context& c,
                                                       const AuditArgs& a) {
  TrustedCheckpoint t;
  std::optional<v1::GetCheckpointResponse> latest;
  if (a.checkpoint.has_value()) {
    MODELSTATE_ASSIGN_OR_RETURN(t.note, ReadInputFile(*a.checkpoint));
  } else {
    MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
    MODELSTATE_ASSIGN_OR_RETURN(latest, rpc->GetCheckpoint(/*fresh=*/true));
    t.note = latest->checkpoint();
  }
  if (a.key.has_value()) {
    MODELSTATE_ASSIGN_OR_RETURN(t.key, VerifierKeyText(*a.key));
  } else {
    if (!latest.has_value()) {
      MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
      MODELSTATE_ASSIGN_OR_RETURN(latest, rpc->GetCheckpoint());
    }
    t.key = latest->verifier_key();
    c.err() << "note: trusting the key the server names (" << t.key
            << "); pass --key to check against a key you hold\n";
  }
  MODELSTATE_ASSIGN_OR_RETURN(t.checkpoint, OpenWithKey(t.note, t.key));
  return t;
}

absl::StatusOr<uint64_t> Operand(const AuditArgs& a, size_t i,
                                 absl::string_view name) {
  uint64_t value = 0;
  if (!absl::SimpleAtoi(a.operands[i], &value)) {
    return UsageError(absl::StrCat(name, ": '", a.operands[i],
                                   "' is not a non-negative integer"));
  }
  return value;
}

absl::StatusOr<std::vector<MerkleHash>> Hashes(
    const google::protobuf::RepeatedPtrField<std::string>& proof) {
  std::vector<MerkleHash> out;
  for (int i = 0; i < proof.size(); ++i) {
    MODELSTATE_ASSIGN_OR_RETURN(
        out.emplace_back(),
        MerkleHashFromBytes(proof[i], absl::StrCat("proof[", i, "]")));
  }
  return out;
}

void PrintHashes(Context& c, const std::vector<MerkleHash>& proof) {
  for (const MerkleHash& h : proof) c.out() << "  " << MerkleHashHex(h) << "\n";
}

absl::Status Refuted(Context& c, absl::string_view what,
                     const absl::Status& why) {
  c.out() << "FAILED: " << what << ": " << why.message() << "\n";
  return AlreadyShown(absl::DataLossError(what));
}

}  // namespace

absl::Status RunCheckpoint(Context& c, const AuditArgs& a) {
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  MODELSTATE_ASSIGN_OR_RETURN(v1::GetCheckpointResponse response,
                              rpc->GetCheckpoint(a.fresh));
  std::string key = response.verifier_key();
  if (a.key.has_value()) {
    MODELSTATE_ASSIGN_OR_RETURN(key, VerifierKeyText(*a.key));
  }
  MODELSTATE_RETURN_IF_ERROR(OpenWithKey(response.checkpoint(), key).status());
  if (c.json()) return c.PrintJson(response);
  // The note exactly as signed, so that "> FILE" keeps a checkpoint.
  c.out() << response.checkpoint();
  return absl::OkStatus();
}

absl::Status RunKey(Context& c, const AuditArgs&) {
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  MODELSTATE_ASSIGN_OR_RETURN(v1::GetCheckpointResponse response,
                              rpc->GetCheckpoint());
  if (c.json()) return c.PrintJson(response);
  c.out() << response.verifier_key() << "\n";
  return absl::OkStatus();
}

absl::Status RunProve(Context& c, const AuditArgs& a) {
  MODELSTATE_ASSIGN_OR_RETURN(uint64_t seq, Operand(a, 0, "SEQ"));
  MODELSTATE_ASSIGN_OR_RETURN(TrustedCheckpoint t, GetTrustedCheckpoint(c, a));
  const uint64_t size = a.size.value_or(t.checkpoint.size);
  if (size != t.checkpoint.size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--size ", size, ": the checkpoint is of tree size ", t.checkpoint.size,
        "; pass --checkpoint with one of size ", size));
  }
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  MODELSTATE_ASSIGN_OR_RETURN(v1::GetInclusionProofResponse response,
                              rpc->GetInclusionProof(seq, size));
  if (c.json()) MODELSTATE_RETURN_IF_ERROR(c.PrintJson(response));
  MODELSTATE_ASSIGN_OR_RETURN(
      MerkleHash leaf, MerkleHashFromBytes(response.leaf_hash(), "leaf_hash"));
  if (!response.record_line().empty() &&
      AuditLeafHash(response.record_line()) != leaf) {
    return Refuted(c, "the record",
                   absl::DataLossError("its line does not hash to leaf_hash"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<MerkleHash> proof,
                              Hashes(response.proof()));
  absl::Status verified =
      VerifyInclusion(leaf, seq - 1, size, t.checkpoint.root, proof);
  if (!verified.ok()) {
    return Refuted(c, absl::StrCat("record ", seq, " in tree size ", size),
                   verified);
  }
  if (c.json()) return absl::OkStatus();
  c.out() << "ok: record " << seq << " is in the tree of size " << size
          << " that " << t.key.substr(0, t.key.find('+', 0)) << " signed\n"
          << "leaf " << MerkleHashHex(leaf) << "\nproof (" << proof.size()
          << " hashes):\n";
  PrintHashes(c, proof);
  if (!response.record_line().empty()) {
    c.out() << "record " << response.record_line() << "\n";
  }
  return absl::OkStatus();
}

absl::Status RunConsistency(Context& c, const AuditArgs& a) {
  MODELSTATE_ASSIGN_OR_RETURN(uint64_t old_size, Operand(a, 0, "OLD"));
  MODELSTATE_ASSIGN_OR_RETURN(uint64_t new_size, Operand(a, 1, "NEW"));
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  MODELSTATE_ASSIGN_OR_RETURN(v1::GetConsistencyProofResponse response,
                              rpc->GetConsistencyProof(old_size, new_size));
  if (c.json()) MODELSTATE_RETURN_IF_ERROR(c.PrintJson(response));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<MerkleHash> proof,
                              Hashes(response.proof()));
  if (!a.checkpoint.has_value()) {
    if (c.json()) return absl::OkStatus();
    c.out() << "proof from " << old_size << " to " << new_size << " ("
            << proof.size()
            << " hashes; not checked: pass --checkpoint with the checkpoint "
               "of size OLD):\n";
    PrintHashes(c, proof);
    return absl::OkStatus();
  }
  // The old checkpoint from --checkpoint, the new one the server's latest.
  // Across a key rotation they are signed by different keys: the old one
  // is checked with --checkpoint-key, the one its signer published then.
  AuditArgs old_args = a;
  if (a.checkpoint_key.has_value()) old_args.key = a.checkpoint_key;
  MODELSTATE_ASSIGN_OR_RETURN(TrustedCheckpoint old_cp,
                              GetTrustedCheckpoint(c, old_args));
  AuditArgs latest_args = a;
  latest_args.checkpoint.reset();
  MODELSTATE_ASSIGN_OR_RETURN(TrustedCheckpoint new_cp,
                              GetTrustedCheckpoint(c, latest_args));
  if (old_cp.checkpoint.size != old_size ||
      new_cp.checkpoint.size != new_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("OLD and NEW must be the sizes of --checkpoint (",
                     old_cp.checkpoint.size, ") and of the latest checkpoint (",
                     new_cp.checkpoint.size, ")"));
  }
  absl::Status verified =
      VerifyConsistency(old_size, new_size, old_cp.checkpoint.root,
                        new_cp.checkpoint.root, proof);
  if (!verified.ok()) {
    return Refuted(c,
                   absl::StrCat("tree ", new_size, " extends tree ", old_size),
                   verified);
  }
  if (c.json()) return absl::OkStatus();
  c.out() << "ok: the tree of size " << new_size
          << " extends the checkpoint of size " << old_size << "\n";
  PrintHashes(c, proof);
  return absl::OkStatus();
}

namespace {

// One replica's log: its chain (VerifyAudit), its latest checkpoint signed
// by the key it recorded, and a consistency proof that the latest extends
// the recorded one. OK, or why not.
absl::StatusOr<std::string> VerifyReplica(Context& c,
                                          const v1::ReplicaCheckpoint& recorded,
                                          const std::string& address) {
  MODELSTATE_ASSIGN_OR_RETURN(
      Checkpoint old_cp, OpenWithKey(recorded.note(), recorded.verifier_key()));
  MODELSTATE_ASSIGN_OR_RETURN(std::unique_ptr<client::ModelStateClient> rpc,
                              c.ConnectTo(address));
  MODELSTATE_ASSIGN_OR_RETURN(v1::VerifyAuditResponse chain,
                              rpc->VerifyAudit());
  if (!chain.ok()) {
    return absl::DataLossError(absl::StrCat("the chain breaks at record ",
                                            chain.broken_seq(), ": ",
                                            chain.problem()));
  }
  MODELSTATE_ASSIGN_OR_RETURN(v1::GetCheckpointResponse latest,
                              rpc->GetCheckpoint(/*fresh=*/true));
  MODELSTATE_ASSIGN_OR_RETURN(
      Checkpoint new_cp,
      OpenWithKey(latest.checkpoint(), recorded.verifier_key()));
  if (new_cp.size < old_cp.size) {
    return absl::DataLossError(absl::StrCat(
        "its log has ", new_cp.size,
        " records, fewer than the checkpoint in etcd (", old_cp.size, ")"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(
      v1::GetConsistencyProofResponse response,
      rpc->GetConsistencyProof(old_cp.size, new_cp.size));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<MerkleHash> proof,
                              Hashes(response.proof()));
  MODELSTATE_RETURN_IF_ERROR(VerifyConsistency(
      old_cp.size, new_cp.size, old_cp.root, new_cp.root, proof));
  return absl::StrCat(chain.records(), " records; the tree of size ",
                      new_cp.size, " extends the checkpoint in etcd (size ",
                      old_cp.size, ")");
}

}  // namespace

absl::Status VerifyCluster(Context& c, const AuditArgs&) {
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  absl::StatusOr<v1::GetClusterStatusResponse> cluster =
      rpc->GetClusterStatus();
  if (!cluster.ok()) return ClusterCallError(cluster.status());
  const v1::GetClusterStatusResponse& status = *cluster;
  std::map<std::string, std::string> addresses;
  for (const v1::ClusterMember& m : status.members()) {
    addresses[m.replica()] = m.address();
  }
  bool all_ok = true;
  for (const v1::ReplicaCheckpoint& recorded : status.checkpoints()) {
    auto address = addresses.find(recorded.replica());
    absl::StatusOr<std::string> verified =
        address == addresses.end()
            ? absl::UnavailableError("no live lease: its log cannot be read")
            : VerifyReplica(c, recorded, address->second);
    all_ok = all_ok && verified.ok();
    c.out() << recorded.replica() << ": "
            << (verified.ok()
                    ? absl::StrCat("ok: ", *verified)
                    : absl::StrCat("FAILED: ", verified.status().message()))
            << "\n";
  }
  for (const auto& member : addresses) {
    const std::string& replica = member.first;
    const bool recorded =
        std::any_of(status.checkpoints().begin(), status.checkpoints().end(),
                    [&](const auto& r) { return r.replica() == replica; });
    if (!recorded) {
      all_ok = false;
      c.out() << replica << ": FAILED: no checkpoint recorded in etcd\n";
    }
  }
  if (all_ok) return absl::OkStatus();
  return AlreadyShown(
      absl::DataLossError("a replica's log does not check out"));
}

absl::Status VerifyFileTree(Context& c, const AuditArgs& a) {
  if (!a.key.has_value()) {
    return UsageError("verify --checkpoint needs --key, the log's key");
  }
  // The checkpoint beside the log (a data directory's) by default.
  const std::string dir = a.file->substr(0, a.file->rfind('/') + 1);
  const std::string note_path =
      a.checkpoint.value_or(absl::StrCat(dir, "audit.checkpoint"));
  MODELSTATE_ASSIGN_OR_RETURN(std::string note, ReadInputFile(note_path));
  MODELSTATE_ASSIGN_OR_RETURN(std::string key, VerifierKeyText(*a.key));
  MODELSTATE_ASSIGN_OR_RETURN(Checkpoint checkpoint, OpenWithKey(note, key));
  std::vector<MerkleHash> leaves;
  MODELSTATE_ASSIGN_OR_RETURN(AuditVerification chain,
                              AuditLog::Verify(*a.file, &leaves));
  // The hash file beside the log, when there is one, names the record.
  const std::string hashes_path =
      a.hashes.value_or(absl::StrCat(dir, "audit.hashes"));
  absl::StatusOr<std::unique_ptr<MemoryHashStore>> old_tree =
      ReadHashFile(hashes_path);
  const HashReader* reader = old_tree.ok() ? old_tree->get() : nullptr;
  CheckpointComparison cmp = CompareWithCheckpoint(
      leaves, checkpoint, reader, old_tree.ok() ? (*old_tree)->size() : 0);
  if (!chain.ok) {
    c.out() << "BROKEN at record " << chain.broken_seq << " (line "
            << chain.broken_line << "): " << chain.problem << "\n";
  }
  if (!cmp.ok) {
    c.out() << "MISMATCH with the checkpoint of tree size " << checkpoint.size
            << ": " << cmp.problem << "\n";
  }
  if (!chain.ok || !cmp.ok) {
    return AlreadyShown(absl::DataLossError("the audit log does not verify"));
  }
  c.out() << "ok: " << chain.records
          << " records, the chain is intact and the first " << checkpoint.size
          << " hash to the checkpoint " << checkpoint.origin << " signed\n";
  return absl::OkStatus();
}

}  // namespace modelstate::cli
