// audit witness: polls the server's checkpoints, checks each against the
// last one this witness cosigned with a consistency proof, cosigns it
// (c2sp.org/tlog-cosignature) and submits the cosignature. Shown a
// checkpoint that is not consistent with one it cosigned (a log rolled back
// or forked), it refuses, prints both checkpoints as evidence and exits 1.
//
// State directory: `checkpoint` (the last checkpoint it cosigned, with its
// cosignature) and `log.key` (the log's verifier key, pinned on the first
// run unless --log-key names it). Both are replaced atomically.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/checkpoint.h"
#include "base/file_util.h"
#include "base/merkle.h"
#include "base/signed_note.h"
#include "base/status_macros.h"
#include "client/cli/audit.h"
#include "client/cli/interrupt.h"
#include "modelstate/v1/model_state_service.pb.h"

namespace modelstate::cli {
namespace {

struct Witness {
  CosignatureSigner signer;
  std::string log_key;
  std::string state_dir;

  std::string CheckpointPath() const { return state_dir + "/checkpoint"; }
};

absl::StatusOr<Checkpoint> ParseNoteCheckpoint(absl::string_view note) {
  MODELSTATE_ASSIGN_OR_RETURN(SignedNote parsed, ParseSignedNote(note));
  return ParseCheckpoint(parsed.text);
}

// The log's checkpoint, opened with the log's key.
absl::StatusOr<Checkpoint> OpenLogCheckpoint(const std::string& note,
                                             const std::string& key) {
  MODELSTATE_ASSIGN_OR_RETURN(Ed25519NoteVerifier verifier,
                              Ed25519NoteVerifier::Parse(key));
  const NoteVerifier* verifiers[] = {&verifier};
  MODELSTATE_ASSIGN_OR_RETURN(OpenedCheckpoint opened,
                              OpenCheckpoint(note, verifiers));
  return opened.checkpoint;
}

// Prints the evidence and fails with exit status 1.
absl::Status Refuse(Context& c, absl::string_view why,
                    const std::string& cosigned, const std::string& served) {
  c.out() << "REFUSED: " << why << "\n"
          << "--- the checkpoint this witness cosigned:\n"
          << cosigned << "--- the checkpoint the server serves now:\n"
          << served << std::flush;
  return AlreadyShown(absl::DataLossError(
      "the log is not consistent with the checkpoint this witness cosigned"));
}

// Whether `served` extends the checkpoint in `cosigned_note`: OK, or the
// refusal (already shown).
absl::Status CheckExtends(Context& c, client::ModelStateClient& rpc,
                          const std::string& cosigned_note,
                          const Checkpoint& served,
                          const std::string& served_note) {
  MODELSTATE_ASSIGN_OR_RETURN(Checkpoint old,
                              ParseNoteCheckpoint(cosigned_note));
  if (served.size < old.size) {
    return Refuse(c,
                  absl::StrCat("the log shrank from tree size ", old.size,
                               " to ", served.size, " (rolled back)"),
                  cosigned_note, served_note);
  }
  absl::StatusOr<v1::GetConsistencyProofResponse> response =
      rpc.GetConsistencyProof(old.size, served.size);
  std::vector<MerkleHash> proof;
  absl::Status verified = response.status();
  for (int i = 0; verified.ok() && i < response->proof_size(); ++i) {
    absl::StatusOr<MerkleHash> h =
        MerkleHashFromBytes(response->proof(i), "proof");
    verified = h.status();
    if (h.ok()) proof.push_back(*h);
  }
  if (verified.ok()) {
    verified =
        VerifyConsistency(old.size, served.size, old.root, served.root, proof);
  }
  if (verified.ok()) return absl::OkStatus();
  return Refuse(
      c,
      absl::StrCat("no valid consistency proof from tree size ", old.size,
                   " to ", served.size, ": ", verified.message()),
      cosigned_note, served_note);
}

// One poll: fetch, check, cosign, submit, remember.
absl::Status WitnessRound(Context& c, const Witness& w) {
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  MODELSTATE_ASSIGN_OR_RETURN(v1::GetCheckpointResponse latest,
                              rpc->GetCheckpoint());
  const std::string& served_note = latest.checkpoint();
  absl::StatusOr<Checkpoint> served = OpenLogCheckpoint(served_note, w.log_key);
  absl::StatusOr<std::string> cosigned = ReadFile(w.CheckpointPath());
  if (!served.ok()) {
    return Refuse(c,
                  absl::StrCat("the served checkpoint is not signed by the "
                               "log's key: ",
                               served.status().message()),
                  cosigned.value_or("(none)\n"), served_note);
  }
  if (cosigned.ok()) {
    MODELSTATE_RETURN_IF_ERROR(
        CheckExtends(c, *rpc, *cosigned, *served, served_note));
  } else if (!absl::IsNotFound(cosigned.status())) {
    return cosigned.status();
  }
  MODELSTATE_ASSIGN_OR_RETURN(
      std::string note,
      CosignCheckpoint(
          served_note, w.signer,
          static_cast<uint64_t>(absl::ToUnixSeconds(absl::Now()))));
  MODELSTATE_RETURN_IF_ERROR(rpc->AddCosignature(note).status());
  MODELSTATE_RETURN_IF_ERROR(Uninterrupted(
      [&] { return WriteFileAtomically(w.CheckpointPath(), note); }));
  c.out() << "cosigned tree size " << served->size << " root "
          << MerkleHashHex(served->root) << std::endl;
  return absl::OkStatus();
}

// --log-key, else the key pinned in the state directory, else the one the
// server names now (pinned from then on).
absl::StatusOr<std::string> LogKey(Context& c, const AuditArgs& a,
                                   const std::string& state_dir) {
  const std::string pinned = state_dir + "/log.key";
  if (a.log_key.has_value()) {
    return std::string(absl::StripAsciiWhitespace(*a.log_key));
  }
  absl::StatusOr<std::string> text = ReadFile(pinned);
  if (text.ok()) return std::string(absl::StripAsciiWhitespace(*text));
  if (!absl::IsNotFound(text.status())) return text.status();
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  MODELSTATE_ASSIGN_OR_RETURN(v1::GetCheckpointResponse latest,
                              rpc->GetCheckpoint());
  MODELSTATE_RETURN_IF_ERROR(Uninterrupted([&] {
    return WriteFileAtomically(pinned, latest.verifier_key() + "\n");
  }));
  c.err() << "pinned the log's key " << latest.verifier_key() << " in "
          << pinned << "\n";
  return latest.verifier_key();
}

}  // namespace

absl::Status RunWitness(Context& c, const AuditArgs& a) {
  if (!a.key.has_value() || !a.state.has_value()) {
    return UsageError("audit witness needs --key WITNESS_KEY and --state DIR");
  }
  // Ctrl-C ends the witness; it must not end it mid-write of its state,
  // whose temporary files would stay behind.
  MODELSTATE_ASSIGN_OR_RETURN(std::unique_ptr<InterruptHandler> interrupts,
                              InterruptHandler::Install());
  std::error_code error;
  std::filesystem::create_directories(*a.state, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state ", *a.state, ": ", error.message()));
  }
  bool created = false;
  MODELSTATE_ASSIGN_OR_RETURN(
      Ed25519PrivateKey key, Ed25519PrivateKey::LoadOrCreate(*a.key, &created));
  MODELSTATE_ASSIGN_OR_RETURN(
      CosignatureSigner signer,
      CosignatureSigner::Create(a.name.value_or("modelstate-witness"), key));
  c.err() << (created ? "created witness key " : "witness key ") << *a.key
          << "; its verifier key (for the server's --audit_witness_keys): "
          << FormatVerifierKey(signer.verifier_key()) << std::endl;
  MODELSTATE_ASSIGN_OR_RETURN(std::string log_key, LogKey(c, a, *a.state));
  Witness w{std::move(signer), std::move(log_key), *a.state};
  for (;;) {
    absl::Status round = WitnessRound(c, w);
    // A refusal ends the witness; other failures (the server restarting)
    // are retried at the next poll.
    if (a.once || absl::IsDataLoss(round)) return round;
    if (!round.ok()) c.err() << "witness: " << round.ToString() << std::endl;
    absl::SleepFor(absl::Seconds(a.interval.value_or(1.0)));
  }
}

}  // namespace modelstate::cli
