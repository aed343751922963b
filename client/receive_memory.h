// Process-wide allocator settings for a program that streams large
// responses (matctl fetch, bench/fetch_discard).
//
// gRPC receives each message into newly allocated buffers of up to a few
// MiB and frees them once the message is read. With glibc's default
// settings those buffers keep leaving the process: allocations above the
// mmap threshold are mapped and unmapped each time, and the heap's top is
// trimmed back to the kernel whenever enough of it is free. Each new
// buffer then costs a page fault and a zeroed page per 4 KiB, which for a
// 4 GiB fetch measured 48k-169k faults and about a tenth of the fetch's
// time (bench/RESULTS.md, "Fetch throughput").
#ifndef MATERIALIZER_CLIENT_RECEIVE_MEMORY_H_
#define MATERIALIZER_CLIENT_RECEIVE_MEMORY_H_

namespace materializer::client {

// Keeps freed receive buffers in the process for reuse: buffers up to
// 32 MiB come from the heap (not mmap), and the heap keeps up to 256 MiB
// of free memory at its top instead of returning it. A process-wide
// setting, so programs call it from main(), never the library itself.
// Returns false if the allocator refused a setting (the program still
// works, only with more page faults), as under ASan, whose allocator
// replaces glibc's.
bool KeepReceiveBuffers();

}  // namespace materializer::client

#endif  // MATERIALIZER_CLIENT_RECEIVE_MEMORY_H_
