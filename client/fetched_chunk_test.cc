#include "client/fetched_chunk.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"
#include "materializer/v1/materializer.pb.h"
#include "tests/testing/status_matchers.h"

namespace materializer::client {
namespace {

using ::materializer::testing::StatusIs;

// `bytes` as a ByteBuffer of slices cut at `cuts` (sorted offsets).
grpc::ByteBuffer Cut(const std::string& bytes, std::vector<size_t> cuts) {
  std::vector<grpc::Slice> slices;
  size_t begin = 0;
  cuts.push_back(bytes.size());
  for (size_t end : cuts) {
    slices.emplace_back(bytes.data() + begin, end - begin);
    begin = end;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

v1::WeightChunk Sample() {
  v1::WeightChunk chunk;
  chunk.set_offset(1 << 20);
  chunk.set_data(std::string(1000, 'x') + std::string(1000, 'y'));
  chunk.set_total_bytes(5 << 20);
  chunk.set_digest("xxh3-128:00112233445566778899aabbccddeeff");
  v1::TensorDigest* entry = chunk.add_tensor_digests();
  entry->set_name("layer.0.weight");
  entry->set_digest("xxh3-64:0011223344556677");
  return chunk;
}

TEST(FetchedChunkTest, PayloadAcrossSlicesIsViewedNotCopied) {
  const std::string bytes = Sample().SerializeAsString();
  // Cuts inside the header, inside the payload and after it.
  const grpc::ByteBuffer buffer = Cut(bytes, {1, 5, 700, 1500, 2010});
  FetchedChunk chunk;
  ASSERT_OK(chunk.Parse(buffer));
  EXPECT_EQ(chunk.offset(), 1u << 20);
  EXPECT_EQ(chunk.total_bytes(), 5u << 20);
  EXPECT_EQ(chunk.digest(), Sample().digest());
  ASSERT_EQ(chunk.fields().tensor_digests_size(), 1);
  EXPECT_EQ(chunk.fields().tensor_digests(0).name(), "layer.0.weight");
  EXPECT_TRUE(chunk.fields().data().empty());
  EXPECT_EQ(chunk.data_size(), 2000u);
  EXPECT_EQ(chunk.CopyData(), Sample().data());
  // The payload crosses two cuts: three pieces, each inside a slice of
  // the buffer (no copy).
  EXPECT_EQ(chunk.pieces().size(), 3u);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(buffer.Dump(&slices).ok());
  for (absl::string_view piece : chunk.pieces()) {
    bool inside = false;
    for (const grpc::Slice& slice : slices) {
      const char* begin = reinterpret_cast<const char*>(slice.begin());
      inside |= piece.data() >= begin &&
                piece.data() + piece.size() <= begin + slice.size();
    }
    EXPECT_TRUE(inside) << "a piece of " << piece.size() << " bytes";
  }
}

TEST(FetchedChunkTest, ParsingAgainStartsOver) {
  FetchedChunk chunk;
  ASSERT_OK(chunk.Parse(Cut(Sample().SerializeAsString(), {})));
  v1::WeightChunk empty;
  empty.set_total_bytes(7);
  ASSERT_OK(chunk.Parse(Cut(empty.SerializeAsString(), {})));
  EXPECT_EQ(chunk.total_bytes(), 7u);
  EXPECT_EQ(chunk.offset(), 0u);
  EXPECT_EQ(chunk.data_size(), 0u);
  EXPECT_TRUE(chunk.pieces().empty());
  EXPECT_EQ(chunk.fields().tensor_digests_size(), 0);
}

TEST(FetchedChunkTest, MalformedIsDataLoss) {
  const std::string bytes = Sample().SerializeAsString();
  FetchedChunk chunk;
  // Cut off inside the payload.
  EXPECT_THAT(chunk.Parse(Cut(bytes.substr(0, 1500), {100})),
              StatusIs(absl::StatusCode::kDataLoss,
                       ::testing::HasSubstr("runs past the message")));
  // A group (wire type 3).
  EXPECT_THAT(chunk.Parse(Cut(std::string("\x33\x34", 2), {})),
              StatusIs(absl::StatusCode::kDataLoss,
                       ::testing::HasSubstr("wire type 3")));
  // A varint of eleven bytes.
  EXPECT_THAT(chunk.Parse(Cut("\x08" + std::string(10, '\xff') + "\x01", {})),
              StatusIs(absl::StatusCode::kDataLoss, ::testing::_));
}

// Differential: on mutated encodings cut into random slices, FetchedChunk
// accepts exactly what protobuf's parser accepts (except groups, which it
// refuses by design) and reads the same fields and payload.
TEST(FetchedChunkTest, AgreesWithProtobufOnMutatedInput) {
  std::mt19937_64 random(20261205);
  auto below = [&](size_t n) {
    return n == 0 ? size_t{0} : static_cast<size_t>(random() % n);
  };
  int both_accepted = 0;
  int both_refused = 0;
  int groups = 0;
  for (int round = 0; round < 20000; ++round) {
    v1::WeightChunk original;
    original.set_offset(random() >> below(64));
    original.set_data(std::string(below(300), static_cast<char>(round)));
    original.set_total_bytes(random() >> below(64));
    if (below(2)) original.set_digest("xxh3-128:" + std::to_string(round));
    for (size_t i = below(3); i > 0; --i) {
      original.add_tensor_digests()->set_name(std::to_string(i));
    }
    std::string bytes = original.SerializeAsString();
    // A second copy of some fields (the last `data` must win).
    if (below(4) == 0) bytes += Sample().SerializeAsString();
    for (size_t m = below(4); m > 0 && !bytes.empty(); --m) {
      switch (below(4)) {
        case 0:
          bytes[below(bytes.size())] = static_cast<char>(random());
          break;
        case 1:
          bytes.resize(below(bytes.size()));
          break;
        case 2:
          bytes.insert(below(bytes.size()), 1, static_cast<char>(random()));
          break;
        default:
          bytes.erase(below(bytes.size()), 1);
          break;
      }
    }
    std::vector<size_t> cuts;
    for (size_t c = below(5); c > 0; --c) cuts.push_back(below(bytes.size()));
    std::sort(cuts.begin(), cuts.end());

    v1::WeightChunk expected;
    const bool protobuf_ok = expected.ParseFromString(bytes);
    FetchedChunk chunk;
    const absl::Status status = chunk.Parse(Cut(bytes, cuts));
    if (!protobuf_ok) {
      EXPECT_THAT(status, StatusIs(absl::StatusCode::kDataLoss, ::testing::_))
          << "round " << round;
      ++both_refused;
      continue;
    }
    if (!status.ok()) {
      EXPECT_TRUE(absl::StrContains(status.message(), "wire type 3") ||
                  absl::StrContains(status.message(), "wire type 4"))
          << "round " << round << ": " << status << " on "
          << absl::BytesToHexString(bytes);
      ++groups;
      continue;
    }
    ++both_accepted;
    EXPECT_EQ(chunk.CopyData(), expected.data()) << "round " << round;
    EXPECT_EQ(chunk.data_size(), expected.data().size());
    expected.clear_data();
    EXPECT_EQ(chunk.fields().SerializeAsString(), expected.SerializeAsString())
        << "round " << round;
  }
  // The mutations reach both outcomes often.
  EXPECT_GT(both_accepted, 5000);
  EXPECT_GT(both_refused, 2000);
  EXPECT_LT(groups, both_accepted / 10);
}

}  // namespace
}  // namespace materializer::client
