#include "server/checkpoint/torch_archive.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "server/checkpoint/test_files.h"
#include "server/delivery/digest.h"
#include "server/delivery/weight_file.h"
#include "tests/testing/status_matchers.h"

namespace materializer::checkpoint {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using spec::DType;
using testing::StateDictPickle;
using testing::TestTensor;
using testing::TestZip;
using testing::TestZipEntry;

constexpr absl::string_view kLabel = "models/pytorch_model.bin";

std::string ReadTestdata(const std::string& name) {
  std::ifstream in("server/checkpoint/testdata/" + name, std::ios::binary);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

absl::StatusOr<std::vector<CheckpointTensor>> Read(const std::string& file) {
  return ReadTorchArchive(StringFile(file), kLabel);
}

std::map<std::string, CheckpointTensor> ByName(
    const std::vector<CheckpointTensor>& tensors) {
  std::map<std::string, CheckpointTensor> out;
  for (const CheckpointTensor& t : tensors) out[t.name] = t;
  return out;
}

template <typename T, size_t N>
std::array<T, N> Values(const std::string& file, const CheckpointTensor& t) {
  std::array<T, N> out;
  EXPECT_EQ(t.nbytes, sizeof(out)) << t.name;
  std::memcpy(out.data(), file.data() + t.offset, sizeof(out));
  return out;
}

// Written by torch.save (testdata/generate.py): an OrderedDict with
// _metadata, ties, a view, a 0-d, a float8 (v3) and a Parameter.
TEST(TorchArchiveTest, ReadsWhatTorchSaveWrote) {
  const std::string file = ReadTestdata("state_dict.pt");
  ASSERT_FALSE(file.empty());
  ASSERT_OK_AND_ASSIGN(std::vector<CheckpointTensor> tensors, Read(file));
  std::vector<std::string> names;
  for (const CheckpointTensor& t : tensors) names.push_back(t.name);
  EXPECT_THAT(names, ElementsAre("linear.weight", "linear.bias",
                                 "embed.weight", "lm_head.weight", "row",
                                 "steps", "mask", "scale", "empty", "param",
                                 "column"));
  std::map<std::string, CheckpointTensor> t = ByName(tensors);
  EXPECT_EQ(t["linear.weight"].dtype, DType::kFloat32);
  EXPECT_THAT(t["linear.weight"].shape, ElementsAre(3, 2));
  EXPECT_THAT((Values<float, 6>(file, t["linear.weight"])),
              ElementsAre(0, 1, 2, 3, 4, 5));
  EXPECT_THAT((Values<float, 3>(file, t["linear.bias"])),
              ElementsAre(-1.0f, 0.5f, 2.0f));
  EXPECT_EQ(t["embed.weight"].dtype, DType::kBFloat16);
  EXPECT_THAT(t["embed.weight"].shape, ElementsAre(4, 2));
  EXPECT_EQ(file.substr(t["embed.weight"].offset, 4),
            std::string("\x80\x3f\x00\x40", 4));  // 1.0, 2.0 in bfloat16
  // Tied: the same bytes, read once.
  EXPECT_EQ(t["lm_head.weight"].offset, t["embed.weight"].offset);
  EXPECT_EQ(t["lm_head.weight"].nbytes, 16u);
  // A view of linear.weight's second row: storage offset 2 elements.
  EXPECT_EQ(t["row"].offset, t["linear.weight"].offset + 8);
  EXPECT_THAT((Values<float, 2>(file, t["row"])), ElementsAre(2, 3));
  EXPECT_EQ(t["steps"].dtype, DType::kInt64);
  EXPECT_TRUE(t["steps"].shape.empty());
  EXPECT_THAT((Values<int64_t, 1>(file, t["steps"])), ElementsAre(7));
  EXPECT_EQ(t["mask"].dtype, DType::kBool);
  EXPECT_EQ(file.substr(t["mask"].offset, 5),
            std::string("\x01\x00\x01\x01\x00", 5));
  EXPECT_EQ(t["scale"].dtype, DType::kFloat8E4M3FN);
  EXPECT_EQ(file.substr(t["scale"].offset, 4), "\x30\x38\xc0\x7e");
  EXPECT_EQ(t["empty"].nbytes, 0u);
  EXPECT_THAT(t["empty"].shape, ElementsAre(0, 3));
  EXPECT_EQ(t["param"].dtype, DType::kFloat16);
  EXPECT_EQ(file.substr(t["param"].offset, 4),
            std::string("\x00\x3e\x00\xb4", 4));  // 1.5, -0.25 in float16
  EXPECT_THAT((Values<int32_t, 4>(file, t["column"])),
              ElementsAre(0, 1, 2, 3));
  // torch.save aligns each storage to 64 bytes.
  EXPECT_EQ(t["linear.weight"].offset % 64, 0u);
}

TEST(TorchArchiveTest, ReadsPickleProtocol4AndPlainDicts) {
  const std::string file = ReadTestdata("protocol4.pt");
  ASSERT_OK_AND_ASSIGN(std::vector<CheckpointTensor> tensors, Read(file));
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_EQ(tensors[0].name, "a");
  EXPECT_THAT((Values<float, 2>(file, tensors[0])), ElementsAre(1, 2));
  EXPECT_EQ(tensors[1].name, "b");
  EXPECT_EQ(tensors[1].dtype, DType::kInt16);
  EXPECT_THAT(tensors[1].shape, ElementsAre(1, 2));
  EXPECT_THAT((Values<int16_t, 2>(file, tensors[1])), ElementsAre(3, 4));
}

TEST(TorchArchiveTest, RefusesANonContiguousTensorTorchSaveWrote) {
  EXPECT_THAT(Read(ReadTestdata("noncontiguous.pt")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(kLabel),
                             HasSubstr("tensor \"t\": not contiguous (size "
                                       "[4, 3], stride [1, 4])"))));
}

TEST(TorchArchiveTest, ReadsThroughAFileDescriptor) {
  const std::string path = ::testing::TempDir() + "/state_dict.pt";
  const std::string bytes = ReadTestdata("state_dict.pt");
  {
    std::ofstream out(path, std::ios::binary);
    out << bytes;
  }
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  absl::StatusOr<std::vector<CheckpointTensor>> from_fd =
      ReadTorchArchive(FdFile(fd, bytes.size(), std::string(kLabel)), kLabel);
  close(fd);
  ASSERT_OK_AND_ASSIGN(std::vector<CheckpointTensor> expected, Read(bytes));
  ASSERT_OK(from_fd);
  ASSERT_EQ(from_fd->size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ((*from_fd)[i].offset, expected[i].offset);
  }
}

// The server's own torch writer (server/delivery): every tensor found at
// the range the writer reports, ties sharing a storage.
TEST(TorchArchiveTest, ReadsWhatTheServersWriterWrites) {
  std::vector<delivery::SourceTensor> tensors;
  auto add = [&](std::string name, DType dtype, std::vector<int64_t> shape,
                 uint64_t source_offset, int64_t group) {
    delivery::SourceTensor t;
    t.name = std::move(name);
    t.dtype = dtype;
    t.shape = std::move(shape);
    uint64_t numel = 1;
    for (int64_t s : t.shape) numel *= static_cast<uint64_t>(s);
    t.nbytes = numel * spec::ItemSize(dtype);
    t.source_offset = source_offset;
    t.group = group;
    tensors.push_back(std::move(t));
  };
  add("wte.weight", DType::kBFloat16, {5, 4}, 0, 0);
  add("lm_head.weight", DType::kBFloat16, {5, 4}, 0, 0);  // tied
  add("ln.bias", DType::kFloat32, {4}, 256, 2);
  add("scale", DType::kFloat8E5M2, {3}, 512, 3);
  add("count", DType::kInt64, {}, 768, 4);
  auto arena_byte = [](uint64_t i) { return static_cast<char>(i * 7 + 1); };
  delivery::SourceReader arena = [&](uint64_t offset, uint64_t length,
                                     void* dst) {
    for (uint64_t i = 0; i < length; ++i) {
      static_cast<char*>(dst)[i] = arena_byte(offset + i);
    }
    return absl::OkStatus();
  };
  for (delivery::SourceTensor& t : tensors) {
    std::string bytes(t.nbytes, '\0');
    ASSERT_OK(arena(t.source_offset, t.nbytes, bytes.data()));
    t.crc32 = delivery::Crc32(bytes.data(), bytes.size());
  }
  const delivery::WeightFile written = delivery::BuildTorchWeightFile(tensors);
  std::string file;
  ASSERT_OK(written.Read(0, written.size(), arena, &file));
  ASSERT_OK_AND_ASSIGN(std::vector<CheckpointTensor> read, Read(file));
  ASSERT_EQ(read.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(read[i].name, tensors[i].name);
    EXPECT_EQ(read[i].dtype, tensors[i].dtype);
    EXPECT_EQ(read[i].shape, tensors[i].shape);
    EXPECT_EQ(read[i].nbytes, tensors[i].nbytes);
    std::string expected(tensors[i].nbytes, '\0');
    ASSERT_OK(arena(tensors[i].source_offset, tensors[i].nbytes,
                    expected.data()));
    EXPECT_EQ(file.substr(read[i].offset, read[i].nbytes), expected)
        << tensors[i].name;
  }
  EXPECT_EQ(read[0].offset, read[1].offset);
  for (const delivery::FileRange& range : written.ranges()) {
    EXPECT_EQ(read[range.input].offset, range.offset) << range.name;
  }
}

// An archive as torch.save lays it out, with the given data.pkl and
// storages.
std::string Archive(const std::string& pickle,
                    std::vector<TestZipEntry> storages,
                    const std::string& byteorder = "little") {
  std::vector<TestZipEntry> entries = {{"archive/data.pkl", pickle}};
  if (!byteorder.empty()) entries.push_back({"archive/byteorder", byteorder});
  for (TestZipEntry& e : storages) {
    e.name = "archive/data/" + e.name;
    entries.push_back(std::move(e));
  }
  entries.push_back({"archive/version", "3\n"});
  testing::TestZipOptions options;
  options.data_descriptors = true;
  options.zip64_end = true;
  return TestZip(entries, options);
}

TestTensor Floats(std::vector<int64_t> shape, std::vector<int64_t> stride,
                  int64_t storage_numel, int64_t storage_offset = 0) {
  TestTensor t;
  t.shape = std::move(shape);
  t.stride = std::move(stride);
  t.storage_numel = storage_numel;
  t.storage_offset = storage_offset;
  return t;
}

TEST(TorchArchiveTest, ReadsAHandWrittenArchive) {
  const std::string file =
      Archive(StateDictPickle({{"w", Floats({2, 1, 3}, {3, 99, 1}, 8, 2)}}),
              {{"0", std::string(32, 'x')}}, /*byteorder=*/"");
  ASSERT_OK_AND_ASSIGN(std::vector<CheckpointTensor> tensors, Read(file));
  ASSERT_EQ(tensors.size(), 1u);
  EXPECT_THAT(tensors[0].shape, ElementsAre(2, 1, 3));
  EXPECT_EQ(tensors[0].nbytes, 24u);
  EXPECT_EQ(file.substr(tensors[0].offset - 8, 32), std::string(32, 'x'));
}

TEST(TorchArchiveTest, RefusesWhatItCannotServeNamingFileAndTensor) {
  const std::string one = StateDictPickle({{"w", Floats({2}, {1}, 2)}});
  const std::string floats(8, 'f');
  TestTensor complex = Floats({2}, {1}, 2);
  complex.storage_class = "ComplexDoubleStorage";  // complex128
  TestTensor u16 = Floats({2}, {1}, 4);
  u16.v3_dtype = "uint16";
  std::string compressed = TestZip(
      {{"archive/data.pkl", one, /*method=*/8}, {"archive/data/0", floats}});
  std::string bad_crc =
      TestZip({{"archive/data.pkl", one, 0, /*bad_crc=*/true},
               {"archive/data/0", floats}});
  const std::pair<std::string, std::string> cases[] = {
      {Archive(one, {{"0", floats}}, "big"), "a big-endian archive"},
      {Archive(one, {{"0", floats}}, "middle"), "unknown byteorder"},
      {compressed, "zip entry \"archive/data.pkl\": is compressed"},
      {Archive(one, {{"0", floats, 8}}), "zip entry \"archive/data/0\": is "
                                         "compressed"},
      {bad_crc, "fails its CRC check"},
      {Archive(one, {}), "tensor \"w\": its storage \"archive/data/0\" is "
                         "not in the archive"},
      {Archive(one, {{"0", std::string(12, 'f')}}),
       "tensor \"w\": its storage \"0\" holds 12 bytes, not the 2 elements"},
      {Archive(StateDictPickle({{"w", Floats({2}, {1}, 2, 1)}}),
               {{"0", floats}}),
       "tensor \"w\": its 8 bytes at storage offset 1 pass the end"},
      {Archive(StateDictPickle({{"w", Floats({2}, {1}, 2, -1)}}),
               {{"0", floats}}),
       "a negative storage offset"},
      {Archive(StateDictPickle({{"w", Floats({2, 2}, {1, 2}, 4)}}),
               {{"0", std::string(16, 'f')}}),
       "tensor \"w\": not contiguous (size [2, 2], stride [1, 2])"},
      {Archive(StateDictPickle({{"w", Floats({-2}, {1}, 2)}}),
               {{"0", floats}}),
       "a negative size"},
      {Archive(StateDictPickle({{"c", complex}}), {{"0", floats}}),
       "tensor \"c\": storage class \"torch.ComplexDoubleStorage\" is of a "
       "dtype the service does not hold"},
      {Archive(StateDictPickle({{"u", u16}}), {{"0", std::string(4, 'u')}}),
       "tensor \"u\": dtype \"torch.uint16\" is one the service does not "
       "hold"},
      {Archive(testing::TestPickle()
                   .Op('}').Op('(').String("model").Op('}').Op('u').Finish(),
               {}),
       "archive/data.pkl: tensor \"model\": is a dict, not a tensor"},
      {TestZip({{"archive/constants.pkl", "x"}}), "a TorchScript archive"},
      {TestZip({{"data.pkl", one}}), "is not in a folder"},
      {TestZip({}), "an empty zip archive"},
      {one, "the legacy torch.save format"},
      {"hello, world", "not a torch.save archive"},
  };
  for (const auto& [file, reason] : cases) {
    EXPECT_THAT(Read(file),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(kLabel), HasSubstr(reason))))
        << reason;
  }
}

}  // namespace
}  // namespace materializer::checkpoint
