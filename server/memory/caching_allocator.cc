#include "server/memory/caching_allocator.h"

#include <c10/core/CachingDeviceAllocator.h>

#include "server/common/torch_guard.h"

namespace materializer::memory {

uint64_t CachingAllocatorReservedBytes(int ordinal) {
  uint64_t bytes = 0;
  // Without a CUDA build of LibTorch, or before the allocator's first use,
  // there is nothing to ask (and asking would throw or initialize it).
  const absl::Status status = GuardTorch("reading allocator stats", [&] {
    c10::DeviceAllocator* allocator =
        c10::getDeviceAllocator(c10::DeviceType::CUDA);
    if (allocator == nullptr || !allocator->initialized()) return;
    const c10::CachingDeviceAllocator::DeviceStats stats =
        allocator->getDeviceStats(static_cast<c10::DeviceIndex>(ordinal));
    const int64_t current =
        stats.reserved_bytes[static_cast<size_t>(
                                 c10::CachingAllocator::StatType::AGGREGATE)]
            .current;
    bytes = current > 0 ? static_cast<uint64_t>(current) : 0;
  });
  return status.ok() ? bytes : 0;
}

}  // namespace materializer::memory
