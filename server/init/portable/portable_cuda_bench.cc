// Bandwidth of the portable CUDA kernel (FillPortableCuda) on one device
// buffer, next to cudaMemsetAsync of the same buffer (the device's write
// bandwidth limit) and a copy of it to pinned host memory (what a fetch
// from a CUDA arena can reach at best), timed with CUDA events. For
// bench/gpu_bench.py, which adds torch's CUDA normal_/uniform_ in its own
// process. Prints one JSON object per line:
//
//   portable_cuda_bench --bytes=2147483648 --reps=10 [--device=0]
//       [--cases=normal:float32,normal:bfloat16,uniform:float32]
//
// Exit status 2 (and an {"error": ...} line) where there is no CUDA
// device or this build has no CUDA code; 1 on any other failure.

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/init/portable/cuda_bench_support.h"
#include "server/init/portable/portable.h"
#include "server/init/portable/portable_cuda.h"
#include "server/spec/dtype.h"

ABSL_FLAG(int64_t, bytes, int64_t{1} << 30, "buffer size");
ABSL_FLAG(int, reps, 10, "timed repetitions per case (after one warm-up)");
ABSL_FLAG(int, device, 0, "CUDA device ordinal");
ABSL_FLAG(std::string, cases,
          "normal:float32,normal:bfloat16,uniform:float32,uniform:bfloat16",
          "distribution:dtype list (normal, uniform, trunc_normal)");

namespace materializer::init::portable {
namespace {

// A JSON string literal (the messages are CUDA's and ours: no control
// characters, but quotes and backslashes are escaped anyway).
std::string Quote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

int Fail(int code, const std::string& message) {
  std::printf("{\"error\": %s}\n", Quote(message).c_str());
  std::fflush(stdout);
  return code;
}

void Print(const std::string& name, int64_t bytes,
           const std::vector<double>& seconds) {
  const std::string list =
      absl::StrJoin(seconds, ", ", [](std::string* out, double s) {
        absl::StrAppend(out, absl::StrFormat("%.7f", s));
      });
  std::printf("{\"case\": %s, \"bytes\": %lld, \"seconds\": [%s]}\n",
              Quote(name).c_str(), static_cast<long long>(bytes), list.c_str());
  std::fflush(stdout);
}

std::optional<Distribution> DistributionNamed(const std::string& name) {
  if (name == "normal") return Distribution::Normal(0, 0.02);
  if (name == "uniform") return Distribution::Uniform(-0.1, 0.1);
  if (name == "trunc_normal") {
    return Distribution::TruncNormal(0, 0.02, -0.04, 0.04);
  }
  return std::nullopt;
}

int Run() {
  const int64_t bytes = absl::GetFlag(FLAGS_bytes);
  const int reps = absl::GetFlag(FLAGS_reps);
  if (bytes <= 0 || bytes % 64 != 0 || reps < 1) {
    return Fail(1, "--bytes must be a positive multiple of 64, --reps >= 1");
  }
  if (!bench::CudaBenchBuilt() || !PortableCudaBuilt()) {
    return Fail(2, "this build has no CUDA kernels (no nvcc at build time)");
  }
  const absl::StatusOr<int> devices = PortableCudaDeviceCount();
  if (!devices.ok()) return Fail(2, std::string(devices.status().message()));

  std::string name;
  size_t total = 0;
  bench::CudaBenchStatus s =
      bench::CudaDescribeDevice(absl::GetFlag(FLAGS_device), &name, &total);
  if (!s.ok()) return Fail(2, s.message);
  std::printf(
      "{\"device\": %s, \"total_bytes\": %zu, \"bytes\": %lld, \"reps\": "
      "%d}\n",
      Quote(name).c_str(), total, static_cast<long long>(bytes), reps);

  void* data = nullptr;
  void* host = nullptr;
  CUstream_st* stream = nullptr;
  s = bench::CudaAllocate(static_cast<size_t>(bytes), &data);
  if (s.ok()) s = bench::CudaAllocatePinned(static_cast<size_t>(bytes), &host);
  if (s.ok()) s = bench::CudaStreamNew(&stream);
  auto cleanup = [&] {
    if (stream != nullptr) bench::CudaStreamDelete(stream);
    if (host != nullptr) bench::CudaReleasePinned(host);
    if (data != nullptr) bench::CudaRelease(data);
  };
  if (!s.ok()) {
    cleanup();
    return Fail(1, s.message);
  }

  std::vector<double> seconds;
  s = bench::TimeOnStream(
      stream, reps,
      [&](CUstream_st* st) {
        return bench::CudaMemsetOn(st, data, 0, static_cast<size_t>(bytes))
            .ok();
      },
      &seconds);
  if (s.ok()) Print("cudaMemset", bytes, seconds);

  if (s.ok()) {
    seconds.clear();
    s = bench::TimeOnStream(
        stream, reps,
        [&](CUstream_st* st) {
          return bench::CudaCopyToHostOn(st, host, data,
                                         static_cast<size_t>(bytes))
              .ok();
        },
        &seconds);
    if (s.ok()) Print("d2h_pinned", bytes, seconds);
  }

  absl::Status fill_status;
  for (absl::string_view item :
       absl::StrSplit(absl::GetFlag(FLAGS_cases), ',', absl::SkipEmpty())) {
    if (!s.ok()) break;
    std::pair<std::string, std::string> parts = absl::StrSplit(item, ':');
    const std::optional<spec::DType> dtype = spec::ParseDType(parts.second);
    const std::optional<Distribution> dist = DistributionNamed(parts.first);
    if (!dtype || !dist) {
      cleanup();
      return Fail(1, absl::StrCat("unknown case ", item));
    }
    PortableRequest r;
    r.seed = 1;
    r.name_hash = NameHash("bench");
    r.dtype = *dtype;
    r.dist = *dist;
    r.shape = {bytes / static_cast<int64_t>(spec::ItemSize(*dtype))};
    seconds.clear();
    s = bench::TimeOnStream(
        stream, reps,
        [&](CUstream_st* st) {
          fill_status.Update(FillPortableCuda(r, data, st));
          return fill_status.ok();
        },
        &seconds);
    if (s.ok())
      Print(absl::StrCat(parts.first, "/", parts.second), bytes, seconds);
  }
  cleanup();
  if (!fill_status.ok()) return Fail(1, fill_status.ToString());
  if (!s.ok()) return Fail(1, s.message);
  return 0;
}

}  // namespace
}  // namespace materializer::init::portable

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return materializer::init::portable::Run();
}
