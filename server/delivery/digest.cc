#include "server/delivery/digest.h"

#include <libdeflate.h>
#include <xxhash.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/delivery/xxh3_builds.h"

namespace materializer::delivery {
namespace {

XXH3_state_t* State(void* state) { return static_cast<XXH3_state_t*>(state); }

// The XXH3 build every digest of this process uses: libxxhash (SSE2), or
// the widest vector build the CPU runs (xxh3_builds.h). The digests are
// the same; the wider loops are faster on data in cache.
struct Kernels {
  HashKernel kind;
  Xxh3Build fns;
};

Kernels SystemKernels() {
  Xxh3Build fns;
  fns.new_state = [] {
    XXH3_state_t* state = XXH3_createState();
    if (state == nullptr) std::abort();  // out of memory for 600 bytes
    XXH3_128bits_reset(state);
    return static_cast<void*>(state);
  };
  fns.free = [](void* state) { XXH3_freeState(State(state)); };
  fns.update = [](void* state, const void* data, size_t length) {
    XXH3_128bits_update(State(state), data, length);
  };
  fns.digest = [](const void* state, uint64_t* high, uint64_t* low) {
    const XXH128_hash_t hash =
        XXH3_128bits_digest(static_cast<const XXH3_state_t*>(state));
    *high = hash.high64;
    *low = hash.low64;
  };
  fns.hash = [](const void* data, size_t length, uint64_t* high,
                uint64_t* low) {
    const XXH128_hash_t hash = XXH3_128bits(data, length);
    *high = hash.high64;
    *low = hash.low64;
  };
  return {HashKernel::kSystem, fns};
}

// Whether the CPU runs the instructions (__builtin_cpu_supports takes a
// string literal only, hence one function each).
bool CpuHasAvx2() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

bool CpuHasAvx512() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

// The build of `kind` if this binary has it and the CPU runs it.
std::optional<Kernels> KernelsOf(HashKernel kind) {
  switch (kind) {
    case HashKernel::kSystem:
      return SystemKernels();
    case HashKernel::kAvx2:
      if (Xxh3Avx2() != nullptr && CpuHasAvx2()) {
        return Kernels{kind, *Xxh3Avx2()};
      }
      return std::nullopt;
    case HashKernel::kAvx512:
      if (Xxh3Avx512() != nullptr && CpuHasAvx512()) {
        return Kernels{kind, *Xxh3Avx512()};
      }
      return std::nullopt;
  }
  return std::nullopt;
}

Kernels ChooseKernels() {
  for (HashKernel kind : {HashKernel::kAvx512, HashKernel::kAvx2}) {
    if (std::optional<Kernels> k = KernelsOf(kind)) return *k;
  }
  return SystemKernels();
}

const Kernels& Active() {
  static const Kernels kernels = ChooseKernels();
  return kernels;
}

}  // namespace

HashKernel ActiveHashKernel() { return Active().kind; }

Digest128 HashBytes(const void* data, size_t length) {
  Digest128 out;
  Active().fns.hash(data, length, &out.high, &out.low);
  return out;
}

Digest128 HashBytesWithSystemLibrary(const void* data, size_t length) {
  Digest128 out;
  SystemKernels().fns.hash(data, length, &out.high, &out.low);
  return out;
}

bool HashKernelRuns(HashKernel kind) { return KernelsOf(kind).has_value(); }

std::optional<Digest128> HashBytesWithKernel(HashKernel kind, const void* data,
                                             size_t length, size_t piece) {
  std::optional<Kernels> k = KernelsOf(kind);
  if (!k.has_value()) return std::nullopt;
  Digest128 out;
  if (piece == 0) {
    k->fns.hash(data, length, &out.high, &out.low);
    return out;
  }
  void* state = k->fns.new_state();
  const char* bytes = static_cast<const char*>(data);
  for (size_t at = 0; at < length; at += piece) {
    k->fns.update(state, bytes + at, std::min(piece, length - at));
  }
  k->fns.digest(state, &out.high, &out.low);
  k->fns.free(state);
  return out;
}

uint32_t Crc32(const void* data, size_t length, uint32_t crc) {
  // libdeflate, as zlib, answers a null buffer with the initial value 0.
  if (length == 0) return crc;
  return libdeflate_crc32(crc, data, length);
}

uint32_t Crc32Combine(uint32_t first, uint32_t second, uint64_t second_length) {
  return static_cast<uint32_t>(
      crc32_combine64(first, second, static_cast<z_off64_t>(second_length)));
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

Hasher::Hasher() : state_(Active().fns.new_state()) {}

Hasher::~Hasher() {
  if (state_ != nullptr) Active().fns.free(state_);
}

Hasher::Hasher(Hasher&& other) noexcept
    : state_(std::exchange(other.state_, nullptr)),
      length_(std::exchange(other.length_, 0)) {}

Hasher& Hasher::operator=(Hasher&& other) noexcept {
  if (this != &other) {
    if (state_ != nullptr) Active().fns.free(state_);
    state_ = std::exchange(other.state_, nullptr);
    length_ = std::exchange(other.length_, 0);
  }
  return *this;
}

void Hasher::Update(const void* data, size_t length) {
  if (length == 0) return;
  Active().fns.update(state_, data, length);
  length_ += length;
}

Digest128 Hasher::Finish() const {
  Digest128 out;
  Active().fns.digest(state_, &out.high, &out.low);
  return out;
}

}  // namespace materializer::delivery
