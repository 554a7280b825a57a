#include "base/signed_note.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace modelstate {
namespace {

using ::modelstate::testing::IsOk;
using ::modelstate::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::SizeIs;

// The worked example in the documentation of Go's
// golang.org/x/mod/sumdb/note: a signer key (its seed after the 0x01 type
// byte), the verifier key Go derives, and the note Go signs.
constexpr absl::string_view kGoSignerSeed =
    "AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz";
constexpr absl::string_view kGoVerifierKey =
    "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW";
constexpr absl::string_view kGoText =
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n";
constexpr absl::string_view kGoSignatureLine =
    "\xE2\x80\x94 PeterNeumann "
    "x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGU"
    "gYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n";
constexpr absl::string_view kGoSecondSignatureLine =
    "\xE2\x80\x94 EnochRoot "
    "rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+"
    "vAF1aGrQ5ovTG01oOTGwnWLox33WWd1RvMc+QQ=\n";

Ed25519PrivateKey GoExampleKey() {
  std::string typed;
  EXPECT_TRUE(absl::Base64Unescape(kGoSignerSeed, &typed));
  absl::StatusOr<Ed25519PrivateKey> key =
      Ed25519PrivateKey::FromSeed(typed.substr(1));
  EXPECT_THAT(key, IsOk());
  return *key;
}

std::string GoExampleNote() {
  return absl::StrCat(kGoText, "\n", kGoSignatureLine);
}

Ed25519NoteSigner NewSigner(const std::string& name) {
  absl::StatusOr<Ed25519PrivateKey> key = Ed25519PrivateKey::Generate();
  EXPECT_THAT(key, IsOk());
  absl::StatusOr<Ed25519NoteSigner> signer =
      Ed25519NoteSigner::Create(name, *key);
  EXPECT_THAT(signer, IsOk());
  return *signer;
}

Ed25519NoteVerifier VerifierFor(const Ed25519NoteSigner& signer) {
  absl::StatusOr<Ed25519NoteVerifier> v =
      Ed25519NoteVerifier::Create(signer.verifier_key());
  EXPECT_THAT(v, IsOk());
  return *v;
}

TEST(SignedNoteTest, Rfc8032Vector) {
  // RFC 8032 section 7.1, TEST 1: the empty message.
  absl::StatusOr<Ed25519PrivateKey> key =
      Ed25519PrivateKey::FromSeed(absl::HexStringToBytes(
          "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"));
  ASSERT_THAT(key, IsOk());
  EXPECT_EQ(absl::BytesToHexString(key->public_key()),
            "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a");
  const std::string want = absl::HexStringToBytes(
      "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
      "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b");
  EXPECT_THAT(key->Sign(""), ::modelstate::testing::IsOkAndHolds(want));
  EXPECT_TRUE(VerifyEd25519(key->public_key(), "", want));
  std::string bad = want;
  bad[10] ^= 1;
  EXPECT_FALSE(VerifyEd25519(key->public_key(), "", bad));
  EXPECT_FALSE(VerifyEd25519(key->public_key(), "x", want));
  EXPECT_FALSE(VerifyEd25519(key->public_key().substr(1), "", want));
  EXPECT_FALSE(VerifyEd25519(key->public_key(), "", want.substr(1)));
}

TEST(SignedNoteTest, SignsGosDocumentedExampleByteForByte) {
  absl::StatusOr<Ed25519NoteSigner> signer =
      Ed25519NoteSigner::Create("PeterNeumann", GoExampleKey());
  ASSERT_THAT(signer, IsOk());
  EXPECT_EQ(FormatVerifierKey(signer->verifier_key()), kGoVerifierKey);
  EXPECT_EQ(signer->key_id(), 0xc74f20a3u);
  absl::StatusOr<std::string> note = SignNote(kGoText, {&*signer});
  ASSERT_THAT(note, IsOk());
  EXPECT_EQ(*note, GoExampleNote());
}

TEST(SignedNoteTest, OpensGosDocumentedExample) {
  absl::StatusOr<Ed25519NoteVerifier> verifier =
      Ed25519NoteVerifier::Parse(kGoVerifierKey);
  ASSERT_THAT(verifier, IsOk());
  // Go's doubly signed version: the second key is unknown here.
  const std::string message =
      absl::StrCat(GoExampleNote(), kGoSecondSignatureLine);
  absl::StatusOr<OpenedNote> opened = OpenNote(message, {&*verifier});
  ASSERT_THAT(opened, IsOk());
  EXPECT_EQ(opened->text, kGoText);
  ASSERT_THAT(opened->verified, SizeIs(1));
  EXPECT_EQ(opened->verified[0].name, "PeterNeumann");
  EXPECT_EQ(opened->verified[0].key_id, 0xc74f20a3u);
  ASSERT_THAT(opened->unverified, SizeIs(1));
  EXPECT_EQ(opened->unverified[0].name, "EnochRoot");
}

TEST(SignedNoteTest, OneChangedByteFailsToOpen) {
  absl::StatusOr<Ed25519NoteVerifier> verifier =
      Ed25519NoteVerifier::Parse(kGoVerifierKey);
  ASSERT_THAT(verifier, IsOk());
  const std::string note = GoExampleNote();
  // Every byte of the text (but the last newline, which ends the text),
  // changed to another printable byte, breaks the signature.
  for (size_t i = 0; i + 1 < kGoText.size(); ++i) {
    std::string bad = note;
    bad[i] = bad[i] == 'x' ? 'y' : 'x';
    EXPECT_THAT(OpenNote(bad, {&*verifier}),
                StatusIs(absl::StatusCode::kPermissionDenied,
                         HasSubstr("invalid signature for key "
                                   "PeterNeumann+c74f20a3")))
        << "byte " << i;
  }
  // A changed signature byte: base64 'x' (the key ID) to 'y' changes the
  // key ID, so the key is unknown; later bytes break the signature.
  std::string bad_id = note;
  bad_id[kGoText.size() + 1 + 4 + 13] = 'y';
  EXPECT_THAT(OpenNote(bad_id, {&*verifier}),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("no signature from a known key")));
  std::string bad_sig = note;
  bad_sig[bad_sig.size() - 10] ^= 1;
  EXPECT_THAT(OpenNote(bad_sig, {&*verifier}),
              StatusIs(absl::StatusCode::kPermissionDenied));
}

