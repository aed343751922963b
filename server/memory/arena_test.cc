#include "server/memory/arena.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"

#include "server/memory/arena_views.h"
#include "tests/testing/mount_namespace.h"
#include "tests/testing/status_matchers.h"

namespace materializer::memory {
namespace {

using ::materializer::testing::HugeMappedBytes;
using ::materializer::testing::kNoMountNamespace;
using ::materializer::testing::RunInMountNamespace;
using ::materializer::testing::StatusIs;
using spec::DType;
using spec::TensorDesc;

TensorDesc Desc(const char* name, std::vector<int64_t> shape, DType dtype) {
  TensorDesc t;
  t.name = name;
  t.shape = std::move(shape);
  t.dtype = dtype;
  t.numel = 1;
  for (int64_t s : t.shape) t.numel *= static_cast<uint64_t>(s);
  t.nbytes = t.numel * spec::ItemSize(dtype);
  return t;
}

std::unique_ptr<DevicePool> CpuPool(uint64_t capacity) {
  DeviceConfig cpu;
  cpu.name = "cpu";
  cpu.capacity_bytes = capacity;
  return DevicePool::Create({cpu}).value();
}

TEST(ArenaTest, ViewsShareOneAllocationAtTheLayoutOffsets) {
  auto pool = CpuPool(1 << 20);
  const std::vector<TensorDesc> tensors = {
      Desc("w", {3, 5}, DType::kFloat32), Desc("b", {5}, DType::kBFloat16),
      Desc("n", {0}, DType::kInt64), Desc("s", {}, DType::kFloat64)};
  ASSERT_OK_AND_ASSIGN(spec::Layout layout, spec::ComputeLayout(tensors));
  ASSERT_OK_AND_ASSIGN(Reservation r,
                       pool->Reserve("alice", "cpu", layout.arena_bytes));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Arena> arena,
                       Arena::Allocate(std::move(r), tensors, layout));

  ASSERT_NE(arena->host_data(), nullptr);
  EXPECT_EQ(arena->bytes(), layout.arena_bytes);
  ASSERT_EQ(arena->num_tensors(), 4u);
  const ArenaTensors& views = arena->tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& v = views.views[i];
    EXPECT_TRUE(v.is_contiguous());
    EXPECT_EQ(v.sizes().vec(), tensors[i].shape);
    EXPECT_EQ(v.nbytes(), tensors[i].nbytes);
    if (tensors[i].nbytes > 0) {
      EXPECT_EQ(static_cast<const std::byte*>(v.const_data_ptr()),
                arena->host_data() + layout.offsets[i]);
    }
  }
  EXPECT_EQ(views.views[0].scalar_type(), at::kFloat);
  EXPECT_EQ(views.views[1].scalar_type(), at::kBFloat16);

  // Fresh pages: every byte reads as zero before init writes anything.
  std::vector<unsigned char> bytes(arena->bytes(), 0xff);
  ASSERT_OK(arena->CopyToHost(0, bytes.size(), bytes.data()));
  for (unsigned char b : bytes) ASSERT_EQ(b, 0);

  // Writes through a view land at its offset in the arena.
  views.views[0].fill_(2.5);
  float value = 0;
  ASSERT_OK(arena->CopyToHost(layout.offsets[0] + 4 * 14, 4, &value));
  EXPECT_EQ(value, 2.5f);

  EXPECT_THAT(arena->CopyToHost(arena->bytes() - 2, 4, &value),
              StatusIs(absl::StatusCode::kOutOfRange, ::testing::_));
  EXPECT_EQ(pool->Snapshot().devices[0].usage.in_use_bytes,
            layout.arena_bytes);
}

TEST(ArenaTest, DestroyingTheArenaFreesTheLedger) {
  auto pool = CpuPool(1 << 24);
  const std::vector<TensorDesc> tensors = {Desc("w", {1024, 1024}, DType::kFloat32)};
  ASSERT_OK_AND_ASSIGN(spec::Layout layout, spec::ComputeLayout(tensors));
  {
    ASSERT_OK_AND_ASSIGN(Reservation r,
                         pool->Reserve("alice", "auto", layout.arena_bytes));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Arena> arena,
                         Arena::Allocate(std::move(r), tensors, layout));
    EXPECT_EQ(pool->Snapshot().total.in_use_bytes, 4u << 20);
  }
  const PoolSnapshot s = pool->Snapshot();
  EXPECT_EQ(s.total.in_use_bytes, 0u);
  EXPECT_EQ(s.total.reserved_bytes, 0u);
  EXPECT_EQ(s.total.handles, 0u);
}

