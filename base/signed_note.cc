#include "base/signed_note.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/file_util.h"
#include "base/quote.h"
#include "base/status_macros.h"

namespace modelstate {
namespace {

constexpr size_t kEd25519KeyBytes = 32;
// U+2014 EM DASH, then a space: how every signature line starts.
constexpr absl::string_view kSignaturePrefix = "\xE2\x80\x94 ";

// The oldest OpenSSL error as text, clearing the queue.
std::string OpenSslError() {
  const unsigned long code = ERR_get_error();  // NOLINT(runtime/int)
  ERR_clear_error();
  if (code == 0) return "unknown OpenSSL error";
  char buffer[256];
  ERR_error_string_n(code, buffer, sizeof(buffer));
  return buffer;
}

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct MdCtxFree {
  void operator()(EVP_MD_CTX* p) const { EVP_MD_CTX_free(p); }
};
struct BioFree {
  void operator()(BIO* p) const { BIO_free(p); }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

// PEM password callback that refuses: an encrypted key is an error, never a
// prompt on the terminal.
int NoPassword(char*, int, int, void*) { return 0; }

// Decodes one UTF-8 sequence at s[*pos], advancing *pos. Returns the code
// point, or -1 for an invalid sequence (overlong, surrogate, > U+10FFFF,
// truncated).
int32_t NextCodePoint(absl::string_view s, size_t* pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t b0 = byte(*pos);
  int length;
  int32_t cp;
  int32_t min;
  if (b0 < 0x80) {
    ++*pos;
    return b0;
  } else if ((b0 & 0xE0) == 0xC0) {
    length = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    length = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    length = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return -1;
  }
  if (*pos + length > s.size()) return -1;
  for (int i = 1; i < length; ++i) {
    const uint8_t b = byte(*pos + i);
    if ((b & 0xC0) != 0x80) return -1;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
  *pos += length;
  return cp;
}

// Unicode White_Space, the set Go's unicode.IsSpace uses.
bool IsUnicodeSpace(int32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// OK if `text` is UTF-8 without control characters other than newline;
// otherwise INVALID_ARGUMENT naming `what` and the byte offset.
absl::Status CheckNoteBytes(absl::string_view text, absl::string_view what) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t at = pos;
    const int32_t cp = NextCodePoint(text, &pos);
    if (cp < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " is not valid UTF-8 at byte ", at));
    }
    if (cp < 0x20 && cp != '\n') {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s has control character 0x%02x at byte %d", what, cp, at));
    }
  }
  return absl::OkStatus();
}

std::string KeyIdHex(uint32_t key_id) {
  return absl::StrFormat("%08x", key_id);
}

bool IsEd25519Type(uint8_t type) {
  return type == kNoteSignatureEd25519 || type == kNoteSignatureCosignatureV1;
}

// The signature lines `signers` make for `text`.
absl::StatusOr<std::vector<NoteSignature>> SignaturesOf(
    absl::string_view text, absl::Span<const NoteSigner* const> signers) {
  if (signers.empty()) {
    return absl::InvalidArgumentError("a note needs at least one signer");
  }
  MODELSTATE_RETURN_IF_ERROR(ValidateNoteText(text));
  std::vector<NoteSignature> out;
  for (const NoteSigner* signer : signers) {
    if (!IsValidKeyName(signer->name())) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid signer name \"", signer->name(), "\""));
    }
    MODELSTATE_ASSIGN_OR_RETURN(std::string signature, signer->Sign(text));
    out.push_back({signer->name(), signer->key_id(), std::move(signature)});
  }
  return out;
}

std::string FormatNote(absl::string_view text,
                       const std::vector<NoteSignature>& signatures) {
  std::string out = absl::StrCat(text, "\n");
  for (const NoteSignature& s : signatures) {
    absl::StrAppend(&out, FormatSignatureLine(s));
  }
  return out;
}

// Parses one signature line (without its newline); `number` counts from 1.
absl::StatusOr<NoteSignature> ParseSignatureLine(absl::string_view line,
                                                 int number) {
  const std::string where = absl::StrCat("signature line ", number);
  if (!absl::ConsumePrefix(&line, kSignaturePrefix)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " does not start with an em dash (U+2014) and a space"));
  }
  const size_t space = line.find(' ');
  if (space == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has no space between key name and signature"));
  }
  NoteSignature out;
  out.name = std::string(line.substr(0, space));
  if (!IsValidKeyName(out.name)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has an invalid key name ", Quote(out.name, '"')));
  }
  std::string raw;
  if (!Base64DecodeCanonical(line.substr(space + 1), &raw)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " (", Quote(out.name, '"'),
                     "): the signature is not canonical standard base64"));
  }
  if (raw.size() < 5) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " (", Quote(out.name, '"'), "): the signature is ",
                     raw.size(), " bytes; it needs a key ID and more"));
  }
  for (int i = 0; i < 4; ++i) {
    out.key_id = (out.key_id << 8) | static_cast<uint8_t>(raw[i]);
  }
  out.signature = raw.substr(4);
  return out;
}

}  // namespace

