#ifndef MATERIALIZER_SERVER_SPEC_LIMITS_H_
#define MATERIALIZER_SERVER_SPEC_LIMITS_H_

// The size limits of a request's model, in one place. Each bounds the work
// or memory one request can cost before anything is reserved; docs/api.md
// ("Limits") lists them for clients. Exceeding one is INVALID_ARGUMENT
// naming the field.

#include <cstddef>
#include <cstdint>

namespace materializer::spec {

// Tensors per model (ModelSpec.tensors).
inline constexpr int kMaxTensors = 1000000;
// Bytes of a tensor name.
inline constexpr size_t kMaxNameLength = 512;
// Dimensions of a tensor.
inline constexpr int kMaxRank = 16;
// A tensor's element count, byte size and strides stay below 2^63 (torch
// sizes and strides are int64).
inline constexpr uint64_t kMaxTensorBytes = (uint64_t{1} << 63) - 1;
// RNG_MODE_PORTABLE draws from a counter space of 2^62 elements per tensor
// (or per init-step region): a tensor drawn from in portable mode has fewer
// elements. docs/portable-rng.md, section 4.
inline constexpr uint64_t kMaxPortableElements = uint64_t{1} << 62;

}  // namespace materializer::spec

#endif  // MATERIALIZER_SERVER_SPEC_LIMITS_H_
