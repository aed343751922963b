#ifndef MATERIALIZER_SERVER_CHECKPOINT_CHECKPOINT_TENSOR_H_
#define MATERIALIZER_SERVER_CHECKPOINT_CHECKPOINT_TENSOR_H_

// One tensor found in a checkpoint file: what the readers of every format
// (safetensors_header.h, torch_archive.h) return. The bytes are not read:
// a tensor is a dense, row-major, little-endian byte range of its file.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/spec/dtype.h"

namespace materializer::checkpoint {

struct CheckpointTensor {
  std::string name;
  spec::DType dtype = spec::DType::kFloat32;
  std::vector<int64_t> shape;
  // Absolute offset of the first byte in the file.
  uint64_t offset = 0;
  // numel(shape) * ItemSize(dtype); the range [offset, offset + nbytes) is
  // inside the file. Tensors of a torch archive that share a storage (tied
  // weights, views) may have equal or overlapping ranges.
  uint64_t nbytes = 0;
  // The zip CRC-32 of exactly these bytes, where the file records one: a
  // torch archive's tensor that is its whole storage. The loader checks it
  // when it reads them all.
  std::optional<uint32_t> crc32;
};

// The most dimensions a checkpoint tensor may have; a file declaring more
// is refused as malformed (the service holds far fewer, spec/limits.h).
inline constexpr size_t kMaxCheckpointRank = 64;

}  // namespace materializer::checkpoint

#endif  // MATERIALIZER_SERVER_CHECKPOINT_CHECKPOINT_TENSOR_H_
