#include "client/credentials.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/testing/status_matchers.h"

namespace materializer::client {
namespace {

using ::materializer::testing::IsOk;
using ::materializer::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kToken[] = "tok-0123456789abcdef-secret";

std::string TempFile(const std::string& name, const std::string& content) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path =
      absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
  std::ofstream(path) << content;
  return path;
}

TEST(ValidateSecurityTest, ATokenNeedsTlsAndTheErrorHidesIt) {
  Security security;
  security.token = kToken;
  security.token_source = "MATERIALIZER_TOKEN";
  const absl::Status status = ValidateSecurity(security);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument,
                               AllOf(HasSubstr("MATERIALIZER_TOKEN"),
                                     HasSubstr("only over TLS"),
                                     Not(HasSubstr(kToken)))));
  security.tls = true;
  EXPECT_THAT(ValidateSecurity(security), IsOk());
}

TEST(ValidateSecurityTest, ATokenMustBeOneWord) {
  Security security;
  security.tls = true;
  security.token = "two words";
  EXPECT_THAT(ValidateSecurity(security),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("one word"), Not(HasSubstr("two")))));
}

TEST(ValidateSecurityTest, ACertificateNeedsItsKey) {
  Security security;
  security.tls_cert_file = "alice.pem";
  EXPECT_THAT(ValidateSecurity(security),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--tls_cert and --tls_key")));
  security.tls_cert_file.clear();
  security.tls_key_file = "alice.key";
  EXPECT_THAT(ValidateSecurity(security),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--tls_cert and --tls_key")));
}

TEST(SecurityTest, EveryTlsFieldButTheTokenImpliesTls) {
  EXPECT_FALSE(Security().UsesTls());
  Security token_only;
  token_only.token = kToken;
  EXPECT_FALSE(token_only.UsesTls());
  Security ca;
  ca.tls_ca_file = "ca.pem";
  EXPECT_TRUE(ca.UsesTls());
  Security name;
  name.tls_server_name = "localhost";
  EXPECT_TRUE(name.UsesTls());
}

TEST(MakeChannelCredentialsTest, ReadsTheFilesAndNamesTheBadOnes) {
  Security plain;
  EXPECT_THAT(MakeChannelCredentials(plain).status(), IsOk());

  Security missing;
  missing.tls_ca_file = "/nonexistent/ca.pem";
  EXPECT_THAT(MakeChannelCredentials(missing).status(),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("CA file /nonexistent/ca.pem")));

  Security not_pem;
  not_pem.tls_ca_file = TempFile("not.pem", "hello\n");
  EXPECT_THAT(MakeChannelCredentials(not_pem).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("holds no PEM block")));

  Security pem;
  pem.tls_ca_file = TempFile(
      "ca.pem",
      "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
  pem.token = kToken;
  EXPECT_THAT(MakeChannelCredentials(pem).status(), IsOk());
}

TEST(ReadTokenFileTest, TrimsTheLineAndNeverQuotesTheContent) {
  EXPECT_THAT(ReadTokenFile(TempFile("token", absl::StrCat(kToken, "\n"))),
              ::testing::Property(&absl::StatusOr<std::string>::value,
                                  std::string(kToken)));
  EXPECT_THAT(
      ReadTokenFile(TempFile("empty", " \n")).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is empty")));
  EXPECT_THAT(
      ReadTokenFile(TempFile("two", absl::StrCat(kToken, "\nsecond-line\n")))
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("more than one line"), Not(HasSubstr(kToken)),
                     Not(HasSubstr("second-line")))));
  EXPECT_THAT(ReadTokenFile("/nonexistent/token").status(),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("token file /nonexistent/token")));
}

TEST(DescribeSecurityTest, SaysWhereTheTokenCameFromButNotWhatItIs) {
  Security security;
  security.tls_ca_file = "ca.pem";
  security.tls_cert_file = "alice.pem";
  security.tls_key_file = "alice.key";
  security.token = kToken;
  security.token_source = "--token_file=/run/token";
  const std::string text = DescribeSecurity(security);
  EXPECT_THAT(text, HasSubstr("TLS, server checked against ca.pem"));
  EXPECT_THAT(text, HasSubstr("client certificate alice.pem (mTLS)"));
  EXPECT_THAT(text, HasSubstr("bearer token from --token_file=/run/token"));
  EXPECT_THAT(text, Not(HasSubstr(kToken)));
  EXPECT_THAT(DescribeSecurity(Security()), HasSubstr("development mode"));
}

}  // namespace
}  // namespace materializer::client
