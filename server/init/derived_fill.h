#ifndef MATERIALIZER_SERVER_INIT_DERIVED_FILL_H_
#define MATERIALIZER_SERVER_INIT_DERIVED_FILL_H_

// Computing derived values (docs/init.md, "Derived values") on LibTorch
// tensors: an init step's elementwise program (InitStep.map) and the norm
// of a source tensor (norm_of), in each RNG mode.
//
// RNG_MODE_TORCH runs the ATen ops the Python code runs, in order, on
// tensors of the program's compute dtype, with Python numbers passed as
// Python passes them (wrapped-number tensors), so the values equal the
// Python expression of docs/init.md bit for bit. RNG_MODE_PORTABLE runs
// the exact float64 arithmetic of docs/portable-rng.md, section 14, on the
// CPU, whatever the arena's device.
//
// Throws c10::Error / std::runtime_error on failure (callers run under
// GuardTorch). Thread-compatible.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "server/init/elementwise.h"

namespace materializer::init {

// RNG_MODE_TORCH: the program's last value, computed from `leaf` (a tensor
// of the compute dtype holding value 0, which this may overwrite) with
// ATen ops on leaf's device.
at::Tensor RunElementwiseTorch(const at::Tensor& leaf,
                               const ParsedElementwise& program);

// RNG_MODE_TORCH: torch.norm_except_dim(source, 2, dim).
at::Tensor NormExceptDimTorch(const at::Tensor& source, int64_t dim);

// RNG_MODE_PORTABLE: the program over `leaf` (a CPU tensor of
// PortableLeafDtype(program)), evaluated in float64 on up to `threads`
// threads; the result is float64 when the program computes in float64,
// else rounded to float32 (a contiguous CPU tensor of leaf's shape; it may
// be `leaf` itself, overwritten).
at::Tensor RunElementwisePortable(const at::Tensor& leaf,
                                  const ParsedElementwise& program,
                                  int threads);

// RNG_MODE_PORTABLE: the 2-norm over every dimension but `dim` (-1: all)
// of a source slab, accumulated piece by piece: `piece` (a tensor of any
// floating dtype, on any device: it is read on the CPU) is the next part of the slab along its dimension 0,
// in order, and `first` the index (along `dim`) of the piece's first
// entry when dim is 0. Squares of the values (widened exactly to float64)
// are added to sums[j] in float64, in row-major order; together the
// pieces give the row-major order of the whole slab.
void AccumulateSquares(const at::Tensor& piece, int64_t dim, int64_t first,
                       std::vector<double>& sums);

// sqrt of each sum, as a float64 CPU tensor of `shape`.
at::Tensor SqrtOfSums(const std::vector<double>& sums,
                      const std::vector<int64_t>& shape);

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_DERIVED_FILL_H_
