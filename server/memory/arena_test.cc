#include "server/memory/arena.h"

#include <sched.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "server/memory/arena_views.h"
#include "tests/testing/status_matchers.h"

namespace materializer::memory {
namespace {

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

// A shared arena larger than what its directory can hold is refused with
// RESOURCE_EXHAUSTED when it is allocated, and leaves no file: never a
// SIGBUS when init first writes a page. The directory is a 1 MiB tmpfs in
// a mount namespace of a child process (user namespaces where unprivileged).
TEST(ArenaTest, SharedArenaOverAFullTmpfsIsRefusedNotASigbus) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (unshare(CLONE_NEWNS) != 0 && unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
      _exit(77);  // no namespaces here: skipped
    }
    mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr);
    char dir[] = "/tmp/arena_full_XXXXXX";
    if (mkdtemp(dir) == nullptr) _exit(78);
    if (mount("tmpfs", dir, "tmpfs", 0, "size=1m") != 0) _exit(77);
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
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal "
                                 << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "no mount namespace here";
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "1: allocated; 2: another code; 3: the message lacks the directory; "
         "4: the reservation stayed; 5: the file stayed";
}

}  // namespace
}  // namespace materializer::memory
