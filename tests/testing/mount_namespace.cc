#include "tests/testing/mount_namespace.h"

#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace materializer::testing {

int RunInMountNamespace(const std::function<int()>& body) {
  const pid_t child = fork();
  if (child < 0) return 128;
  if (child == 0) {
    if (unshare(CLONE_NEWNS) != 0 &&
        unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
      _exit(kNoMountNamespace);
    }
    mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr);
    _exit(body());
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child) return 128;
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

uint64_t HugeMappedBytes(const void* begin, const void* end) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  uint64_t kib = 0;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 &&
        line.find(':') > line.find('-')) {
      inside = lo >= reinterpret_cast<uintptr_t>(begin) &&
               hi <= reinterpret_cast<uintptr_t>(end);
      continue;
    }
    unsigned long value = 0;
    if (inside &&
        std::sscanf(line.c_str(), "ShmemPmdMapped: %lu kB", &value) == 1) {
      kib += value;
    }
  }
  return uint64_t{kib} << 10;
}

}  // namespace materializer::testing
