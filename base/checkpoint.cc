#include "base/checkpoint.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/quote.h"
#include "base/status_macros.h"

namespace modelstate {
namespace {

constexpr size_t kTimestampBytes = 8;

absl::Status CheckLine(absl::string_view line, absl::string_view what) {
  if (line.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", what, " is empty"));
  }
  if (line.find('\n') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", what, " contains a newline"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ParseSize(absl::string_view line) {
  const absl::string_view what = "line 2 (tree size)";
  uint64_t size = 0;
  if (line.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(line, &size) || size > kMaxCheckpointValue) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", what, " ", Quote(line, '"'),
                     " is not a decimal number up to 2^63 - 1"));
  }
  if (line.size() > 1 && line[0] == '0') {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", what, " ", Quote(line, '"'), " has a leading zero"));
  }
  return size;
}

absl::StatusOr<MerkleHash> ParseRoot(absl::string_view line) {
  std::string raw;
  if (!Base64DecodeCanonical(line, &raw)) {
    return absl::InvalidArgumentError(
        "checkpoint line 3 (root hash) is not canonical standard base64");
  }
  return MerkleHashFromBytes(raw, "checkpoint line 3 (root hash)");
}

// Signs one fixed message time for CosignCheckpoint.
class CosignerAt : public NoteSigner {
 public:
  CosignerAt(const CosignatureSigner& signer, uint64_t timestamp)
      : signer_(signer), timestamp_(timestamp) {}
  const std::string& name() const override { return signer_.name(); }
  uint32_t key_id() const override { return signer_.key_id(); }
  absl::StatusOr<std::string> Sign(absl::string_view text) const override {
    return signer_.SignAt(text, timestamp_);
  }

 private:
  const CosignatureSigner& signer_;
  const uint64_t timestamp_;
};

}  // namespace

absl::StatusOr<std::string> FormatCheckpoint(const Checkpoint& checkpoint) {
  MODELSTATE_RETURN_IF_ERROR(CheckLine(checkpoint.origin, "origin"));
  for (size_t i = 0; i < checkpoint.extensions.size(); ++i) {
    MODELSTATE_RETURN_IF_ERROR(CheckLine(
        checkpoint.extensions[i], absl::StrCat("extension line ", i + 1)));
  }
  if (checkpoint.size > kMaxCheckpointValue) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint tree size ", checkpoint.size, " is above 2^63 - 1"));
  }
  std::string text =
      absl::StrCat(checkpoint.origin, "\n", checkpoint.size, "\n",
                   absl::Base64Escape(absl::string_view(
                       reinterpret_cast<const char*>(checkpoint.root.data()),
                       checkpoint.root.size())),
                   "\n");
  for (const std::string& line : checkpoint.extensions) {
    absl::StrAppend(&text, line, "\n");
  }
  // What is left to check (control characters, UTF-8) ParseCheckpoint does.
  MODELSTATE_RETURN_IF_ERROR(ParseCheckpoint(text).status());
  return text;
}

absl::StatusOr<Checkpoint> ParseCheckpoint(absl::string_view text) {
  MODELSTATE_RETURN_IF_ERROR(ValidateNoteText(text));
  text.remove_suffix(1);  // the last newline ends a line, not starts one
  const std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  if (lines.size() < 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint has ", lines.size(), lines.size() == 1 ? " line" : " lines",
        "; it needs an origin, a tree size and a root hash"));
  }
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint line ", i + 1, " is empty"));
    }
  }
  Checkpoint checkpoint;
  checkpoint.origin = std::string(lines[0]);
  MODELSTATE_ASSIGN_OR_RETURN(checkpoint.size, ParseSize(lines[1]));
  MODELSTATE_ASSIGN_OR_RETURN(checkpoint.root, ParseRoot(lines[2]));
  for (size_t i = 3; i < lines.size(); ++i) {
    checkpoint.extensions.emplace_back(lines[i]);
  }
  return checkpoint;
}

absl::StatusOr<std::string> SignCheckpoint(const Checkpoint& checkpoint,
                                           const NoteSigner& signer) {
  MODELSTATE_ASSIGN_OR_RETURN(std::string text, FormatCheckpoint(checkpoint));
  return SignNote(text, {&signer});
}