// ---------------------------------------------------------------- keys --

struct Ed25519PrivateKey::Key {
  PkeyPtr pkey;
};

Ed25519PrivateKey::Ed25519PrivateKey(std::shared_ptr<const Key> key)
    : key_(std::move(key)) {
  unsigned char raw[kEd25519KeyBytes];
  size_t length = sizeof(raw);
  if (EVP_PKEY_get_raw_public_key(key_->pkey.get(), raw, &length) == 1 &&
      length == kEd25519KeyBytes) {
    public_key_.assign(reinterpret_cast<const char*>(raw), length);
  }
}

absl::StatusOr<Ed25519PrivateKey> Ed25519PrivateKey::Generate() {
  std::unique_ptr<EVP_PKEY_CTX, void (*)(EVP_PKEY_CTX*)> ctx(
      EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr), EVP_PKEY_CTX_free);
  EVP_PKEY* raw = nullptr;
  if (ctx == nullptr || EVP_PKEY_keygen_init(ctx.get()) != 1 ||
      EVP_PKEY_keygen(ctx.get(), &raw) != 1) {
    return absl::InternalError(
        absl::StrCat("cannot generate an Ed25519 key: ", OpenSslError()));
  }
  auto key = std::make_shared<Key>();
  key->pkey.reset(raw);
  return Ed25519PrivateKey(std::move(key));
}

absl::StatusOr<Ed25519PrivateKey> Ed25519PrivateKey::FromSeed(
    absl::string_view seed) {
  if (seed.size() != kEd25519KeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("an Ed25519 private key is 32 bytes, not ", seed.size()));
  }
  auto key = std::make_shared<Key>();
  key->pkey.reset(EVP_PKEY_new_raw_private_key(
      EVP_PKEY_ED25519, nullptr,
      reinterpret_cast<const unsigned char*>(seed.data()), seed.size()));
  if (key->pkey == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot load the Ed25519 key: ", OpenSslError()));
  }
  return Ed25519PrivateKey(std::move(key));
}

absl::StatusOr<Ed25519PrivateKey> Ed25519PrivateKey::FromPem(
    absl::string_view pem) {
  std::unique_ptr<BIO, BioFree> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (bio == nullptr) return absl::InternalError("BIO_new_mem_buf failed");
  auto key = std::make_shared<Key>();
  key->pkey.reset(
      PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassword, nullptr));
  if (key->pkey == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("not an unencrypted PEM private key: ", OpenSslError()));
  }
  if (EVP_PKEY_id(key->pkey.get()) != EVP_PKEY_ED25519) {
    return absl::InvalidArgumentError(
        "the PEM private key is not an Ed25519 key");
  }
  return Ed25519PrivateKey(std::move(key));
}

absl::StatusOr<std::string> Ed25519PrivateKey::ToPem() const {
  std::unique_ptr<BIO, BioFree> bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr ||
      PEM_write_bio_PrivateKey(bio.get(), key_->pkey.get(), nullptr, nullptr, 0,
                               nullptr, nullptr) != 1) {
    return absl::InternalError(
        absl::StrCat("cannot write the key as PEM: ", OpenSslError()));
  }
  char* data = nullptr;
  const long length = BIO_get_mem_data(bio.get(), &data);  // NOLINT
  return std::string(data, static_cast<size_t>(length));
}

absl::StatusOr<std::string> Ed25519PrivateKey::Sign(
    absl::string_view message) const {
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  unsigned char signature[kEd25519SignatureBytes];
  size_t length = sizeof(signature);
  if (ctx == nullptr ||
      EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr,
                         key_->pkey.get()) != 1 ||
      EVP_DigestSign(ctx.get(), signature, &length,
                     reinterpret_cast<const unsigned char*>(message.data()),
                     message.size()) != 1 ||
      length != sizeof(signature)) {
    return absl::InternalError(
        absl::StrCat("Ed25519 signing failed: ", OpenSslError()));
  }
  return std::string(reinterpret_cast<const char*>(signature), length);
}

