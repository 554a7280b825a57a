#include "base/dsse.h"

#include <string>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/status_matchers.h"

namespace modelstate {
namespace {

using ::modelstate::testing::IsOk;
using ::modelstate::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::SizeIs;

Ed25519PrivateKey KeyFromByte(char b) {
  return *Ed25519PrivateKey::FromSeed(std::string(32, b));
}

TEST(DsseTest, PaeIsTheSpecsTestVector) {
  // protocol.md, "Test Vectors".
  EXPECT_EQ(DssePae("http://example.com/HelloWorld", "hello world"),
            "DSSEv1 29 http://example.com/HelloWorld 11 hello world");
  // Lengths count bytes, not characters; an empty body is "0 ".
  EXPECT_EQ(DssePae("t\xC3\xA9", ""), "DSSEv1 3 t\xC3\xA9 0 ");
}

TEST(DsseTest, SignsThePaeAndVerifies) {
  Ed25519PrivateKey key = KeyFromByte(7);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      DsseEnvelope envelope, SignDsse(kInTotoPayloadType, "{\"a\":1}", key));
  ASSERT_THAT(envelope.signatures, SizeIs(1));
  EXPECT_EQ(envelope.signatures[0].keyid, DsseKeyId(key.public_key()));
  EXPECT_EQ(envelope.signatures[0].keyid.size(), 64u);
  // The signature is over the PAE, not over the bare payload.
  EXPECT_TRUE(VerifyEd25519(key.public_key(),
                            DssePae(kInTotoPayloadType, "{\"a\":1}"),
                            envelope.signatures[0].sig));
  EXPECT_FALSE(
      VerifyEd25519(key.public_key(), "{\"a\":1}", envelope.signatures[0].sig));
  EXPECT_THAT(VerifyDsse(envelope, key.public_key()), IsOk());
}

TEST(DsseTest, AlteredPayloadTypeOrSignatureFails) {
  Ed25519PrivateKey key = KeyFromByte(7);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(DsseEnvelope envelope,
                                  SignDsse(kInTotoPayloadType, "body", key));
  DsseEnvelope payload = envelope;
  payload.payload = "bodY";
  EXPECT_THAT(VerifyDsse(payload, key.public_key()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not verify")));
  // The type is inside the signed bytes (the point of PAE).
  DsseEnvelope type = envelope;
  type.payload_type = "application/json";
  EXPECT_THAT(VerifyDsse(type, key.public_key()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  DsseEnvelope sig = envelope;
  sig.signatures[0].sig[10] ^= 1;
  EXPECT_THAT(VerifyDsse(sig, key.public_key()),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(DsseTest, AnotherKeyOrNoSignatureFails) {
  Ed25519PrivateKey key = KeyFromByte(7);
  Ed25519PrivateKey other = KeyFromByte(8);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(DsseEnvelope envelope,
                                  SignDsse(kInTotoPayloadType, "body", key));
  EXPECT_THAT(VerifyDsse(envelope, other.public_key()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("no signature by key")));
  // Without a keyid hint the signature is tried, and fails.
  envelope.signatures[0].keyid.clear();
  EXPECT_THAT(VerifyDsse(envelope, other.public_key()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not verify")));
  EXPECT_THAT(VerifyDsse(envelope, key.public_key()), IsOk());
  envelope.signatures.clear();
  EXPECT_THAT(
      VerifyDsse(envelope, key.public_key()),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no signature")));
}

TEST(DsseTest, JsonRoundTripsAndUsesTheSpecsFields) {
  Ed25519PrivateKey key = KeyFromByte(1);
  std::string payload("\x00\xFFpayload", 9);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(DsseEnvelope envelope,
                                  SignDsse("text/plain", payload, key));
  std::string json = DsseToJson(envelope);
  nlohmann::json parsed = nlohmann::json::parse(json);
  EXPECT_EQ(parsed["payloadType"], "text/plain");
  EXPECT_EQ(parsed["payload"], absl::Base64Escape(payload));
  EXPECT_EQ(parsed["signatures"][0]["keyid"], DsseKeyId(key.public_key()));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(DsseEnvelope read, DsseFromJson(json));
  EXPECT_EQ(read.payload, payload);
  EXPECT_EQ(read.payload_type, "text/plain");
  ASSERT_THAT(read.signatures, SizeIs(1));
  EXPECT_EQ(read.signatures[0].sig, envelope.signatures[0].sig);
  EXPECT_THAT(VerifyDsse(read, key.public_key()), IsOk());
}

TEST(DsseTest, MalformedJsonNamesTheField) {
  EXPECT_THAT(DsseFromJson("[1]"), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("not a JSON object")));
  EXPECT_THAT(
      DsseFromJson(R"({"payload": "aGk=", "signatures": []})"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("payloadType")));
  EXPECT_THAT(
      DsseFromJson(
          R"({"payload": "***", "payloadType": "t", "signatures": []})"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("payload")));
  EXPECT_THAT(
      DsseFromJson(R"({"payload": "aGk=", "payloadType": "t"})"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("signatures")));
  EXPECT_THAT(DsseFromJson(R"({"payload": "aGk=", "payloadType": "t",
                               "signatures": [{"keyid": "k", "sig": 5}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("signatures[0].sig")));
  // URL-safe base64 is accepted, as the spec allows.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      DsseEnvelope read, DsseFromJson(R"({"payload": "-_8", "payloadType": "t",
                       "signatures": [{"sig": "AA"}]})"));
  EXPECT_EQ(read.payload, "\xFB\xFF");
}

}  // namespace
}  // namespace modelstate
