#include "server/service/tls_files.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/service/test_certificates.h"
#include "tests/testing/status_matchers.h"

namespace materializer::service {
namespace {

using ::materializer::testing::IsOk;
using ::materializer::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

class TlsFilesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ca_ = new TestIdentity(MakeTestCa("files-ca"));
    server_ = new TestIdentity(MakeTestCertificate("server-1", *ca_));
    other_ = new TestIdentity(MakeTestCertificate("server-2", *ca_));
  }
  static TestIdentity* ca_;
  static TestIdentity* server_;
  static TestIdentity* other_;
};

TestIdentity* TlsFilesTest::ca_ = nullptr;
TestIdentity* TlsFilesTest::server_ = nullptr;
TestIdentity* TlsFilesTest::other_ = nullptr;

TEST_F(TlsFilesTest, AcceptsAChainWithItsKeyAndSummarizesTheLeaf) {
  const absl::Time now = absl::Now();
  absl::StatusOr<CertificateSummary> leaf = CheckKeyPair(
      absl::StrCat(server_->cert_pem, ca_->cert_pem), server_->key_pem, now);
  ASSERT_THAT(leaf, IsOk());
  EXPECT_EQ(leaf->subject, "CN=server-1");
  EXPECT_EQ(leaf->chain_length, 2);
  EXPECT_GT(leaf->not_after, now + absl::Hours(23));
  EXPECT_LT(leaf->not_after, now + absl::Hours(25));
}

TEST_F(TlsFilesTest, RefusesAKeyOfAnotherCertificate) {
  EXPECT_THAT(
      CheckKeyPair(server_->cert_pem, other_->key_pem, absl::Now()),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("private key does not belong to the certificate")));
}

TEST_F(TlsFilesTest, RefusesDamagedTruncatedOrEmptyFiles) {
  const absl::Time now = absl::Now();
  std::string damaged = server_->cert_pem;
  damaged[damaged.size() / 2] = '!';
  EXPECT_THAT(CheckKeyPair(damaged, server_->key_pem, now),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("certificate 1 does not parse")));
  const std::string truncated =
      server_->cert_pem.substr(0, server_->cert_pem.size() - 40);
  EXPECT_THAT(CheckKeyPair(truncated, server_->key_pem, now),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not parse")));
  EXPECT_THAT(CheckKeyPair("", server_->key_pem, now),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("no PEM certificate")));
  EXPECT_THAT(CheckKeyPair("not a certificate\n", server_->key_pem, now),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("no PEM certificate")));
  absl::StatusOr<CertificateSummary> bad_key =
      CheckKeyPair(server_->cert_pem, "garbage", now);
  EXPECT_THAT(bad_key, StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("no PEM private key parses")));
  // A second certificate that is damaged is found too.
  std::string second = ca_->cert_pem;
  second[second.size() / 2] = '!';
  EXPECT_THAT(CheckKeyPair(absl::StrCat(server_->cert_pem, second),
                           server_->key_pem, now),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("certificate 2 does not parse")));
}

TEST_F(TlsFilesTest, RefusesAnExpiredCertificate) {
  const TestIdentity expired =
      MakeTestCertificate("old", *ca_, -absl::Minutes(1));
  EXPECT_THAT(CheckKeyPair(expired.cert_pem, expired.key_pem, absl::Now()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("(CN=old) expired at ")));
  // The same pair is fine at a time before it expired.
  EXPECT_THAT(CheckKeyPair(expired.cert_pem, expired.key_pem,
                           absl::Now() - absl::Minutes(30)),
              IsOk());
}

TEST_F(TlsFilesTest, CountsTheCertificatesOfABundle) {
  EXPECT_THAT(CheckCaBundle(ca_->cert_pem), IsOk());
  EXPECT_EQ(*CheckCaBundle(absl::StrCat(ca_->cert_pem, server_->cert_pem)), 2);
  EXPECT_THAT(CheckCaBundle(""), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("no PEM certificate")));
  std::string damaged = ca_->cert_pem;
  damaged[damaged.size() / 2] = '!';
  EXPECT_THAT(CheckCaBundle(damaged), Not(IsOk()));
}

}  // namespace
}  // namespace materializer::service
