#include "client/cli/connection.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/command.h"
#include "tests/testing/status_matchers.h"

namespace materializer::client::cli {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kToken[] = "tok-secret-0123456789abcdef";

Environment Env(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string TokenFile(const std::string& name, const std::string& content) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path =
      absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
  std::ofstream(path) << content;
  return path;
}

absl::StatusOr<ClientOptions> Options(std::vector<std::string> args,
                                      std::map<std::string, std::string> env) {
  const Environment environment = Env(env);
  absl::StatusOr<CommandLine> line =
      ParseCommandLine(args, FlagTable(), environment);
  if (!line.ok()) return line.status();
  return ConnectionOptions(line->flags, environment);
}

TEST(ConnectionOptionsTest, FlagsAndVariablesSetTheConnection) {
  ASSERT_OK_AND_ASSIGN(
      ClientOptions options,
      Options({"--tls_cert=alice.pem", "--tls_key=alice.key", "--timeout=5s"},
              {{"MATERIALIZER_SERVER", "a:1,b:2"},
               {"MATERIALIZER_TLS_CA", "ca.pem"}}));
  EXPECT_EQ(options.target, "a:1,b:2");
  EXPECT_EQ(options.security.tls_ca_file, "ca.pem");
  EXPECT_EQ(options.security.tls_cert_file, "alice.pem");
  EXPECT_EQ(options.security.tls_key_file, "alice.key");
  EXPECT_EQ(options.timeout, absl::Seconds(5));
  EXPECT_TRUE(options.security.token.empty());
}

TEST(ConnectionOptionsTest, TokenFromAFileFromAVariableOrItsFile) {
  const std::string path = TokenFile("token", absl::StrCat(kToken, "\n"));
  ASSERT_OK_AND_ASSIGN(ClientOptions from_flag,
                       Options({"--tls", "--token_file=" + path}, {}));
  EXPECT_EQ(from_flag.security.token, kToken);
  EXPECT_EQ(from_flag.security.token_source, "--token_file=" + path);

  ASSERT_OK_AND_ASSIGN(ClientOptions from_file_variable,
                       Options({"--tls"}, {{kTokenFileVariable, path}}));
  EXPECT_EQ(from_file_variable.security.token, kToken);
  EXPECT_EQ(from_file_variable.security.token_source,
            absl::StrCat(kTokenFileVariable, "=", path));

  ASSERT_OK_AND_ASSIGN(ClientOptions from_variable,
                       Options({"--tls"}, {{kTokenVariable, kToken}}));
  EXPECT_EQ(from_variable.security.token, kToken);
  EXPECT_EQ(from_variable.security.token_source, kTokenVariable);

  // The flag wins over both variables.
  ASSERT_OK_AND_ASSIGN(ClientOptions flag_wins,
                       Options({"--tls", "--token_file=" + path},
                               {{kTokenVariable, "tok-other-0123456789"},
                                {kTokenFileVariable, "/nonexistent"}}));
  EXPECT_EQ(flag_wins.security.token, kToken);
}

TEST(ConnectionOptionsTest, ConflictsAndMistakesNeverShowTheToken) {
  const std::string path = TokenFile("token2", kToken);
  EXPECT_THAT(Options({"--tls"},
                      {{kTokenVariable, kToken}, {kTokenFileVariable, path}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("both MATERIALIZER_TOKEN and "
                                       "MATERIALIZER_TOKEN_FILE"),
                             Not(HasSubstr(kToken)))));
  EXPECT_THAT(Options({}, {{kTokenVariable, kToken}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("the token from MATERIALIZER_TOKEN is "
                                       "sent only over TLS"),
                             Not(HasSubstr(kToken)))));
  EXPECT_THAT(Options({"--tls", "--token_file=/nonexistent/t"}, {}),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("token file /nonexistent/t")));
  EXPECT_THAT(Options({"--tls_cert=a.pem"}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--tls_cert and --tls_key")));
}

TEST(DescribeConnectionTest, NamesSourcesNotSecrets) {
  const std::string path = TokenFile("token3", kToken);
  absl::StatusOr<CommandLine> line =
      ParseCommandLine({"--tls_ca=ca.pem", "--token_file=" + path}, FlagTable(),
                       Env({{"MATERIALIZER_SERVER", "pod:1"}}));
  ASSERT_TRUE(line.ok());
  ASSERT_OK_AND_ASSIGN(ClientOptions options,
                       ConnectionOptions(line->flags, Env({})));
  const std::string text = DescribeConnection(options, line->flags);
  EXPECT_THAT(text, HasSubstr("server pod:1 (from MATERIALIZER_SERVER)"));
  EXPECT_THAT(text, HasSubstr("bearer token from --token_file=" + path));
  EXPECT_THAT(text, Not(HasSubstr(kToken)));
}

}  // namespace
}  // namespace materializer::client::cli
