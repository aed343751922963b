#include "server/delivery/weight_stream.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/common/log.h"
#include "server/common/status_macros.h"

namespace materializer::delivery {
namespace {

// Each chunk hashes the file bytes it carries, plus up to this many bytes of
// a resumed fetch's prefix, so a resume spreads that work over its chunks.
constexpr uint64_t kCatchUpPerChunk = uint64_t{8} << 20;

// A hash-ahead thread looks for its stop signal at least this often.
constexpr uint64_t kHashAheadStep = uint64_t{8} << 20;

// Hash-ahead threads running in the process (at most
// WeightStream::MaxHashAheadThreads()).
std::atomic<int> hash_ahead_threads{0};

bool TakeHashAheadSlot() {
  int now = hash_ahead_threads.load();
  while (now < WeightStream::MaxHashAheadThreads()) {
    if (hash_ahead_threads.compare_exchange_weak(now, now + 1)) return true;
  }
  return false;
}

}  // namespace

int WeightStream::MaxHashAheadThreads() {
  static const int limit =
      static_cast<int>(std::max(2u, std::thread::hardware_concurrency()));
  return limit;
}

// The whole file's digest, computed on a thread of its own from byte 0
// while the stream sends the chunks. On two cores a fetch leaves one core
// partly idle (the sender and the receiver hand each chunk over); the hash
// fills that time instead of adding to the sender's: a 4 GiB fetch with a
// cold digest took 1.06x of one whose digest is cached, against 1.35x when
// Next hashed each chunk (bench/RESULTS.md, "After the fix: the file digest
// hashed beside the stream"). It runs as far ahead as it can: kept within
// 16 MiB of the stream, so that the kernel would copy bytes still in the
// cache, it measured slower. Host arenas only: a CUDA arena's bytes reach
// the host through the stream's staging buffers. Destroying it stops the
// hash within kHashAheadStep bytes and joins the thread.
class WeightStream::HashAhead {
 public:
  HashAhead(std::shared_ptr<const memory::Arena> arena,
            std::shared_ptr<const WeightFile> file)
      : arena_(std::move(arena)), file_(std::move(file)), thread_([this] {
          absl::StatusOr<Digest128> result = Run();
          absl::MutexLock lock(&mu_);
          result_ = std::move(result);
          done_ = true;
        }) {}

  ~HashAhead() {
    stop_.store(true);
    thread_.join();
    hash_ahead_threads.fetch_sub(1);  // the slot its creator took
  }

  // Blocks until the whole file is hashed.
  absl::StatusOr<Digest128> Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    return result_;
  }

 private:
  absl::StatusOr<Digest128> Run() {
    Hasher hasher;
    const char* host = reinterpret_cast<const char*>(arena_->host_data());
    RETURN_IF_ERROR(file_->ForEachPiece(
        0, file_->size(), [&](const Piece& piece) -> absl::Status {
          const char* data = piece.data;
          if (piece.kind == Piece::Kind::kSource) {
            if (piece.source_offset > arena_->bytes() ||
                piece.length > arena_->bytes() - piece.source_offset) {
              return absl::OutOfRangeError(absl::StrCat(
                  "arena range [", piece.source_offset, ", ",
                  piece.source_offset + piece.length, ") is outside its ",
                  arena_->bytes(), " bytes"));
            }
            data = host + piece.source_offset;
          }
          for (uint64_t done = 0; done < piece.length;) {
            if (stop_.load(std::memory_order_relaxed)) {
              return absl::CancelledError("the stream was closed");
            }
            const uint64_t n =
                std::min(piece.length - done, kHashAheadStep);
            hasher.Update(data + done, n);
            done += n;
          }
          return absl::OkStatus();
        }));
    return hasher.Finish();
  }

  const std::shared_ptr<const memory::Arena> arena_;
  const std::shared_ptr<const WeightFile> file_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::StatusOr<Digest128> result_ ABSL_GUARDED_BY(mu_) =
      absl::UnknownError("not computed");
  // Last: it starts running once every member above exists.
  std::thread thread_;
};

uint64_t WeightStream::Chunk::length() const {
  uint64_t n = 0;
  for (const ChunkPiece& piece : pieces) n += piece.length;
  return n;
}

void WeightStream::Chunk::ToMessage(v1::WeightChunk* message) const {
  message->Clear();
  message->set_offset(offset);
  message->set_total_bytes(total_bytes);
  message->set_digest(digest);
  for (const NamedDigest& entry : tensor_digests) {
    v1::TensorDigest* out = message->add_tensor_digests();
    out->set_name(entry.name);
    out->set_digest(entry.digest);
  }
  std::string* data = message->mutable_data();
  data->reserve(length());
  for (const ChunkPiece& piece : pieces) data->append(piece.data, piece.length);
}

