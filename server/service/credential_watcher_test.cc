#include "server/service/credential_watcher.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics/metrics.h"
#include "tests/testing/status_matchers.h"

namespace materializer::service {
namespace {

using ::materializer::testing::IsOk;
using ::materializer::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

void WriteFile(const std::string& path, const std::string& text) {
  // Written beside and renamed, as a careful operator (or Kubernetes) does.
  const std::string temporary = path + ".new";
  std::ofstream(temporary, std::ios::binary | std::ios::trunc) << text;
  ASSERT_EQ(std::rename(temporary.c_str(), path.c_str()), 0);
}

// A fake owner: takes contents that start with "good", refuses others, and
// remembers what is in force. Thread-safe.
class Owner {
 public:
  absl::StatusOr<std::string> Apply(const std::vector<std::string>& contents) {
    absl::MutexLock lock(&mu_);
    ++calls_;
    for (const std::string& text : contents) {
      if (text.rfind("good", 0) != 0) {
        return absl::InvalidArgumentError(absl::StrCat("bad: ", text));
      }
    }
    in_force_ = contents;
    return absl::StrCat(contents.size(), " files");
  }
  std::vector<std::string> in_force() {
    absl::MutexLock lock(&mu_);
    return in_force_;
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> in_force_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

class CredentialWatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(
        ::testing::TempDir(), "/watcher-", getpid(), "-",
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_EQ(::system(absl::StrCat("mkdir -p '", dir_, "'").c_str()), 0);
    a_ = dir_ + "/a";
    b_ = dir_ + "/b";
    WriteFile(a_, "good a0");
    WriteFile(b_, "good b0");
  }

  CredentialSource Source() {
    CredentialSource source;
    source.kind = "certificate";
    source.paths = {a_, b_};
    source.in_force = {"good a0", "good b0"};
    source.apply = [this](const std::vector<std::string>& contents) {
      return owner_.Apply(contents);
    };
    return source;
  }

  // The value of the reload counter for `result` in `metrics`.
  static int Reloads(const metrics::Metrics& metrics, const char* result) {
    const std::string text = metrics.TextFormat();
    const std::string key =
        absl::StrCat("materializer_credential_reloads_total{kind=\"",
                     "certificate\",result=\"", result, "\"} ");
    const size_t at = text.find(key);
    if (at == std::string::npos) return -1;
    return std::atoi(text.c_str() + at + key.size());
  }

  std::string dir_, a_, b_;
  Owner owner_;
};

TEST_F(CredentialWatcherTest, AppliesAChangeOnceTwoPollsAgree) {
  metrics::Metrics metrics;
  CredentialWatcher watcher({Source()}, absl::ZeroDuration(), &metrics);
  watcher.PollOnce();
  EXPECT_EQ(owner_.calls(), 0);  // nothing changed
  WriteFile(a_, "good a1");
  watcher.PollOnce();
  EXPECT_EQ(owner_.calls(), 0);  // seen once: maybe half written
  WriteFile(b_, "good b1");
  watcher.PollOnce();
  EXPECT_EQ(owner_.calls(), 0);  // changed again since
  watcher.PollOnce();
  EXPECT_EQ(owner_.calls(), 1);
  EXPECT_THAT(owner_.in_force(), ElementsAre("good a1", "good b1"));
  watcher.PollOnce();
  EXPECT_EQ(owner_.calls(), 1);  // in force: nothing to do
  EXPECT_EQ(Reloads(metrics, "ok"), 1);
  EXPECT_EQ(Reloads(metrics, "error"), 0);
}

TEST_F(CredentialWatcherTest, RefusedContentsAreReportedOnceAndKeepTheOld) {
  metrics::Metrics metrics;
  CredentialWatcher watcher({Source()}, absl::ZeroDuration(), &metrics);
  WriteFile(a_, "corrupt");
  for (int i = 0; i < 5; ++i) watcher.PollOnce();
  EXPECT_EQ(owner_.calls(), 1);
  EXPECT_EQ(Reloads(metrics, "error"), 1);
  EXPECT_TRUE(owner_.in_force().empty());  // the fake keeps the start-up set
  // Fixed: applied.
  WriteFile(a_, "good a2");
  watcher.PollOnce();
  watcher.PollOnce();
  EXPECT_THAT(owner_.in_force(), ElementsAre("good a2", "good b0"));
  EXPECT_EQ(Reloads(metrics, "ok"), 1);
  // Back to the contents in force at start: a change like any other.
  WriteFile(a_, "good a0");
  watcher.PollOnce();
  watcher.PollOnce();
  EXPECT_THAT(owner_.in_force(), ElementsAre("good a0", "good b0"));
  EXPECT_EQ(Reloads(metrics, "ok"), 2);
}

TEST_F(CredentialWatcherTest, AMissingFileIsRefusedUntilItIsBack) {
  metrics::Metrics metrics;
  CredentialWatcher watcher({Source()}, absl::ZeroDuration(), &metrics);
  ASSERT_EQ(std::remove(b_.c_str()), 0);
  watcher.PollOnce();
  watcher.PollOnce();
  watcher.PollOnce();
  EXPECT_EQ(owner_.calls(), 0);  // never handed to the owner
  EXPECT_EQ(Reloads(metrics, "error"), 1);
  WriteFile(b_, "good b0");  // as in force: nothing to apply
  watcher.PollOnce();
  watcher.PollOnce();
  EXPECT_EQ(owner_.calls(), 0);
  EXPECT_EQ(Reloads(metrics, "ok"), 0);
}

TEST_F(CredentialWatcherTest, ReloadNowAppliesAtOnceAndReportsRefusalsAgain) {
  metrics::Metrics metrics;
  CredentialWatcher watcher({Source()}, absl::ZeroDuration(), &metrics);
  EXPECT_THAT(watcher.ReloadNow(), IsOk());  // unchanged
  EXPECT_EQ(owner_.calls(), 0);
  WriteFile(a_, "good a3");
  EXPECT_THAT(watcher.ReloadNow(), IsOk());
  EXPECT_THAT(owner_.in_force(), ElementsAre("good a3", "good b0"));
  WriteFile(b_, "broken");
  EXPECT_THAT(watcher.ReloadNow(), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("bad: broken")));
  EXPECT_THAT(watcher.ReloadNow(), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("bad: broken")));
  EXPECT_EQ(Reloads(metrics, "ok"), 1);
  EXPECT_EQ(Reloads(metrics, "error"), 2);
  EXPECT_THAT(owner_.in_force(), ElementsAre("good a3", "good b0"));
}

TEST_F(CredentialWatcherTest, ThePollingThreadAppliesChangesAndStops) {
  metrics::Metrics metrics;
  CredentialWatcher watcher({Source()}, absl::Milliseconds(5), &metrics);
  WriteFile(a_, "good a4");
  // Reloads on request race the thread's polls; each change is applied
  // exactly once whoever finds it.
  std::thread sighup([&] {
    for (int i = 0; i < 20; ++i) {
      watcher.ReloadNow().IgnoreError();
      absl::SleepFor(absl::Milliseconds(1));
    }
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (owner_.in_force() != std::vector<std::string>{"good a4", "good b0"} &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  sighup.join();
  EXPECT_THAT(owner_.in_force(), ElementsAre("good a4", "good b0"));
  EXPECT_EQ(owner_.calls(), 1);
  EXPECT_EQ(Reloads(metrics, "ok"), 1);
  watcher.Stop();
  watcher.Stop();
}

}  // namespace
}  // namespace materializer::service
