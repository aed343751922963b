#include "server/delivery/digest.h"

#include <xxhash.h>
#include <zlib.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"

namespace materializer::delivery {
namespace {

XXH3_state_t* State(void* state) { return static_cast<XXH3_state_t*>(state); }

}  // namespace

Digest128 HashBytes(const void* data, size_t length) {
  const XXH128_hash_t hash = XXH3_128bits(data, length);
  return Digest128{hash.high64, hash.low64};
}

uint32_t Crc32(const void* data, size_t length, uint32_t crc) {
  const auto* bytes = static_cast<const Bytef*>(data);
  // zlib takes 32-bit lengths in crc32(); crc32_z takes size_t.
  return static_cast<uint32_t>(crc32_z(crc, bytes, length));
}

std::array<unsigned char, 16> CanonicalBytes(const Digest128& digest) {
  std::array<unsigned char, 16> out;
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<unsigned char>(digest.high >> (56 - 8 * i));
    out[8 + i] = static_cast<unsigned char>(digest.low >> (56 - 8 * i));
  }
  return out;
}

std::string FormatDigest(const Digest128& digest) {
  return absl::StrCat(kDigestPrefix, absl::Hex(digest.high, absl::kZeroPad16),
                      absl::Hex(digest.low, absl::kZeroPad16));
}

Hasher::Hasher() : state_(XXH3_createState()) {
  if (state_ == nullptr) std::abort();  // out of memory for 600 bytes
  XXH3_128bits_reset(State(state_));
}

Hasher::~Hasher() {
  if (state_ != nullptr) XXH3_freeState(State(state_));
}

Hasher::Hasher(Hasher&& other) noexcept
    : state_(std::exchange(other.state_, nullptr)),
      length_(std::exchange(other.length_, 0)) {}

Hasher& Hasher::operator=(Hasher&& other) noexcept {
  if (this != &other) {
    if (state_ != nullptr) XXH3_freeState(State(state_));
    state_ = std::exchange(other.state_, nullptr);
    length_ = std::exchange(other.length_, 0);
  }
  return *this;
}

void Hasher::Update(const void* data, size_t length) {
  if (length == 0) return;
  XXH3_128bits_update(State(state_), data, length);
  length_ += length;
}

Digest128 Hasher::Finish() const {
  const XXH128_hash_t hash = XXH3_128bits_digest(State(state_));
  return Digest128{hash.high64, hash.low64};
}

}  // namespace materializer::delivery
