#include "client/cli/matctl_main.h"

#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/command.h"
#include "client/cli/exit_code.h"
#include "client/cli/hints.h"
#include "client/cli/usage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace materializer::client::cli {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

struct Outcome {
  int code;
  std::string out;
  std::string err;
};

Outcome Matctl(std::vector<std::string> args,
               std::map<std::string, std::string> env = {}) {
  std::ostringstream out;
  std::ostringstream err;
  const int code = MatctlMain(
      args,
      [env](const char* name) -> std::optional<std::string> {
        auto it = env.find(name);
        if (it == env.end()) return std::nullopt;
        return it->second;
      },
      out, err);
  return Outcome{code, out.str(), err.str()};
}

bool IsGlobal(const std::string& name) {
  for (const char* global : GlobalFlags()) {
    if (name == global) return true;
  }
  return false;
}

TEST(TablesTest, EveryFlagIsDeclaredOnceAndUsed) {
  std::set<std::string> names;
  for (const FlagSpec& spec : FlagTable()) {
    EXPECT_TRUE(names.insert(spec.name).second) << spec.name;
    EXPECT_STRNE(spec.help, "") << spec.name;
  }
  for (const char* global : GlobalFlags()) {
    EXPECT_NE(FindFlag(FlagTable(), global), nullptr) << global;
  }
  std::set<std::string> used;
  std::set<std::string> commands;
  for (const Command& command : Commands()) {
    EXPECT_TRUE(commands.insert(command.name).second) << command.name;
    for (const char* flag : command.flags) {
      EXPECT_NE(FindFlag(FlagTable(), flag), nullptr)
          << command.name << " --" << flag;
      EXPECT_FALSE(IsGlobal(flag)) << command.name << " --" << flag;
      used.insert(flag);
    }
    for (const char* flag : command.required) {
      EXPECT_NE(std::find(command.flags.begin(), command.flags.end(),
                          std::string(flag)),
                command.flags.end())
          << command.name << " requires --" << flag << " it does not take";
    }
  }
  for (const FlagSpec& spec : FlagTable()) {
    EXPECT_TRUE(IsGlobal(spec.name) || used.count(spec.name) > 0)
        << "--" << spec.name << " belongs to no command";
  }
}

TEST(HelpTest, MainUsageListsCommandsFlagsVariablesAndExitCodes) {
  const Outcome run = Matctl({"--help"});
  EXPECT_EQ(run.code, 0);
  EXPECT_THAT(run.err, IsEmpty());
  for (const Command& command : Commands()) {
    EXPECT_THAT(run.out, HasSubstr(absl::StrCat("  ", command.name)));
  }
  for (const char* global : GlobalFlags()) {
    EXPECT_THAT(run.out, HasSubstr(absl::StrCat("--", global)));
  }
  EXPECT_THAT(run.out, HasSubstr("MATERIALIZER_TOKEN_FILE"));
  EXPECT_THAT(run.out, HasSubstr("[env MATERIALIZER_SERVER]"));
  for (const ExitCodeRow& row : ExitCodeTable()) {
    EXPECT_THAT(run.out, HasSubstr(absl::StrCat("  ", row.code, "  ")));
  }
  EXPECT_EQ(Matctl({"help"}).out, run.out);
  EXPECT_EQ(Matctl({"-h"}).out, run.out);
}

TEST(HelpTest, EachCommandHasItsOwn) {
  for (const Command& command : Commands()) {
    const Outcome run = Matctl({command.name, "--help"});
    EXPECT_EQ(run.code, 0) << command.name;
    EXPECT_THAT(run.out, HasSubstr(CommandSynopsis(command).substr(0, 30)));
    EXPECT_EQ(Matctl({"help", command.name}).out, run.out) << command.name;
  }
  const Outcome fetch = Matctl({"fetch", "--help"});
  EXPECT_THAT(fetch.out, AllOf(HasSubstr("-o OUT"), HasSubstr("--resume"),
                               HasSubstr("--fetch_timeout"),
                               Not(HasSubstr("--importer_device_uuid")),
                               Not(HasSubstr("materialize FILE"))));
  // Help wins over a broken command line.
  EXPECT_EQ(Matctl({"fetch", "--bogus", "--help"}).out, fetch.out);
}

TEST(UsageErrorTest, ExitTwoWithTheReasonAndTheSynopsis) {
  struct Case {
    std::vector<std::string> args;
    const char* reason;
  };
  const std::vector<Case> cases = {
      {{}, "no command given"},
      {{"frobnicate"}, "unknown command \"frobnicate\""},
      {{"ls", "--frob"}, "unknown flag --frob"},
      {{"ls", "--all"}, "--all does not apply to ls"},
      {{"describe"}, "describe takes 1 argument (got 0)"},
      {{"ls", "extra"}, "ls takes no arguments (got 1)"},
      {{"fetch", "h-1"}, "fetch needs -o OUT"},
      {{"ls", "--output=yaml"}, "--output must be table, json, not \"yaml\""},
      {{"fetch", "h-1", "-o", "x", "--chunk_bytes=5GiB"},
       "--chunk_bytes is at most 4294967295 bytes"},
      {{"ls", "--tls_key=k.pem"}, "give both --tls_cert and --tls_key"},
  };
  for (const Case& c : cases) {
    const Outcome run = Matctl(c.args);
    EXPECT_EQ(run.code, kExitUsage) << c.reason;
    EXPECT_THAT(run.err, HasSubstr(c.reason));
    EXPECT_THAT(run.out, IsEmpty());
  }
  EXPECT_THAT(Matctl({"describe"}).err,
              HasSubstr("usage: matctl [FLAGS] describe HANDLE [--all]"));
}

