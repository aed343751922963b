#include "client/receive_memory.h"

#include <malloc.h>

namespace materializer::client {

bool KeepReceiveBuffers() {
  // 32 MiB is the largest mmap threshold glibc accepts on 64-bit systems.
  // Setting any of these also turns off glibc's dynamic threshold, which
  // would otherwise move them back after a large free.
  bool ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  ok = mallopt(M_TRIM_THRESHOLD, 256 << 20) == 1 && ok;
  ok = mallopt(M_TOP_PAD, 64 << 20) == 1 && ok;
  return ok;
}

}  // namespace materializer::client
