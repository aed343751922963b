#include "server/checkpoint/safetensors_header.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "tests/testing/status_matchers.h"

namespace materializer::checkpoint {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using spec::DType;

constexpr absl::string_view kLabel = "models/m.safetensors";

// The 8-byte little-endian length of `header`, the header, then `data`.
std::string File(const std::string& header, const std::string& data) {
  std::string out;
  for (int i = 0; i < 8; ++i) {
    out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  }
  return out + header + data;
}

absl::StatusOr<std::vector<CheckpointTensor>> Read(
    const std::string& file, SafetensorsMetadata* metadata = nullptr) {
  return ReadSafetensorsTensors(StringFile(file), kLabel, metadata);
}

std::string ReadTestdata(const std::string& name) {
  std::ifstream in("server/checkpoint/testdata/" + name, std::ios::binary);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

TEST(SafetensorsHeaderTest, ReadsTensorsInFileOrderWithAbsoluteOffsets) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],)"
      R"("data_offsets":[2,10]},"a\"b\\c":{"dtype":"BF16","shape":[],)"
      R"("data_offsets":[0,2]},"\u00e9":{"dtype":"I64","shape":[0,3],)"
      R"("data_offsets":[10,10]}}    )";
  SafetensorsMetadata metadata;
  ASSERT_OK_AND_ASSIGN(std::vector<CheckpointTensor> tensors,
                       Read(File(header, std::string(10, 'x')), &metadata));
  const uint64_t data_start = 8 + header.size();
  ASSERT_EQ(tensors.size(), 3u);
  EXPECT_EQ(tensors[0].name, "a\"b\\c");
  EXPECT_EQ(tensors[0].dtype, DType::kBFloat16);
  EXPECT_TRUE(tensors[0].shape.empty());
  EXPECT_EQ(tensors[0].offset, data_start);
  EXPECT_EQ(tensors[0].nbytes, 2u);
  EXPECT_EQ(tensors[1].name, "w");
  EXPECT_EQ(tensors[1].dtype, DType::kFloat32);
  EXPECT_THAT(tensors[1].shape, ElementsAre(2));
  EXPECT_EQ(tensors[1].offset, data_start + 2);
  EXPECT_EQ(tensors[1].nbytes, 8u);
  EXPECT_EQ(tensors[2].name, "\xc3\xa9");
  EXPECT_THAT(tensors[2].shape, ElementsAre(0, 3));
  EXPECT_EQ(tensors[2].nbytes, 0u);
  ASSERT_EQ(metadata.size(), 1u);
  EXPECT_EQ(metadata[0].first, "format");
  EXPECT_EQ(metadata[0].second, "pt");
}

// Empty tensors share an offset; their order must not follow the order of the
// JSON members (a header written again in another order reads the same).
TEST(SafetensorsHeaderTest, OrdersEmptyTensorsAtOneOffsetByName) {
  const std::string a = R"("wn":{"dtype":"F16","shape":[0,3],"data_offsets":[8,8]})";
  const std::string b = R"("<\n":{"dtype":"F16","shape":[0],"data_offsets":[8,8]})";
  const std::string c = R"("x":{"dtype":"U8","shape":[1],"data_offsets":[8,9]})";
  const std::string d = R"("m":{"dtype":"I64","shape":[],"data_offsets":[0,8]})";
  for (const std::string& header :
       {"{" + a + "," + b + "," + c + "," + d + "}",
        "{" + d + "," + c + "," + b + "," + a + "}"}) {
    ASSERT_OK_AND_ASSIGN(std::vector<CheckpointTensor> tensors,
                         Read(File(header, std::string(9, 'x'))));
    ASSERT_EQ(tensors.size(), 4u) << header;
    EXPECT_EQ(tensors[0].name, "m");
    EXPECT_EQ(tensors[1].name, "<\n") << header;
    EXPECT_EQ(tensors[2].name, "wn") << header;
    EXPECT_EQ(tensors[3].name, "x");
  }
}

// Written by safetensors.torch.save_file (testdata/generate.py).
TEST(SafetensorsHeaderTest, ReadsAFileTheSafetensorsLibraryWrote) {
  const std::string file = ReadTestdata("tiny.safetensors");
  ASSERT_FALSE(file.empty());
  SafetensorsMetadata metadata;
  ASSERT_OK_AND_ASSIGN(std::vector<CheckpointTensor> tensors,
                       Read(file, &metadata));
  ASSERT_EQ(tensors.size(), 3u);
  std::map<std::string, const CheckpointTensor*> by_name;
  for (const CheckpointTensor& t : tensors) by_name[t.name] = &t;
  const CheckpointTensor& a = *by_name.at("a");
  EXPECT_EQ(a.dtype, DType::kInt64);
  EXPECT_THAT(a.shape, ElementsAre(2, 2));
  int64_t a_values[4];
  std::memcpy(a_values, file.data() + a.offset, sizeof(a_values));
  EXPECT_THAT(a_values, ElementsAre(1, 2, 3, 4));
  const CheckpointTensor& b = *by_name.at("b");
  EXPECT_EQ(b.dtype, DType::kFloat32);
  float b_values[3];
  std::memcpy(b_values, file.data() + b.offset, sizeof(b_values));
  EXPECT_THAT(b_values, ElementsAre(1.0f, 2.0f, 3.0f));
  const CheckpointTensor& h = *by_name.at("h");
  EXPECT_EQ(h.dtype, DType::kBFloat16);
  EXPECT_EQ(file.substr(h.offset, 2), std::string("\x00\x3f", 2));  // 0.5
  EXPECT_EQ(tensors.back().offset + tensors.back().nbytes, file.size());
  ASSERT_EQ(metadata.size(), 1u);
  EXPECT_EQ(metadata[0].second, "pt");
}