namespace {

// Creates `path` holding `content`, mode 0600, only if it does not exist:
// the content goes to a private temporary file first, which is then linked
// into place (link fails rather than overwrite). ALREADY_EXISTS if another
// process got there first.
absl::Status CreatePrivateFile(const std::string& path,
                               absl::string_view content) {
  const std::string temp = TempPathFor(path);
  int fd;
  do {
    fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoStatus(errno, path, "cannot create the key file");
  ScopedFd file(fd);
  absl::Status status;
  if (fchmod(fd, 0600) != 0) status = ErrnoStatus(errno, path, "chmod failed");
  if (status.ok()) status = WriteAll(fd, content, path);
  if (status.ok() && fsync(fd) != 0) {
    status = ErrnoStatus(errno, path, "fsync failed");
  }
  if (status.ok()) status = file.Close(path);
  if (status.ok() && link(temp.c_str(), path.c_str()) != 0) {
    status = errno == EEXIST
                 ? absl::AlreadyExistsError(absl::StrCat(path, ": exists"))
                 : ErrnoStatus(errno, path, "cannot link the key file");
  }
  unlink(temp.c_str());
  MODELSTATE_RETURN_IF_ERROR(status);
  return FsyncParentDirectory(path);
}

absl::StatusOr<Ed25519PrivateKey> ReadKeyFile(const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(std::string pem, ReadFile(path));
  absl::StatusOr<Ed25519PrivateKey> key = Ed25519PrivateKey::FromPem(pem);
  if (!key.ok()) {
    return absl::Status(key.status().code(),
                        absl::StrCat(path, ": ", key.status().message()));
  }
  return key;
}

}  // namespace

absl::StatusOr<Ed25519PrivateKey> Ed25519PrivateKey::LoadOrCreate(
    const std::string& path, bool* created) {
  if (created != nullptr) *created = false;
  absl::StatusOr<Ed25519PrivateKey> existing = ReadKeyFile(path);
  if (!absl::IsNotFound(existing.status())) return existing;
  MODELSTATE_ASSIGN_OR_RETURN(Ed25519PrivateKey key, Generate());
  MODELSTATE_ASSIGN_OR_RETURN(std::string pem, key.ToPem());
  absl::Status made = CreatePrivateFile(path, pem);
  if (absl::IsAlreadyExists(made)) return ReadKeyFile(path);
  MODELSTATE_RETURN_IF_ERROR(made);
  if (created != nullptr) *created = true;
  return key;
}

bool VerifyEd25519(absl::string_view public_key, absl::string_view message,
                   absl::string_view signature) {
  if (public_key.size() != kEd25519KeyBytes ||
      signature.size() != kEd25519SignatureBytes) {
    return false;
  }
  PkeyPtr pkey(EVP_PKEY_new_raw_public_key(
      EVP_PKEY_ED25519, nullptr,
      reinterpret_cast<const unsigned char*>(public_key.data()),
      public_key.size()));
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  const bool ok =
      pkey != nullptr && ctx != nullptr &&
      EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, pkey.get()) ==
          1 &&
      EVP_DigestVerify(ctx.get(),
                       reinterpret_cast<const unsigned char*>(signature.data()),
                       signature.size(),
                       reinterpret_cast<const unsigned char*>(message.data()),
                       message.size()) == 1;
  ERR_clear_error();  // a failed verification leaves an error queued
  return ok;
}

// ------------------------------------------------------- verifier keys --

bool IsValidKeyName(absl::string_view name) {
  if (name.empty()) return false;
  size_t pos = 0;
  while (pos < name.size()) {
    const int32_t cp = NextCodePoint(name, &pos);
    if (cp < 0x20 || cp == '+' || IsUnicodeSpace(cp)) return false;
  }
  return true;
}

uint32_t NoteKeyId(absl::string_view name, uint8_t type,
                   absl::string_view public_key) {
  const std::string input = absl::StrCat(
      name, "\n", absl::string_view(reinterpret_cast<const char*>(&type), 1),
      public_key);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(input.data(), input.size(), digest, &length, EVP_sha256(),
                 nullptr) != 1) {
    return 0;  // unreachable: SHA-256 of memory cannot fail
  }
  return (uint32_t{digest[0]} << 24) | (uint32_t{digest[1]} << 16) |
         (uint32_t{digest[2]} << 8) | uint32_t{digest[3]};
}

