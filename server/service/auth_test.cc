#include "server/service/auth.h"

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "server/service/test_certificates.h"
#include "tests/testing/status_matchers.h"

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
  TokenTable table(
      {{"alice-token-0123456789", "alice"}, {"bob-token-0123456789ab", "bob"}});
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
    EXPECT_EQ(client.status().message().find("alice-token"), std::string::npos);
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

// Replacing credentials while a server runs (CredentialSources), over real
// TLS connections on loopback.

namespace materializer::service {
namespace {

using ::materializer::testing::IsOk;
using ::materializer::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kAliceToken[] = "alice-token-0123456789";
constexpr char kBobToken[] = "bob-token-0123456789ab";

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/auth-", getpid(), "-", name);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  return path;
}

// grpc.health.v1 that always answers SERVING.
class AlwaysServing final : public grpc::health::v1::Health::Service {
  grpc::Status Check(grpc::ServerContext*,
                     const grpc::health::v1::HealthCheckRequest*,
                     grpc::health::v1::HealthCheckResponse* response) override {
    response->set_status(grpc::health::v1::HealthCheckResponse::SERVING);
    return grpc::Status::OK;
  }
};

// An Authenticator serving grpc.health.v1 on a loopback port.
class ReloadTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ca_ = new TestIdentity(MakeTestCa("ca-1"));
    other_ca_ = new TestIdentity(MakeTestCa("ca-2"));
  }

  void Start(const AuthOptions& options) {
    absl::StatusOr<std::unique_ptr<Authenticator>> auth =
        Authenticator::Create(options);
    ASSERT_THAT(auth, IsOk());
    auth_ = std::move(*auth);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", auth_->ServerCredentials(), &port_);
    builder.RegisterService(&health_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    for (CredentialSource& source : auth_->CredentialSources()) {
      sources_[source.kind] = std::move(source);
    }
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  // Puts `contents` in force as the credential of `kind`, as the watcher
  // would.
  absl::StatusOr<std::string> Replace(
      const std::string& kind, const std::vector<std::string>& contents) {
    return sources_.at(kind).apply(contents);
  }

  // A new channel with a connection of its own, trusting `roots`, with a
  // client certificate and/or a token when given.
  std::shared_ptr<grpc::Channel> Connect(const std::string& roots,
                                         const TestIdentity* client = nullptr,
                                         const std::string& token = "") {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = roots;
    if (client != nullptr) {
      ssl.pem_private_key = client->key_pem;
      ssl.pem_cert_chain = client->cert_pem;
    }
    std::shared_ptr<grpc::ChannelCredentials> credentials =
        grpc::SslCredentials(ssl);
    if (!token.empty()) {
      credentials = grpc::CompositeChannelCredentials(
          credentials, grpc::AccessTokenCredentials(token));
    }
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetSslTargetNameOverride("localhost");
    return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port_),
                                     credentials, args);
  }

  // The status of one health check on `channel`.
  static grpc::StatusCode Check(const std::shared_ptr<grpc::Channel>& channel) {
    grpc::health::v1::HealthCheckRequest request;
    grpc::health::v1::HealthCheckResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    return grpc::health::v1::Health::NewStub(channel)
        ->Check(&context, request, &response)
        .error_code();
  }

  // Waits (up to 10 s) for new connections to get `want`: gRPC's provider
  // picks up a checked certificate within about a second.
  grpc::StatusCode EventuallyOnNewConnections(
      grpc::StatusCode want, const std::string& roots,
      const TestIdentity* client = nullptr, const std::string& token = "") {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    grpc::StatusCode got;
    do {
      got = Check(Connect(roots, client, token));
      if (got == want) break;
      absl::SleepFor(absl::Milliseconds(100));
    } while (absl::Now() < deadline);
    return got;
  }

  static TestIdentity* ca_;
  static TestIdentity* other_ca_;
  AlwaysServing health_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::map<std::string, CredentialSource> sources_;
};

TestIdentity* ReloadTest::ca_ = nullptr;
TestIdentity* ReloadTest::other_ca_ = nullptr;

