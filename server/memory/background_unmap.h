#ifndef MATERIALIZER_SERVER_MEMORY_BACKGROUND_UNMAP_H_
#define MATERIALIZER_SERVER_MEMORY_BACKGROUND_UNMAP_H_

#include <cstddef>
#include <cstdint>

namespace materializer::memory {

// Unmaps address ranges on a thread of its own, in the order given.
//
// Why: munmap of a large populated shared mapping walks every page-table
// entry of it; for a 2.2 GB shared-memory arena of 4 KiB pages it took
// 83-95 ms (strace of Release on the 2-core VM), and the Release call that
// drops the arena answered only after it. A co-located trainer that maps
// the arena's pages holds them past the release (they are its weights), so
// unmapping the server's view frees nothing it waits for. The arena's files
// are unlinked and its ledger entry is returned at once as before; only the
// page-table teardown moves off the call.
void UnmapInBackground(void* addr, size_t bytes);

// Blocks until every range queued before this call is unmapped (tests, and
// anything that must see the address space as it will be).
void WaitForBackgroundUnmaps();

// Ranges queued and not yet unmapped.
uint64_t PendingBackgroundUnmaps();

}  // namespace materializer::memory

#endif  // MATERIALIZER_SERVER_MEMORY_BACKGROUND_UNMAP_H_