TEST(ArenaTest, EmptyModelGetsAnEmptyArena) {
  auto pool = CpuPool(0);
  ASSERT_OK_AND_ASSIGN(spec::Layout layout, spec::ComputeLayout({}));
  ASSERT_OK_AND_ASSIGN(Reservation r, pool->Reserve("alice", "cpu", 0));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Arena> arena,
                       Arena::Allocate(std::move(r), {}, layout));
  EXPECT_EQ(arena->bytes(), 0u);
  EXPECT_EQ(arena->num_tensors(), 0u);
}

TEST(ArenaTest, ReservationSmallerThanLayoutIsRefusedAndRolledBack) {
  auto pool = CpuPool(1 << 20);
  const std::vector<TensorDesc> tensors = {Desc("w", {1000}, DType::kFloat32)};
  ASSERT_OK_AND_ASSIGN(spec::Layout layout, spec::ComputeLayout(tensors));
  ASSERT_OK_AND_ASSIGN(Reservation r, pool->Reserve("alice", "cpu", 16));
  EXPECT_THAT(Arena::Allocate(std::move(r), tensors, layout).status(),
              StatusIs(absl::StatusCode::kInternal, ::testing::_));
  EXPECT_EQ(pool->Snapshot().total.reserved_bytes, 0u);
}

// Pages of [data, data + bytes) that are resident, by mincore.
uint64_t ResidentPages(const std::byte* data, uint64_t bytes) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in_core((bytes + page - 1) / page);
  if (mincore(const_cast<std::byte*>(data), bytes, in_core.data()) != 0) {
    return 0;
  }
  uint64_t n = 0;
  for (unsigned char c : in_core) n += c & 1;
  return n;
}

// Init writes the arena right after Allocate: its pages are already there
// (populated on the allocating threads), for private and shared arenas.
TEST(ArenaTest, PagesAreResidentBeforeInitWrites) {
  for (bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "shared memory" : "anonymous");
    auto pool = CpuPool(uint64_t{1} << 30);
    const std::vector<TensorDesc> tensors = {
        Desc("w", {64, 1024, 1024}, DType::kUInt8)};  // 64 MiB
    ASSERT_OK_AND_ASSIGN(spec::Layout layout, spec::ComputeLayout(tensors));
    ASSERT_OK_AND_ASSIGN(Reservation r,
                         pool->Reserve("alice", "cpu", layout.arena_bytes));
    ArenaOptions options;
    options.shared_memory = shared;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Arena> arena,
                         Arena::Allocate(std::move(r), tensors, layout, options));
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    EXPECT_EQ(ResidentPages(arena->host_data(), arena->bytes()),
              arena->bytes() / page);
    // And they read as zeros.
    const std::byte* p = arena->host_data();
    EXPECT_TRUE(p[0] == std::byte{0} && p[arena->bytes() - 1] == std::byte{0});
  }
}

