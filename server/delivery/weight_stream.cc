#include "server/delivery/weight_stream.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace materializer::delivery {

absl::StatusOr<std::unique_ptr<WeightStream>> WeightStream::Open(
    std::shared_ptr<const memory::Arena> arena, SafetensorsFile file,
    uint64_t offset, uint32_t chunk_bytes) {
  if (chunk_bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes: ", chunk_bytes, " is above the limit of ",
                     kMaxChunkBytes));
  }
  if (offset > file.size()) {
    return absl::OutOfRangeError(
        absl::StrCat("offset: ", offset, " is past the end of the ",
                     file.size(), "-byte file"));
  }
  if (chunk_bytes == 0) chunk_bytes = kDefaultChunkBytes;
  return std::unique_ptr<WeightStream>(
      new WeightStream(std::move(arena), std::move(file), offset, chunk_bytes));
}

WeightStream::WeightStream(std::shared_ptr<const memory::Arena> arena,
                           SafetensorsFile file, uint64_t offset,
                           uint32_t chunk_bytes)
    : arena_(std::move(arena)),
      file_(std::move(file)),
      position_(offset),
      chunk_bytes_(chunk_bytes) {}

absl::Status WeightStream::Next(v1::WeightChunk* chunk) {
  const uint64_t length =
      std::min<uint64_t>(chunk_bytes_, file_.size() - position_);
  chunk->Clear();
  chunk->set_offset(position_);
  chunk->set_total_bytes(file_.size());
  const memory::Arena* arena = arena_.get();
  absl::Status status = file_.Read(
      position_, length,
      [arena](uint64_t offset, uint64_t n, void* dst) {
        return arena->CopyToHost(offset, n, dst);
      },
      chunk->mutable_data());
  if (!status.ok()) return status;
  position_ += length;
  sent_any_ = true;
  return absl::OkStatus();
}

}  // namespace materializer::delivery