absl::StatusOr<VerifierKey> MakeVerifierKey(absl::string_view name,
                                            uint8_t type,
                                            absl::string_view public_key) {
  if (!IsValidKeyName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid key name \"", name,
        "\": it must be non-empty UTF-8 without spaces, '+' or control "
        "characters"));
  }
  if (IsEd25519Type(type) && public_key.size() != kEd25519KeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an Ed25519 public key is 32 bytes, not ", public_key.size()));
  }
  return VerifierKey{std::string(name), NoteKeyId(name, type, public_key), type,
                     std::string(public_key)};
}

absl::StatusOr<VerifierKey> CheckVerifierKey(const VerifierKey& key,
                                             uint8_t type) {
  if (key.type != type) {
    return absl::InvalidArgumentError(
        absl::StrFormat("verifier key %s has signature type 0x%02x, not 0x%02x",
                        key.name, key.type, type));
  }
  MODELSTATE_ASSIGN_OR_RETURN(VerifierKey checked,
                              MakeVerifierKey(key.name, type, key.public_key));
  if (checked.key_id != key.key_id) {
    return absl::InvalidArgumentError(absl::StrCat(
        "verifier key ", key.name, " has key ID ", KeyIdHex(key.key_id),
        "; its name and key give ", KeyIdHex(checked.key_id)));
  }
  return checked;
}

std::string FormatVerifierKey(const VerifierKey& key) {
  const std::string typed = absl::StrCat(
      absl::string_view(reinterpret_cast<const char*>(&key.type), 1),
      key.public_key);
  return absl::StrCat(key.name, "+", KeyIdHex(key.key_id), "+",
                      absl::Base64Escape(typed));
}

absl::StatusOr<VerifierKey> ParseVerifierKey(absl::string_view text) {
  const size_t first = text.find('+');
  const size_t second =
      first == absl::string_view::npos ? first : text.find('+', first + 1);
  if (second == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        "a verifier key has the form <name>+<key id>+<key>");
  }
  const absl::string_view name = text.substr(0, first);
  const absl::string_view id_hex = text.substr(first + 1, second - first - 1);
  std::string typed;
  if (!Base64DecodeCanonical(text.substr(second + 1), &typed) ||
      typed.empty()) {
    return absl::InvalidArgumentError(
        "the key part of the verifier key is not canonical standard base64");
  }
  uint32_t id = 0;
  if (id_hex.size() != 8 || !absl::SimpleHexAtoi(id_hex, &id) ||
      id_hex.find_first_not_of("0123456789abcdefABCDEF") !=
          absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the key ID \"", id_hex, "\" of the verifier key is not 8 hex digits"));
  }
  const uint8_t type = static_cast<uint8_t>(typed[0]);
  if (!IsEd25519Type(type)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the verifier key has signature type 0x%02x; only Ed25519 (0x01) "
        "and Ed25519 cosignatures (0x04) are supported",
        type));
  }
  MODELSTATE_ASSIGN_OR_RETURN(
      VerifierKey key,
      MakeVerifierKey(name, type, absl::string_view(typed).substr(1)));
  if (key.key_id != id) {
    return absl::InvalidArgumentError(
        absl::StrCat("the verifier key's ID ", id_hex, " is not the ID ",
                     KeyIdHex(key.key_id), " of its name and key"));
  }
  return key;
}

// --------------------------------------------------------------- notes --

std::string FormatSignatureLine(const NoteSignature& signature) {
  std::string raw(4, '\0');
  for (int i = 0; i < 4; ++i) {
    raw[i] = static_cast<char>(signature.key_id >> (24 - 8 * i));
  }
  raw += signature.signature;
  return absl::StrCat(kSignaturePrefix, signature.name, " ",
                      absl::Base64Escape(raw), "\n");
}

absl::StatusOr<SignedNote> ParseSignedNote(absl::string_view message) {
  MODELSTATE_RETURN_IF_ERROR(CheckNoteBytes(message, "note"));
  // The signatures follow the last blank line.
  const size_t split = message.rfind("\n\n");
  if (split == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        "note has no blank line before its signatures");
  }
  SignedNote note;
  note.text = std::string(message.substr(0, split + 1));
  absl::string_view lines = message.substr(split + 2);
  if (lines.empty()) {
    return absl::InvalidArgumentError("note has no signature lines");
  }
  if (lines.back() != '\n') {
    return absl::InvalidArgumentError(
        "note's last signature line does not end in a newline");
  }
  int number = 0;
  while (!lines.empty()) {
    if (++number > kMaxNoteSignatures) {
      return absl::InvalidArgumentError(absl::StrCat(
          "note has more than ", kMaxNoteSignatures, " signatures"));
    }
    const size_t end = lines.find('\n');
    MODELSTATE_ASSIGN_OR_RETURN(
        NoteSignature signature,
        ParseSignatureLine(lines.substr(0, end), number));
    note.signatures.push_back(std::move(signature));
    lines.remove_prefix(end + 1);
  }
  return note;
}