TEST(UsageErrorTest, ATokenWithoutTlsIsRefusedWithoutShowingIt) {
  constexpr char kToken[] = "tok-never-print-me-0123456789";
  const Outcome run =
      Matctl({"ls", "--verbose"}, {{"MATERIALIZER_TOKEN", kToken}});
  EXPECT_EQ(run.code, kExitUsage);
  EXPECT_THAT(run.err, HasSubstr("the token from MATERIALIZER_TOKEN is sent "
                                 "only over TLS"));
  EXPECT_THAT(run.err + run.out, Not(HasSubstr(kToken)));
}

TEST(UnreachableTest, NoServerIsUnavailableWithAHint) {
  // Port 1 on loopback: nothing listens there in a test sandbox.
  const Outcome run = Matctl({"--server=127.0.0.1:1", "--timeout=10s", "ls"});
  EXPECT_EQ(run.code, kExitUnavailable);
  EXPECT_THAT(run.err, AllOf(HasSubstr("matctl: UNAVAILABLE: "),
                             HasSubstr("hint: no server answered at "
                                       "127.0.0.1:1. Is materializerd "
                                       "running there?")));
}

TEST(HintForTest, TheFirstProblemsPeopleMeet) {
  ClientOptions plain;
  ClientOptions tls;
  tls.security.tls_ca_file = "ca.pem";
  ClientOptions token = tls;
  token.security.token = "tok-secret-0123456789";
  token.security.token_source = "MATERIALIZER_TOKEN";

  EXPECT_THAT(HintFor(absl::UnauthenticatedError("missing bearer token"), tls),
              HasSubstr("the server wants an identity"));
  EXPECT_THAT(
      HintFor(absl::UnauthenticatedError("bearer token not recognised"), token),
      AllOf(HasSubstr("did not accept the token from MATERIALIZER_TOKEN"),
            Not(HasSubstr("tok-secret"))));
  EXPECT_THAT(HintFor(absl::UnavailableError(
                          "failed to connect to all addresses; last error: "
                          "UNKNOWN: ipv4:127.0.0.1:5: Ssl handshake failed: "
                          "SSL_ERROR_SSL: error:0A00010B:SSL "
                          "routines::wrong version number"),
                      tls),
              HasSubstr("does not seem to speak TLS"));
  EXPECT_THAT(HintFor(absl::UnavailableError(
                          "failed to connect to all addresses; last error: "
                          "UNKNOWN: ipv4:127.0.0.1:5: Ssl handshake failed: "
                          "SSL_ERROR_SSL: error:0A000086:SSL "
                          "routines::certificate verify failed"),
                      tls),
              HasSubstr("must chain to ca.pem (--tls_ca)"));
  const absl::Status closed = absl::UnavailableError(
      "failed to connect to all addresses; last error: UNAVAILABLE: "
      "ipv4:127.0.0.1:5: Socket closed");
  EXPECT_THAT(HintFor(closed, tls),
              HasSubstr("probably requires a client certificate"));
  EXPECT_THAT(HintFor(closed, plain),
              HasSubstr("if it uses TLS, give --tls_ca"));
  EXPECT_THAT(HintFor(absl::UnavailableError(
                          "replica r2 (127.0.0.1:7) did not answer: failed to "
                          "connect to all addresses"),
                      plain),
              HasSubstr("one replica is not answering"));
  EXPECT_THAT(HintFor(absl::UnavailableError(
                          "no replica at a:1,b:2 answered: a:1 did not answer "
                          "(Connection refused)"),
                      plain),
              HasSubstr("no server answered at"));
  EXPECT_EQ(HintFor(absl::NotFoundError("handle h-1 not found"), plain), "");
}

TEST(HintForTest, AClientCertificateWithoutATokenIsToldToAddAToken) {
  ClientOptions mtls;
  mtls.security.tls_ca_file = "ca.pem";
  mtls.security.tls_cert_file = "me.pem";
  mtls.security.tls_key_file = "me.key";
  const std::string hint =
      HintFor(absl::UnauthenticatedError("missing bearer token: send metadata "
                                         "\"authorization: Bearer <token>\""),
              mtls);
  EXPECT_THAT(hint, AllOf(HasSubstr("took the client certificate"),
                          HasSubstr("give --token_file"),
                          Not(HasSubstr("--tls_cert"))));
}

TEST(HintForTest, SomeReplicasSilentNamesThemNotEveryAddress) {
  ClientOptions several;
  several.target = "127.0.0.1:5,127.0.0.1:6";
  const absl::Status one = WithSilentReplicas(
      absl::UnavailableError("the server at 127.0.0.1:6: failed to connect "
                             "to all addresses; Connection refused"),
      {"the server at 127.0.0.1:6"});
  const std::string hint = HintFor(one, several);
  EXPECT_THAT(hint, AllOf(HasSubstr("the server at 127.0.0.1:6 did not "
                                    "answer, while the other replicas did"),
                          Not(HasSubstr("no server answered")),
                          Not(HasSubstr("127.0.0.1:5"))));
  const absl::Status two = WithSilentReplicas(
      absl::DeadlineExceededError("..."),
      {"replica r1 (10.0.0.2:50051)", "replica r2 (10.0.0.3:50051)"});
  EXPECT_THAT(HintFor(two, several),
              HasSubstr("replica r1 (10.0.0.2:50051), replica r2 "
                        "(10.0.0.3:50051) did not answer"));
  // Without the mark (nobody answered) the plain hint stays.
  EXPECT_THAT(HintFor(absl::UnavailableError("failed to connect to all "
                                             "addresses"),
                      several),
              HasSubstr("no server answered at 127.0.0.1:5,127.0.0.1:6"));
  EXPECT_TRUE(WithSilentReplicas(absl::OkStatus(), {"x"}).ok());
}

}  // namespace
}  // namespace materializer::client::cli