TEST(SignedNoteTest, RoundTripWithSeveralSigners) {
  Ed25519NoteSigner a = NewSigner("a.example/log");
  Ed25519NoteSigner b = NewSigner("b.example/witness");
  const std::string text = "line one\n\nline three after a blank\n";
  absl::StatusOr<std::string> note = SignNote(text, {&a, &b});
  ASSERT_THAT(note, IsOk());
  Ed25519NoteVerifier va = VerifierFor(a);
  Ed25519NoteVerifier vb = VerifierFor(b);
  absl::StatusOr<OpenedNote> opened = OpenNote(*note, {&vb});
  ASSERT_THAT(opened, IsOk());
  EXPECT_EQ(opened->text, text);  // split at the last blank line
  EXPECT_THAT(opened->verified, SizeIs(1));
  EXPECT_THAT(opened->unverified, SizeIs(1));
  opened = OpenNote(*note, {&va, &vb});
  ASSERT_THAT(opened, IsOk());
  EXPECT_THAT(opened->verified, SizeIs(2));
  // A verifier with the right name but another key ignores the line.
  Ed25519NoteVerifier other = VerifierFor(NewSigner("a.example/log"));
  EXPECT_THAT(OpenNote(*note, {&other}),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("a.example/log+")));
  EXPECT_THAT(OpenNote(*note, {&va, &va}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("two verifiers for key a.example/log+")));
}

TEST(SignedNoteTest, AddSignaturesAppendsAndReplaces) {
  Ed25519NoteSigner log = NewSigner("log");
  Ed25519NoteSigner witness = NewSigner("witness");
  absl::StatusOr<std::string> note = SignNote("body\n", {&log});
  ASSERT_THAT(note, IsOk());
  absl::StatusOr<std::string> twice = AddNoteSignatures(*note, {&witness});
  ASSERT_THAT(twice, IsOk());
  EXPECT_TRUE(absl::StartsWith(*twice, *note));
  // Signing again with the same key replaces its line.
  absl::StatusOr<std::string> again = AddNoteSignatures(*twice, {&witness});
  ASSERT_THAT(again, IsOk());
  absl::StatusOr<SignedNote> parsed = ParseSignedNote(*again);
  ASSERT_THAT(parsed, IsOk());
  ASSERT_THAT(parsed->signatures, SizeIs(2));
  EXPECT_EQ(parsed->signatures[0].name, "log");
  EXPECT_EQ(parsed->signatures[1].name, "witness");
  Ed25519NoteVerifier vl = VerifierFor(log);
  Ed25519NoteVerifier vw = VerifierFor(witness);
  EXPECT_THAT(OpenNote(*again, {&vl, &vw}), IsOk());
}