absl::StatusOr<Ed25519NoteSigner> Ed25519NoteSigner::Create(
    absl::string_view name, Ed25519PrivateKey key) {
  MODELSTATE_ASSIGN_OR_RETURN(
      VerifierKey verifier_key,
      MakeVerifierKey(name, kNoteSignatureEd25519, key.public_key()));
  return Ed25519NoteSigner(std::move(verifier_key), std::move(key));
}

absl::StatusOr<std::string> Ed25519NoteSigner::Sign(
    absl::string_view text) const {
  return private_key().Sign(text);
}

absl::StatusOr<Ed25519NoteVerifier> Ed25519NoteVerifier::Create(
    const VerifierKey& key) {
  MODELSTATE_ASSIGN_OR_RETURN(VerifierKey checked,
                              CheckVerifierKey(key, kNoteSignatureEd25519));
  return Ed25519NoteVerifier(std::move(checked));
}

bool Ed25519NoteVerifier::Verify(absl::string_view text,
                                 absl::string_view signature) const {
  return VerifyEd25519(verifier_key().public_key, text, signature);
}

absl::StatusOr<std::string> SignNote(
    absl::string_view text, absl::Span<const NoteSigner* const> signers) {
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<NoteSignature> signatures,
                              SignaturesOf(text, signers));
  return FormatNote(text, signatures);
}

absl::StatusOr<std::string> AddNoteSignatures(
    absl::string_view message, absl::Span<const NoteSigner* const> signers) {
  MODELSTATE_ASSIGN_OR_RETURN(SignedNote note, ParseSignedNote(message));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<NoteSignature> added,
                              SignaturesOf(note.text, signers));
  std::vector<NoteSignature> kept;
  for (NoteSignature& old : note.signatures) {
    bool replaced = false;
    for (const NoteSignature& s : added) {
      replaced |= s.name == old.name && s.key_id == old.key_id;
    }
    if (!replaced) kept.push_back(std::move(old));
  }
  for (NoteSignature& s : added) kept.push_back(std::move(s));
  return FormatNote(note.text, kept);
}

absl::StatusOr<OpenedNote> OpenNote(
    absl::string_view message,
    absl::Span<const NoteVerifier* const> verifiers) {
  absl::flat_hash_map<std::pair<std::string, uint32_t>, const NoteVerifier*>
      known;
  for (const NoteVerifier* v : verifiers) {
    if (!known.emplace(std::make_pair(v->name(), v->key_id()), v).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "two verifiers for key ", v->name(), "+", KeyIdHex(v->key_id())));
    }
  }
  MODELSTATE_ASSIGN_OR_RETURN(SignedNote note, ParseSignedNote(message));
  OpenedNote opened;
  std::vector<std::string> others;
  for (NoteSignature& s : note.signatures) {
    const std::string id = absl::StrCat(s.name, "+", KeyIdHex(s.key_id));
    auto it = known.find(std::make_pair(s.name, s.key_id));
    if (it == known.end()) {
      others.push_back(id);
      opened.unverified.push_back(std::move(s));
      continue;
    }
    // Every signature by a known key is checked, repeats included.
    if (!it->second->Verify(note.text, s.signature)) {
      return absl::PermissionDeniedError(
          absl::StrCat("invalid signature for key ", id));
    }
    bool seen = false;
    for (const NoteSignature& v : opened.verified) {
      seen |= v.name == s.name && v.key_id == s.key_id;
    }
    if (!seen) opened.verified.push_back(std::move(s));
  }
  if (opened.verified.empty()) {
    return absl::UnauthenticatedError(
        absl::StrCat("note has no signature from a known key (it is signed "
                     "by ",
                     absl::StrJoin(others, ", "), ")"));
  }
  opened.text = std::move(note.text);
  return opened;
}

absl::Status ValidateNoteText(absl::string_view text) {
  if (text.empty() || text.back() != '\n') {
    return absl::InvalidArgumentError("note text must end in a newline");
  }
  return CheckNoteBytes(text, "note text");
}

bool Base64DecodeCanonical(absl::string_view in, std::string* out) {
  return absl::Base64Unescape(in, out) && absl::Base64Escape(*out) == in;
}

}  // namespace modelstate
