#include "server/service/fetch_reactor.h"

#include <utility>

#include "server/common/log.h"
#include "server/service/status.h"

namespace materializer::service {
namespace {

// Streams one fetch. Writes one chunk at a time: the next chunk is produced
// only after the previous write completed, so server memory per fetch is one
// chunk regardless of model size. Deletes itself when gRPC is done with it.
class FetchReactor final : public grpc::ServerWriteReactor<v1::WeightChunk> {
 public:
  explicit FetchReactor(std::unique_ptr<delivery::WeightStream> stream)
      : stream_(std::move(stream)) {
    WriteNext();
  }

  // A failed open: finish at once with the error.
  explicit FetchReactor(const absl::Status& status) {
    Finish(ToGrpcStatus(status));
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      // The client went away or cancelled; stop producing and let go of the
      // arena at once.
      stream_.reset();
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "fetch cancelled"));
      return;
    }
    WriteNext();
  }

  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    if (stream_ == nullptr) {  // the last chunk has been written
      Finish(grpc::Status::OK);
      return;
    }
    absl::Status status = stream_->Next(&chunk_);
    if (!status.ok()) {
      MLOG(ERROR) << "fetch failed mid-stream: " << status;
      stream_.reset();
      Finish(ToGrpcStatus(status));
      return;
    }
    // The last chunk is a copy: let go of the arena now, not when gRPC gets
    // round to OnDone, so a Release right after the client read everything
    // frees the memory at once.
    if (stream_->done()) stream_.reset();
    StartWrite(&chunk_);
  }

  std::unique_ptr<delivery::WeightStream> stream_;
  v1::WeightChunk chunk_;
};

}  // namespace

grpc::ServerWriteReactor<v1::WeightChunk>* StartFetch(
    absl::StatusOr<std::unique_ptr<delivery::WeightStream>> stream) {
  if (!stream.ok()) return new FetchReactor(stream.status());
  return new FetchReactor(std::move(*stream));
}

}  // namespace materializer::service
