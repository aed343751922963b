// What fresh shared-memory pages cost: creates a file of MIB mebibytes in
// each DIR, maps it shared, makes it resident (MADV_POPULATE_WRITE, one
// thread), then unmaps and unlinks it; four rounds per directory, printing
// seconds and microseconds per 4 KiB. Compare /dev/shm with a tmpfs
// mounted huge=within_size (docs/operations.md, "Huge pages for shared
// memory"):
//
//   bazel build //bench:shm_pages && bazel-bin/bench/shm_pages 2048 /dev/shm DIR
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static double now() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s MIB DIR...\n", argv[0]);
    return 2;
  }
  const size_t bytes = static_cast<size_t>(atol(argv[1])) << 20;
  for (int d = 2; d < argc; ++d) {
    char path[4096];
    snprintf(path, sizeof path, "%s/shm-pages-%d", argv[d], static_cast<int>(getpid()));
    for (int round = 0; round < 4; ++round) {
      const double t0 = now();
      const int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
      if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
        perror(path);
        return 1;
      }
      void* pages =
          mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (pages == MAP_FAILED || madvise(pages, bytes, MADV_POPULATE_WRITE) != 0) {
        perror("map and populate");
        return 1;
      }
      const double seconds = now() - t0;
      munmap(pages, bytes);
      close(fd);
      unlink(path);
      printf("%s round %d: %.3f s, %.2f us per 4 KiB\n", argv[d], round, seconds,
             seconds * 1e6 / static_cast<double>(bytes / 4096));
    }
  }
  return 0;
}
