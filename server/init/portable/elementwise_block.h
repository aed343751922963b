#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_ELEMENTWISE_BLOCK_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_ELEMENTWISE_BLOCK_H_

// The inner loop of RunElementwiseF64, built once per instruction set
// (elementwise_block.cc: generic x86-64, and AVX2 + FMA where the compiler
// can vectorize the f64 functions); elementwise.cc picks one at run time.
// Every build computes the same bits: the same IEEE operations, no
// contraction, no reassociation.

#include <cstdint>
#include <vector>

#include "server/init/portable/elementwise.h"

namespace materializer::init::portable::internal {

// Elements per block.
inline constexpr int64_t kElementwiseBlock = 256;

// Runs every op over one block of m <= kElementwiseBlock elements: value v
// is at regs + v * kElementwiseBlock; value 0 is filled by the caller.
using ElementwiseBlockFn = void (*)(const std::vector<ElementwiseOpDesc>& ops,
                                    double* regs, int64_t m);

void ElementwiseBlockGeneric(const std::vector<ElementwiseOpDesc>& ops,
                             double* regs, int64_t m);
// nullptr where the library was built without AVX2 + FMA.
ElementwiseBlockFn ElementwiseBlockAvx2();

}  // namespace materializer::init::portable::internal

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_ELEMENTWISE_BLOCK_H_
