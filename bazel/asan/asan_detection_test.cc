// The --config=asan setup finds what it must: a heap overflow, a use after
// free (AddressSanitizer), a signed overflow (UndefinedBehaviorSanitizer)
// and a leak (LeakSanitizer, with the suppressions of .bazelrc loaded),
// each failing the program with a report naming our source line; a program
// whose allocations cross the uninstrumented protobuf and abseil libraries
// runs clean. Meaningful only under --config=asan; skipped otherwise.

#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "gtest/gtest.h"

namespace {

struct Outcome {
  int exit_code = -1;
  std::string output;
};

Outcome RunFaultProgram(const std::string& mode) {
  Outcome outcome;
  const std::string command = "bazel/asan/fault_program " + mode + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return outcome;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    outcome.output.append(buffer, n);
  }
  const int status = pclose(pipe);
  if (WIFEXITED(status)) outcome.exit_code = WEXITSTATUS(status);
  return outcome;
}

class AsanDetectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef MATERIALIZER_ASAN
    GTEST_SKIP() << "only meaningful under --config=asan";
#endif
  }

  void ExpectReported(const std::string& mode, const std::string& report) {
    const Outcome outcome = RunFaultProgram(mode);
    EXPECT_NE(outcome.exit_code, 0) << mode << ":\n" << outcome.output;
    EXPECT_NE(outcome.output.find(report), std::string::npos)
        << mode << ":\n" << outcome.output;
    // The report points at the fault, not at a library.
    EXPECT_NE(outcome.output.find("fault_program.cc"), std::string::npos)
        << mode << ":\n" << outcome.output;
  }
};

TEST_F(AsanDetectionTest, CleanProgramRunsClean) {
  const Outcome outcome = RunFaultProgram("clean");
  EXPECT_EQ(outcome.exit_code, 0) << outcome.output;
  EXPECT_EQ(outcome.output.find("Sanitizer"), std::string::npos)
      << outcome.output;
}

TEST_F(AsanDetectionTest, HeapOverflowIsReported) {
  ExpectReported("overflow", "AddressSanitizer: heap-buffer-overflow");
}

TEST_F(AsanDetectionTest, UseAfterFreeIsReported) {
  ExpectReported("use-after-free", "AddressSanitizer: heap-use-after-free");
}

TEST_F(AsanDetectionTest, SignedOverflowIsReported) {
  ExpectReported("signed-overflow", "runtime error: signed integer overflow");
}

TEST_F(AsanDetectionTest, LeakIsReported) {
  ExpectReported("leak", "LeakSanitizer: detected memory leaks");
}

}  // namespace
