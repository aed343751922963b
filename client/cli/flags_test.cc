#include "client/cli/flags.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace materializer::client::cli {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const std::vector<FlagSpec>& Specs() {
  static const auto* specs = new std::vector<FlagSpec>{
      {"server", FlagType::kString, "HOST:PORT", "server", "127.0.0.1:50051",
       "TEST_SERVER"},
      {"tls", FlagType::kBool, "", "tls", "", "TEST_TLS"},
      {"all", FlagType::kBool, "", "all"},
      {"timeout", FlagType::kDuration, "DURATION", "timeout"},
      {"o", FlagType::kString, "OUT", "out"},
      {"format", FlagType::kChoice, "a|b", "format", "a", "", {"a", "b"}},
      {"include", FlagType::kList, "GLOBS", "include"},
      {"chunk", FlagType::kBytes, "N", "chunk", "0", "", {}, 4096},
  };
  return *specs;
}

Environment Env(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

absl::StatusOr<CommandLine> Parse(std::vector<std::string> args,
                                  std::map<std::string, std::string> env = {}) {
  return ParseCommandLine(args, Specs(), Env(std::move(env)));
}

TEST(ParseCommandLineTest, EveryValueSyntax) {
  ASSERT_OK_AND_ASSIGN(CommandLine line,
                       Parse({"--server=a:1", "fetch", "h-1", "-o", "out.st",
                              "--all", "--timeout", "30s", "--format=b",
                              "--include=x.*,y.*", "--chunk=4KiB"}));
  EXPECT_THAT(line.positional, ElementsAre("fetch", "h-1"));
  EXPECT_EQ(line.flags.String("server"), "a:1");
  EXPECT_EQ(line.flags.String("o"), "out.st");
  EXPECT_TRUE(line.flags.Bool("all"));
  EXPECT_EQ(line.flags.Duration("timeout", absl::ZeroDuration()),
            absl::Seconds(30));
  EXPECT_EQ(line.flags.String("format"), "b");
  EXPECT_THAT(line.flags.List("include"), ElementsAre("x.*", "y.*"));
  EXPECT_EQ(line.flags.Bytes("chunk", 0), 4096u);
  EXPECT_EQ(line.flags.Source("o"), "-o");
  EXPECT_EQ(line.flags.Source("server"), "--server");
}

TEST(ParseCommandLineTest, BooleansAndTheEndOfFlags) {
  ASSERT_OK_AND_ASSIGN(CommandLine line,
                       Parse({"--noall", "--tls=false", "--", "--all"}));
  EXPECT_TRUE(line.flags.Has("all"));
  EXPECT_FALSE(line.flags.Bool("all"));
  EXPECT_FALSE(line.flags.Bool("tls"));
  EXPECT_THAT(line.positional, ElementsAre("--all"));
}

TEST(ParseCommandLineTest, UnsetFlagsHaveTheirFallbacks) {
  ASSERT_OK_AND_ASSIGN(CommandLine line, Parse({"ls"}));
  EXPECT_FALSE(line.flags.Has("server"));
  EXPECT_EQ(line.flags.String("server", "default:1"), "default:1");
  EXPECT_EQ(line.flags.Duration("timeout", absl::Minutes(10)),
            absl::Minutes(10));
  EXPECT_THAT(line.flags.List("include"), IsEmpty());
}

TEST(ParseCommandLineTest, BadFlagsAndValuesNameTheFlag) {
  EXPECT_THAT(Parse({"--nosuch=1"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown flag --nosuch")));
  EXPECT_THAT(Parse({"--noserver"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown flag --noserver")));
  EXPECT_THAT(Parse({"-o"}), StatusIs(absl::StatusCode::kInvalidArgument,
                                      HasSubstr("-o needs a value")));
  EXPECT_THAT(Parse({"--timeout=soon"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--timeout must be a positive duration")));
  EXPECT_THAT(Parse({"--timeout=0s"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--timeout must be a positive duration")));
  EXPECT_THAT(Parse({"--format=c"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--format must be a, b, not \"c\"")));
  EXPECT_THAT(Parse({"--chunk=8KiB"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--chunk is at most 4096 bytes")));
  EXPECT_THAT(Parse({"--all=maybe"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--all must be true or false")));
}

TEST(ParseCommandLineTest, EnvironmentFillsWhatTheCommandLineLeaves) {
  ASSERT_OK_AND_ASSIGN(
      CommandLine from_env,
      Parse({"ls"}, {{"TEST_SERVER", "env:1"}, {"TEST_TLS", "1"}}));
  EXPECT_EQ(from_env.flags.String("server"), "env:1");
  EXPECT_EQ(from_env.flags.Source("server"), "TEST_SERVER");
  EXPECT_TRUE(from_env.flags.Bool("tls"));
  // Only flags from the command line are checked against a command.
  EXPECT_THAT(from_env.flags.FromCommandLine(), IsEmpty());

  ASSERT_OK_AND_ASSIGN(CommandLine flag_wins,
                       Parse({"--server=flag:1"}, {{"TEST_SERVER", "env:1"}}));
  EXPECT_EQ(flag_wins.flags.String("server"), "flag:1");
  EXPECT_THAT(flag_wins.flags.FromCommandLine(), ElementsAre("server"));

  EXPECT_THAT(Parse({}, {{"TEST_TLS", "perhaps"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("TEST_TLS must be true or false")));
}

TEST(FlagSynopsisTest, AsUsageWritesThem) {
  EXPECT_EQ(FlagSynopsis(*FindFlag(Specs(), "all")), "--all");
  EXPECT_EQ(FlagSynopsis(*FindFlag(Specs(), "o")), "-o OUT");
  EXPECT_EQ(FlagSynopsis(*FindFlag(Specs(), "timeout")), "--timeout=DURATION");
  EXPECT_EQ(FindFlag(Specs(), "missing"), nullptr);
}

}  // namespace
}  // namespace materializer::client::cli
