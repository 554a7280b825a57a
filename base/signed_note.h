// File: signed_note.h
// C2SP signed notes (c2sp.org/signed-note): a UTF-8 text ending in a
// newline, a blank line, and one or more signature lines
// "— <key name> <base64(4-byte key ID || signature)>". Ed25519 keys come from
// OpenSSL's libcrypto and are kept in PEM (PKCS #8) files. A key is named and
// identified to verifiers by its verifier key,
// "<name>+<8 hex digits of key ID>+<base64(type byte || public key)>", the
// form Go's golang.org/x/mod/sumdb/note reads.
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(Ed25519PrivateKey key,
//                               Ed25519PrivateKey::LoadOrCreate(key_path));
//   MODELSTATE_ASSIGN_OR_RETURN(Ed25519NoteSigner signer,
//                               Ed25519NoteSigner::Create("example.com/log",
//                                                         key));
//   std::string vkey = FormatVerifierKey(signer.verifier_key());  // publish
//   MODELSTATE_ASSIGN_OR_RETURN(std::string note,
//                               SignNote("hello\n", {&signer}));
//   // Elsewhere, with only the verifier key:
//   MODELSTATE_ASSIGN_OR_RETURN(Ed25519NoteVerifier verifier,
//                               Ed25519NoteVerifier::Parse(vkey));
//   MODELSTATE_ASSIGN_OR_RETURN(OpenedNote opened,
//                               OpenNote(note, {&verifier}));
//   // opened.text == "hello\n"
#ifndef MODELSTATE_BASE_SIGNED_NOTE_H_
#define MODELSTATE_BASE_SIGNED_NOTE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace modelstate {

// Signature type bytes, from the signed-note spec's registry. They enter the
// key ID and the verifier key, so one key used for two types gets two IDs.
inline constexpr uint8_t kNoteSignatureEd25519 = 0x01;
// Timestamped Ed25519 witness cosignatures (c2sp.org/tlog-cosignature).
inline constexpr uint8_t kNoteSignatureCosignatureV1 = 0x04;

// A note may carry at most this many signature lines (the spec requires
// accepting at least 16; Go's reader stops at 100).
inline constexpr int kMaxNoteSignatures = 100;
// An Ed25519 signature's length in bytes (RFC 8032).
inline constexpr size_t kEd25519SignatureBytes = 64;

// An Ed25519 private key. Copies share the key. Thread-safe.
class Ed25519PrivateKey {
 public:
  // A fresh random key.
  static absl::StatusOr<Ed25519PrivateKey> Generate();
  // The key whose RFC 8032 private key (seed) is these 32 bytes.
  static absl::StatusOr<Ed25519PrivateKey> FromSeed(absl::string_view seed);
  // Reads an unencrypted PEM private key ("BEGIN PRIVATE KEY", PKCS #8).
  // INVALID_ARGUMENT if it is not PEM, is encrypted, or is not Ed25519.
  static absl::StatusOr<Ed25519PrivateKey> FromPem(absl::string_view pem);
  // Reads the PEM key at `path`; if there is no file there, creates one
  // with a fresh key, mode 0600, durably (and without overwriting a file
  // another process created meanwhile). Sets *created when it made one.
  // Errors name the path.
  static absl::StatusOr<Ed25519PrivateKey> LoadOrCreate(
      const std::string& path, bool* created = nullptr);

  // The key as unencrypted PKCS #8 PEM (FromPem reads it back).
  absl::StatusOr<std::string> ToPem() const;
  // The 32-byte public key.
  const std::string& public_key() const { return public_key_; }
  // The 64-byte Ed25519 signature of `message`.
  absl::StatusOr<std::string> Sign(absl::string_view message) const;

 private:
  struct Key;
  explicit Ed25519PrivateKey(std::shared_ptr<const Key> key);

  std::shared_ptr<const Key> key_;
  std::string public_key_;
};

// Whether `signature` is a valid Ed25519 signature of `message` by the
// 32-byte `public_key`. False for keys or signatures of the wrong length.
bool VerifyEd25519(absl::string_view public_key, absl::string_view message,
                   absl::string_view signature);

// A key name: non-empty UTF-8 with no Unicode space, no '+' and no ASCII
// control character.
bool IsValidKeyName(absl::string_view name);

// The first 4 bytes, big-endian, of SHA-256(name || 0x0A || type ||
// public_key): the key ID the spec recommends and Go computes.
uint32_t NoteKeyId(absl::string_view name, uint8_t type,
                   absl::string_view public_key);

// What a verifier needs to know about a key.
struct VerifierKey {
  std::string name;
  uint32_t key_id = 0;
  uint8_t type = 0;        // kNoteSignatureEd25519, ...
  std::string public_key;  // raw bytes (32 for the Ed25519 types)
};

// The verifier key for `public_key` under `name`, with its key ID.
// INVALID_ARGUMENT for a bad name, or a key of the wrong length for an
// Ed25519 type.
absl::StatusOr<VerifierKey> MakeVerifierKey(absl::string_view name,
                                            uint8_t type,
                                            absl::string_view public_key);
// `key` itself if it is a valid verifier key of signature type `type` (its
// name valid, its key the right length, its ID the ID of both);
// INVALID_ARGUMENT naming the key and the problem otherwise.
absl::StatusOr<VerifierKey> CheckVerifierKey(const VerifierKey& key,
                                             uint8_t type);
// "<name>+<key ID as 8 lowercase hex digits>+<base64(type || key)>".
std::string FormatVerifierKey(const VerifierKey& key);
// Parses that text. INVALID_ARGUMENT naming the part that is wrong: the
// name, the key ID (not 8 hex digits, or not the ID of this name and key),
// the base64, the type (only the Ed25519 types), or the key length.
absl::StatusOr<VerifierKey> ParseVerifierKey(absl::string_view text);

// One signature line of a note.
struct NoteSignature {
  std::string name;
  uint32_t key_id = 0;
  std::string signature;  // the bytes after the key ID
};

// "— <name> <base64(key ID || signature)>\n".
std::string FormatSignatureLine(const NoteSignature& signature);

// A note whose signatures have been parsed but not checked.
struct SignedNote {
  std::string text;  // ends in a newline
  std::vector<NoteSignature> signatures;
};

// Splits a signed note into its text and signature lines, checking the
// syntax only. INVALID_ARGUMENT naming what is malformed: not UTF-8, a
// control character, no blank line before the signatures, no signatures or
// more than kMaxNoteSignatures, a line that does not start with "— ", a bad
// key name, base64 that is not canonical standard base64, a signature
// shorter than 5 bytes.
absl::StatusOr<SignedNote> ParseSignedNote(absl::string_view message);

// Signs note texts with one key.
class NoteSigner {
 public:
  virtual ~NoteSigner() = default;
  virtual const std::string& name() const = 0;
  virtual uint32_t key_id() const = 0;
  // The signature of `text` (without the key ID).
  virtual absl::StatusOr<std::string> Sign(absl::string_view text) const = 0;
};

// Checks one key's signatures on note texts.
class NoteVerifier {
 public:
  virtual ~NoteVerifier() = default;
  virtual const std::string& name() const = 0;
  virtual uint32_t key_id() const = 0;
  // Whether `signature` (without the key ID) is this key's signature of
  // `text`.
  virtual bool Verify(absl::string_view text,
                      absl::string_view signature) const = 0;
};

// A named Ed25519 key signing one signature type: what the note signer and
// the cosignature signer (checkpoint.h) share. Thread-safe.
class Ed25519KeySigner : public NoteSigner {
 public:
  const std::string& name() const override { return key_.name; }
  uint32_t key_id() const override { return key_.key_id; }
  // The verifier key to hand to whoever checks this signer's signatures.
  const VerifierKey& verifier_key() const { return key_; }

 protected:
  // REQUIRES: `verifier_key` is MakeVerifierKey's for `key`'s public key.
  Ed25519KeySigner(VerifierKey verifier_key, Ed25519PrivateKey key)
      : key_(std::move(verifier_key)), private_key_(std::move(key)) {}
  const Ed25519PrivateKey& private_key() const { return private_key_; }

 private:
  VerifierKey key_;
  Ed25519PrivateKey private_key_;
};

// Checks signatures of one type by one Ed25519 key: what the note verifier
// and the cosignature verifier (checkpoint.h) share. Thread-safe.
class Ed25519KeyVerifier : public NoteVerifier {
 public:
  const std::string& name() const override { return key_.name; }
  uint32_t key_id() const override { return key_.key_id; }
  const VerifierKey& verifier_key() const { return key_; }

 protected:
  explicit Ed25519KeyVerifier(VerifierKey key) : key_(std::move(key)) {}

 private:
  VerifierKey key_;
};

// Verifier::Create(ParseVerifierKey(text)), for the verifier classes'
// Parse.
template <typename Verifier>
absl::StatusOr<Verifier> ParseVerifierAs(absl::string_view text) {
  absl::StatusOr<VerifierKey> key = ParseVerifierKey(text);
  if (!key.ok()) return key.status();
  return Verifier::Create(*key);
}

// Plain Ed25519 note signatures (type 0x01). Thread-safe.
class Ed25519NoteSigner : public Ed25519KeySigner {
 public:
  // INVALID_ARGUMENT if `name` is not a valid key name.
  static absl::StatusOr<Ed25519NoteSigner> Create(absl::string_view name,
                                                  Ed25519PrivateKey key);
  absl::StatusOr<std::string> Sign(absl::string_view text) const override;

 private:
  using Ed25519KeySigner::Ed25519KeySigner;
};

// Checks plain Ed25519 note signatures (type 0x01). Thread-safe.
class Ed25519NoteVerifier : public Ed25519KeyVerifier {
 public:
  // INVALID_ARGUMENT unless `key` is a valid type-0x01 verifier key.
  static absl::StatusOr<Ed25519NoteVerifier> Create(const VerifierKey& key);
  // From verifier key text (ParseVerifierKey, then Create).
  static absl::StatusOr<Ed25519NoteVerifier> Parse(absl::string_view text) {
    return ParseVerifierAs<Ed25519NoteVerifier>(text);
  }
  bool Verify(absl::string_view text,
              absl::string_view signature) const override;

 private:
  using Ed25519KeyVerifier::Ed25519KeyVerifier;
};

// Signs `text` with each signer. INVALID_ARGUMENT if the text does not end
// in a newline, is not UTF-8, holds a control character other than newline,
// or there are no signers; a signer's own error otherwise.
absl::StatusOr<std::string> SignNote(
    absl::string_view text, absl::Span<const NoteSigner* const> signers);

// Adds each signer's signature to an already signed note (a witness adding
// its cosignature to a checkpoint), after the existing lines; an existing
// line from the same key (name and key ID) is replaced. The existing
// signatures are not checked. Errors as for ParseSignedNote and SignNote.
absl::StatusOr<std::string> AddNoteSignatures(
    absl::string_view message, absl::Span<const NoteSigner* const> signers);

// A note whose signatures have been checked.
struct OpenedNote {
  std::string text;
  // Signatures by known keys, all valid; each key once.
  std::vector<NoteSignature> verified;
  // Signatures by keys no verifier knows: ignored, kept for forwarding.
  std::vector<NoteSignature> unverified;
};

// Parses `message` and checks every signature whose key name and key ID
// match a verifier. Returns INVALID_ARGUMENT for a malformed note (see
// ParseSignedNote) or two verifiers for the same name and key ID,
// PERMISSION_DENIED if a known key's signature does not verify (the spec
// says to reject the whole note), and UNAUTHENTICATED if no known key
// signed it.
absl::StatusOr<OpenedNote> OpenNote(
    absl::string_view message, absl::Span<const NoteVerifier* const> verifiers);

// OK if `text` can be a note's text: it ends in a newline, is UTF-8, and
// holds no control character other than newline. INVALID_ARGUMENT naming
// the first problem (and its byte offset) otherwise.
absl::Status ValidateNoteText(absl::string_view text);

// Standard base64 (RFC 4648 section 4) that must be canonical: padded, no
// other characters, zero unused bits. Returns false otherwise. Strict so
// that a signed text has one spelling.
bool Base64DecodeCanonical(absl::string_view in, std::string* out);

}  // namespace modelstate

#endif  // MODELSTATE_BASE_SIGNED_NOTE_H_
