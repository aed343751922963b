// DecodeWeightChunk against protobuf's own encoding and parser: the same
// fields, with the data read from the received slices wherever their
// boundaries fall, and malformed messages refused.

#include "client/chunk_decoder.h"

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"

namespace materializer::client {
namespace {

// `wire` split into slices at `cuts` (offsets, ascending), as gRPC may
// deliver one message in several slices.
grpc::ByteBuffer Split(const std::string& wire, std::vector<size_t> cuts) {
  std::vector<grpc::Slice> slices;
  size_t begin = 0;
  cuts.push_back(wire.size());
  for (size_t cut : cuts) {
    slices.emplace_back(wire.substr(begin, cut - begin));
    begin = cut;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Joined(const DecodedChunk& chunk) {
  std::string out;
  for (absl::string_view piece : chunk.data) out.append(piece.data(), piece.size());
  return out;
}

v1::WeightChunk Example() {
  v1::WeightChunk chunk;
  chunk.set_offset(1234567);
  std::string data;
  for (int i = 0; i < 3000; ++i) data.push_back(static_cast<char>(i * 7));
  chunk.set_data(data);
  chunk.set_total_bytes(uint64_t{1} << 40);
  chunk.set_digest("xxh3-128:00112233445566778899aabbccddeeff");
  v1::TensorDigest* entry = chunk.add_tensor_digests();
  entry->set_name("layers.0.weight");
  entry->set_digest("xxh3-128:ffeeddccbbaa99887766554433221100");
  return chunk;
}

TEST(ChunkDecoderTest, EqualsProtobufWhereverTheSlicesAreCut) {
  const v1::WeightChunk original = Example();
  const std::string wire = original.SerializeAsString();
  // Every single cut (inside keys, varints, the data and the digests),
  // and a cut at every byte at once.
  std::vector<std::vector<size_t>> cut_sets = {{}};
  for (size_t cut = 1; cut < wire.size(); cut += 1) cut_sets.push_back({cut});
  std::vector<size_t> every;
  for (size_t cut = 1; cut < wire.size(); ++cut) every.push_back(cut);
  cut_sets.push_back(every);
  for (const std::vector<size_t>& cuts : cut_sets) {
    DecodedChunk decoded;
    ASSERT_TRUE(DecodeWeightChunk(Split(wire, cuts), &decoded).ok())
        << cuts.size() << " cuts, first at " << (cuts.empty() ? 0 : cuts[0]);
    EXPECT_EQ(decoded.data_size, original.data().size());
    ASSERT_EQ(Joined(decoded), original.data());
    v1::WeightChunk rebuilt = decoded.fields;
    EXPECT_TRUE(rebuilt.data().empty());
    rebuilt.set_data(Joined(decoded));
    ASSERT_EQ(rebuilt.SerializeAsString(), wire);
  }
}

TEST(ChunkDecoderTest, DataIsViewedNotCopied) {
  const std::string wire = Example().SerializeAsString();
  const grpc::ByteBuffer received = Split(wire, {100, 2000});
  DecodedChunk decoded;
  ASSERT_TRUE(DecodeWeightChunk(received, &decoded).ok());
  // Each piece points into one of the received slices.
  ASSERT_EQ(decoded.data.size(), 3u);
  for (absl::string_view piece : decoded.data) {
    bool inside = false;
    for (const grpc::Slice& slice : decoded.slices) {
      const char* begin = reinterpret_cast<const char*>(slice.begin());
      inside |= piece.data() >= begin &&
                piece.data() + piece.size() <= begin + slice.size();
    }
    EXPECT_TRUE(inside);
  }
}

TEST(ChunkDecoderTest, AChunkWithoutDataAndAnEmptyMessage) {
  v1::WeightChunk last;
  last.set_total_bytes(10);
  last.set_offset(10);
  last.set_digest("xxh3-128:0");
  DecodedChunk decoded;
  ASSERT_TRUE(
      DecodeWeightChunk(Split(last.SerializeAsString(), {}), &decoded).ok());
  EXPECT_EQ(decoded.data_size, 0u);
  EXPECT_TRUE(decoded.data.empty());
  EXPECT_EQ(decoded.fields.digest(), "xxh3-128:0");
  ASSERT_TRUE(DecodeWeightChunk(grpc::ByteBuffer(), &decoded).ok());
  EXPECT_EQ(decoded.fields.offset(), 0u);
  EXPECT_EQ(decoded.data_size, 0u);
}

TEST(ChunkDecoderTest, TheLastDataFieldWinsAndUnknownFieldsAreKept) {
  v1::WeightChunk first;
  first.set_data("first data");
  v1::WeightChunk second;
  second.set_data("second");
  second.set_offset(3);
  // Field 99, a varint: unknown to this client, kept as protobuf keeps it.
  const std::string unknown = "\x98\x06\x2a";
  const std::string wire =
      first.SerializeAsString() + unknown + second.SerializeAsString();
  v1::WeightChunk reference;
  ASSERT_TRUE(reference.ParseFromString(wire));
  DecodedChunk decoded;
  ASSERT_TRUE(DecodeWeightChunk(Split(wire, {5, 13}), &decoded).ok());
  EXPECT_EQ(Joined(decoded), reference.data());
  EXPECT_EQ(decoded.fields.offset(), 3u);
  v1::WeightChunk rebuilt = decoded.fields;
  rebuilt.set_data(Joined(decoded));
  EXPECT_EQ(rebuilt.SerializeAsString(), reference.SerializeAsString());
}

TEST(ChunkDecoderTest, MalformedMessagesAreRefused) {
  const std::string wire = Example().SerializeAsString();
  DecodedChunk decoded;
  // Every truncation of the message but those that end between fields.
  int refused = 0;
  for (size_t length = 1; length < wire.size(); ++length) {
    const std::string cut = wire.substr(0, length);
    v1::WeightChunk reference;
    const bool protobuf_ok = reference.ParseFromString(cut);
    const absl::Status status = DecodeWeightChunk(Split(cut, {}), &decoded);
    EXPECT_EQ(status.ok(), protobuf_ok) << "length " << length;
    if (!status.ok()) {
      ++refused;
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(status.message().find("not a WeightChunk"), std::string::npos)
          << status.message();
    }
  }
  EXPECT_GT(refused, 3000);
  // A data length past the end; a group (wire type 3); field number 0; a
  // varint of eleven bytes.
  for (const std::string& bad :
       {std::string("\x12\xff\xff\x03xyz"), std::string("\x0b\x0c"),
        std::string("\x02\x01", 2),
        std::string("\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01")}) {
    EXPECT_EQ(DecodeWeightChunk(Split(bad, {1}), &decoded).code(),
              absl::StatusCode::kInvalidArgument)
        << absl::CEscape(bad);
  }
}

}  // namespace
}  // namespace materializer::client
