#include "server/delivery/digest.h"

#include <xxhash.h>
#include <zlib.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/delivery/xxh3_avx2.h"

namespace materializer::delivery {
namespace {

XXH3_state_t* State(void* state) { return static_cast<XXH3_state_t*>(state); }

// The XXH3 build every digest of this process uses: libxxhash (SSE2), or
// the AVX2 build where the CPU has AVX2. The digests are the same; the
// AVX2 loops are about twice as fast on data in cache.
struct Kernels {
  HashKernel kind;
  void* (*new_state)();
  void (*free)(void*);
  void (*update)(void*, const void*, size_t);
  void (*digest)(const void*, uint64_t*, uint64_t*);
  void (*hash)(const void*, size_t, uint64_t*, uint64_t*);
};

Kernels SystemKernels() {
  Kernels k;
  k.kind = HashKernel::kSystem;
  k.new_state = [] {
    XXH3_state_t* state = XXH3_createState();
    if (state == nullptr) std::abort();  // out of memory for 600 bytes
    XXH3_128bits_reset(state);
    return static_cast<void*>(state);
  };
  k.free = [](void* state) { XXH3_freeState(State(state)); };
  k.update = [](void* state, const void* data, size_t length) {
    XXH3_128bits_update(State(state), data, length);
  };
  k.digest = [](const void* state, uint64_t* high, uint64_t* low) {
    const XXH128_hash_t hash =
        XXH3_128bits_digest(static_cast<const XXH3_state_t*>(state));
    *high = hash.high64;
    *low = hash.low64;
  };
  k.hash = [](const void* data, size_t length, uint64_t* high, uint64_t* low) {
    const XXH128_hash_t hash = XXH3_128bits(data, length);
    *high = hash.high64;
    *low = hash.low64;
  };
  return k;
}

bool CpuHasAvx2() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

Kernels ChooseKernels() {
  if (!xxh3_avx2::compiled() || !CpuHasAvx2()) return SystemKernels();
  Kernels k;
  k.kind = HashKernel::kAvx2;
  k.new_state = xxh3_avx2::NewState;
  k.free = xxh3_avx2::Free;
  k.update = xxh3_avx2::Update;
  k.digest = xxh3_avx2::Digest;
  k.hash = xxh3_avx2::HashBytes;
  return k;
}

const Kernels& Active() {
  static const Kernels kernels = ChooseKernels();
  return kernels;
}

}  // namespace

HashKernel ActiveHashKernel() { return Active().kind; }

Digest128 HashBytes(const void* data, size_t length) {
  Digest128 out;
  Active().hash(data, length, &out.high, &out.low);
  return out;
}

Digest128 HashBytesWithSystemLibrary(const void* data, size_t length) {
  Digest128 out;
  SystemKernels().hash(data, length, &out.high, &out.low);
  return out;
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

Hasher::Hasher() : state_(Active().new_state()) {}

Hasher::~Hasher() {
  if (state_ != nullptr) Active().free(state_);
}

Hasher::Hasher(Hasher&& other) noexcept
    : state_(std::exchange(other.state_, nullptr)),
      length_(std::exchange(other.length_, 0)) {}

Hasher& Hasher::operator=(Hasher&& other) noexcept {
  if (this != &other) {
    if (state_ != nullptr) Active().free(state_);
    state_ = std::exchange(other.state_, nullptr);
    length_ = std::exchange(other.length_, 0);
  }
  return *this;
}

void Hasher::Update(const void* data, size_t length) {
  if (length == 0) return;
  Active().update(state_, data, length);
  length_ += length;
}

Digest128 Hasher::Finish() const {
  Digest128 out;
  Active().digest(state_, &out.high, &out.low);
  return out;
}

}  // namespace materializer::delivery
