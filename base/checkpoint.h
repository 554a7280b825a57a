// File: checkpoint.h
// Transparency-log checkpoints (c2sp.org/tlog-checkpoint) and witness
// cosignatures (c2sp.org/tlog-cosignature, the Ed25519 "cosignature/v1"
// kind).
//
// A checkpoint is the text of a signed note:
//   <origin>\n<tree size in decimal>\n<base64 root hash>\n[extension lines]
// signed by the log. A witness that has checked a consistency proof from
// the last checkpoint it saw adds a cosignature line: Ed25519 over
// "cosignature/v1\ntime <unix seconds>\n" + the checkpoint text, carried as
// base64(key ID || 8-byte big-endian time || 64-byte signature), with key
// IDs of signature type 0x04.
//
// Example:
//   Checkpoint c{"example.com/log", store.size(), root, {}};
//   MODELSTATE_ASSIGN_OR_RETURN(std::string note,
//                               SignCheckpoint(c, log_signer));
//   // A witness, after VerifyConsistency from its last checkpoint:
//   MODELSTATE_ASSIGN_OR_RETURN(
//       std::string cosigned,
//       CosignCheckpoint(note, witness_signer, absl::ToUnixSeconds(
//                                                  absl::Now())));
//   // A client that trusts the log and the witness:
//   MODELSTATE_ASSIGN_OR_RETURN(
//       OpenedCheckpoint opened,
//       OpenCheckpoint(cosigned, {&log_verifier, &witness_verifier}));
#ifndef MODELSTATE_BASE_CHECKPOINT_H_
#define MODELSTATE_BASE_CHECKPOINT_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/merkle.h"
#include "base/signed_note.h"

namespace modelstate {

// The largest tree size and cosignature time the formats allow (Go's tlog
// reads sizes as int64; the cosignature spec caps the time at 2^63 - 1).
inline constexpr uint64_t kMaxCheckpointValue =
    static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// A checkpoint's text, parsed.
struct Checkpoint {
  std::string origin;  // the log's identity, e.g. "example.com/log"
  uint64_t size = 0;   // number of leaves
  MerkleHash root{};   // RFC 6962 root of those leaves
  std::vector<std::string> extensions;  // optional non-empty lines

  bool operator==(const Checkpoint&) const = default;
};

// The checkpoint's text. INVALID_ARGUMENT naming the field if the origin or
// an extension line is empty or holds a newline or control character, or
// the size is above kMaxCheckpointValue.
absl::StatusOr<std::string> FormatCheckpoint(const Checkpoint& checkpoint);

// Parses checkpoint text strictly: at least three non-empty lines, each
// ending in a newline; a decimal size without leading zeros (except "0") up
// to kMaxCheckpointValue; a root in canonical standard base64 of exactly 32
// bytes; UTF-8 without control characters. INVALID_ARGUMENT naming the
// line and what is wrong.
absl::StatusOr<Checkpoint> ParseCheckpoint(absl::string_view text);

// The checkpoint as a note signed by `signer` (the log's key; its name
// should be the origin).
absl::StatusOr<std::string> SignCheckpoint(const Checkpoint& checkpoint,
                                           const NoteSigner& signer);

struct OpenedCheckpoint {
  Checkpoint checkpoint;
  OpenedNote note;  // which keys signed it (verified) and which are unknown
};

// OpenNote, then ParseCheckpoint on the text. Errors as for those two.
// Which verified keys a caller requires (the log's, a quorum of witnesses)
// is its own policy: check `note.verified`.
absl::StatusOr<OpenedCheckpoint> OpenCheckpoint(
    absl::string_view message, absl::Span<const NoteVerifier* const> verifiers);

// "cosignature/v1\ntime <timestamp>\n" + checkpoint_text: what a v1
// cosignature signs.
std::string CosignedMessage(absl::string_view checkpoint_text,
                            uint64_t timestamp);

// The time (Unix seconds) a cosignature line claims. INVALID_ARGUMENT
// unless its signature is 72 bytes (time and Ed25519 signature) with a time
// up to kMaxCheckpointValue.
absl::StatusOr<uint64_t> CosignatureTimestamp(const NoteSignature& signature);

// Makes v1 cosignatures (type 0x04) with an Ed25519 key. Thread-safe.
class CosignatureSigner : public Ed25519KeySigner {
 public:
  // INVALID_ARGUMENT if `name` is not a valid key name.
  static absl::StatusOr<CosignatureSigner> Create(absl::string_view name,
                                                  Ed25519PrivateKey key);
  // Cosigns `checkpoint_text` as of now.
  absl::StatusOr<std::string> Sign(
      absl::string_view checkpoint_text) const override;
  // Cosigns as of `timestamp` (Unix seconds). INVALID_ARGUMENT above
  // kMaxCheckpointValue.
  absl::StatusOr<std::string> SignAt(absl::string_view checkpoint_text,
                                     uint64_t timestamp) const;

 private:
  using Ed25519KeySigner::Ed25519KeySigner;
};

// Checks v1 cosignatures (type 0x04). Thread-safe.
class CosignatureVerifier : public Ed25519KeyVerifier {
 public:
  // INVALID_ARGUMENT unless `key` is a valid type-0x04 verifier key.
  static absl::StatusOr<CosignatureVerifier> Create(const VerifierKey& key);
  // From verifier key text (ParseVerifierKey, then Create).
  static absl::StatusOr<CosignatureVerifier> Parse(absl::string_view text) {
    return ParseVerifierAs<CosignatureVerifier>(text);
  }
  bool Verify(absl::string_view checkpoint_text,
              absl::string_view signature) const override;

 private:
  using Ed25519KeyVerifier::Ed25519KeyVerifier;
};

// Adds `signer`'s cosignature as of `timestamp` to a signed checkpoint,
// replacing an earlier one by the same key. It checks that the note's text
// is a checkpoint, not its signatures: the witness verifies the log's
// signature and a consistency proof first. Errors as for ParseSignedNote,
// ParseCheckpoint and SignAt.
absl::StatusOr<std::string> CosignCheckpoint(absl::string_view message,
                                             const CosignatureSigner& signer,
                                             uint64_t timestamp);

}  // namespace modelstate

#endif  // MODELSTATE_BASE_CHECKPOINT_H_
