#ifndef MATERIALIZER_SERVER_DELIVERY_WEIGHT_STREAM_H_
#define MATERIALIZER_SERVER_DELIVERY_WEIGHT_STREAM_H_

// The chunks of one fetch, produced in order from a start offset to the end
// of a WeightFile, without copying tensor bytes out of host arenas.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<WeightStream> stream,
//                    WeightStream::Open(arena, file, offset, 0, digest));
//   while (!stream->done()) {
//     WeightStream::Chunk chunk;
//     RETURN_IF_ERROR(stream->Next(&chunk));
//     ...  // send chunk.pieces; each keeps its memory alive
//   }
//
// Memory: a chunk of a CPU arena references the arena's pages (each piece
// holds a reference to the arena), so producing it allocates nothing but
// the piece list. A chunk of a CUDA arena is copied device -> pinned
// staging buffer -> a buffer the chunk owns; the stream keeps two pinned
// buffers and starts copying the next chunk's first range while the
// current one is being sent. The last chunk is always a copy, so the
// stream (and its arena reference) can be dropped as soon as the last chunk
// exists. docs/delivery.md states the resulting bound per fetch.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "materializer/v1/materializer.pb.h"
#include "server/delivery/digest.h"
#include "server/delivery/weight_file.h"
#include "server/memory/arena.h"

namespace materializer::delivery {

// 4 MiB minus 4 KiB: the largest chunk plus its message framing still fits
// gRPC's default 4 MiB receive limit, so no client has to raise it.
inline constexpr uint32_t kMaxChunkBytes = (4 << 20) - (4 << 10);
// The largest chunk is also the default: on loopback a discarding client
// receives 1 GiB at 1.98 GB/s in such chunks, 1.34 GB/s in 1 MiB ones
// (bench/RESULTS.md, fetch throughput).
inline constexpr uint32_t kDefaultChunkBytes = kMaxChunkBytes;

// A tensor's digest as a stream sends it (v1::TensorDigest).
struct NamedDigest {
  std::string name;
  std::string digest;
};

// Bytes of TensorDigest entries one chunk carries at most.
inline constexpr uint64_t kMaxDigestBytesPerChunk = 64 << 10;

// Per-tensor digests being computed elsewhere (on threads of their own)
// while a stream sends its data. Destroying it stops the computation.
class PendingTensorDigests {
 public:
  virtual ~PendingTensorDigests() = default;
  // Blocks until the digests of every tensor of the file are known, in file
  // order.
  virtual absl::StatusOr<std::vector<NamedDigest>> Wait() = 0;
};

// How a stream proves its bytes (v1::FetchDigest).
//
// File digest (per_tensor false): known already (cached from an earlier
// fetch or DescribeFile), or computed while streaming and then handed to
// `on_computed` (which caches it); the last chunk carries it. A host
// arena's file is hashed on a thread of its own, from the first byte,
// while the chunks go out (`hash_ahead`); a CUDA arena's, with
// `hash_ahead` false, or while WeightStream::MaxHashAheadThreads() such
// threads run in the process (or none can be had), by Next, chunk by chunk.
//
// Per-tensor digests (per_tensor true): every tensor of the file in file
// order, in `tensors` if known when the stream opens, else from `pending`
// once the data is out; the stream hashes nothing and ends with chunks
// without data that carry them.
struct FileDigest {
  std::string known;
  std::function<void(const std::string& digest)> on_computed;
  bool hash_ahead = true;
  bool per_tensor = false;
  std::vector<NamedDigest> tensors;
  std::unique_ptr<PendingTensorDigests> pending;
};

// Thread-compatible: one caller at a time. Holds a reference to the arena,
// so the bytes stay valid (and counted in the ledger) until the stream and
// every chunk it produced are destroyed, even if the handle is released
// meanwhile.
class WeightStream {
 public:
  struct ChunkPiece {
    const char* data = nullptr;
    uint64_t length = 0;
    // Keeps `data` valid (the arena, the file, or a buffer of the chunk).
    std::shared_ptr<const void> keepalive;
  };

