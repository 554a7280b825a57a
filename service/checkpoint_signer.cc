#include "service/checkpoint_signer.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/checkpoint.h"
#include "base/log.h"
#include "base/quote.h"
#include "base/status_macros.h"

namespace modelstate {
namespace {

std::string KeyLabel(absl::string_view name, uint32_t key_id) {
  return absl::StrFormat("%s+%08x", name, key_id);
}

// A malformed note or checkpoint, as the caller's field.
absl::Status BadCheckpoint(const absl::Status& error) {
  return absl::InvalidArgumentError(
      absl::StrCat("checkpoint: ", error.message()));
}

}  // namespace

CheckpointSigner::CheckpointSigner(AuditLog* log, Ed25519NoteSigner signer,
                                   CheckpointSignerOptions options,
                                   Ed25519PrivateKey key)
    : log_(log),
      signer_(std::move(signer)),
      options_(std::move(options)),
      key_(std::move(key)) {
  verifier_key_text_ = FormatVerifierKey(signer_.verifier_key());
}

absl::StatusOr<std::unique_ptr<CheckpointSigner>> CheckpointSigner::Create(
    AuditLog* log, Ed25519PrivateKey key, CheckpointSignerOptions options) {
  MODELSTATE_ASSIGN_OR_RETURN(Ed25519NoteSigner note_signer,
                              Ed25519NoteSigner::Create(options.origin, key));
  std::vector<CosignatureVerifier> witnesses;
  for (const VerifierKey& key : options.witnesses) {
    MODELSTATE_ASSIGN_OR_RETURN(CosignatureVerifier verifier,
                                CosignatureVerifier::Create(key));
    witnesses.push_back(std::move(verifier));
  }
  std::unique_ptr<CheckpointSigner> signer(new CheckpointSigner(
      log, std::move(note_signer), std::move(options), std::move(key)));
  signer->witnesses_ = std::move(witnesses);
  // The saved checkpoint counts only if this key signed it; after a key
  // rotation the next one is signed with the new key.
  const std::string& saved = log->opened_checkpoint();
  if (!saved.empty()) {
    MODELSTATE_ASSIGN_OR_RETURN(
        Ed25519NoteVerifier verifier,
        Ed25519NoteVerifier::Create(signer->signer_.verifier_key()));
    const NoteVerifier* verifiers[] = {&verifier};
    absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpoint(saved, verifiers);
    if (opened.ok() && opened->checkpoint.origin == signer->origin()) {
      MutexLock lock(&signer->mu_);
      signer->latest_ = opened->checkpoint;
      signer->latest_note_ = saved;
    }
  }
  MODELSTATE_RETURN_IF_ERROR(signer->SignNow().status());
  return signer;
}

CheckpointSigner::~CheckpointSigner() { Stop(); }

void CheckpointSigner::Start() {
  MutexLock lock(&mu_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] { Run(); });
}

void CheckpointSigner::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    wake_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

void CheckpointSigner::Run() {
  for (;;) {
    {
      MutexLock lock(&mu_);
      const absl::Time deadline = absl::Now() + options_.interval;
      while (!stopping_ && !wake_.WaitWithDeadline(&mu_, deadline)) {
      }
      if (stopping_) return;
      if (log_->last_seq() <= latest_.size && !latest_note_.empty()) {
        if (options_.covered_at != nullptr) {
          options_.covered_at->Set(absl::Now());
        }
        continue;
      }
    }
    absl::StatusOr<std::string> signed_note = SignNow();
    if (!signed_note.ok()) {
      internal::LogLine(absl::StrCat("cannot sign an audit checkpoint: ",
                                     signed_note.status().ToString()));
    }
  }
}

absl::StatusOr<std::string> CheckpointSigner::SignNow() {
  MutexLock signing(&sign_mu_);
  MODELSTATE_ASSIGN_OR_RETURN(AuditTreeHead head, log_->SyncTree());
  {
    MutexLock lock(&mu_);
    if (!latest_note_.empty() && latest_.size == head.size) {
      return LatestLocked();
    }
  }
  Checkpoint checkpoint{options_.origin, head.size, head.root, {}};
  MODELSTATE_ASSIGN_OR_RETURN(std::string note,
                              SignCheckpoint(checkpoint, signer_));
  // Durable before it is served: a start after a crash must not find a log
  // that falls short of a checkpoint someone may hold.
  MODELSTATE_RETURN_IF_ERROR(log_->SaveCheckpoint(note));
  if (options_.covered_at != nullptr) options_.covered_at->Set(absl::Now());
  MutexLock lock(&mu_);
  latest_ = std::move(checkpoint);
  latest_note_ = std::move(note);
  return LatestLocked();
}

std::string CheckpointSigner::Latest() const {
  MutexLock lock(&mu_);
  return LatestLocked();
}

