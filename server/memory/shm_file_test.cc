#include "server/memory/shm_file.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/mount_namespace.h"
#include "tests/testing/status_matchers.h"

namespace materializer::memory {
namespace {

using ::materializer::testing::kNoMountNamespace;
using ::materializer::testing::RunInMountNamespace;
using ::materializer::testing::StatusIs;
using ::testing::HasSubstr;

// From 2 MiB up, the range starts on a 2 MiB boundary whatever its size,
// and the padding reserved to get there is given back.
TEST(ReserveAddressSpaceTest, StartsOnAHugePageBoundaryAndKeepsNoSlack) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  for (uint64_t bytes :
       {page, kHugePageBytes - page, kHugePageBytes, kHugePageBytes + page,
        9 * kHugePageBytes + 3 * page}) {
    SCOPED_TRACE(bytes);
    // Several times: a broken alignment would otherwise pass by luck.
    for (int i = 0; i < 8; ++i) {
      std::byte* range = ReserveAddressSpace(bytes);
      ASSERT_NE(range, nullptr);
      if (bytes >= kHugePageBytes) {
        EXPECT_EQ(reinterpret_cast<uintptr_t>(range) % kHugePageBytes, 0u);
        // The padding past the range was given back. (Below 2 MiB there
        // is none: the kernel may place the range against a neighbour.)
        void* after =
            mmap(range + bytes, page, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        EXPECT_EQ(after, static_cast<void*>(range + bytes));
        if (after != MAP_FAILED) munmap(after, page);
      }
      EXPECT_EQ(munmap(range, bytes), 0);
    }
  }
}

TEST(InspectSharedMemoryDirTest, RefusesWhatIsNotAWritableTmpfsDirectory) {
  EXPECT_THAT(InspectSharedMemoryDir("/nonexistent/materializer-shm"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("/nonexistent/materializer-shm")));
  EXPECT_THAT(InspectSharedMemoryDir("/proc"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("/proc: not on a tmpfs")));
  char file[] = "/dev/shm/shm_file_test_XXXXXX";
  const int fd = mkstemp(file);
  ASSERT_GE(fd, 0);
  close(fd);
  EXPECT_THAT(InspectSharedMemoryDir(file),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not a directory")));
  unlink(file);
}

std::string SystemWideShmemSetting() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string line;
  std::getline(in, line);
  return line;
}

// Two tmpfs mounts in a child's mount namespace, one with huge pages: the
// huge= option of the mount that holds the directory is what counts.
TEST(InspectSharedMemoryDirTest, ReadsTheHugeOptionOfTheMountHoldingIt) {
  const std::string system_wide = SystemWideShmemSetting();
  if (system_wide.find("[deny]") != std::string::npos ||
      system_wide.find("[force]") != std::string::npos) {
    GTEST_SKIP() << "shmem_enabled overrides every mount: " << system_wide;
  }
  const int result = RunInMountNamespace([] {
    char huge[] = "/tmp/shm_huge_XXXXXX";
    char plain[] = "/tmp/shm_plain_XXXXXX";
    if (mkdtemp(huge) == nullptr || mkdtemp(plain) == nullptr) return 78;
    if (mount("tmpfs", huge, "tmpfs", 0, "size=8m,huge=within_size") != 0 ||
        mount("tmpfs", plain, "tmpfs", 0, "size=1m") != 0) {
      return kNoMountNamespace;
    }
    const std::string below = std::string(huge) + "/arenas";
    int code = 0;
    if (mkdir(below.c_str(), 0700) != 0) code = 79;
    absl::StatusOr<SharedMemoryDirInfo> in_huge = InspectSharedMemoryDir(below);
    absl::StatusOr<SharedMemoryDirInfo> in_plain =
        InspectSharedMemoryDir(plain);
    if (code != 0) {
    } else if (!in_huge.ok() || !in_plain.ok()) {
      code = 1;
    } else if (in_huge->mount_point != huge || in_plain->mount_point != plain) {
      code = 2;
    } else if (in_huge->huge != "within_size" || !in_huge->huge_pages) {
      code = 3;
    } else if (in_plain->huge != "never" || in_plain->huge_pages) {
      code = 4;
    }
    umount(huge);
    umount(plain);
    rmdir(huge);
    rmdir(plain);
    return code;
  });
  if (result == kNoMountNamespace) GTEST_SKIP() << "no mount namespace here";
  ASSERT_LT(result, 128) << "the child died of signal " << result - 128;
  EXPECT_EQ(result, 0)
      << "1: refused; 2: wrong mount point; 3: the huge mount not seen as "
         "huge; 4: the plain mount seen as huge";
}

}  // namespace
}  // namespace materializer::memory
