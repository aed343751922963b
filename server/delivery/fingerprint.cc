#include "server/delivery/fingerprint.h"

#include <cstring>
#include <utility>

#include "server/init/seed.h"

namespace materializer::delivery {
namespace {

uint64_t Bits(const unsigned char* p, uint32_t itemsize) {
  uint64_t bits = 0;
  std::memcpy(&bits, p, itemsize);  // little-endian host
  return bits;
}

}  // namespace

Fingerprinter::Fingerprinter(uint32_t itemsize, std::vector<int64_t> shape,
                             std::vector<int64_t> full_shape,
                             std::vector<int64_t> offset)
    : itemsize_(itemsize),
      shape_(std::move(shape)),
      offset_(std::move(offset)),
      index_(shape_.size(), 0) {
  if (offset_.empty()) offset_.assign(shape_.size(), 0);
  full_strides_.assign(full_shape.size(), 1);
  for (int d = static_cast<int>(full_shape.size()) - 2; d >= 0; --d) {
    full_strides_[d] =
        full_strides_[d + 1] * static_cast<uint64_t>(full_shape[d + 1]);
  }
}

uint64_t Fingerprinter::RowStart() const {
  uint64_t g = 0;
  for (size_t d = 0; d < shape_.size(); ++d) {
    const int64_t i = d + 1 == shape_.size() ? 0 : index_[d];
    g += static_cast<uint64_t>(offset_[d] + i) * full_strides_[d];
  }
  return g;
}

void Fingerprinter::Add(const void* data, uint64_t count) {
  const auto* p = static_cast<const unsigned char*>(data);
  if (shape_.empty()) {  // a scalar: one element, index 0
    for (uint64_t k = 0; k < count; ++k, p += itemsize_) {
      sum_ += init::SplitMix64(0 ^ init::SplitMix64(Bits(p, itemsize_)));
    }
    return;
  }
  const size_t last = shape_.size() - 1;
  while (count > 0) {
    // The rest of the current innermost row.
    const uint64_t row_left =
        static_cast<uint64_t>(shape_[last] - index_[last]);
    const uint64_t n = count < row_left ? count : row_left;
    const uint64_t g0 = RowStart() + static_cast<uint64_t>(index_[last]);
    for (uint64_t j = 0; j < n; ++j, p += itemsize_) {
      sum_ += init::SplitMix64((g0 + j) ^ init::SplitMix64(Bits(p, itemsize_)));
    }
    count -= n;
    index_[last] += static_cast<int64_t>(n);
    // Carry into the outer dimensions at the end of a row.
    for (size_t d = last; d > 0 && index_[d] == shape_[d]; --d) {
      index_[d] = 0;
      ++index_[d - 1];
    }
  }
}

uint64_t FingerprintOf(const void* data, uint32_t itemsize,
                       const std::vector<int64_t>& shape) {
  uint64_t numel = 1;
  for (int64_t s : shape) numel *= static_cast<uint64_t>(s);
  Fingerprinter f(itemsize, shape, shape, {});
  f.Add(data, numel);
  return f.value();
}

}  // namespace materializer::delivery
