#include "server/service/fetch_reactor.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
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
constexpr char kTensorDigestsTag = (5 << 3) | 2;
// TensorDigest's fields.
constexpr char kNameTag = (1 << 3) | 2;
constexpr char kEntryDigestTag = (2 << 3) | 2;

void PutString(std::string* out, char tag, const std::string& value) {
  out->push_back(tag);
  PutVarint(out, value.size());
  *out += value;
}

void ReleaseKeepalive(void* user_data) {
  delete static_cast<std::shared_ptr<const void>*>(user_data);
}

// Streams one fetch. Deletes itself when gRPC is done with it.
//
// Chunks are produced on the worker pool, one ahead of the write in
// flight: when a write starts, the next chunk is queued for production, so
// the hop to a worker overlaps with sending and the stream never waits for
// it while there is something to send. At most two chunks exist at a time
// (one being sent, one produced or parked in next_); one producer runs at
// a time and owns stream_ while it runs.
class FetchReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  FetchReactor(ThreadPool* workers, std::string client, CallObserver observer)
      : workers_(workers),
        client_(std::move(client)),
        observer_(std::move(observer)) {}

  // A failed open: finish at once with the error.
  FetchReactor(const absl::Status& status, CallObserver observer)
      : observer_(std::move(observer)) {
    ReactionScope reaction(this);
    grpc::Status ended = observer_.End(status);
    HandOffToGrpc([&] { Finish(std::move(ended)); });
  }

  // Queues the open; false if the client's queue is full (nothing queued).
  bool Begin(OpenStream open, std::function<bool()> cancelled) {
    {
      absl::MutexLock lock(&mu_);
      producing_ = true;
    }
    return workers_->TrySchedule(client_, [this, open = std::move(open),
                                           cancelled = std::move(cancelled)] {
      if (cancelled()) {
        HandOver(Step::Failed(absl::CancelledError(
            "the fetch was cancelled, or its deadline passed, before a "
            "worker took it")));
        return;
      }
      absl::StatusOr<std::unique_ptr<delivery::WeightStream>> stream =
          open(&observer_);
      if (!stream.ok()) {
        HandOver(Step::Failed(stream.status()));
        return;
      }
      stream_ = std::move(*stream);
      // Before the first write, so no other step touches observer_ yet.
      observer_.FetchOpened(stream_->position(), stream_->total_bytes());
      Produce();
    });
  }

  void Refuse(const absl::Status& status) {
    ReactionScope reaction(this);
    grpc::Status ended = observer_.End(status);
    HandOffToGrpc([&] { Finish(std::move(ended)); });
  }

  void OnWriteDone(bool ok) override {
    ReactionScope reaction(this);
    Step step;
    {
      absl::MutexLock lock(&mu_);
      in_flight_ = false;
      if (ok) {
        observer_.FetchChunk(written_.data_bytes, written_.wire_bytes,
                             written_.digest);
      }
      // gRPC holds its own references to what it still sends.
      buffer_.Clear();
      if (!ok) {
        // The client went away or cancelled: stop producing and let go of
        // the arena and any staging buffers at once (a producer still
        // running does it when it hands over).
        cancelled_ = true;
        next_.reset();
        if (producing_) return;
        stream_.reset();
        step = Step::Failed(absl::CancelledError("fetch cancelled"));
      } else if (next_ != nullptr) {
        step = std::move(*next_);
        next_.reset();
      } else if (producing_) {
        return;  // the producer starts the write when it is done
      } else {
        step = Step::Failed(absl::OkStatus());  // everything was sent
      }
      if (step.chunk) in_flight_ = true;
    }
    Start(std::move(step));
  }

  void OnDone() override {
    HappensAfter(this);
    delete this;
  }

 private:
  // What comes next: a chunk to write (`last` if no chunk follows), or the
  // end of the call with `status`.
  struct Step {
    bool chunk = false;
    bool last = false;
    grpc::ByteBuffer buffer;
    // Payload bytes and whether the chunk carries the file digest.
    uint64_t data_bytes = 0;
    bool digest = false;
    absl::Status status;

    static Step Failed(absl::Status status) {
      Step step;
      step.status = std::move(status);
      return step;
    }
  };

  // On a worker: the next chunk from stream_, then hand it over.
  void Produce() {
    delivery::WeightStream::Chunk chunk;
    absl::Status status = stream_->Next(&chunk);
    if (!status.ok()) {
      MLOG(ERROR) << "fetch failed mid-stream: " << status;
      stream_.reset();
      HandOver(Step::Failed(status));
      return;
    }
    Step step;
    step.chunk = true;
    step.buffer = EncodeChunk(chunk);
    step.data_bytes = chunk.length();
    step.digest = !chunk.digest.empty();
    // The last chunk is a copy: let go of the arena now, not when gRPC gets
    // round to OnDone, so a Release right after the client read everything
    // frees the memory at once.
    if (stream_->done()) {
      stream_.reset();
      step.last = true;
    }
    HandOver(std::move(step));
  }

  // On a worker, when a produced step is ready: start it if nothing is
  // being written, else park it for OnWriteDone.
  void HandOver(Step step) {
    {
      absl::MutexLock lock(&mu_);
      producing_ = false;
      if (cancelled_) {
        stream_.reset();
        step = Step::Failed(absl::CancelledError("fetch cancelled"));
      } else if (in_flight_) {
        next_ = std::make_unique<Step>(std::move(step));
        return;
      } else if (step.chunk) {
        in_flight_ = true;
      }
    }
    Start(std::move(step));
  }

  // Writes a chunk (and queues the production of the one after it) or
  // finishes. The caller has set in_flight_ for a chunk.
  void Start(Step step) {
    if (!step.chunk) {
      grpc::Status ended = observer_.End(step.status);
      HappensBefore(this);
      HandOffToGrpc([&] { Finish(std::move(ended)); });
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      buffer_ = std::move(step.buffer);
      written_ = {step.data_bytes, buffer_.Length(), step.digest};
      if (!step.last) producing_ = true;
    }
    if (!step.last) {
      workers_->Schedule(client_, [this] { Produce(); });
    }
    HappensBefore(this);
    HandOffToGrpc([&] { StartWrite(&buffer_); });
  }

  ThreadPool* const workers_ = nullptr;
  const std::string client_;
  // Used by the one producer at a time (open, then Produce); reset under
  // mu_ when the call is cancelled between producers.
  std::unique_ptr<delivery::WeightStream> stream_;

  // The chunk being written: set by whoever starts a write (having set
  // in_flight_), read by gRPC until OnWriteDone clears it.
  grpc::ByteBuffer buffer_;

  absl::Mutex mu_;
  // Guards the flags and next_. in_flight_: a write is outstanding;
  // producing_: a producer is queued or running; next_: a step produced
  // while a write was in flight; cancelled_: a write failed (the client is
  // gone).
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool producing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<Step> next_ ABSL_GUARDED_BY(mu_);

  // Used by the open before the first write, then by whoever holds the
  // write (Start, OnWriteDone); mu_ orders the hand-overs.
  CallObserver observer_;
  // The chunk being written, counted once its write completes.
  struct Written {
    uint64_t data_bytes = 0;
    uint64_t wire_bytes = 0;
    bool digest = false;
  } written_ ABSL_GUARDED_BY(mu_);
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
  if (!chunk.digest.empty()) PutString(&pending, kDigestTag, chunk.digest);
  std::string entry;
  for (const delivery::NamedDigest& digest : chunk.tensor_digests) {
    entry.clear();
    if (!digest.name.empty()) PutString(&entry, kNameTag, digest.name);
    if (!digest.digest.empty()) {
      PutString(&entry, kEntryDigestTag, digest.digest);
    }
    PutString(&pending, kTensorDigestsTag, entry);
  }
  flush();
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartFetch(
    ThreadPool* workers, std::string client, OpenStream open,
    std::function<bool()> cancelled, absl::Status queue_full,
    CallObserver observer) {
  auto* reactor =
      new FetchReactor(workers, std::move(client), std::move(observer));
  if (!reactor->Begin(std::move(open), std::move(cancelled))) {
    reactor->Refuse(queue_full);
  }
  return reactor;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* RefuseFetch(
    const absl::Status& status, CallObserver observer) {
  return new FetchReactor(status, std::move(observer));
}

}  // namespace materializer::service