// With a pool, a shared arena is the pool's resident files mapped back to
// back (the last one cut to what is left), plus a fresh file when the pool
// runs short. Each segment's file holds exactly its arena bytes: what init
// writes through the arena is what a reader of the files sees.
TEST(ArenaTest, SharedArenaFromPoolSlabsIsTheFilesBackToBack) {
  char dir[] = "/dev/shm/arena_pool_test_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  // Removed however the test ends (a failed assertion returns early).
  struct RemoveDir {
    const char* dir;
    ~RemoveDir() {
      if (system((std::string("rm -rf ") + dir).c_str()) != 0) {}
    }
  } remove_dir{dir};
  constexpr uint64_t kSlab = uint64_t{1} << 20;
  struct Case {
    uint64_t pool_slabs;
    int64_t bytes;
    size_t segments;  // expected
    size_t pooled;    // of them from the pool
  };
  // 3.5 slabs: 3 whole, the half is cut from a 4th. 3.1 slabs: the tenth
  // is fresh. Pool of 2 for 3.5 slabs: 2 pooled, the rest fresh. A small
  // arena: fresh, the pool untouched.
  const Case cases[] = {{8, 3 * kSlab + kSlab / 2, 4, 4},
                        {8, 3 * kSlab + kSlab / 10, 4, 3},
                        {2, 3 * kSlab + kSlab / 2, 3, 2},
                        {8, 4096 * 3, 1, 0}};
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.bytes << " bytes, pool of "
                                      << c.pool_slabs);
    SharedMemoryPool::Options pool_options;
    pool_options.target_bytes = c.pool_slabs * kSlab;
    pool_options.slab_bytes = kSlab;
    pool_options.dir = dir;
    pool_options.quiet = absl::ZeroDuration();
    SharedMemoryPool shm_pool(pool_options);
    ASSERT_TRUE(shm_pool.WaitUntilFull(absl::Seconds(30)));
    auto pool = CpuPool(uint64_t{1} << 30);
    const std::vector<TensorDesc> tensors = {
        Desc("w", {c.bytes}, DType::kUInt8)};
    ASSERT_OK_AND_ASSIGN(spec::Layout layout, spec::ComputeLayout(tensors));
    ASSERT_OK_AND_ASSIGN(Reservation r,
                         pool->Reserve("alice", "cpu", layout.arena_bytes));
    ArenaOptions options;
    options.shared_memory = true;
    options.shared_memory_pool = &shm_pool;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Arena> arena,
                         Arena::Allocate(std::move(r), tensors, layout, options));
    EXPECT_EQ(shm_pool.stats().taken_bytes_total, c.pooled * kSlab);
    const std::vector<SharedMemorySegment>& segments =
        arena->shared_memory_segments();
    ASSERT_EQ(segments.size(), c.segments);
    EXPECT_EQ(ResidentPages(arena->host_data(), arena->bytes()),
              (arena->bytes() + page - 1) / page);
    // Zero, then a pattern written through the arena (as init does).
    std::byte* data = const_cast<std::byte*>(arena->host_data());
    bool zero = true;
    for (uint64_t i = 0; i < arena->bytes(); ++i) zero &= data[i] == std::byte{0};
    EXPECT_TRUE(zero);
    for (uint64_t i = 0; i < arena->bytes(); ++i) {
      data[i] = static_cast<std::byte>((i * 7 + i / 4096) & 0xFF);
    }
    uint64_t covered = 0;
    std::vector<std::string> paths;
    for (const SharedMemorySegment& s : segments) {
      EXPECT_EQ(s.offset, covered);
      covered += s.bytes;
      paths.push_back(s.path);
      const int fd = open(s.path.c_str(), O_RDONLY | O_CLOEXEC);
      ASSERT_GE(fd, 0) << s.path;
      struct stat st;
      ASSERT_EQ(fstat(fd, &st), 0);
      EXPECT_EQ(static_cast<uint64_t>(st.st_size), s.bytes) << s.path;
      EXPECT_EQ(st.st_mode & 0777, 0600u);
      std::vector<std::byte> read_back(s.bytes);
      ASSERT_EQ(pread(fd, read_back.data(), s.bytes, 0),
                static_cast<ssize_t>(s.bytes));
      close(fd);
      EXPECT_EQ(std::memcmp(read_back.data(), data + s.offset, s.bytes), 0)
          << s.path;
    }
    EXPECT_EQ(covered, arena->bytes());
    arena.reset();
    for (const std::string& path : paths) {
      EXPECT_NE(access(path.c_str(), F_OK), 0) << path << " outlived its arena";
    }
    EXPECT_EQ(pool->Snapshot().total.reserved_bytes, 0u);
  }
}

