#ifndef MATERIALIZER_SERVER_DELIVERY_DIGEST_H_
#define MATERIALIZER_SERVER_DELIVERY_DIGEST_H_

// Content digests: XXH3-128 (libxxhash), written "xxh3-128:<32 hex>", the
// 128-bit value high 64 bits first, exactly as Python's
// xxhash.xxh3_128(data).hexdigest() prints it. They guard against
// corruption (a truncated or garbled file, a bad resume), not tampering:
// TLS covers the transport.
//
//   Hasher hasher;
//   hasher.Update(header);
//   hasher.Update(data);
//   std::string digest = FormatDigest(hasher.Finish());

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace materializer::delivery {

inline constexpr absl::string_view kDigestPrefix = "xxh3-128:";

struct Digest128 {
  uint64_t high = 0;
  uint64_t low = 0;

  bool operator==(const Digest128& other) const {
    return high == other.high && low == other.low;
  }
  bool operator!=(const Digest128& other) const { return !(*this == other); }
};

// XXH3-128 of one buffer.
Digest128 HashBytes(const void* data, size_t length);

// Which XXH3 build this process hashes with (chosen once, by the CPU):
// libxxhash as Debian builds it (SSE2), or this project's AVX2 or AVX-512
// build of the same code (server/delivery/xxh3_builds.h), the widest the
// CPU runs. All give the same digests.
enum class HashKernel { kSystem, kAvx2, kAvx512 };
HashKernel ActiveHashKernel();

// HashBytes through libxxhash whatever ActiveHashKernel() is: the
// reference the vector builds are tested against.
Digest128 HashBytesWithSystemLibrary(const void* data, size_t length);

// Whether this binary has the build `kind` and the CPU runs it.
bool HashKernelRuns(HashKernel kind);
// XXH3-128 of `data` with the build `kind` (nullopt where it does not
// run): one call, or streamed in pieces of `piece` bytes if nonzero. For
// tests of every build, whichever one is active.
std::optional<Digest128> HashBytesWithKernel(HashKernel kind, const void* data,
                                             size_t length, size_t piece = 0);

// The 16 bytes of a digest, big-endian (xxhash's canonical form, what
// Python's .digest() returns).
std::array<unsigned char, 16> CanonicalBytes(const Digest128& digest);

// "xxh3-128:" followed by 32 lowercase hex digits.
std::string FormatDigest(const Digest128& digest);

// CRC-32 (zip's, as zlib computes it) of `data`, continuing from `crc`.
// libdeflate's, which folds with carry-less multiplies where the CPU has
// them: 7.2 GB/s from memory against zlib's 2.0 on the 2-core Xeon.
uint32_t Crc32(const void* data, size_t length, uint32_t crc = 0);

// The CRC-32 of A followed by B, from Crc32(A), Crc32(B) and B's length
// (zlib's crc32_combine64): pieces of one buffer checked in parallel.
uint32_t Crc32Combine(uint32_t first, uint32_t second, uint64_t second_length);

// Streaming XXH3-128: the digest of everything passed to Update, in order.
// Thread-compatible; movable, not copyable.
class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(Hasher&& other) noexcept;
  Hasher& operator=(Hasher&& other) noexcept;
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  void Update(const void* data, size_t length);
  void Update(absl::string_view bytes) { Update(bytes.data(), bytes.size()); }
  // Bytes passed to Update so far.
  uint64_t length() const { return length_; }
  // The digest so far; Update may continue afterwards.
  Digest128 Finish() const;

 private:
  void* state_;  // XXH3_state_t, kept out of this header
  uint64_t length_ = 0;
};

}  // namespace materializer::delivery

#endif  // MATERIALIZER_SERVER_DELIVERY_DIGEST_H_
