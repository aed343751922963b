#ifndef MATERIALIZER_SERVER_MEMORY_CACHING_ALLOCATOR_H_
#define MATERIALIZER_SERVER_MEMORY_CACHING_ALLOCATOR_H_

// What LibTorch's CUDA caching allocator holds in this process. Arenas do
// not come from it (each is a cudaMalloc of its own, arena.cc), but init
// kernels in torch mode may allocate temporaries through it, and it keeps
// what they freed cached: bytes the driver charges to this server beyond
// the ledger.

#include <cstdint>

namespace materializer::memory {

// Bytes reserved by the caching allocator on CUDA device `ordinal` (its
// segments, in use or cached); 0 when LibTorch has no CUDA or the allocator
// has not been used yet.
uint64_t CachingAllocatorReservedBytes(int ordinal);

}  // namespace materializer::memory

#endif  // MATERIALIZER_SERVER_MEMORY_CACHING_ALLOCATOR_H_
