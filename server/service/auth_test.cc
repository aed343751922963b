#include "server/service/auth.h"

#include "gtest/gtest.h"

namespace materializer::service {
namespace {

TEST(ClientNameProblemTest, AcceptsTypicalNamesRejectsOthers) {
  EXPECT_EQ(ClientNameProblem("trainer-7"), "");
  EXPECT_EQ(ClientNameProblem("alice@example.com"), "");
  EXPECT_EQ(ClientNameProblem("job:42.rank+0_x"), "");
  EXPECT_NE(ClientNameProblem(""), "");
  EXPECT_NE(ClientNameProblem(std::string(129, 'a')), "");
  EXPECT_NE(ClientNameProblem("has space"), "");
  EXPECT_NE(ClientNameProblem("slash/y"), "");
}

TEST(IsLoopbackAddressTest, RecognisesLoopbackForms) {
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1:50051"));
  EXPECT_TRUE(IsLoopbackAddress("127.1.2.3:0"));
  EXPECT_TRUE(IsLoopbackAddress("localhost:50051"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:50051"));
  EXPECT_FALSE(IsLoopbackAddress("0.0.0.0:50051"));
  EXPECT_FALSE(IsLoopbackAddress("[::]:50051"));
  EXPECT_FALSE(IsLoopbackAddress("10.0.0.5:50051"));
  EXPECT_FALSE(IsLoopbackAddress("128.0.0.1:1"));
}

}  // namespace
}  // namespace materializer::service

namespace materializer::service {
namespace {

TEST(ParseTokenFileTest, ParsesTokensAndNamesBadLines) {
  auto tokens = ParseTokenFile(
      "# ops tokens\n"
      "0123456789abcdef0123 trainer-a\n"
      "\n"
      "fedcba9876543210fedc  ci  # the CI bot\n");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(tokens->size(), 2u);
  EXPECT_EQ(tokens->at("0123456789abcdef0123"), "trainer-a");
  EXPECT_EQ(tokens->at("fedcba9876543210fedc"), "ci");

  EXPECT_FALSE(ParseTokenFile("").ok());
  auto short_token = ParseTokenFile("abc trainer\n");
  ASSERT_FALSE(short_token.ok());
  EXPECT_NE(short_token.status().message().find("line 1"), std::string::npos);
  auto bad_name = ParseTokenFile("0123456789abcdef0123 bad/name\n");
  EXPECT_FALSE(bad_name.ok());
  auto repeated = ParseTokenFile(
      "0123456789abcdef0123 a\n0123456789abcdef0123 b\n");
  ASSERT_FALSE(repeated.ok());
  EXPECT_NE(repeated.status().message().find("line 2"), std::string::npos);
  EXPECT_FALSE(ParseTokenFile("0123456789abcdef0123\n").ok());
}

TEST(TokenTableTest, NamesTheClientOfEachTokenAndNothingElse) {
  TokenTable table({{"alice-token-0123456789", "alice"},
                    {"bob-token-0123456789ab", "bob"}});
  EXPECT_EQ(*table.ClientOf("Bearer alice-token-0123456789"), "alice");
  EXPECT_EQ(*table.ClientOf("Bearer bob-token-0123456789ab"), "bob");
  // Alternating lookups do not remember anything.
  EXPECT_EQ(*table.ClientOf("Bearer alice-token-0123456789"), "alice");
  for (const char* bad :
       {"Bearer alice-token-012345678", "Bearer alice-token-01234567890",
        "bearer alice-token-0123456789", "alice-token-0123456789", "Bearer ",
        ""}) {
    absl::StatusOr<std::string> client = table.ClientOf(bad);
    ASSERT_FALSE(client.ok()) << bad;
    EXPECT_EQ(client.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(client.status().message().find("alice-token"),
              std::string::npos);
  }
}

TEST(AuthenticatorTest, TokensAndClientCasNeedTls) {
  AuthOptions options;
  options.token_file = "/nonexistent";
  EXPECT_FALSE(Authenticator::Create(options).ok());
  options = AuthOptions();
  options.client_ca_file = "/nonexistent";
  EXPECT_FALSE(Authenticator::Create(options).ok());
  auto insecure = Authenticator::Create(AuthOptions());
  ASSERT_TRUE(insecure.ok());
  EXPECT_TRUE((*insecure)->insecure());
}

}  // namespace
}  // namespace materializer::service