TEST(SignedNoteTest, MalformedNotesAreNamed) {
  const std::string sig(kGoSignatureLine);
  struct Case {
    std::string note;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"text\n" + sig, "no blank line"},
      {"text\n\n", "no signature lines"},
      {"text\n\n" + sig.substr(0, sig.size() - 1), "does not end in a newline"},
      {"te\txt\n\n" + sig, "control character 0x09 at byte 2"},
      {"te\xffxt\n\n" + sig, "not valid UTF-8 at byte 2"},
      {"te\xc0\xafxt\n\n" + sig, "not valid UTF-8"},  // overlong '/'
      {"text\n\n- PeterNeumann AAAAAAA=\n", "signature line 1 does not start"},
      {"text\n\n" + sig + "\xE2\x80\x94 x\n", "signature line 2 has no space"},
      {"text\n\n\xE2\x80\x94 a+b x08go/ZJ\n", "invalid key name \"a+b\""},
      {"text\n\n\xE2\x80\x94 a x08go/Z\n", "not canonical standard base64"},
      {"text\n\n\xE2\x80\x94 a AAAA\n", "3 bytes; it needs a key ID"},
      {"text\n\n\xE2\x80\x94 a AAAAAA==\n", "4 bytes"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(
        ParseSignedNote(c.note),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.note;
  }
  std::string many = "text\n\n";
  for (int i = 0; i <= kMaxNoteSignatures; ++i) many += sig;
  EXPECT_THAT(ParseSignedNote(many),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("more than 100 signatures")));
}

TEST(SignedNoteTest, SigningChecksTheText) {
  Ed25519NoteSigner s = NewSigner("s");
  EXPECT_THAT(SignNote("no newline", {&s}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("must end in a newline")));
  EXPECT_THAT(SignNote("a\rb\n", {&s}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("control character 0x0d")));
  EXPECT_THAT(SignNote("text\n", {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("at least one signer")));
  EXPECT_THAT(
      Ed25519NoteSigner::Create("has space", *Ed25519PrivateKey::Generate()),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("invalid key name \"has space\"")));
}

TEST(SignedNoteTest, KeyNamesFollowTheSpec) {
  EXPECT_TRUE(IsValidKeyName("example.com/log"));
  EXPECT_TRUE(IsValidKeyName("h\xC3\xA9llo"));  // "héllo"
  EXPECT_FALSE(IsValidKeyName(""));
  EXPECT_FALSE(IsValidKeyName("a+b"));
  EXPECT_FALSE(IsValidKeyName("a b"));
  EXPECT_FALSE(IsValidKeyName("a\nb"));
  EXPECT_FALSE(IsValidKeyName("a\x01"));
  EXPECT_FALSE(
      IsValidKeyName("a\xC2\xA0"
                     "b"));  // U+00A0
  EXPECT_FALSE(
      IsValidKeyName("a\xE3\x80\x80"
                     "b"));  // U+3000
  EXPECT_FALSE(
      IsValidKeyName("a\xE2\x80\xA8"
                     "b"));  // U+2028
  EXPECT_FALSE(IsValidKeyName("a\xff"));
  EXPECT_FALSE(IsValidKeyName("a\xED\xA0\x80"));  // a surrogate
}

TEST(SignedNoteTest, VerifierKeysParseStrictly) {
  absl::StatusOr<VerifierKey> key = ParseVerifierKey(kGoVerifierKey);
  ASSERT_THAT(key, IsOk());
  EXPECT_EQ(key->name, "PeterNeumann");
  EXPECT_EQ(key->type, kNoteSignatureEd25519);
  EXPECT_THAT(key->public_key, SizeIs(32));
  EXPECT_EQ(FormatVerifierKey(*key), kGoVerifierKey);
  const auto fails = [](absl::string_view text, absl::string_view message) {
    EXPECT_THAT(
        ParseVerifierKey(text),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)))
        << text;
  };
  fails("PeterNeumann", "has the form");
  fails("PeterNeumann+c74f20a3", "has the form");
  fails("PeterNeumann+c74f20a4+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
        "is not the ID c74f20a3");
  fails("PeterNeumann+c74f20a+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
        "not 8 hex digits");
  fails("PeterNeumann+-74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
        "not 8 hex digits");
  fails("PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10T",
        "not canonical standard base64");
  fails("Peter Neumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
        "invalid key name");
  // Type 0x02 (ECDSA) is not supported; a 31-byte Ed25519 key is wrong.
  fails("a+00000000+AhpcAA==", "signature type 0x02");
  fails(absl::StrCat("a+00000000+", absl::Base64Escape(std::string("\x01") +
                                                       std::string(31, 'k'))),
        "32 bytes, not 31");
  // The cosignature type gets its own key ID from the same key.
  absl::StatusOr<VerifierKey> cosigner = MakeVerifierKey(
      "PeterNeumann", kNoteSignatureCosignatureV1, key->public_key);
  ASSERT_THAT(cosigner, IsOk());
  EXPECT_NE(cosigner->key_id, key->key_id);
  EXPECT_THAT(ParseVerifierKey(FormatVerifierKey(*cosigner)), IsOk());
  EXPECT_THAT(Ed25519NoteVerifier::Create(*cosigner),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("type 0x04, not 0x01")));
  VerifierKey wrong_id = *key;
  wrong_id.key_id ^= 1;
  EXPECT_THAT(Ed25519NoteVerifier::Create(wrong_id),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("its name and key give c74f20a3")));
}

