#ifndef MATERIALIZER_SERVER_DELIVERY_FINGERPRINT_H_
#define MATERIALIZER_SERVER_DELIVERY_FINGERPRINT_H_

// A tensor fingerprint that adds up over shards: the sum, mod 2^64, of
//   SplitMix64(g ^ SplitMix64(bits))
// over the elements held, where g is the element's linear (row-major) index
// in the FULL tensor and bits its raw little-endian value, zero-extended to
// 64 bits. The order of elements does not matter, and the fingerprints of
// the shards of a tensor sum to the full tensor's, so replicas, runs and
// shards can be compared without moving the bytes (docs/delivery.md).
//
//   Fingerprinter f(itemsize, shard_shape, full_shape, shard_offset);
//   f.Add(bytes, count);  // the next `count` elements, row-major
//   uint64_t value = f.value();

#include <cstdint>
#include <vector>

namespace materializer::delivery {

// Thread-compatible.
class Fingerprinter {
 public:
  // `shape` is what is stored; for a whole tensor `full_shape` equals it and
  // `offset` is empty (or zeros).
  Fingerprinter(uint32_t itemsize, std::vector<int64_t> shape,
                std::vector<int64_t> full_shape, std::vector<int64_t> offset);

  // Folds in the next `count` stored elements (itemsize bytes each).
  void Add(const void* data, uint64_t count);

  uint64_t value() const { return sum_; }

 private:
  // Global index of the first element of the current innermost row.
  uint64_t RowStart() const;

  const uint32_t itemsize_;
  const std::vector<int64_t> shape_;
  std::vector<uint64_t> full_strides_;
  std::vector<int64_t> offset_;
  // Position of the next element: its index within the current innermost
  // row, and the indices of the outer dimensions.
  std::vector<int64_t> index_;
  uint64_t sum_ = 0;
};

// The fingerprint of a whole, contiguous tensor in one call.
uint64_t FingerprintOf(const void* data, uint32_t itemsize,
                       const std::vector<int64_t>& shape);

}  // namespace materializer::delivery

#endif  // MATERIALIZER_SERVER_DELIVERY_FINGERPRINT_H_
