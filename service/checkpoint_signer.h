// File: checkpoint_signer.h
// Signs the audit log's tree: a C2SP tlog-checkpoint (origin, tree size,
// root) as a signed note with the log's Ed25519 key, at least once per
// interval while records arrive and whenever asked. Each checkpoint is made
// durable in the log's checkpoint file before anyone sees it, so the next
// start can refuse a log that falls short of it. Witnesses (keys configured
// with the server) add cosignatures; the latest checkpoint is served with
// the cosignatures it received.
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(Ed25519PrivateKey key,
//                               Ed25519PrivateKey::LoadOrCreate(key_path));
//   MODELSTATE_ASSIGN_OR_RETURN(
//       std::unique_ptr<CheckpointSigner> signer,
//       CheckpointSigner::Create(audit_log, key, CheckpointSignerOptions{}));
//   signer->Start();  // a checkpoint each second while records arrive
//   MODELSTATE_ASSIGN_OR_RETURN(std::string note, signer->SignNow());
#ifndef MODELSTATE_SERVICE_CHECKPOINT_SIGNER_H_
#define MODELSTATE_SERVICE_CHECKPOINT_SIGNER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/checkpoint.h"
#include "base/metrics.h"
#include "base/signed_note.h"
#include "base/sync.h"
#include "service/audit_log.h"

namespace modelstate {

struct CheckpointSignerOptions {
  // The log's identity: the checkpoint's first line and the key's name.
  std::string origin = "modelstate/audit";
  // A checkpoint at least this often while records arrive.
  absl::Duration interval = absl::Seconds(1);
  // The witnesses whose cosignatures (type 0x04 verifier keys) are
  // accepted.
  std::vector<VerifierKey> witnesses;
  // Set to the time whenever the latest checkpoint covers every record:
  // after each signature, and at each interval that appended nothing. An
  // operator's alert on its age catches a signer that fails or stalls
  // (may be null; not owned).
  metrics::Timestamp* covered_at = nullptr;
};

// Thread-safe.
class CheckpointSigner {
 public:
  // Signs for `log` (not owned; must outlive the signer) with `key`. The
  // log's saved checkpoint stays the latest when this key signed it and the
  // tree has not grown; otherwise (none yet, a rotated key) one is signed
  // now. INVALID_ARGUMENT for a bad origin or witness key.
  static absl::StatusOr<std::unique_ptr<CheckpointSigner>> Create(
      AuditLog* log, Ed25519PrivateKey key, CheckpointSignerOptions options);
  ~CheckpointSigner();

  // Starts (and Stop ends) the thread that signs each interval while the
  // tree grows. Stop is idempotent; the destructor calls it.
  void Start();
  void Stop();

  const std::string& origin() const { return options_.origin; }
  // The log's verifier key, "<origin>+<key ID>+<base64 key>".
  const std::string& verifier_key() const { return verifier_key_text_; }
  // The log's private key, which also signs the server's attestations
  // (service/attestation.h): one key for a consumer to trust.
  const Ed25519PrivateKey& key() const { return key_; }

  // Signs a checkpoint of everything appended so far (made durable first)
  // unless the latest already covers it; returns the latest, as Latest().
  absl::StatusOr<std::string> SignNow();
  // The latest checkpoint note with the cosignatures received for it.
  std::string Latest() const;
  // The latest checkpoint, parsed.
  Checkpoint LatestCheckpoint() const;

  // Takes the witness cosignatures on `note`, a checkpoint this log signed
  // (the note carries the log's signature by this key, as GetCheckpoint
  // served it; any size up to the tree's, its root checked against the
  // tree). Each configured witness key keeps its newest cosignature: of the
  // largest tree, then the latest time; an older one never replaces it.
  // INVALID_ARGUMENT naming the checkpoint for a malformed note, another
  // origin, no valid signature by this log's key, a root the log never
  // had, or no cosignature; PERMISSION_DENIED naming the key for a
  // cosignature from a key not configured as a witness, or one that does
  // not verify. Nothing is attached unless every cosignature is good.
  // FAILED_PRECONDITION naming the sizes when every cosignature is older
  // than the one its key has (nothing changes); older ones carried along
  // with a newer or the same one are ignored. Returns Latest().
  absl::StatusOr<std::string> AddCosignature(absl::string_view note);

 private:
  struct Cosigned {
    std::string checkpoint_text;
    NoteSignature signature;
    uint64_t size = 0;       // the checkpoint's tree size
    uint64_t timestamp = 0;  // the cosignature's time (Unix seconds)
  };

  CheckpointSigner(AuditLog* log, Ed25519NoteSigner signer,
                   CheckpointSignerOptions options, Ed25519PrivateKey key);
  void Run();
  std::string LatestLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The witness cosignatures of a checkpoint of this log, all checked.
  absl::StatusOr<std::vector<Cosigned>> CheckCosignatures(
      absl::string_view note) const;

  // Constant after construction.
  AuditLog* const log_;
  const Ed25519NoteSigner signer_;
  const CheckpointSignerOptions options_;
  const Ed25519PrivateKey key_;
  std::string verifier_key_text_;
  std::vector<CosignatureVerifier> witnesses_;

  // Held while signing, so that checkpoints are saved in tree order.
  Mutex sign_mu_;

  mutable Mutex mu_;
  Checkpoint latest_ ABSL_GUARDED_BY(mu_);
  std::string latest_note_ ABSL_GUARDED_BY(mu_);  // "" before the first
  // Each witness's latest cosignature, by "<name>+<key ID>".
  std::map<std::string, Cosigned> cosigned_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  CondVar wake_;

  std::thread thread_;
};

}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_CHECKPOINT_SIGNER_H_