  struct Chunk {
    uint64_t offset = 0;
    uint64_t total_bytes = 0;
    // Set in the last chunk: the whole file's digest (file digests only).
    std::string digest;
    // Per-tensor digests: set in the chunks after the data, at most
    // kMaxDigestBytesPerChunk of entries each.
    std::vector<NamedDigest> tensor_digests;
    std::vector<ChunkPiece> pieces;

    uint64_t length() const;
    // The chunk as a message (copies the bytes; for tests and callers that
    // do not send pieces).
    void ToMessage(v1::WeightChunk* message) const;
  };

  // OUT_OF_RANGE if `offset` is past the end of the file; INVALID_ARGUMENT
  // if `chunk_bytes` exceeds kMaxChunkBytes (0 means kDefaultChunkBytes).
  static absl::StatusOr<std::unique_ptr<WeightStream>> Open(
      std::shared_ptr<const memory::Arena> arena,
      std::shared_ptr<const WeightFile> file, uint64_t offset,
      uint32_t chunk_bytes, FileDigest digest);

  ~WeightStream();
  WeightStream(const WeightStream&) = delete;
  WeightStream& operator=(const WeightStream&) = delete;

  // Hash-ahead threads the whole process runs at most: one per hardware
  // thread (at least 2). Beyond it streams hash on the thread that calls
  // Next, a worker of the client's queue, so a client that opens many
  // fetches at once gets no more of the CPU than the worker pool gives it.
  static int MaxHashAheadThreads();
  // Whether this stream's file digest is being hashed on a thread of its
  // own (for tests).
  bool hashing_ahead() const { return ahead_ != nullptr; }

  uint64_t total_bytes() const { return file_->size(); }
  uint64_t position() const { return position_; }
  bool done() const {
    return position_ >= file_->size() && sent_any_ &&
           digest_.pending == nullptr &&
           digests_sent_ >= digest_.tensors.size();
  }

  // The next up to chunk_bytes bytes; with per-tensor digests, once the
  // bytes are sent, the next chunk of digests (the first of them waits for
  // pending digests). A fetch that starts at the
  // end of the file yields exactly one empty chunk (file digest), or only
  // the digest chunks, so the client still learns total_bytes and the
  // digests.
  absl::Status Next(Chunk* chunk);

  // Compatibility: the next chunk as a message (a copy).
  absl::Status Next(v1::WeightChunk* message);

 private:
  WeightStream(std::shared_ptr<const memory::Arena> arena,
               std::shared_ptr<const WeightFile> file, uint64_t offset,
               uint32_t chunk_bytes, FileDigest digest);

  // Host bytes of source range [offset, offset + length): a pointer into a
  // host arena, or a copy (through the staging buffers) into *copy.
  absl::StatusOr<const char*> SourceBytes(uint64_t offset, uint64_t length,
                                          std::string* copy);
  // Hashes file bytes [hashed_, until).
  absl::Status HashUntil(uint64_t until);
  // Starts copying the first source range at or after `offset` into
  // staging (CUDA arenas only).
  void PrefetchFrom(uint64_t offset);

  std::shared_ptr<const memory::Arena> arena_;
  std::shared_ptr<const WeightFile> file_;
  uint64_t position_;
  uint32_t chunk_bytes_;
  bool sent_any_ = false;

  FileDigest digest_;
  // Per-tensor digests: entries of digest_.tensors already sent.
  size_t digests_sent_ = 0;
  // Whole-file hashing, when the digest is not known: on a thread of its
  // own (ahead_), else here, bytes [0, hashed_) being in hasher_.
  class HashAhead;
  std::unique_ptr<HashAhead> ahead_;
  Hasher hasher_;
  uint64_t hashed_ = 0;

  // Device-to-host staging (CUDA arenas); null for host arenas or when
  // CUDA staging is unavailable (then arena->CopyToHost is used).
  std::unique_ptr<memory::HostStaging> staging_;
};

}  // namespace materializer::delivery

#endif  // MATERIALIZER_SERVER_DELIVERY_WEIGHT_STREAM_H_