TEST_F(ReloadTest, ARemovedTokenIsRefusedFromTheNextCallOn) {
  const TestIdentity server = MakeTestCertificate("server", *ca_);
  AuthOptions options;
  options.tls_cert_file = WriteTemp("tokens-server.pem", server.cert_pem);
  options.tls_key_file = WriteTemp("tokens-server.key", server.key_pem);
  options.token_file =
      WriteTemp("tokens.txt", absl::StrCat(kAliceToken, " alice\n"));
  Start(options);
  ASSERT_EQ(sources_.count("tokens"), 1u);
  EXPECT_EQ(sources_.count("client_ca"), 0u);
  EXPECT_EQ(sources_.at("tokens").in_force,
            std::vector<std::string>{absl::StrCat(kAliceToken, " alice\n")});

  const auto alice = Connect(ca_->cert_pem, nullptr, kAliceToken);
  const auto bob = Connect(ca_->cert_pem, nullptr, kBobToken);
  EXPECT_EQ(Check(alice), grpc::StatusCode::OK);
  EXPECT_EQ(Check(bob), grpc::StatusCode::UNAUTHENTICATED);

  // Bob added: his open channel works from its next call.
  EXPECT_EQ(*Replace("tokens", {absl::StrCat(kAliceToken, " alice\n", kBobToken,
                                             " bob\n")}),
            "2 tokens for 2 clients");
  EXPECT_EQ(Check(bob), grpc::StatusCode::OK);
  // Alice removed: refused on the connection she already has.
  ASSERT_THAT(Replace("tokens", {absl::StrCat(kBobToken, " bob\n")}), IsOk());
  EXPECT_EQ(Check(alice), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Check(bob), grpc::StatusCode::OK);
  // A bad file changes nothing.
  EXPECT_THAT(Replace("tokens", {"short bob\n"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tokens must be at least 16 characters")));
  EXPECT_EQ(Check(bob), grpc::StatusCode::OK);
  EXPECT_EQ(Check(alice), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(ReloadTest, NewConnectionsGetTheNewCertificateOldOnesKeepTheirs) {
  const TestIdentity first = MakeTestCertificate("server-1", *ca_);
  const TestIdentity client = MakeTestCertificate("alice", *ca_);
  const TestIdentity other_client = MakeTestCertificate("carol", *other_ca_);
  AuthOptions options;
  options.tls_cert_file = WriteTemp("cert-server.pem", first.cert_pem);
  options.tls_key_file = WriteTemp("cert-server.key", first.key_pem);
  options.client_ca_file = WriteTemp("cert-clients.pem", ca_->cert_pem);
  Start(options);
  ASSERT_EQ(sources_.count("certificate"), 1u);
  ASSERT_EQ(sources_.count("client_ca"), 1u);
  EXPECT_EQ(sources_.count("tokens"), 0u);

  const auto open = Connect(ca_->cert_pem, &client);
  ASSERT_EQ(Check(open), grpc::StatusCode::OK);
  EXPECT_EQ(Check(Connect(other_ca_->cert_pem, &client)),
            grpc::StatusCode::UNAVAILABLE);

  // The client CA first: carol's certificate (from the new CA) is accepted
  // on new connections, alice's still is.
  ASSERT_THAT(
      Replace("client_ca", {absl::StrCat(ca_->cert_pem, other_ca_->cert_pem)}),
      IsOk());
  EXPECT_EQ(EventuallyOnNewConnections(grpc::StatusCode::OK, ca_->cert_pem,
                                       &other_client),
            grpc::StatusCode::OK);
  // Then a server certificate from the new CA: clients that trust it
  // connect, those that trust only the old CA no longer can; the
  // connection already open is untouched.
  const TestIdentity second = MakeTestCertificate("server-2", *other_ca_);
  EXPECT_THAT(*Replace("certificate", {second.cert_pem, second.key_pem}),
              HasSubstr("CN=server-2, valid until "));
  EXPECT_EQ(EventuallyOnNewConnections(grpc::StatusCode::OK,
                                       other_ca_->cert_pem, &client),
            grpc::StatusCode::OK);
  EXPECT_EQ(Check(Connect(ca_->cert_pem, &client)),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Check(open), grpc::StatusCode::OK);

  // Refused: a key of another certificate, a damaged certificate, a CA
  // bundle that does not parse. What is in force stays.
  EXPECT_THAT(Replace("certificate", {second.cert_pem, first.key_pem}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not belong to the certificate")));
  EXPECT_THAT(Replace("certificate",
                      {"-----BEGIN CERTIFICATE-----\nxx\n", second.key_pem}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not parse")));
  EXPECT_THAT(Replace("client_ca", {"garbage"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("no PEM certificate")));
  absl::SleepFor(absl::Milliseconds(1500));  // past a provider refresh
  EXPECT_EQ(Check(Connect(other_ca_->cert_pem, &client)), grpc::StatusCode::OK);
  EXPECT_EQ(Check(Connect(other_ca_->cert_pem, &other_client)),
            grpc::StatusCode::OK);
  EXPECT_EQ(Check(open), grpc::StatusCode::OK);
}

TEST_F(ReloadTest, StartUpRefusesWhatAReloadWouldRefuse) {
  const TestIdentity server = MakeTestCertificate("server", *ca_);
  const TestIdentity other = MakeTestCertificate("other", *ca_);
  AuthOptions options;
  options.tls_cert_file = WriteTemp("start-server.pem", server.cert_pem);
  options.tls_key_file = WriteTemp("start-other.key", other.key_pem);
  options.client_ca_file = WriteTemp("start-clients.pem", ca_->cert_pem);
  EXPECT_THAT(Authenticator::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("start-other.key: the private key does not "
                                 "belong to the certificate")));
  options.tls_key_file = WriteTemp("start-server.key", server.key_pem);
  options.client_ca_file = WriteTemp("start-bad-ca.pem", "not PEM\n");
  EXPECT_THAT(Authenticator::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("start-bad-ca.pem: CA bundle: no PEM "
                                 "certificate")));
}

}  // namespace
}  // namespace materializer::service
