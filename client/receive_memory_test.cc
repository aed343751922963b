#include "client/receive_memory.h"

#include <sys/resource.h>

#include <cstdlib>
#include <cstring>

#include "gtest/gtest.h"

namespace materializer::client {
namespace {

long MinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Page faults taken to allocate and fill `bytes`, then free them.
long FaultsToFill(size_t bytes) {
  const long before = MinorFaults();
  char* block = static_cast<char*>(std::malloc(bytes));
  std::memset(block, 1, bytes);
  // Keeps the compiler from dropping the allocation and the fill.
  asm volatile("" : : "r"(block) : "memory");
  const long after = MinorFaults();
  std::free(block);
  return after - before;
}

TEST(ReceiveMemoryTest, AFreedReceiveBufferIsReusedWithoutPageFaults) {
  // What a fetch does per message: allocate a buffer of a few MiB, fill
  // it, free it. With glibc's defaults the first buffer is mapped and
  // unmapped, the second comes from newly grown heap: each pays a fault
  // per 4 KiB page (4,096 for 16 MiB). Kept, the second is free of them.
#if defined(MATERIALIZER_ASAN) || defined(MATERIALIZER_TSAN)
  GTEST_SKIP() << "the sanitizer's allocator replaces glibc's";
#endif
  ASSERT_TRUE(KeepReceiveBuffers());
  constexpr size_t kBuffer = 16 << 20;
  FaultsToFill(kBuffer);
  EXPECT_LT(FaultsToFill(kBuffer), 64);
  EXPECT_LT(FaultsToFill(kBuffer), 64);
}

}  // namespace
}  // namespace materializer::client
