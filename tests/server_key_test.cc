// The server's signing key and the credential payload that vouches for it (common/auth.h): what
// a client relies on to tell the real server from one that copied the real server's credential.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/escaping.h"
#include "common/auth.h"

namespace rdzv {
namespace {

using ::testing::HasSubstr;

TEST(ServerKeyTest, ASignatureVerifiesUnderItsKeyForItsMessageOnly) {
  absl::StatusOr<SigningKey> key = SigningKey::Generate();
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(key->public_key().size(), 91u);
  const std::string message =
      ServerProofPayload("Join", "job-1", "00112233445566778899aabbccddeeff", "uid:1000");
  const std::string sig = key->Sign(message);
  ASSERT_GE(sig.size(), 128u);
  ASSERT_LE(sig.size(), 144u);
  EXPECT_TRUE(VerifySignature(key->public_key(), message, sig));

  // Another call (method, job, nonce or caller): refused.
  for (const std::string& other :
       {ServerProofPayload("GetStatus", "job-1", "00112233445566778899aabbccddeeff", "uid:1000"),
        ServerProofPayload("Join", "job-2", "00112233445566778899aabbccddeeff", "uid:1000"),
        ServerProofPayload("Join", "job-1", "ffeeddccbbaa99887766554433221100", "uid:1000"),
        ServerProofPayload("Join", "job-1", "00112233445566778899aabbccddeeff", "uid:1001")}) {
    EXPECT_FALSE(VerifySignature(key->public_key(), other, sig)) << other;
  }
  // Another key's signature of the same message: refused.
  absl::StatusOr<SigningKey> other_key = SigningKey::Generate();
  ASSERT_TRUE(other_key.ok());
  EXPECT_NE(other_key->public_key(), key->public_key());
  EXPECT_FALSE(VerifySignature(key->public_key(), message, other_key->Sign(message)));
  EXPECT_TRUE(VerifySignature(other_key->public_key(), message, other_key->Sign(message)));
}

TEST(ServerKeyTest, MalformedSignaturesAndKeysAreRefusedNotTrusted) {
  absl::StatusOr<SigningKey> key = SigningKey::Generate();
  ASSERT_TRUE(key.ok());
  const std::string sig = key->Sign("m");
  std::string flipped = sig;
  flipped[10] = flipped[10] == '0' ? '1' : '0';
  EXPECT_FALSE(VerifySignature(key->public_key(), "m", flipped));
  EXPECT_FALSE(VerifySignature(key->public_key(), "m", ""));
  EXPECT_FALSE(VerifySignature(key->public_key(), "m", sig.substr(2)));
  EXPECT_FALSE(VerifySignature(key->public_key(), "m", sig + "00"));
  EXPECT_FALSE(VerifySignature(key->public_key(), "m", std::string(128, 'z')));
  EXPECT_FALSE(VerifySignature("", "m", sig));
  EXPECT_FALSE(VerifySignature(key->public_key().substr(1), "m", sig));
  EXPECT_FALSE(VerifySignature(std::string(91, '\0'), "m", sig));
  std::string bent_key = key->public_key();
  bent_key[40] ^= 1;  // a point off the curve, or another key
  EXPECT_FALSE(VerifySignature(bent_key, "m", sig));
}

TEST(ServerKeyTest, TheKeyCredentialPayloadNamesExactlyOneKey) {
  absl::StatusOr<SigningKey> key = SigningKey::Generate();
  ASSERT_TRUE(key.ok());
  const std::string payload = ServerKeyPayload(key->public_key());
  EXPECT_THAT(payload, HasSubstr("rdzv.v1 server-key p256 "));
  absl::StatusOr<std::string> parsed = ParseServerKeyPayload(payload);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, key->public_key());

  // A call's credential payload, a server proof payload, a truncated or padded key: none is a
  // key credential.
  const std::string hex = absl::BytesToHexString(key->public_key());
  for (const std::string& bad :
       {CallPayload("Join", "job"), ServerProofPayload("Join", "j", "00112233445566778899", "u"),
        std::string("rdzv.v1 server-key p256 ") + hex.substr(2),
        std::string("rdzv.v1 server-key p256 ") + hex + "00",
        std::string("rdzv.v1 server-key p256 ") + hex + " ",
        std::string("rdzv.v1 server-key ed25519 ") + hex,
        std::string("rdzv.v1 server-key p256 ") + std::string(64, 'g'), std::string()}) {
    EXPECT_FALSE(ParseServerKeyPayload(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace rdzv
