#include "server/delivery/weight_stream.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "server/delivery/digest.h"
#include "server/memory/pool.h"
#include "tests/testing/status_matchers.h"

namespace materializer::delivery {
namespace {

using ::materializer::testing::StatusIs;
using spec::DType;

struct Fixture {
  std::unique_ptr<memory::DevicePool> pool;
  std::shared_ptr<const memory::Arena> arena;
  std::shared_ptr<const WeightFile> file;
};

spec::TensorDesc Desc(const char* name, std::vector<int64_t> shape, DType dtype) {
  spec::TensorDesc t;
  t.name = name;
  t.shape = std::move(shape);
  t.dtype = dtype;
  t.numel = 1;
  for (int64_t s : t.shape) t.numel *= static_cast<uint64_t>(s);
  t.nbytes = t.numel * spec::ItemSize(dtype);
  return t;
}

// A CPU arena of two tensors filled with a pattern, and its file.
Fixture Make(v1::WeightFormat format) {
  Fixture f;
  memory::DeviceConfig cpu;
  cpu.name = "cpu";
  cpu.capacity_bytes = 64 << 20;
  f.pool = memory::DevicePool::Create({cpu}).value();
  const std::vector<spec::TensorDesc> tensors = {
      Desc("big", {300000}, DType::kFloat32), Desc("small", {5}, DType::kInt64)};
  const spec::Layout layout = spec::ComputeLayout(tensors).value();
  memory::Reservation r =
      f.pool->Reserve("alice", "cpu", layout.arena_bytes).value();
  std::unique_ptr<memory::Arena> arena =
      memory::Arena::Allocate(std::move(r), tensors, layout).value();
  auto* bytes = const_cast<std::byte*>(arena->host_data());
  for (uint64_t i = 0; i < arena->bytes(); ++i) {
    bytes[i] = static_cast<std::byte>((i * 13 + 5) & 0xff);
  }
  std::vector<SourceTensor> sources;
  for (size_t i = 0; i < tensors.size(); ++i) {
    SourceTensor s;
    s.name = tensors[i].name;
    s.dtype = tensors[i].dtype;
    s.shape = tensors[i].shape;
    s.nbytes = tensors[i].nbytes;
    s.source_offset = layout.offsets[i];
    s.crc32 = Crc32(bytes + layout.offsets[i], s.nbytes);
    sources.push_back(s);
  }
  f.file = std::make_shared<const WeightFile>(
      BuildWeightFile(format, sources, {}).value());
  f.arena = std::move(arena);
  return f;
}

std::string WholeFile(const Fixture& f) {
  std::string out;
  EXPECT_OK(f.file->Read(0, f.file->size(),
                         [&](uint64_t offset, uint64_t length, void* dst) {
                           return f.arena->CopyToHost(offset, length, dst);
                         },
                         &out));
  return out;
}

// Streams from `offset`, returning the bytes and the last chunk's digest.
std::string StreamAll(const Fixture& f, uint64_t offset, uint32_t chunk_bytes,
                      FileDigest digest, std::string* last_digest,
                      int* arena_pieces = nullptr) {
  auto stream = WeightStream::Open(f.arena, f.file, offset, chunk_bytes,
                                   std::move(digest))
                    .value();
  std::string out;
  const char* arena_begin = reinterpret_cast<const char*>(f.arena->host_data());
  while (!stream->done()) {
    WeightStream::Chunk chunk;
    EXPECT_OK(stream->Next(&chunk));
    EXPECT_EQ(chunk.offset, offset + out.size());
    EXPECT_EQ(chunk.total_bytes, f.file->size());
    for (const auto& piece : chunk.pieces) {
      if (arena_pieces != nullptr && piece.data >= arena_begin &&
          piece.data < arena_begin + f.arena->bytes()) {
        ++*arena_pieces;
      }
      out.append(piece.data, piece.length);
    }
    if (stream->done()) {
      *last_digest = chunk.digest;
    } else {
      EXPECT_EQ(chunk.digest, "");
    }
  }
  return out;
}

// Both ways of hashing the file: on a thread of its own ahead of the
// stream (the default for host arenas), and chunk by chunk in Next.
class FileHashingTest : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(HashAhead, FileHashingTest, ::testing::Bool());

FileDigest Unknown(bool hash_ahead) {
  FileDigest digest;
  digest.hash_ahead = hash_ahead;
  return digest;
}

TEST_P(FileHashingTest, ChunksReferenceTheArenaAndEndWithTheFileDigest) {
  for (v1::WeightFormat format :
       {v1::WEIGHT_FORMAT_SAFETENSORS, v1::WEIGHT_FORMAT_TORCH,
        v1::WEIGHT_FORMAT_RAW}) {
    Fixture f = Make(format);
    const std::string whole = WholeFile(f);
    std::string cached;
    FileDigest digest = Unknown(GetParam());
    digest.on_computed = [&](const std::string& d) { cached = d; };
    std::string last_digest;
    int arena_pieces = 0;
    EXPECT_EQ(StreamAll(f, 0, 100000, std::move(digest), &last_digest,
                        &arena_pieces),
              whole);
    const std::string expected =
        FormatDigest(HashBytes(whole.data(), whole.size()));
    EXPECT_EQ(last_digest, expected);
    EXPECT_EQ(cached, expected);
    // Zero copy: every chunk but the last points into the arena.
    EXPECT_GE(arena_pieces, 10) << format;
  }
}

TEST_P(FileHashingTest, AResumedStreamSendsTheRestAndTheWholeFilesDigest) {
  Fixture f = Make(v1::WEIGHT_FORMAT_SAFETENSORS);
  const std::string whole = WholeFile(f);
  const std::string expected =
      FormatDigest(HashBytes(whole.data(), whole.size()));
  for (uint64_t offset : {uint64_t{1}, uint64_t{777777}, whole.size() - 1,
                          uint64_t{whole.size()}}) {
    std::string last_digest;
    EXPECT_EQ(StreamAll(f, offset, 4096, Unknown(GetParam()), &last_digest),
              whole.substr(offset));
    EXPECT_EQ(last_digest, expected) << offset;
  }
}

TEST(WeightStreamTest, HashAheadThreadsAreBoundedAndTheRestHashInline) {
  Fixture f = Make(v1::WEIGHT_FORMAT_SAFETENSORS);
  const std::string whole = WholeFile(f);
  const std::string expected =
      FormatDigest(HashBytes(whole.data(), whole.size()));
  const int limit = WeightStream::MaxHashAheadThreads();
  std::vector<std::unique_ptr<WeightStream>> open;
  for (int i = 0; i <= limit; ++i) {
    open.push_back(
        WeightStream::Open(f.arena, f.file, 0, 0, FileDigest()).value());
  }
  for (int i = 0; i < limit; ++i) EXPECT_TRUE(open[i]->hashing_ahead()) << i;
  EXPECT_FALSE(open[limit]->hashing_ahead());
  // Both kinds end with the file's digest.
  for (size_t i : {size_t{0}, static_cast<size_t>(limit)}) {
    std::string last;
    while (!open[i]->done()) {
      WeightStream::Chunk chunk;
      ASSERT_OK(open[i]->Next(&chunk));
      last = chunk.digest;
    }
    EXPECT_EQ(last, expected) << i;
  }
  // Stream 0 has finished, so its slot is free again.
  auto again = WeightStream::Open(f.arena, f.file, 0, 0, FileDigest()).value();
  EXPECT_TRUE(again->hashing_ahead());
}

TEST_P(FileHashingTest, AStreamClosedMidwayCachesNoDigestAndHoldsNothing) {
  Fixture f = Make(v1::WEIGHT_FORMAT_SAFETENSORS);
  bool computed = false;
  FileDigest digest = Unknown(GetParam());
  digest.on_computed = [&](const std::string&) { computed = true; };
  auto stream =
      WeightStream::Open(f.arena, f.file, 0, 4096, std::move(digest)).value();
  WeightStream::Chunk chunk;
  ASSERT_OK(stream->Next(&chunk));
  chunk = WeightStream::Chunk();
  f.arena.reset();
  stream.reset();  // the client went away; the hashing thread is joined
  EXPECT_FALSE(computed);
  EXPECT_EQ(f.pool->Snapshot().total.in_use_bytes, 0u);
}

TEST(WeightStreamTest, AKnownDigestIsSentAsIs) {
  Fixture f = Make(v1::WEIGHT_FORMAT_RAW);
  FileDigest digest;
  digest.known = "xxh3-128:cached";
  std::string last_digest;
  StreamAll(f, 0, 0, std::move(digest), &last_digest);
  EXPECT_EQ(last_digest, "xxh3-128:cached");
}

TEST(WeightStreamTest, TheStreamAndItsChunksKeepTheArenaAlive) {
  Fixture f = Make(v1::WEIGHT_FORMAT_RAW);
  const std::string whole = WholeFile(f);
  auto stream =
      WeightStream::Open(f.arena, f.file, 0, 65536, FileDigest()).value();
  WeightStream::Chunk chunk;
  ASSERT_OK(stream->Next(&chunk));
  f.arena.reset();  // the handle was released
  stream.reset();   // the client went away after one chunk
  EXPECT_GT(f.pool->Snapshot().total.in_use_bytes, 0u);
  EXPECT_EQ(std::string(chunk.pieces[0].data, chunk.pieces[0].length),
            whole.substr(0, chunk.pieces[0].length));
  chunk = WeightStream::Chunk();  // gRPC let go of the last bytes
  EXPECT_EQ(f.pool->Snapshot().total.in_use_bytes, 0u);
}

// Streams from `offset` with per-tensor digests: the bytes, and the
// digest entries in the order they came. Checks that the data comes first,
// that no chunk carries a file digest, and that a chunk of digests has no
// data, sits at the end of the file and stays within its size bound.
std::string StreamPerTensor(const Fixture& f, uint64_t offset,
                            uint32_t chunk_bytes,
                            std::vector<NamedDigest> tensors,
                            std::vector<NamedDigest>* digests,
                            int* digest_chunks) {
  FileDigest digest;
  digest.per_tensor = true;
  digest.tensors = std::move(tensors);
  auto stream = WeightStream::Open(f.arena, f.file, offset, chunk_bytes,
                                   std::move(digest))
                    .value();
  std::string out;
  *digest_chunks = 0;
  while (!stream->done()) {
    WeightStream::Chunk chunk;
    EXPECT_OK(stream->Next(&chunk));
    EXPECT_EQ(chunk.total_bytes, f.file->size());
    EXPECT_EQ(chunk.digest, "");
    if (!chunk.tensor_digests.empty()) {
      ++*digest_chunks;
      EXPECT_EQ(chunk.offset, f.file->size());
      EXPECT_EQ(chunk.length(), 0u);
      uint64_t bytes = 0;
      for (const NamedDigest& entry : chunk.tensor_digests) {
        bytes += entry.name.size() + entry.digest.size() + 16;
        digests->push_back(entry);
      }
      EXPECT_LE(bytes, kMaxDigestBytesPerChunk);
      continue;
    }
    EXPECT_TRUE(digests->empty()) << "data after the digests";
    EXPECT_EQ(chunk.offset, offset + out.size());
    for (const auto& piece : chunk.pieces) out.append(piece.data, piece.length);
  }
  return out;
}

std::vector<std::string> Names(const std::vector<NamedDigest>& entries) {
  std::vector<std::string> names;
  for (const NamedDigest& entry : entries) names.push_back(entry.name);
  return names;
}

TEST(WeightStreamTest, PerTensorDigestsFollowTheDataAndTheFileIsNotHashed) {
  Fixture f = Make(v1::WEIGHT_FORMAT_RAW);
  const std::string whole = WholeFile(f);
  const std::vector<NamedDigest> tensors = {{"big", "xxh3-128:b"},
                                            {"small", "xxh3-128:s"}};
  for (uint64_t offset :
       {uint64_t{0}, uint64_t{777777}, uint64_t{whole.size()}}) {
    std::vector<NamedDigest> got;
    int digest_chunks = 0;
    EXPECT_EQ(StreamPerTensor(f, offset, 65536, tensors, &got, &digest_chunks),
              whole.substr(offset));
    // Every tensor once, whatever the start: a resumed client checks every
    // tensor at its end.
    EXPECT_EQ(Names(got), Names(tensors)) << offset;
    EXPECT_EQ(got[1].digest, "xxh3-128:s");
    EXPECT_EQ(digest_chunks, 1);
  }
}

TEST(WeightStreamTest, ManyTensorDigestsAreSpreadOverBoundedChunks) {
  Fixture f = Make(v1::WEIGHT_FORMAT_RAW);
  std::vector<NamedDigest> tensors;
  for (int i = 0; i < 5000; ++i) {
    tensors.push_back({"model.layers." + std::to_string(i) + ".mlp.weight",
                       "xxh3-128:" + std::string(32, 'a' + i % 6)});
  }
  std::vector<NamedDigest> got;
  int digest_chunks = 0;
  StreamPerTensor(f, 0, 0, tensors, &got, &digest_chunks);
  EXPECT_EQ(Names(got), Names(tensors));
  // Each chunk is within the bound (checked above) and nearly full.
  uint64_t bytes = 0;
  for (const NamedDigest& entry : tensors) {
    bytes += entry.name.size() + entry.digest.size() + 16;
  }
  const int fewest = static_cast<int>((bytes + kMaxDigestBytesPerChunk - 1) /
                                      kMaxDigestBytesPerChunk);
  EXPECT_GE(digest_chunks, fewest);
  EXPECT_LE(digest_chunks, fewest + 1);
}

// Pending digests that count how often they were waited for, when, and
// whether they were dropped.
class FakePending : public PendingTensorDigests {
 public:
  FakePending(absl::StatusOr<std::vector<NamedDigest>> result,
              const WeightStream** stream, std::vector<uint64_t>* waits,
              bool* destroyed)
      : result_(std::move(result)),
        stream_(stream),
        waits_(waits),
        destroyed_(destroyed) {}
  ~FakePending() override { *destroyed_ = true; }
  absl::StatusOr<std::vector<NamedDigest>> Wait() override {
    waits_->push_back((*stream_)->position());
    return result_;
  }