// A fresh directory under TEST_TMPDIR (or /tmp), removed afterwards.
class KeyFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string pattern =
        absl::StrCat(base != nullptr ? base : "/tmp", "/note_test.XXXXXX");
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    path_ = dir_ + "/audit.pem";
  }
  void TearDown() override {
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }
  std::string dir_;
  std::string path_;
};

TEST_F(KeyFileTest, CreatedOnceWithMode0600ThenLoaded) {
  bool created = false;
  absl::StatusOr<Ed25519PrivateKey> first =
      Ed25519PrivateKey::LoadOrCreate(path_, &created);
  ASSERT_THAT(first, IsOk());
  EXPECT_TRUE(created);
  struct stat st;
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  absl::StatusOr<Ed25519PrivateKey> second =
      Ed25519PrivateKey::LoadOrCreate(path_, &created);
  ASSERT_THAT(second, IsOk());
  EXPECT_FALSE(created);
  EXPECT_EQ(second->public_key(), first->public_key());
  // The same key signs the same (deterministic Ed25519) signature.
  EXPECT_EQ(*second->Sign("m"), *first->Sign("m"));
  absl::StatusOr<std::string> pem = ReadFile(path_);
  ASSERT_THAT(pem, IsOk());
  EXPECT_TRUE(absl::StartsWith(*pem, "-----BEGIN PRIVATE KEY-----\n"));
  EXPECT_EQ(*pem, *first->ToPem());
}

TEST_F(KeyFileTest, BadKeyFilesAreNamed) {
  ASSERT_THAT(WriteFileAtomically(path_, "not pem"), IsOk());
  EXPECT_THAT(Ed25519PrivateKey::LoadOrCreate(path_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(path_ + ": not an unencrypted PEM")));
  // A P-256 key (made for this test).
  ASSERT_THAT(
      WriteFileAtomically(
          path_,
          "-----BEGIN PRIVATE KEY-----\n"
          "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg/o9+RPCPVouPczLe\n"
          "chDItuVVpOvButxYTGO/DBrQCkmhRANCAATMZ1UymMXIXWP32nh9mZ/jAMSarW1B\n"
          "v1prjHEITaPcRpKJoCqrSsOMAceq2sucwcsnJneeMKccVC6FXupVsB6V\n"
          "-----END PRIVATE KEY-----\n"),
      IsOk());
  EXPECT_THAT(Ed25519PrivateKey::LoadOrCreate(path_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not an Ed25519 key")));
  // An encrypted Ed25519 key: refused, never a password prompt.
  ASSERT_THAT(
      WriteFileAtomically(
          path_,
          "-----BEGIN ENCRYPTED PRIVATE KEY-----\n"
          "MIGbMFcGCSqGSIb3DQEFDTBKMCkGCSqGSIb3DQEFDDAcBAgwfvYuldXT0wICCAAw\n"
          "DAYIKoZIhvcNAgkFADAdBglghkgBZQMEAQIEELvigzgBmJFQqSHqFCdfncoEQEcf\n"
          "ZbbKJDYMkyXeVpibjIiJ2K0/AYKeXU0QbMb21Mr2jJXGE4EoqwJ/La2MsvPWXxXM\n"
          "jhlm2dazve6OzOOuh20=\n"
          "-----END ENCRYPTED PRIVATE KEY-----\n"),
      IsOk());
  EXPECT_THAT(Ed25519PrivateKey::LoadOrCreate(path_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not an unencrypted PEM")));
  EXPECT_THAT(Ed25519PrivateKey::LoadOrCreate(dir_ + "/no/such/dir/k.pem"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no/such/dir")));
  EXPECT_THAT(Ed25519PrivateKey::FromSeed("short"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("32 bytes, not 5")));
}

}  // namespace
}  // namespace modelstate