TEST(SafetensorsHeaderTest, RefusesBadHeadersNamingFileAndTensor) {
  const std::string f32 = R"({"dtype":"F32","shape":[2],"data_offsets":)";
  struct Case {
    std::string header;
    size_t data;
    std::string reason;
  };
  const Case cases[] = {
      {R"({"a":)" + f32 + R"([0,8]},"b":)" + f32 + "[4,12]}}", 12,
       "tensor \"b\": data_offsets [4, 12] overlap tensor \"a\"'s [0, 8]"},
      {R"({"a":)" + f32 + "[0,8]}}", 4,
       "tensor \"a\": data_offsets [0, 8] run past the end of the 4-byte "
       "data section"},
      {R"({"a":)" + f32 + "[0,4]}}", 4,
       "tensor \"a\": data_offsets [0, 4] hold 4 bytes, but F32 of shape "
       "[2] is 8 bytes"},
      {R"({"a":{"dtype":"U16","shape":[2],"data_offsets":[0,4]}})", 4,
       "tensor \"a\": dtype \"U16\" is unknown to the service"},
      {R"({"a":)" + f32 + R"([0,8]},"a":)" + f32 + "[0,8]}}", 8,
       "duplicate key \"a\""},
      {R"({"a":)" + f32 + "[4,12]}}", 12, "leave a gap of 4 bytes"},
      {R"({"a":)" + f32 + "[0,8]}}", 9, "bytes after the last tensor"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8,
       "tensor \"a\": unknown field \"x\""},
      {R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", 8,
       "tensor \"a\": lacks shape"},
      {R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}})", 8,
       "tensor \"a\": shape[0] is a non-integer"},
      {R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8,
       "tensor \"a\": shape[0] is negative"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8,
       "end before they begin"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}})", 8,
       "more than 2 values"},
      {R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],)"
       R"("data_offsets":[0,8]}})",
       8, "tensor \"a\": shape has 2^63 bytes or more"},
      {R"({"__metadata__":{"k":1}})", 0, "__metadata__ \"k\" is not a string"},
      {R"({"a":[]})", 0, "tensor \"a\": is not an object"},
      {R"( {})", 0, "does not start with '{'"},
      {"{\"a\x01\":1}", 0, "JSON byte 3: unescaped control character"},
      {"{} x", 0, "text after the JSON value"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(Read(File(c.header, std::string(c.data, 'x'))),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(kLabel), HasSubstr(c.reason))))
        << c.header;
  }
}

TEST(SafetensorsHeaderTest, RefusesTruncatedFilesAndHeaderLengths) {
  const std::string file = ReadTestdata("tiny.safetensors");
  ASSERT_GT(file.size(), 16u);
  // Cut inside the data: the last tensor runs past the end.
  EXPECT_THAT(Read(file.substr(0, file.size() - 1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("run past the end")));
  // Cut inside the header.
  EXPECT_THAT(Read(file.substr(0, 20)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("passes the end of a 20-byte file")));
  EXPECT_THAT(Read(file.substr(0, 5)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("too short")));
  // A header length past the format's limit, in a file that long: refused
  // before anything is read or allocated.
  std::string huge(8, '\0');
  const uint64_t length = kMaxSafetensorsHeaderBytes + 1;
  for (int i = 0; i < 8; ++i) huge[i] = static_cast<char>(length >> (8 * i));
  EXPECT_THAT(ParseSafetensorsHeader("", length, length + 8, kLabel),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("more than the format's limit of "
                                 "100000000 bytes")));
  EXPECT_THAT(Read(huge), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("limit")));
}

TEST(SafetensorsHeaderTest, ReadsThroughAFileDescriptor) {
  const std::string file = ReadTestdata("tiny.safetensors");
  const std::string path =
      std::string(std::getenv("TEST_TMPDIR")) + "/fd.safetensors";
  {
    std::ofstream out(path, std::ios::binary);
    out << file;
  }
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  absl::StatusOr<std::vector<CheckpointTensor>> from_fd =
      ReadSafetensorsTensors(fd, file.size(), kLabel);
  close(fd);
  ASSERT_OK_AND_ASSIGN(std::vector<CheckpointTensor> expected, Read(file));
  ASSERT_OK(from_fd);
  ASSERT_EQ(from_fd->size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ((*from_fd)[i].name, expected[i].name);
    EXPECT_EQ((*from_fd)[i].offset, expected[i].offset);
  }
}

}  // namespace
}  // namespace materializer::checkpoint
