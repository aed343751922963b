#include "client/export_import.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>

#include <ATen/ops/equal.h>
#include <ATen/ops/tensor.h>

#include "absl/strings/str_cat.h"
#include "client/export_torch.h"
#include "tests/testing/mount_namespace.h"
#include "tests/testing/status_matchers.h"

namespace materializer::client {
namespace {

using ::materializer::testing::HugeMappedBytes;
using ::materializer::testing::kNoMountNamespace;
using ::materializer::testing::RunInMountNamespace;
using ::materializer::testing::StatusIs;

// A file laid out like an exported arena: float32 [0, 1, 2, 3] at 0 and
// int64 [7] at 256.
std::string WriteArena(const std::string& name) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/", name, ".arena");
  std::string bytes(512, '\0');
  const float values[4] = {0, 1, 2, 3};
  std::memcpy(bytes.data(), values, sizeof(values));
  const int64_t seven = 7;
  std::memcpy(bytes.data() + 256, &seven, sizeof(seven));
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  EXPECT_EQ(::write(fd, bytes.data(), bytes.size()),
            static_cast<ssize_t>(bytes.size()));
  ::close(fd);
  return path;
}

v1::ExportResponse Response(const std::string& path) {
  v1::ExportResponse response;
  response.set_export_id("x-test");
  response.mutable_shared_memory()->set_path(path);
  response.set_arena_bytes(512);
  v1::ExportedTensor* w = response.add_tensors();
  w->set_name("w");
  w->set_dtype("float32");
  w->add_shape(2);
  w->add_shape(2);
  w->set_offset(0);
  w->set_nbytes(16);
  v1::ExportedTensor* n = response.add_tensors();
  n->set_name("n");
  n->set_dtype("int64");
  n->set_offset(256);
  n->set_nbytes(8);
  return response;
}

TEST(ExportImportTest, MapsTheFileAndViewsTensorsWithoutCopying) {
  const std::string path = WriteArena("views");
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<const ExportImport> import,
                       ExportImport::Open(Response(path)));
  ASSERT_EQ(import->tensors().size(), 2u);
  EXPECT_EQ(import->tensors()[1].data,
            static_cast<char*>(import->data()) + 256);

  ASSERT_OK_AND_ASSIGN(auto tensors, ViewAsTensors(import));
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_EQ(tensors[0].first, "w");
  EXPECT_TRUE(at::equal(tensors[0].second,
                        at::tensor({0.f, 1.f, 2.f, 3.f}).reshape({2, 2})));
  EXPECT_EQ(tensors[0].second.data_ptr(), import->data());
  EXPECT_EQ(tensors[1].second.dim(), 0);
  EXPECT_EQ(tensors[1].second.item<int64_t>(), 7);

  // The views keep the mapping alive after the caller drops the import,
  // and after the file is gone.
  import.reset();
  ::unlink(path.c_str());
  EXPECT_EQ(tensors[1].second.item<int64_t>(), 7);
}

// Whether some open file other than a fresh one of ours holds a flock on
// `path`: the server's test for "an importer still maps it".
bool LockedByAnImporter(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0);
  const bool locked = ::flock(fd, LOCK_EX | LOCK_NB) != 0;
  ::close(fd);
  return locked;
}

TEST(ExportImportTest, TheFilesAreLockedWhileAnyViewMapsThem) {
  for (const bool writable : {false, true}) {
    SCOPED_TRACE(writable ? "copy-on-write" : "read-only");
    const std::string path = WriteArena("locked");
    EXPECT_FALSE(LockedByAnImporter(path));
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<const ExportImport> import,
                         ExportImport::Open(Response(path), writable));
    EXPECT_TRUE(LockedByAnImporter(path));
    ASSERT_OK_AND_ASSIGN(auto tensors, ViewAsTensors(import));
    import.reset();
    EXPECT_TRUE(LockedByAnImporter(path));  // the views still map it
    tensors.clear();
    EXPECT_FALSE(LockedByAnImporter(path));
  }
}

TEST(ExportImportTest, WritableImportIsCopyOnWrite) {
  const std::string path = WriteArena("cow");
  ASSERT_OK_AND_ASSIGN(auto writable, ExportImport::Open(Response(path), true));
  ASSERT_OK_AND_ASSIGN(auto tensors, ViewAsTensors(writable));
  tensors[0].second.fill_(5);
  ASSERT_OK_AND_ASSIGN(auto fresh, ExportImport::Open(Response(path)));
  float first = -1;
  std::memcpy(&first, fresh->data(), sizeof(first));
  EXPECT_EQ(first, 0.f);  // the file is unchanged
}

TEST(ExportImportTest, ReleasedExportIsNotFound) {
  EXPECT_THAT(ExportImport::Open(Response("/dev/shm/materializer-gone")),
              StatusIs(absl::StatusCode::kNotFound,
                       ::testing::HasSubstr("was its handle released?")));
}

TEST(ExportImportTest, TensorOutsideTheArenaIsDataLoss) {
  const std::string path = WriteArena("outside");
  v1::ExportResponse response = Response(path);
  response.mutable_tensors(1)->set_offset(508);
  EXPECT_THAT(ExportImport::Open(response),
              StatusIs(absl::StatusCode::kDataLoss,
                       ::testing::HasSubstr("lies outside")));
}