std::string CheckpointSigner::LatestLocked() const {
  if (latest_note_.empty()) return "";
  absl::StatusOr<SignedNote> note = ParseSignedNote(latest_note_);
  if (!note.ok()) return latest_note_;
  std::string out = latest_note_;
  for (const auto& [label, cosigned] : cosigned_) {
    if (cosigned.checkpoint_text == note->text) {
      out.append(FormatSignatureLine(cosigned.signature));
    }
  }
  return out;
}

Checkpoint CheckpointSigner::LatestCheckpoint() const {
  MutexLock lock(&mu_);
  return latest_;
}

absl::StatusOr<std::vector<CheckpointSigner::Cosigned>>
CheckpointSigner::CheckCosignatures(absl::string_view message) const {
  absl::StatusOr<SignedNote> note = ParseSignedNote(message);
  if (!note.ok()) return BadCheckpoint(note.status());
  absl::StatusOr<Checkpoint> checkpoint = ParseCheckpoint(note->text);
  if (!checkpoint.ok()) return BadCheckpoint(checkpoint.status());
  if (checkpoint->origin != options_.origin) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint: origin ", Quote(checkpoint->origin),
                     " is not this log's '", options_.origin, "'"));
  }
  // Only what this log signed: a witness cosigns the log's checkpoints (the
  // one it fetched carries the log's signature), and a text the log never
  // signed, even one whose root the tree had, is no commitment of the log's.
  bool log_signed = false;
  for (const NoteSignature& s : note->signatures) {
    if (s.name == signer_.name() && s.key_id == signer_.key_id() &&
        VerifyEd25519(signer_.verifier_key().public_key, note->text,
                      s.signature)) {
      log_signed = true;
    }
  }
  if (!log_signed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint: it carries no valid signature by this log's key ",
        KeyLabel(signer_.name(), signer_.key_id()),
        " (a witness cosigns the note GetCheckpoint serves, as served)"));
  }
  absl::StatusOr<MerkleHash> root = log_->TreeRoot(checkpoint->size);
  if (!root.ok() || *root != checkpoint->root) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint: this log never had root ", MerkleHashHex(checkpoint->root),
        " at tree size ", checkpoint->size));
  }
  std::vector<Cosigned> out;
  for (const NoteSignature& s : note->signatures) {
    if (s.name == signer_.name() && s.key_id == signer_.key_id()) continue;
    const CosignatureVerifier* witness = nullptr;
    for (const CosignatureVerifier& w : witnesses_) {
      if (w.name() == s.name && w.key_id() == s.key_id) witness = &w;
    }
    const std::string label = KeyLabel(s.name, s.key_id);
    if (witness == nullptr) {
      // Any key name the client chose: quoted, and cut when long.
      return absl::PermissionDeniedError(
          absl::StrCat("checkpoint: the signature by ", Quote(label),
                       " is not from a key configured as a witness"));
    }
    absl::StatusOr<uint64_t> timestamp = CosignatureTimestamp(s);
    if (!timestamp.ok() || !witness->Verify(note->text, s.signature)) {
      return absl::PermissionDeniedError(
          absl::StrCat("checkpoint: the cosignature by witness ", label,
                       " does not verify"));
    }
    out.push_back(Cosigned{note->text, s, checkpoint->size, *timestamp});
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(
        "checkpoint: it carries no witness cosignature");
  }
  return out;
}

absl::StatusOr<std::string> CheckpointSigner::AddCosignature(
    absl::string_view note) {
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<Cosigned> cosignatures,
                              CheckCosignatures(note));
  {
    MutexLock lock(&mu_);
    // Each witness key keeps its newest cosignature: of the largest tree,
    // then the latest time. An older one (a replay, or one carried along
    // on a note fetched before the witness cosigned a newer checkpoint)
    // never replaces it, or the served checkpoint would lose that
    // witness's cosignature. The same one again is no change.
    const Cosigned* stale = nullptr;
    const Cosigned* newer_held = nullptr;
    bool taken = false;
    for (Cosigned& c : cosignatures) {
      const std::string label = KeyLabel(c.signature.name, c.signature.key_id);
      auto held = cosigned_.find(label);
      if (held == cosigned_.end() ||
          std::pair(c.size, c.timestamp) >
              std::pair(held->second.size, held->second.timestamp)) {
        cosigned_.insert_or_assign(label, std::move(c));
        taken = true;
      } else if (c.size == held->second.size &&
                 c.timestamp == held->second.timestamp) {
        taken = true;
      } else if (stale == nullptr) {
        stale = &c;
        newer_held = &held->second;
      }
    }
    if (!taken && stale != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint: witness ",
          KeyLabel(stale->signature.name, stale->signature.key_id),
          " already cosigned tree size ", newer_held->size, " at time ",
          newer_held->timestamp, "; its cosignature of tree size ", stale->size,
          " at time ", stale->timestamp, " is older and was not kept"));
    }
  }
  return Latest();
}

}  // namespace modelstate
