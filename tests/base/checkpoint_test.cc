#include "base/checkpoint.h"

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace modelstate {
namespace {

using ::modelstate::testing::IsOk;
using ::modelstate::testing::IsOkAndHolds;
using ::modelstate::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::SizeIs;

// The checkpoint body in the C2SP tlog-checkpoint and tlog-cosignature
// specs.
constexpr absl::string_view kSpecCheckpoint =
    "example.com/behind-the-sofa\n"
    "20852163\n"
    "CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n";

Ed25519PrivateKey NewKey() {
  absl::StatusOr<Ed25519PrivateKey> key = Ed25519PrivateKey::Generate();
  EXPECT_THAT(key, IsOk());
  return *key;
}

Checkpoint TestCheckpoint() {
  return Checkpoint{"example.com/log", 1234, HashLeaf("root"), {}};
}

TEST(CheckpointTest, ParsesAndFormatsTheSpecExample) {
  absl::StatusOr<Checkpoint> c = ParseCheckpoint(kSpecCheckpoint);
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->origin, "example.com/behind-the-sofa");
  EXPECT_EQ(c->size, 20852163u);
  EXPECT_EQ(absl::Base64Escape(absl::string_view(
                reinterpret_cast<const char*>(c->root.data()), 32)),
            "CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=");
  EXPECT_THAT(c->extensions, SizeIs(0));
  EXPECT_THAT(FormatCheckpoint(*c), IsOkAndHolds(std::string(kSpecCheckpoint)));
  // Extension lines are kept in order.
  const std::string with_extensions =
      absl::StrCat(kSpecCheckpoint, "ext one\n", "ext two\n");
  c = ParseCheckpoint(with_extensions);
  ASSERT_THAT(c, IsOk());
  EXPECT_THAT(c->extensions, ElementsAre("ext one", "ext two"));
  EXPECT_THAT(FormatCheckpoint(*c), IsOkAndHolds(with_extensions));
  // The empty tree.
  Checkpoint empty{"o", 0, EmptyTreeHash(), {}};
  absl::StatusOr<std::string> text = FormatCheckpoint(empty);
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(ParseCheckpoint(*text), IsOkAndHolds(empty));
  EXPECT_EQ(*text, "o\n0\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n");
}

TEST(CheckpointTest, ParsingIsStrict) {
  const std::string root = "CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=";
  struct Case {
    std::string text;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"o\n1\n" + root, "must end in a newline"},
      {"o\n1\n", "has 2 lines"},
      {"\n1\n" + root + "\n", "line 1 is empty"},
      {"o\n\n" + root + "\n", "line 2 is empty"},
      {"o\n1\n" + root + "\n\next\n", "line 4 is empty"},
      {"o\n01\n" + root + "\n", "\"01\" has a leading zero"},
      {"o\n00\n" + root + "\n", "leading zero"},
      {"o\n-1\n" + root + "\n", "not a decimal number"},
      {"o\n+1\n" + root + "\n", "not a decimal number"},
      {"o\n 1\n" + root + "\n", "not a decimal number"},
      {"o\n1e3\n" + root + "\n", "not a decimal number"},
      {"o\n9223372036854775808\n" + root + "\n", "up to 2^63 - 1"},
      {"o\n99999999999999999999999\n" + root + "\n", "up to 2^63 - 1"},
      // Unused low bits set: decodes to the same bytes, but not canonical.
      {"o\n1\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2J=\n",
       "not canonical standard base64"},
      {"o\n1\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I\n",
       "not canonical standard base64"},
      {"o\n1\nCsUYapGGPo4dkMgIAUqom_Xajj7h2fB2MPA3j2jxq2I=\n",
       "not canonical standard base64"},
      {"o\n1\nAAAA\n", "root hash) is 3 bytes long"},
      {"o\t\n1\n" + root + "\n", "control character 0x09"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(
        ParseCheckpoint(c.text),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.text;
  }
  EXPECT_THAT(ParseCheckpoint("o\n9223372036854775807\n" + root + "\n"),
              IsOk());
}

TEST(CheckpointTest, FormattingNamesTheBadField) {
  Checkpoint c = TestCheckpoint();
  c.origin = "";
  EXPECT_THAT(FormatCheckpoint(c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("checkpoint origin is empty")));
  c.origin = "a\nb";
  EXPECT_THAT(FormatCheckpoint(c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("checkpoint origin contains a newline")));
  c = TestCheckpoint();
  c.extensions = {"fine", ""};
  EXPECT_THAT(FormatCheckpoint(c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("extension line 2 is empty")));
  c = TestCheckpoint();
  c.size = kMaxCheckpointValue + 1;
  EXPECT_THAT(FormatCheckpoint(c), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("above 2^63 - 1")));
}

TEST(CheckpointTest, SignedCheckpointOpensOnlyWithTheLogKey) {
  absl::StatusOr<Ed25519NoteSigner> log =
      Ed25519NoteSigner::Create("example.com/log", NewKey());
  ASSERT_THAT(log, IsOk());
  absl::StatusOr<std::string> note = SignCheckpoint(TestCheckpoint(), *log);
  ASSERT_THAT(note, IsOk());
  absl::StatusOr<Ed25519NoteVerifier> verifier =
      Ed25519NoteVerifier::Create(log->verifier_key());
  ASSERT_THAT(verifier, IsOk());
  absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpoint(*note, {&*verifier});
  ASSERT_THAT(opened, IsOk());
  EXPECT_EQ(opened->checkpoint, TestCheckpoint());
  // The tree size changed by one digit.
  std::string forged = *note;
  forged[forged.find("1234")] = '2';
  EXPECT_THAT(OpenCheckpoint(forged, {&*verifier}),
              StatusIs(absl::StatusCode::kPermissionDenied));
  // A well-signed note whose text is not a checkpoint.
  absl::StatusOr<std::string> other = SignNote("hello\n", {&*log});
  ASSERT_THAT(other, IsOk());
  EXPECT_THAT(OpenCheckpoint(*other, {&*verifier}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("checkpoint has 1 line;")));
}

TEST(CheckpointTest, CosignedMessageIsTheSpecsLayout) {
  EXPECT_EQ(CosignedMessage(kSpecCheckpoint, 1679315147),
            "cosignature/v1\n"
            "time 1679315147\n"
            "example.com/behind-the-sofa\n"
            "20852163\n"
            "CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n");
  EXPECT_EQ(CosignedMessage(kSpecCheckpoint, 0),
            absl::StrCat("cosignature/v1\ntime 0\n", kSpecCheckpoint));
}

TEST(CheckpointTest, CosignatureRoundTrip) {
  const Ed25519PrivateKey key = NewKey();
  absl::StatusOr<CosignatureSigner> witness =
      CosignatureSigner::Create("witness.example/w1", key);
  ASSERT_THAT(witness, IsOk());
  // Type 0x04 in the key ID and in the verifier key.
  EXPECT_EQ(witness->key_id(),
            NoteKeyId("witness.example/w1", kNoteSignatureCosignatureV1,
                      key.public_key()));
  const std::string vkey = FormatVerifierKey(witness->verifier_key());
  EXPECT_THAT(vkey, HasSubstr("+B"));  // base64 of 0x04 ... starts with 'B'
  absl::StatusOr<CosignatureVerifier> verifier =
      CosignatureVerifier::Parse(vkey);
  ASSERT_THAT(verifier, IsOk());

  absl::StatusOr<Ed25519NoteSigner> log =
      Ed25519NoteSigner::Create("example.com/log", NewKey());
  ASSERT_THAT(log, IsOk());
  absl::StatusOr<Ed25519NoteVerifier> log_verifier =
      Ed25519NoteVerifier::Create(log->verifier_key());
  ASSERT_THAT(log_verifier, IsOk());
  absl::StatusOr<std::string> note = SignCheckpoint(TestCheckpoint(), *log);
  ASSERT_THAT(note, IsOk());
  absl::StatusOr<std::string> cosigned =
      CosignCheckpoint(*note, *witness, 1700000000);
  ASSERT_THAT(cosigned, IsOk());
  absl::StatusOr<OpenedCheckpoint> opened =
      OpenCheckpoint(*cosigned, {&*log_verifier, &*verifier});
  ASSERT_THAT(opened, IsOk());
  ASSERT_THAT(opened->note.verified, SizeIs(2));
  const NoteSignature& cosignature = opened->note.verified[1];
  EXPECT_EQ(cosignature.name, "witness.example/w1");
  EXPECT_THAT(cosignature.signature, SizeIs(72));
  EXPECT_THAT(CosignatureTimestamp(cosignature), IsOkAndHolds(1700000000u));
  // The witness alone vouches for it too (policy is the caller's).
  EXPECT_THAT(OpenCheckpoint(*cosigned, {&*verifier}), IsOk());

  // A later cosignature by the same witness replaces the earlier one.
  absl::StatusOr<std::string> recosigned =
      CosignCheckpoint(*cosigned, *witness, 1700000001);
  ASSERT_THAT(recosigned, IsOk());
  opened = OpenCheckpoint(*recosigned, {&*verifier});
  ASSERT_THAT(opened, IsOk());
  ASSERT_THAT(opened->note.verified, SizeIs(1));
  EXPECT_THAT(opened->note.unverified, SizeIs(1));  // the log's line
  EXPECT_THAT(CosignatureTimestamp(opened->note.verified[0]),
              IsOkAndHolds(1700000001u));
}

TEST(CheckpointTest, AlteredCosignaturesFail) {
  absl::StatusOr<CosignatureSigner> witness =
      CosignatureSigner::Create("w", NewKey());
  ASSERT_THAT(witness, IsOk());
  absl::StatusOr<CosignatureVerifier> verifier =
      CosignatureVerifier::Create(witness->verifier_key());
  ASSERT_THAT(verifier, IsOk());
  const std::string text(kSpecCheckpoint);
  absl::StatusOr<std::string> signature = witness->SignAt(text, 1679315147);
  ASSERT_THAT(signature, IsOk());
  ASSERT_THAT(*signature, SizeIs(72));
  EXPECT_TRUE(verifier->Verify(text, *signature));
  // Any one flipped bit (time or signature) and any change to the text.
  for (size_t i = 0; i < signature->size(); ++i) {
    std::string bad = *signature;
    bad[i] ^= 0x04;
    EXPECT_FALSE(verifier->Verify(text, bad)) << "byte " << i;
  }
  for (size_t i = 0; i < text.size(); ++i) {
    std::string bad = text;
    bad[i] ^= 0x01;
    EXPECT_FALSE(verifier->Verify(bad, *signature)) << "byte " << i;
  }
  EXPECT_FALSE(verifier->Verify(text, signature->substr(1)));
  // A plain Ed25519 signature of the text by the same key is not a
  // cosignature.
  EXPECT_THAT(
      CosignatureTimestamp({"w", 0, std::string(64, 'x')}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is 64 bytes")));
  EXPECT_THAT(CosignatureTimestamp({"w", 0, std::string(72, '\xff')}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("above 2^63 - 1")));
  EXPECT_THAT(witness->SignAt(text, kMaxCheckpointValue + 1),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(
      CosignatureVerifier::Create(*MakeVerifierKey(
          "w", kNoteSignatureEd25519, witness->verifier_key().public_key)),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("type 0x01, not 0x04")));
  // Cosigning something that is not a checkpoint is refused.
  absl::StatusOr<Ed25519NoteSigner> log =
      Ed25519NoteSigner::Create("log", NewKey());
  ASSERT_THAT(log, IsOk());
  absl::StatusOr<std::string> not_checkpoint = SignNote("hello\n", {&*log});
  ASSERT_THAT(not_checkpoint, IsOk());
  EXPECT_THAT(CosignCheckpoint(*not_checkpoint, *witness, 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("checkpoint has 1 line;")));
}

}  // namespace
}  // namespace modelstate