absl::StatusOr<std::unique_ptr<WeightStream>> WeightStream::Open(
    std::shared_ptr<const memory::Arena> arena,
    std::shared_ptr<const WeightFile> file, uint64_t offset,
    uint32_t chunk_bytes, FileDigest digest) {
  if (chunk_bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes: ", chunk_bytes, " is above the limit of ",
                     kMaxChunkBytes));
  }
  if (offset > file->size()) {
    return absl::OutOfRangeError(
        absl::StrCat("offset: ", offset, " is past the end of the ",
                     file->size(), "-byte file"));
  }
  if (chunk_bytes == 0) chunk_bytes = kDefaultChunkBytes;
  return std::unique_ptr<WeightStream>(
      new WeightStream(std::move(arena), std::move(file), offset, chunk_bytes,
                       std::move(digest)));
}

WeightStream::WeightStream(std::shared_ptr<const memory::Arena> arena,
                           std::shared_ptr<const WeightFile> file,
                           uint64_t offset, uint32_t chunk_bytes,
                           FileDigest digest)
    : arena_(std::move(arena)),
      file_(std::move(file)),
      position_(offset),
      chunk_bytes_(chunk_bytes),
      digest_(std::move(digest)) {
  if (arena_->host_data() == nullptr && arena_->bytes() > 0) {
    // CUDA arena: pinned double buffers if the runtime is there, else
    // plain (synchronous) copies.
    absl::StatusOr<std::unique_ptr<memory::HostStaging>> staging =
        memory::HostStaging::Create(*arena_, chunk_bytes_);
    if (staging.ok()) {
      staging_ = std::move(*staging);
    } else {
      // Still correct, only slower: say so, or a slow fetch has no cause.
      MLOG(WARNING) << "fetch from a CUDA arena without pinned staging ("
                    << staging.status().message()
                    << "); chunks are copied synchronously";
    }
    PrefetchFrom(position_);
  }
  // Without a free slot or a thread, Next hashes each chunk as it goes.
  if (!digest_.per_tensor && digest_.known.empty() && digest_.hash_ahead &&
      arena_->host_data() != nullptr && TakeHashAheadSlot()) {
    try {
      ahead_ = std::make_unique<HashAhead>(arena_, file_);
    } catch (const std::system_error&) {
      hash_ahead_threads.fetch_sub(1);
    }
  }
}

WeightStream::~WeightStream() = default;

absl::StatusOr<const char*> WeightStream::SourceBytes(uint64_t offset,
                                                      uint64_t length,
                                                      std::string* copy) {
  if (offset > arena_->bytes() || length > arena_->bytes() - offset) {
    return absl::OutOfRangeError(absl::StrCat(
        "arena range [", offset, ", ", offset + length, ") is outside its ",
        arena_->bytes(), " bytes"));
  }
  if (arena_->host_data() != nullptr) {
    return reinterpret_cast<const char*>(arena_->host_data()) + offset;
  }
  copy->resize(length);
  if (staging_ != nullptr && length <= staging_->buffer_bytes()) {
    RETURN_IF_ERROR(staging_->CopyOut(offset, length, copy->data()));
  } else {
    RETURN_IF_ERROR(arena_->CopyToHost(offset, length, copy->data()));
  }
  return copy->data();
}

void WeightStream::PrefetchFrom(uint64_t offset) {
  if (staging_ == nullptr || offset >= file_->size()) return;
  const uint64_t length =
      std::min<uint64_t>(chunk_bytes_, file_->size() - offset);
  bool started = false;
  file_->ForEachPiece(offset, length, [&](const Piece& piece) {
         if (started || piece.kind != Piece::Kind::kSource) {
           return absl::OkStatus();
         }
         started = true;
         // Best effort: a failed prefetch is retried by the real copy.
         staging_->Prefetch(piece.source_offset, piece.length).IgnoreError();
         return absl::OkStatus();
       })
      .IgnoreError();
}

absl::Status WeightStream::HashUntil(uint64_t until) {
  if (until <= hashed_) return absl::OkStatus();
  std::string copy;
  RETURN_IF_ERROR(file_->ForEachPiece(
      hashed_, until - hashed_, [&](const Piece& piece) -> absl::Status {
        if (piece.kind != Piece::Kind::kSource) {
          hasher_.Update(piece.data, piece.length);
          return absl::OkStatus();
        }
        // Bounded copies for CUDA arenas: at most one chunk at a time.
        for (uint64_t done = 0; done < piece.length;) {
          const uint64_t n =
              std::min<uint64_t>(piece.length - done,
                                 arena_->host_data() != nullptr
                                     ? piece.length
                                     : uint64_t{chunk_bytes_});
          ASSIGN_OR_RETURN(const char* bytes,
                           SourceBytes(piece.source_offset + done, n, &copy));
          hasher_.Update(bytes, n);
          done += n;
        }
        return absl::OkStatus();
      }));
  hashed_ = until;
  return absl::OkStatus();
}

