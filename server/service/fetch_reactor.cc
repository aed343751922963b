#include "server/service/fetch_reactor.h"

#include <string>
#include <utility>
#include <vector>

#include "grpcpp/support/slice.h"
#include "server/common/happens_before.h"
#include "server/common/log.h"
#include "server/service/status.h"

namespace materializer::service {
namespace {

void PutVarint(std::string* out, uint64_t value) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

// WeightChunk field tags (field number << 3 | wire type).
constexpr char kOffsetTag = (1 << 3) | 0;
constexpr char kDataTag = (2 << 3) | 2;
constexpr char kTotalBytesTag = (3 << 3) | 0;
constexpr char kDigestTag = (4 << 3) | 2;

void ReleaseKeepalive(void* user_data) {
  delete static_cast<std::shared_ptr<const void>*>(user_data);
}

// Streams one fetch. Deletes itself when gRPC is done with it.
//
// Each step (open, produce a chunk) is a closure on the worker pool that
// ends by starting a write or finishing; the next step is queued when that
// write completes. So exactly one thing touches the reactor's state at a
// time: a worker step, or the callback after it. A worker step marks the
// reactor (HappensBefore) right before handing it to gRPC, since gRPC's
// ordering of the write and its completion is invisible to TSan.
class FetchReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  FetchReactor(ThreadPool* workers, std::string client)
      : workers_(workers), client_(std::move(client)) {}

  // A failed open: finish at once with the error.
  explicit FetchReactor(const absl::Status& status) {
    ReactionScope reaction(this);
    Finish(EndCall("FetchWeights", status));
  }

  // Queues the open; false if the client's queue is full (nothing queued).
  bool Begin(OpenStream open, std::function<bool()> cancelled) {
    HappensBefore(this);
    return workers_->TrySchedule(
        client_, [this, open = std::move(open),
                  cancelled = std::move(cancelled)] {
          HappensAfter(this);
          if (cancelled()) {
            End(absl::CancelledError(
                "the fetch was cancelled, or its deadline passed, before a "
                "worker took it"));
            return;
          }
          absl::StatusOr<std::unique_ptr<delivery::WeightStream>> stream =
              open();
          if (!stream.ok()) {
            End(stream.status());
            return;
          }
          stream_ = std::move(*stream);
          WriteNext();
        });
  }

  void Refuse(const absl::Status& status) {
    ReactionScope reaction(this);
    Finish(EndCall("FetchWeights", status));
  }

  void OnWriteDone(bool ok) override {
    ReactionScope reaction(this);
    // gRPC holds its own references to what it still sends.
    buffer_.Clear();
    if (!ok) {
      // The client went away or cancelled: stop producing and let go of
      // the arena and any staging buffers at once.
      stream_.reset();
      Finish(EndCall("FetchWeights",
                     absl::CancelledError("fetch cancelled")));
      return;
    }
    workers_->Schedule(client_, [this] {
      HappensAfter(this);
      WriteNext();
    });
  }

  void OnDone() override {
    HappensAfter(this);
    delete this;
  }

 private:
  // On a worker. The last thing it does is hand the reactor to gRPC.
  void WriteNext() {
    if (stream_ == nullptr) {  // the last chunk has been written
      End(absl::OkStatus());
      return;
    }
    delivery::WeightStream::Chunk chunk;
    absl::Status status = stream_->Next(&chunk);
    if (!status.ok()) {
      MLOG(ERROR) << "fetch failed mid-stream: " << status;
      stream_.reset();
      End(status);
      return;
    }
    // The last chunk is a copy: let go of the arena now, not when gRPC gets
    // round to OnDone, so a Release right after the client read everything
    // frees the memory at once.
    if (stream_->done()) stream_.reset();
    buffer_ = EncodeChunk(chunk);
    HappensBefore(this);
    StartWrite(&buffer_);
  }

  void End(const absl::Status& status) {
    HappensBefore(this);
    Finish(EndCall("FetchWeights", status));
  }

  ThreadPool* const workers_ = nullptr;
  const std::string client_;
  std::unique_ptr<delivery::WeightStream> stream_;
  grpc::ByteBuffer buffer_;
};

}  // namespace

grpc::ByteBuffer EncodeChunk(const delivery::WeightStream::Chunk& chunk) {
  std::vector<grpc::Slice> slices;
  std::string pending;  // bytes to copy into the next copied slice
  auto flush = [&] {
    if (pending.empty()) return;
    slices.emplace_back(pending);
    pending.clear();
  };

  if (chunk.offset != 0) {
    pending.push_back(kOffsetTag);
    PutVarint(&pending, chunk.offset);
  }
  const uint64_t length = chunk.length();
  if (length > 0) {
    pending.push_back(kDataTag);
    PutVarint(&pending, length);
    for (const delivery::WeightStream::ChunkPiece& piece : chunk.pieces) {
      if (piece.length < kMinZeroCopyBytes) {
        pending.append(piece.data, piece.length);
        continue;
      }
      flush();
      if (piece.keepalive == nullptr) {  // static memory
        slices.emplace_back(piece.data, piece.length,
                            grpc::Slice::STATIC_SLICE);
      } else {
        slices.emplace_back(const_cast<char*>(piece.data), piece.length,
                            &ReleaseKeepalive,
                            new std::shared_ptr<const void>(piece.keepalive));
      }
    }
  }
  if (chunk.total_bytes != 0) {
    pending.push_back(kTotalBytesTag);
    PutVarint(&pending, chunk.total_bytes);
  }
  if (!chunk.digest.empty()) {
    pending.push_back(kDigestTag);
    PutVarint(&pending, chunk.digest.size());
    pending += chunk.digest;
  }
  flush();
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartFetch(
    ThreadPool* workers, std::string client, OpenStream open,
    std::function<bool()> cancelled, absl::Status queue_full) {
  auto* reactor = new FetchReactor(workers, std::move(client));
  if (!reactor->Begin(std::move(open), std::move(cancelled))) {
    reactor->Refuse(queue_full);
  }
  return reactor;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* RefuseFetch(
    const absl::Status& status) {
  return new FetchReactor(status);
}

}  // namespace materializer::service
