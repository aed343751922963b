#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_KERNEL_PARAMS_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_KERNEL_PARAMS_H_

// What a kernel needs to fill a box: plain data, computed once on the host
// by MakeKernelParams (portable.h) and copied by value to every kernel (CPU
// paths and CUDA), so all of them see the same rounded parameters.

#include <cstdint>

namespace materializer::init::portable {

enum class Dist : uint32_t {
  kConstant = 0,
  kUniform = 1,
  kNormal = 2,
  kTruncNormal = 3,
};

// Output element format. float64 computes in double; every other format
// computes in float32 and rounds (narrow.h).
enum class Format : uint32_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kBFloat16 = 2,
  kFloat16 = 3,
  kFloat8E4M3FN = 4,
  kFloat8E5M2 = 5,
};

inline constexpr int kMaxRank = 8;

// Layout of the counter space: elements come in groups of 64 (float32
// compute) or 32 (float64) that share 16 consecutive Philox blocks; word j
// of block 16g + l is element 64g + 16j + l (float32), and words 2j, 2j+1
// are element 32g + 16j + l (float64). So SIMD lanes map to consecutive
// blocks and consecutive elements at once. docs/portable-rng.md, "Counter".
inline constexpr int kBlocksPerGroup = 16;

// Distribution parameters in the compute type. For a float64 tensor the
// d_ fields apply, for every other one the f_ fields.
//   constant:     value = shift
//   uniform:      x = fma(u, scale, shift), u in [0, 1)
//   normal:       x = fma(z, scale, shift), z ~ N(0, 1)
//   trunc_normal: y = fma(u, width, lo), u in (0, 1);
//                 x = min(max(fma(erfinv(y), scale, shift), clamp_lo),
//                         clamp_hi)
template <class T>
struct DistParams {
  T scale = 0;
  T shift = 0;
  T lo = 0;
  T width = 0;
  T clamp_lo = 0;
  T clamp_hi = 0;
};

struct KernelParams {
  uint32_t key0 = 0;
  uint32_t key1 = 0;
  uint32_t stream = 0;
  Dist dist = Dist::kConstant;
  Format format = Format::kFloat32;
  DistParams<float> f;
  DistParams<double> d;
};

// The box as runs: after merging dimensions the box spans completely, it
// is num_runs runs of run_len elements that are contiguous in the full
// tensor (and in the output, one after another). Run r starts at full
// linear index base + sum_k idx_k * outer_stride[k], where idx is r
// written in the mixed radix outer_len (row-major).
struct RunLayout {
  int outer_rank = 0;
  int64_t outer_len[kMaxRank] = {};
  int64_t outer_stride[kMaxRank] = {};
  int64_t base = 0;
  int64_t run_len = 0;
  int64_t num_runs = 0;
};

}  // namespace materializer::init::portable

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_KERNEL_PARAMS_H_
