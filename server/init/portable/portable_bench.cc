// Throughput of FillPortable on one buffer, next to memset of the same
// buffer, for bench/portable_throughput.py (which adds torch.nn.init in
// its own process). Prints one JSON object per line.
//
//   portable_bench --bytes=1073741824 --threads=2 --reps=5
//       [--cases=normal:float32,uniform:bfloat16] [--path=auto]

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/init/portable/portable.h"
#include "server/spec/dtype.h"

ABSL_FLAG(int64_t, bytes, int64_t{1} << 30, "buffer size");
ABSL_FLAG(int, threads, 0, "threads for fills and memset (0: all cores)");
ABSL_FLAG(int, reps, 5, "timed repetitions per case (after one warm-up)");
ABSL_FLAG(std::string, cases,
          "normal:float32,normal:bfloat16,uniform:float32,uniform:bfloat16",
          "distribution:dtype list");
ABSL_FLAG(std::string, path, "auto", "auto, scalar, avx2 or avx512");

namespace materializer::init::portable {
namespace {

using Clock = std::chrono::steady_clock;

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) +
         1e-9 * static_cast<double>(ts.tv_nsec);
}

// Wall-clock and process CPU seconds of each repetition.
struct Timings {
  std::vector<double> wall;
  std::vector<double> cpu;
};

template <class Fn>
Timings Time(int reps, Fn fn) {
  fn();  // warm-up
  Timings t;
  for (int i = 0; i < reps; ++i) {
    const double cpu = CpuSeconds();
    const Clock::time_point start = Clock::now();
    fn();
    t.wall.push_back(
        std::chrono::duration<double>(Clock::now() - start).count());
    t.cpu.push_back(CpuSeconds() - cpu);
  }
  return t;
}

std::string JsonList(const std::vector<double>& values) {
  return absl::StrJoin(values, ", ", [](std::string* out, double s) {
    absl::StrAppend(out, absl::StrFormat("%.6f", s));
  });
}

void Print(const std::string& name, int64_t bytes, int threads,
           const std::string& path, const Timings& t) {
  std::printf(
      "{\"case\": \"%s\", \"bytes\": %lld, \"threads\": %d, \"path\": \"%s\", "
      "\"seconds\": [%s], \"cpu_seconds\": [%s]}\n",
      name.c_str(), static_cast<long long>(bytes), threads, path.c_str(),
      JsonList(t.wall).c_str(), JsonList(t.cpu).c_str());
  std::fflush(stdout);
}

int Run() {
  const int64_t bytes = absl::GetFlag(FLAGS_bytes);
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) {
    threads =
        static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  const int reps = absl::GetFlag(FLAGS_reps);
  const std::string path_name = absl::GetFlag(FLAGS_path);
  CpuPath path = CpuPath::kAuto;
  for (CpuPath p : {CpuPath::kScalar, CpuPath::kAvx2, CpuPath::kAvx512}) {
    if (path_name == CpuPathName(p)) path = p;
  }
  if (path == CpuPath::kAuto) path = AvailableCpuPaths().back();

  // One buffer for everything, touched once so page faults are not timed.
  std::unique_ptr<char[]> buffer(new char[bytes]);
  char* const data = buffer.get();
  std::memset(data, 1, bytes);

  // memset split across the same threads: the memory-bandwidth limit.
  auto parallel_memset = [&](int n) {
    std::vector<std::thread> workers;
    for (int t = 1; t < n; ++t) {
      workers.emplace_back([=] {
        const int64_t begin = bytes / n * t;
        const int64_t end = t + 1 == n ? bytes : bytes / n * (t + 1);
        std::memset(data + begin, 0, end - begin);
      });
    }
    std::memset(data, 0, bytes / n);
    for (std::thread& w : workers) w.join();
  };
  Print("memset", bytes, threads, "-",
        Time(reps, [&] { parallel_memset(threads); }));
  Print("memset_1thread", bytes, 1, "-",
        Time(reps, [&] { parallel_memset(1); }));

  for (absl::string_view item :
       absl::StrSplit(absl::GetFlag(FLAGS_cases), ',')) {
    std::pair<std::string, std::string> parts = absl::StrSplit(item, ':');
    const std::optional<spec::DType> dtype = spec::ParseDType(parts.second);
    if (!dtype) {
      std::fprintf(stderr, "unknown dtype %s\n", parts.second.c_str());
      return 1;
    }
    PortableRequest r;
    r.seed = 1;
    r.name_hash = NameHash("bench");
    r.dtype = *dtype;
    if (parts.first == "normal") {
      r.dist = Distribution::Normal(0, 0.02);
    } else if (parts.first == "uniform") {
      r.dist = Distribution::Uniform(-0.1, 0.1);
    } else if (parts.first == "trunc_normal") {
      r.dist = Distribution::TruncNormal(0, 0.02, -0.04, 0.04);
    } else {
      std::fprintf(stderr, "unknown distribution %s\n", parts.first.c_str());
      return 1;
    }
    r.shape = {bytes / spec::ItemSize(*dtype)};
    const FillOptions options{threads, path};
    absl::Status status;
    const Timings seconds =
        Time(reps, [&] { status.Update(FillPortable(r, data, options)); });
    if (!status.ok()) {
      std::fprintf(stderr, "%s\n", status.ToString().c_str());
      return 1;
    }
    Print(absl::StrCat(parts.first, "/", parts.second), bytes, threads,
          CpuPathName(path), seconds);
  }
  return 0;
}

}  // namespace
}  // namespace materializer::init::portable

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return materializer::init::portable::Run();
}
