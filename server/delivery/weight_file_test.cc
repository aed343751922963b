#include "server/delivery/weight_file.h"

#include <cstring>
#include <string>

#include "server/delivery/digest.h"
#include "tests/testing/status_matchers.h"

namespace materializer::delivery {
namespace {

using ::materializer::testing::StatusIs;
using spec::DType;

// A fake source: byte i of the arena is (i * 7 + 3) mod 256.
absl::Status PatternReader(uint64_t offset, uint64_t length, void* dst) {
  auto* out = static_cast<unsigned char*>(dst);
  for (uint64_t i = 0; i < length; ++i) {
    out[i] = static_cast<unsigned char>(((offset + i) * 7 + 3) & 0xff);
  }
  return absl::OkStatus();
}

std::string SourceBytes(uint64_t offset, uint64_t length) {
  std::string out(length, '\0');
  PatternReader(offset, length, out.data()).IgnoreError();
  return out;
}

SourceTensor T(const char* name, DType dtype, std::vector<int64_t> shape,
               uint64_t source_offset, int64_t group = -1) {
  SourceTensor t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  uint64_t numel = 1;
  for (int64_t s : t.shape) numel *= static_cast<uint64_t>(s);
  t.nbytes = numel * spec::ItemSize(dtype);
  t.source_offset = source_offset;
  t.group = group;
  const std::string bytes = SourceBytes(source_offset, t.nbytes);
  t.crc32 = Crc32(bytes.data(), bytes.size());
  return t;
}

std::vector<SourceTensor> Example() {
  return {T("a.weight", DType::kFloat32, {2, 3}, 0, 0),
          T("a.bias", DType::kFloat32, {3}, 256, 1),
          T("b.small", DType::kBFloat16, {3}, 512, 2),
          T("c.ids", DType::kInt64, {2}, 768, 3),
          T("d.empty", DType::kFloat32, {0}, 1024, 4),
          T("e.scalar", DType::kFloat8E4M3FN, {}, 1280, 5),
          T("tied", DType::kFloat32, {2, 3}, 0, 0)};
}

std::string Whole(const WeightFile& file) {
  std::string out;
  EXPECT_OK(file.Read(0, file.size(), PatternReader, &out));
  return out;
}

uint32_t LE32(const std::string& bytes, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[at + i]);
  return v;
}

TEST(WeightFileTest, SafetensorsEqualsTheSafetensorsFileLayout) {
  const std::vector<SourceTensor> tensors = Example();
  const WeightFile file = BuildSafetensorsWeightFile(tensors, {{"format", "pt"}});
  const std::string whole = Whole(file);
  ASSERT_EQ(whole.size(), file.size());
  // Every range holds the tensor's source bytes.
  ASSERT_EQ(file.ranges().size(), tensors.size());
  uint64_t previous_end = 0;
  for (const FileRange& range : file.ranges()) {
    const SourceTensor& t = tensors[range.input];
    EXPECT_EQ(range.name, t.name);
    EXPECT_EQ(whole.substr(range.offset, range.nbytes),
              SourceBytes(t.source_offset, t.nbytes));
    EXPECT_GE(range.offset, previous_end);  // file order
    previous_end = range.offset + range.nbytes;
  }
  EXPECT_EQ(previous_end, file.size());
}

TEST(WeightFileTest, RawAlignsEveryTensorTo64BytesWithZeroPadding) {
  const std::vector<SourceTensor> tensors = Example();
  const WeightFile file = BuildRawWeightFile(tensors);
  const std::string whole = Whole(file);
  ASSERT_EQ(file.ranges().size(), tensors.size());
  uint64_t end = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const FileRange& range = file.ranges()[i];
    EXPECT_EQ(range.input, i);
    EXPECT_EQ(range.offset % kFileAlignment, 0u);
    EXPECT_EQ(whole.substr(end, range.offset - end),
              std::string(range.offset - end, '\0'));
    EXPECT_EQ(whole.substr(range.offset, range.nbytes),
              SourceBytes(tensors[i].source_offset, tensors[i].nbytes));
    end = range.offset + range.nbytes;
  }
  EXPECT_EQ(end, file.size());
}