// A shared arena larger than what its directory can hold is refused with
// RESOURCE_EXHAUSTED when it is allocated, and leaves no file: never a
// SIGBUS when init first writes a page. The directory is a 1 MiB tmpfs in
// a mount namespace of a child process (user namespaces where unprivileged).
TEST(ArenaTest, SharedArenaOverAFullTmpfsIsRefusedNotASigbus) {
  const int result = RunInMountNamespace([] {
    char dir[] = "/tmp/arena_full_XXXXXX";
    if (mkdtemp(dir) == nullptr) return 78;
    if (mount("tmpfs", dir, "tmpfs", 0, "size=1m") != 0) return kNoMountNamespace;
    auto pool = CpuPool(uint64_t{1} << 30);
    const std::vector<TensorDesc> tensors = {
        Desc("w", {8, 1024, 1024}, DType::kUInt8)};  // 8 MiB
    absl::StatusOr<spec::Layout> layout = spec::ComputeLayout(tensors);
    absl::StatusOr<Reservation> r =
        pool->Reserve("alice", "cpu", layout->arena_bytes);
    ArenaOptions options;
    options.shared_memory = true;
    options.shared_memory_dir = dir;
    absl::StatusOr<std::unique_ptr<Arena>> arena =
        Arena::Allocate(std::move(*r), tensors, *layout, options);
    int code = 0;
    if (arena.ok()) code = 1;
    else if (arena.status().code() != absl::StatusCode::kResourceExhausted) code = 2;
    else if (arena.status().message().find(dir) == std::string::npos) code = 3;
    else if (pool->Snapshot().total.reserved_bytes != 0) code = 4;
    // The file went with the error.
    else if (system((std::string("test -z \"$(ls -A ") + dir + ")\"").c_str()) != 0) code = 5;
    umount(dir);
    rmdir(dir);
    return code;
  });
  if (result == kNoMountNamespace) GTEST_SKIP() << "no mount namespace here";
  ASSERT_LT(result, 128) << "the child died of signal " << result - 128;
  EXPECT_EQ(result, 0)
      << "1: allocated; 2: another code; 3: the message lacks the directory; "
         "4: the reservation stayed; 5: the file stayed";
}

// In a tmpfs mounted huge=always, a shared arena's whole 2 MiB pieces are
// mapped with 2 MiB pages, both from a fresh file and from the pool's
// slabs: its range starts on a 2 MiB boundary. (Mapped anywhere else, the
// same files get 4 KiB entries.) The tmpfs is mounted in a child's mount
// namespace.
TEST(ArenaTest, SharedArenaInAHugePageTmpfsIsMappedWithHugePages) {
  const int result = RunInMountNamespace([] {
    char dir[] = "/tmp/arena_huge_XXXXXX";
    if (mkdtemp(dir) == nullptr) return 78;
    if (mount("tmpfs", dir, "tmpfs", 0, "size=96m,huge=always") != 0) return kNoMountNamespace;
    int code = 0;
    // 9 MiB and 12 KiB: four whole huge pages, and a tail. An odd size, so
    // that no reservation lands on a 2 MiB boundary by chance.
    constexpr int64_t kBytes = (int64_t{9} << 20) + 3 * 4096;
    for (int pooled = 0; pooled < 2 && code == 0; ++pooled) {
      SharedMemoryPool::Options pool_options;
      pool_options.target_bytes = uint64_t{16} << 20;
      pool_options.slab_bytes = uint64_t{4} << 20;
      pool_options.dir = dir;
      pool_options.quiet = absl::ZeroDuration();
      std::unique_ptr<SharedMemoryPool> shm_pool;
      if (pooled) {
        shm_pool = std::make_unique<SharedMemoryPool>(pool_options);
        if (!shm_pool->WaitUntilFull(absl::Seconds(30))) code = 10;
      }
      auto pool = CpuPool(uint64_t{1} << 30);
      const std::vector<TensorDesc> tensors = {Desc("w", {kBytes}, DType::kUInt8)};
      absl::StatusOr<spec::Layout> layout = spec::ComputeLayout(tensors);
      absl::StatusOr<Reservation> r =
          pool->Reserve("alice", "cpu", layout->arena_bytes);
      ArenaOptions options;
      options.shared_memory = true;
      options.shared_memory_dir = dir;
      options.shared_memory_pool = shm_pool.get();
      absl::StatusOr<std::unique_ptr<Arena>> arena =
          Arena::Allocate(std::move(*r), tensors, *layout, options);
      if (code != 0) {
      } else if (!arena.ok()) {
        code = 1 + 10 * pooled;
      } else if (pooled && (*arena)->shared_memory_segments().size() != 3) {
        code = 2 + 10 * pooled;  // not from the pool's slabs
      } else {
        const std::byte* data = (*arena)->host_data();
        const uint64_t huge = HugeMappedBytes(data, data + (*arena)->bytes());
        if (huge < (uint64_t{8} << 20)) code = 3 + 10 * pooled;
      }
    }
    umount(dir);
    rmdir(dir);
    return code;
  });
  if (result == kNoMountNamespace) GTEST_SKIP() << "no mount namespace here";
  ASSERT_LT(result, 128) << "the child died of signal " << result - 128;
  EXPECT_EQ(result, 0)
      << "x1: refused; 12: not from the slabs; x3: under 8 MiB mapped with "
         "2 MiB pages (x = 0 fresh file, 1 pool)";
}

}  // namespace
}  // namespace materializer::memory