// A file of `bytes` bytes, byte i = (i + seed) mod 251.
std::string WritePattern(const std::string& name, size_t bytes, int seed) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/", name, ".segment");
  std::string data(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>((i + seed) % 251);
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  EXPECT_EQ(::write(fd, data.data(), data.size()),
            static_cast<ssize_t>(data.size()));
  ::close(fd);
  return path;
}

// An arena of several files (a server with a shared-memory pool): mapped
// back to back, so a tensor across the boundary reads both files' bytes.
TEST(ExportImportTest, SegmentsAreMappedBackToBack) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const std::string first = WritePattern("first", page, 0);
  const std::string second = WritePattern("second", 300, 7);
  v1::ExportResponse response;
  response.set_export_id("x-segments");
  v1::SharedMemoryExport* shm = response.mutable_shared_memory();
  shm->set_path(first);
  v1::SharedMemorySegment* a = shm->add_segments();
  a->set_path(first);
  a->set_offset(0);
  a->set_bytes(page);
  v1::SharedMemorySegment* b = shm->add_segments();
  b->set_path(second);
  b->set_offset(page);
  b->set_bytes(300);
  response.set_arena_bytes(page + 300);
  v1::ExportedTensor* t = response.add_tensors();
  t->set_name("across");
  t->set_dtype("uint8");
  t->add_shape(16);
  t->set_offset(page - 8);
  t->set_nbytes(16);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<const ExportImport> import,
                       ExportImport::Open(response));
  const auto* bytes = static_cast<const unsigned char*>(import->tensors()[0].data);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(bytes[i], (page - 8 + i) % 251) << i;      // end of the first
    EXPECT_EQ(bytes[8 + i], (i + 7) % 251) << 8 + i;     // start of the second
  }
  // Segments that leave a gap, or do not add up to the arena, are refused.
  b->set_offset(page * 2);
  EXPECT_THAT(ExportImport::Open(response),
              StatusIs(absl::StatusCode::kDataLoss, ::testing::HasSubstr("expected")));
  b->set_offset(page);
  response.set_arena_bytes(page + 400);
  EXPECT_THAT(ExportImport::Open(response),
              StatusIs(absl::StatusCode::kDataLoss, ::testing::HasSubstr("cover")));
}

// A server whose --shm_dir is a huge-page tmpfs exports files with 2 MiB
// pages; the import maps its segments into a range reserved on a 2 MiB
// boundary, so they are mapped with 2 MiB entries (mapped at an address
// aligned otherwise than the file offset, they would get 4 KiB ones). The
// tmpfs is mounted in a child's mount namespace.
TEST(ExportImportTest, SegmentsInAHugePageTmpfsAreMappedWithHugePages) {
  const int result = RunInMountNamespace([] {
    char dir[] = "/tmp/export_huge_XXXXXX";
    if (::mkdtemp(dir) == nullptr) return 78;
    if (::mount("tmpfs", dir, "tmpfs", 0, "size=32m,huge=always") != 0) {
      return kNoMountNamespace;
    }
    // 4 MiB, then 2 MiB and 12 KiB: an arena size the kernel would not
    // place on a 2 MiB boundary by itself.
    constexpr uint64_t kMiB = uint64_t{1} << 20;
    const uint64_t sizes[2] = {4 * kMiB, 2 * kMiB + 3 * 4096};
    v1::ExportResponse response;
    response.set_export_id("x-huge");
    v1::SharedMemoryExport* shm = response.mutable_shared_memory();
    uint64_t offset = 0;
    for (int i = 0; i < 2; ++i) {
      const std::string path = absl::StrCat(dir, "/segment-", i);
      const std::string bytes(sizes[i], static_cast<char>(i + 1));
      const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY, 0600);
      if (fd < 0 || ::write(fd, bytes.data(), bytes.size()) !=
                        static_cast<ssize_t>(bytes.size())) {
        return 79;
      }
      ::close(fd);
      v1::SharedMemorySegment* segment = shm->add_segments();
      segment->set_path(path);
      segment->set_offset(offset);
      segment->set_bytes(sizes[i]);
      offset += sizes[i];
    }
    shm->set_path(shm->segments(0).path());
    response.set_arena_bytes(offset);
    int code = 0;
    {
      absl::StatusOr<std::shared_ptr<const ExportImport>> import =
          ExportImport::Open(response);
      if (!import.ok()) {
        code = 1;
      } else {
        // Read every page, as a trainer's first pass does.
        const auto* data = static_cast<const volatile char*>((*import)->data());
        int sum = 0;
        for (uint64_t at = 0; at < offset; at += 4096) sum += data[at];
        const uint64_t huge = HugeMappedBytes(
            (*import)->data(), static_cast<const char*>((*import)->data()) + offset);
        if (sum == 0) code = 2;
        else if (huge < 6 * kMiB) code = 3;
      }
    }
    ::umount2(dir, MNT_DETACH);
    ::rmdir(dir);
    return code;
  });
  if (result == kNoMountNamespace) GTEST_SKIP() << "no mount namespace here";
  ASSERT_LT(result, 128) << "the child died of signal " << result - 128;
  EXPECT_EQ(result, 0)
      << "1: not imported; 2: read zeros; 3: under 6 MiB mapped with 2 MiB "
         "pages";
}

}  // namespace
}  // namespace materializer::client