TEST(WeightFileTest, TorchIsAZipWithAlignedStoredEntriesAndSharedStorages) {
  const std::vector<SourceTensor> tensors = Example();
  const WeightFile file = BuildTorchWeightFile(tensors);
  const std::string whole = Whole(file);
  EXPECT_EQ(whole.substr(0, 4), "PK\x03\x04");
  // End of central directory: data.pkl, .format_version,
  // .storage_alignment, byteorder, 6 storages, version) = 11.
  const size_t eocd = whole.size() - 22;
  EXPECT_EQ(LE32(whole, eocd), 0x06054b50u);
  EXPECT_EQ(whole[eocd + 10], 11);
  EXPECT_NE(whole.find("archive/data.pkl"), std::string::npos);
  EXPECT_NE(whole.find("archive/data/5"), std::string::npos);
  EXPECT_EQ(whole.find("archive/data/6"), std::string::npos);  // tied: shared
  // Each tensor's data is aligned and holds its bytes; the tied one shares
  // its root's range.
  ASSERT_EQ(file.ranges().size(), tensors.size());
  for (const FileRange& range : file.ranges()) {
    const SourceTensor& t = tensors[range.input];
    EXPECT_EQ(range.offset % kFileAlignment, 0u) << range.name;
    EXPECT_EQ(whole.substr(range.offset, range.nbytes),
              SourceBytes(t.source_offset, t.nbytes));
  }
  EXPECT_EQ(file.ranges()[0].name, "a.weight");
  EXPECT_EQ(file.ranges()[1].name, "tied");
  EXPECT_EQ(file.ranges()[0].offset, file.ranges()[1].offset);
  // Deterministic: the same input builds the same bytes.
  EXPECT_EQ(Whole(BuildTorchWeightFile(tensors)), whole);
}

TEST(WeightFileTest, TorchUsesZip64WhenOffsetsPass4GiB) {
  // 5 GiB of source (never read): the central directory needs zip64.
  std::vector<SourceTensor> tensors = {
      T("big", DType::kUInt8, {0}, 0), T("after", DType::kFloat32, {4}, 0)};
  tensors[0].shape = {int64_t{5} << 30};
  tensors[0].nbytes = uint64_t{5} << 30;
  const WeightFile file = BuildTorchWeightFile(tensors);
  ASSERT_GT(file.size(), uint64_t{5} << 30);
  std::string tail;
  const uint64_t from = file.ranges()[1].offset + 16;
  ASSERT_OK(file.Read(from, file.size() - from, PatternReader, &tail));
  // zip64 end record, its locator, then the classic record with 0xffffffff
  // markers.
  EXPECT_NE(tail.find("PK\x06\x06"), std::string::npos);
  EXPECT_NE(tail.find("PK\x06\x07"), std::string::npos);
  const size_t eocd = tail.size() - 22;
  EXPECT_EQ(LE32(tail, eocd), 0x06054b50u);
  EXPECT_EQ(LE32(tail, eocd + 16), 0xffffffffu);
}

TEST(WeightFileTest, AnyRangeEqualsTheSameSliceOfTheWholeFile) {
  for (v1::WeightFormat format :
       {v1::WEIGHT_FORMAT_SAFETENSORS, v1::WEIGHT_FORMAT_TORCH,
        v1::WEIGHT_FORMAT_RAW}) {
    ASSERT_OK_AND_ASSIGN(WeightFile file,
                         BuildWeightFile(format, Example(), {}));
    const std::string whole = Whole(file);
    for (uint64_t offset = 0; offset <= file.size(); offset += 7) {
      for (uint64_t length : {uint64_t{0}, uint64_t{1}, uint64_t{63},
                              uint64_t{4097}, file.size() - offset}) {
        if (length > file.size() - offset) continue;
        std::string part;
        ASSERT_OK(file.Read(offset, length, PatternReader, &part));
        ASSERT_EQ(part, whole.substr(offset, length))
            << format << " " << offset << " " << length;
      }
    }
  }
}

TEST(WeightFileTest, RangePastTheEndIsOutOfRange) {
  const WeightFile file = BuildRawWeightFile(Example());
  std::string out;
  EXPECT_THAT(file.Read(file.size(), 1, PatternReader, &out),
              StatusIs(absl::StatusCode::kOutOfRange, ::testing::_));
  EXPECT_THAT(
      file.ForEachPiece(file.size() + 1, 0,
                        [](const Piece&) { return absl::OkStatus(); }),
      StatusIs(absl::StatusCode::kOutOfRange, ::testing::_));
}

TEST(WeightFileTest, UnknownFormatIsInvalidArgument) {
  EXPECT_THAT(BuildWeightFile(static_cast<v1::WeightFormat>(42), Example(), {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("unknown format 42")));
}

}  // namespace
}  // namespace materializer::delivery
