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

// rope_inv_freq computes its frequencies into scratch memory (float32,
// with temporaries) outside the reserved arena; rotary dimensions are in
// the hundreds.
inline constexpr int64_t kMaxRopeFrequencies = int64_t{1} << 20;
// TensorSpec.init_steps: steps of one tensor, and of the whole request.
// Recorded init code has a handful per tensor (a draw, then a padding row
// zeroed); each step is a kernel launch, so the request's total bounds the
// work.
inline constexpr int kMaxInitStepsPerTensor = 1024;
inline constexpr int kMaxInitStepsPerRequest = 1 << 20;
// Bytes of literal values (InitScheme.values) in one request, all tensors
// and steps together: half the server's default gRPC receive limit
// (256 MiB), so the rest of a large model's request still fits beside them.
inline constexpr uint64_t kMaxValuesBytesPerRequest = uint64_t{128} << 20;

}  // namespace materializer::spec

#endif  // MATERIALIZER_SERVER_SPEC_LIMITS_H_