absl::Status WeightStream::Next(Chunk* chunk) {
  const uint64_t total = file_->size();
  const uint64_t length = std::min<uint64_t>(chunk_bytes_, total - position_);
  const bool last = position_ + length >= total;
  chunk->offset = position_;
  chunk->total_bytes = total;
  chunk->digest.clear();
  chunk->tensor_digests.clear();
  chunk->pieces.clear();

  if (digest_.per_tensor && position_ >= total &&
      (sent_any_ || !digest_.tensors.empty() || digest_.pending != nullptr)) {
    // Every byte is out: the next batch of tensor digests. An entry's
    // size bound counts its own framing (tags and lengths).
    if (digest_.pending != nullptr) {
      ASSIGN_OR_RETURN(digest_.tensors, digest_.pending->Wait());
      digest_.pending.reset();
    }
    uint64_t bytes = 0;
    while (digests_sent_ < digest_.tensors.size()) {
      const NamedDigest& entry = digest_.tensors[digests_sent_];
      const uint64_t size = entry.name.size() + entry.digest.size() + 16;
      if (!chunk->tensor_digests.empty() &&
          bytes + size > kMaxDigestBytesPerChunk) {
        break;
      }
      chunk->tensor_digests.push_back(entry);
      bytes += size;
      ++digests_sent_;
    }
    sent_any_ = true;
    return absl::OkStatus();
  }

  const bool hashing =
      !digest_.per_tensor && digest_.known.empty() && ahead_ == nullptr;
  // A resumed fetch first catches up on the prefix it does not send.
  if (hashing && hashed_ < position_) {
    RETURN_IF_ERROR(HashUntil(
        last ? position_
             : std::min(position_, hashed_ + kCatchUpPerChunk + length)));
  }
  const bool hash_inline = hashing && hashed_ == position_;

  // The last chunk, and every chunk of a device arena, is one buffer the
  // chunk owns; other chunks reference the arena and the file.
  const bool copy_all = last || arena_->host_data() == nullptr;
  std::shared_ptr<std::string> owned;
  if (copy_all) {
    owned = std::make_shared<std::string>();
    owned->reserve(length);
  }
  std::string scratch;
  RETURN_IF_ERROR(file_->ForEachPiece(
      position_, length, [&](const Piece& piece) -> absl::Status {
        const char* data = piece.data;
        if (piece.kind == Piece::Kind::kSource) {
          ASSIGN_OR_RETURN(data, SourceBytes(piece.source_offset,
                                             piece.length, &scratch));
        }
        if (hash_inline) hasher_.Update(data, piece.length);
        if (copy_all) {
          owned->append(data, piece.length);
          return absl::OkStatus();
        }
        ChunkPiece out;
        out.data = data;
        out.length = piece.length;
        if (piece.kind == Piece::Kind::kSource) {
          out.keepalive = arena_;
        } else if (piece.kind == Piece::Kind::kLiteral) {
          out.keepalive = file_;
        }  // zeros: a static page
        // Merge with the previous piece when contiguous (same memory).
        if (!chunk->pieces.empty()) {
          ChunkPiece& previous = chunk->pieces.back();
          if (previous.data + previous.length == out.data &&
              previous.keepalive == out.keepalive) {
            previous.length += out.length;
            return absl::OkStatus();
          }
        }
        chunk->pieces.push_back(std::move(out));
        return absl::OkStatus();
      }));
  if (hash_inline) hashed_ = position_ + length;
  if (copy_all && length > 0) {
    ChunkPiece out;
    out.data = owned->data();
    out.length = owned->size();
    out.keepalive = owned;
    chunk->pieces.push_back(std::move(out));
  }
  position_ += length;
  sent_any_ = true;

  if (last) {
    if (ahead_ != nullptr) {
      absl::StatusOr<Digest128> digest = ahead_->Wait();
      ahead_.reset();
      RETURN_IF_ERROR(digest.status());
      chunk->digest = FormatDigest(*digest);
      if (digest_.on_computed) digest_.on_computed(chunk->digest);
    } else if (hashing) {
      RETURN_IF_ERROR(HashUntil(total));
      chunk->digest = FormatDigest(hasher_.Finish());
      if (digest_.on_computed) digest_.on_computed(chunk->digest);
    } else if (!digest_.per_tensor) {
      chunk->digest = digest_.known;
    }
  } else {
    PrefetchFrom(position_);
  }
  return absl::OkStatus();
}

absl::Status WeightStream::Next(v1::WeightChunk* message) {
  Chunk chunk;
  RETURN_IF_ERROR(Next(&chunk));
  chunk.ToMessage(message);
  return absl::OkStatus();
}

}  // namespace materializer::delivery