absl::StatusOr<OpenedCheckpoint> OpenCheckpoint(
    absl::string_view message,
    absl::Span<const NoteVerifier* const> verifiers) {
  OpenedCheckpoint out;
  MODELSTATE_ASSIGN_OR_RETURN(out.note, OpenNote(message, verifiers));
  MODELSTATE_ASSIGN_OR_RETURN(out.checkpoint, ParseCheckpoint(out.note.text));
  return out;
}

std::string CosignedMessage(absl::string_view checkpoint_text,
                            uint64_t timestamp) {
  return absl::StrCat("cosignature/v1\ntime ", timestamp, "\n",
                      checkpoint_text);
}

absl::StatusOr<uint64_t> CosignatureTimestamp(const NoteSignature& signature) {
  if (signature.signature.size() != kTimestampBytes + kEd25519SignatureBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cosignature by ", Quote(signature.name, '"'), " is ",
        signature.signature.size(),
        " bytes; a v1 cosignature is 72 (time and Ed25519 signature)"));
  }
  uint64_t timestamp = 0;
  for (size_t i = 0; i < kTimestampBytes; ++i) {
    timestamp = (timestamp << 8) | static_cast<uint8_t>(signature.signature[i]);
  }
  if (timestamp > kMaxCheckpointValue) {
    return absl::InvalidArgumentError(
        absl::StrCat("cosignature by ", Quote(signature.name, '"'),
                     " has time ", timestamp, ", above 2^63 - 1"));
  }
  return timestamp;
}

absl::StatusOr<CosignatureSigner> CosignatureSigner::Create(
    absl::string_view name, Ed25519PrivateKey key) {
  MODELSTATE_ASSIGN_OR_RETURN(
      VerifierKey verifier_key,
      MakeVerifierKey(name, kNoteSignatureCosignatureV1, key.public_key()));
  return CosignatureSigner(std::move(verifier_key), std::move(key));
}

absl::StatusOr<std::string> CosignatureSigner::Sign(
    absl::string_view checkpoint_text) const {
  return SignAt(checkpoint_text,
                static_cast<uint64_t>(absl::ToUnixSeconds(absl::Now())));
}

absl::StatusOr<std::string> CosignatureSigner::SignAt(
    absl::string_view checkpoint_text, uint64_t timestamp) const {
  if (timestamp > kMaxCheckpointValue) {
    return absl::InvalidArgumentError(
        absl::StrCat("cosignature time ", timestamp, " is above 2^63 - 1"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(
      std::string signature,
      private_key().Sign(CosignedMessage(checkpoint_text, timestamp)));
  std::string out(kTimestampBytes, '\0');
  for (size_t i = 0; i < kTimestampBytes; ++i) {
    out[i] = static_cast<char>(timestamp >> (56 - 8 * i));
  }
  return out + signature;
}

absl::StatusOr<CosignatureVerifier> CosignatureVerifier::Create(
    const VerifierKey& key) {
  MODELSTATE_ASSIGN_OR_RETURN(
      VerifierKey checked, CheckVerifierKey(key, kNoteSignatureCosignatureV1));
  return CosignatureVerifier(std::move(checked));
}

bool CosignatureVerifier::Verify(absl::string_view checkpoint_text,
                                 absl::string_view signature) const {
  absl::StatusOr<uint64_t> timestamp =
      CosignatureTimestamp({name(), key_id(), std::string(signature)});
  if (!timestamp.ok()) return false;
  return VerifyEd25519(verifier_key().public_key,
                       CosignedMessage(checkpoint_text, *timestamp),
                       signature.substr(kTimestampBytes));
}

absl::StatusOr<std::string> CosignCheckpoint(absl::string_view message,
                                             const CosignatureSigner& signer,
                                             uint64_t timestamp) {
  MODELSTATE_ASSIGN_OR_RETURN(SignedNote note, ParseSignedNote(message));
  MODELSTATE_RETURN_IF_ERROR(ParseCheckpoint(note.text).status());
  const CosignerAt at(signer, timestamp);
  return AddNoteSignatures(message, {&at});
}

}  // namespace modelstate