 private:
  absl::StatusOr<std::vector<NamedDigest>> result_;
  const WeightStream** stream_;
  std::vector<uint64_t>* waits_;
  bool* destroyed_;
};

TEST(WeightStreamTest, PendingDigestsAreWaitedForOnlyOnceTheDataIsOut) {
  Fixture f = Make(v1::WEIGHT_FORMAT_RAW);
  const std::string whole = WholeFile(f);
  const WeightStream* raw = nullptr;
  std::vector<uint64_t> waits;
  bool destroyed = false;
  FileDigest digest;
  digest.per_tensor = true;
  digest.pending = std::make_unique<FakePending>(
      std::vector<NamedDigest>{{"big", "xxh3-128:b"}, {"small", "xxh3-128:s"}},
      &raw, &waits, &destroyed);
  auto stream =
      WeightStream::Open(f.arena, f.file, 0, 65536, std::move(digest)).value();
  raw = stream.get();
  std::string data;
  std::vector<std::string> names;
  while (!stream->done()) {
    WeightStream::Chunk chunk;
    ASSERT_OK(stream->Next(&chunk));
    for (const auto& piece : chunk.pieces)
      data.append(piece.data, piece.length);
    for (const NamedDigest& entry : chunk.tensor_digests) {
      names.push_back(entry.name);
    }
  }
  EXPECT_EQ(data, whole);
  EXPECT_EQ(names, (std::vector<std::string>{"big", "small"}));
  // Once, after the last data byte; then let go of.
  EXPECT_EQ(waits, std::vector<uint64_t>{whole.size()});
  EXPECT_TRUE(destroyed);
}

TEST(WeightStreamTest, PendingDigestsThatFailEndTheStreamWithTheirError) {
  Fixture f = Make(v1::WEIGHT_FORMAT_RAW);
  const WeightStream* raw = nullptr;
  std::vector<uint64_t> waits;
  bool destroyed = false;
  FileDigest digest;
  digest.per_tensor = true;
  digest.pending = std::make_unique<FakePending>(
      absl::DataLossError("arena unreadable"), &raw, &waits, &destroyed);
  auto stream =
      WeightStream::Open(f.arena, f.file, 0, 0, std::move(digest)).value();
  raw = stream.get();
  absl::Status status;
  for (int i = 0; i < 100 && status.ok() && !stream->done(); ++i) {
    WeightStream::Chunk chunk;
    status = stream->Next(&chunk);
  }
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kDataLoss,
                               ::testing::HasSubstr("arena unreadable")));
  EXPECT_FALSE(stream->done());
  stream.reset();  // the client went away: the computation is dropped
  EXPECT_TRUE(destroyed);
}

TEST(WeightStreamTest, BadOffsetsAndChunkSizesAreRefused) {
  Fixture f = Make(v1::WEIGHT_FORMAT_RAW);
  EXPECT_THAT(WeightStream::Open(f.arena, f.file, f.file->size() + 1, 0,
                                 FileDigest()),
              StatusIs(absl::StatusCode::kOutOfRange,
                       ::testing::HasSubstr("is past the end of the")));
  EXPECT_THAT(WeightStream::Open(f.arena, f.file, 0, kMaxChunkBytes + 1,
                                 FileDigest()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("above the limit")));
}

}  // namespace
}  // namespace materializer::delivery
