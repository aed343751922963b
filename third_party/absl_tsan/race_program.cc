// A small program for tsan_detection_test: two threads share data either
// through abseil's synchronization ("synchronized") or not at all ("race":
// an int; "function_race": a std::function one thread assigns while the
// other calls it). Under --config=tsan the first must run clean and the
// others must be reported, which shows that the annotations make abseil's
// edges visible, and tsan.supp's entries for gRPC's tags leave our own
// std::function races reported.

#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace {

absl::Mutex mu;
int guarded = 0;    // under mu
int published = 0;  // written before Notify, read after the wait
int unguarded = 0;  // written by both threads with nothing between them
// Assigned by one thread and called by the other with nothing between them.
std::function<int()> unguarded_function = [] { return 1; };
int function_result = 0;
std::atomic<int> started{0};

void StartTogether() {
  started.fetch_add(1, std::memory_order_relaxed);
  while (started.load(std::memory_order_relaxed) < 2) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool race = argc > 1 && std::strcmp(argv[1], "race") == 0;
  const bool function_race =
      argc > 1 && std::strcmp(argv[1], "function_race") == 0;
  absl::Notification ready;
  auto work = [&](bool writer) {
    StartTogether();
    for (int i = 0; i < 1000; ++i) {
      absl::MutexLock lock(&mu);
      ++guarded;
    }
    if (writer) {
      published = 42;
      ready.Notify();
    } else {
      ready.WaitForNotification();
      if (published != 42) std::abort();
    }
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(
          +[](int* n) { return *n >= 2000; }, &guarded));
    }
    if (race) ++unguarded;
    if (function_race) {
      if (writer) {
        unguarded_function = [] { return 2; };
      } else {
        function_result = unguarded_function();
      }
    }
  };
  std::thread a(work, true), b(work, false);
  a.join();
  b.join();
  std::printf("guarded=%d\n", guarded);
  return guarded == 2000 ? 0 : 1;
}
