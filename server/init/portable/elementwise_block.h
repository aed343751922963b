#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_ELEMENTWISE_BLOCK_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_ELEMENTWISE_BLOCK_H_

// The inner loops of RunElementwiseF64, built once per instruction set
// (elementwise_block.cc: generic x86-64, and AVX2 + FMA where the compiler
// can vectorize the f64 functions); elementwise.cc picks one at run time.
// Every build computes the same bits: the same IEEE operations, no
// contraction, no reassociation.

#include <cstdint>
#include <vector>

#include "server/init/portable/elementwise.h"

namespace materializer::init::portable::internal {

// Elements per block: every value of a program over one block stays in the
// first-level cache while the ops run.
inline constexpr int64_t kElementwiseBlock = 256;

// Runs the program over elements [0, n) of `leaf` into `out` (may alias
// `leaf` exactly: each block is read before it is written), computing in
// the leaf's dtype. `scratch` holds ops.size() * kElementwiseBlock values
// of that dtype.
struct ElementwiseKernels {
  void (*f32)(const std::vector<ElementwiseOpDesc>& ops, const float* leaf,
              float* out, int64_t n, void* scratch);
  void (*f64)(const std::vector<ElementwiseOpDesc>& ops, const double* leaf,
              double* out, int64_t n, void* scratch);
};

ElementwiseKernels ElementwiseKernelsGeneric();
// {nullptr, nullptr} where the library was built without AVX2 + FMA.
ElementwiseKernels ElementwiseKernelsAvx2();

}  // namespace materializer::init::portable::internal

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_ELEMENTWISE_BLOCK_H_
