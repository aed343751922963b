#include "server/memory/arena.h"

#include <cstring>

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

}  // namespace
}  // namespace materializer::memory
