#ifndef MATERIALIZER_SERVER_DELIVERY_WEIGHT_STREAM_H_
#define MATERIALIZER_SERVER_DELIVERY_WEIGHT_STREAM_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "materializer/v1/materializer.pb.h"
#include "server/delivery/safetensors.h"
#include "server/memory/arena.h"

namespace materializer::delivery {

inline constexpr uint32_t kDefaultChunkBytes = 1 << 20;
// 4 MiB minus 4 KiB: the largest chunk plus its message framing still fits
// gRPC's default 4 MiB receive limit, so no client has to raise it.
inline constexpr uint32_t kMaxChunkBytes = (4 << 20) - (4 << 10);

// Produces the chunks of one fetch, in order, from `offset` to the end of the
// file. Holds a reference to the arena, so the bytes stay valid (and
// counted in the ledger) until the stream is destroyed, even if the handle
// is released meanwhile.
//
// Thread-compatible: one caller at a time.
class WeightStream {
 public:
  // OUT_OF_RANGE if `offset` is past the end of the file; INVALID_ARGUMENT
  // if `chunk_bytes` exceeds kMaxChunkBytes (0 means kDefaultChunkBytes).
  static absl::StatusOr<std::unique_ptr<WeightStream>> Open(
      std::shared_ptr<const memory::Arena> arena, SafetensorsFile file,
      uint64_t offset, uint32_t chunk_bytes);

  uint64_t total_bytes() const { return file_.size(); }
  uint64_t position() const { return position_; }
  bool done() const { return position_ >= file_.size() && sent_any_; }

  // Fills `chunk` with the next up to chunk_bytes bytes. A fetch that
  // starts at the end of the file yields exactly one empty chunk, so the
  // client still learns total_bytes.
  absl::Status Next(v1::WeightChunk* chunk);

 private:
  WeightStream(std::shared_ptr<const memory::Arena> arena,
               SafetensorsFile file, uint64_t offset, uint32_t chunk_bytes);

  std::shared_ptr<const memory::Arena> arena_;
  SafetensorsFile file_;
  uint64_t position_;
  uint32_t chunk_bytes_;
  bool sent_any_ = false;
};

}  // namespace materializer::delivery

#endif  // MATERIALIZER_SERVER_DELIVERY_WEIGHT_STREAM_H_
