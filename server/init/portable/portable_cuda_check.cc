// Random-case equality of two portable fill paths: the CUDA kernel (or a
// CPU path) against a CPU path, byte for byte, over random distributions,
// parameters, dtypes, shapes (rank 0 to 4, empty, and huge full shapes
// with a small box) and shard boxes. Prints one JSON summary line with the
// coverage and the first mismatches. For tools/gpu-run, which runs it on a
// GPU (--target=cuda) and, rehearsing on a CPU, as a widest CPU path
// against the scalar one.
//
//   portable_cuda_check --cases=300 --seed=1 --target=cuda [--reference=auto]
//
// Exit status 0: every case equal; 1: a mismatch or a fill error; 2: the
// target cannot run here (no CUDA device, no CUDA in this build, or a CPU
// path this CPU lacks).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/init/portable/box.h"
#include "server/init/portable/portable.h"
#include "server/init/portable/portable_cuda.h"
#include "server/spec/dtype.h"

ABSL_FLAG(int, cases, 300, "random cases");
ABSL_FLAG(uint64_t, seed, 1, "seed of the case generator");
ABSL_FLAG(std::string, target, "cuda",
          "cuda, or a CPU path: auto, scalar, "
          "avx2, avx512");
ABSL_FLAG(std::string, reference, "",
          "the CPU path to compare with (default: auto for --target=cuda, "
          "scalar for a CPU target)");
ABSL_FLAG(int, device, 0, "CUDA device ordinal");
ABSL_FLAG(int64_t, max_elements, int64_t{1} << 21,
          "largest box per case (elements)");

namespace materializer::init::portable {
namespace {

using Rng = std::mt19937_64;

constexpr spec::DType kDTypes[] = {
    spec::DType::kFloat32, spec::DType::kFloat64,      spec::DType::kBFloat16,
    spec::DType::kFloat16, spec::DType::kFloat8E4M3FN, spec::DType::kFloat8E5M2,
};
constexpr const char* kDistNames[] = {"constant", "uniform", "normal",
                                      "trunc_normal"};

double Uniform(Rng& rng, double lo, double hi) {
  return std::uniform_real_distribution<double>(lo, hi)(rng);
}

int64_t Between(Rng& rng, int64_t lo, int64_t hi) {  // inclusive
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// Sizes spread over orders of magnitude, odd ones included.
int64_t LogSize(Rng& rng, int64_t max) {
  const double e = Uniform(rng, 0.0, std::log(static_cast<double>(max) + 1));
  return std::max<int64_t>(1, static_cast<int64_t>(std::exp(e)));
}

Distribution RandomDistribution(Rng& rng, int kind) {
  switch (kind) {
    case 0:
      return Distribution::Constant(Uniform(rng, -4, 4));
    case 1: {
      const double a = Uniform(rng, -3, 3);
      const double width = Between(rng, 0, 9) == 0 ? 0 : Uniform(rng, 1e-3, 4);
      return Distribution::Uniform(a, a + width);
    }
    case 2: {
      const int pick = static_cast<int>(Between(rng, 0, 9));
      const double std =
          pick == 0   ? 1e-40  // subnormal float32 outputs
          : pick == 1 ? 0.0
                      : std::exp(Uniform(rng, std::log(1e-3), std::log(3.0)));
      return Distribution::Normal(Uniform(rng, -2, 2), std);
    }
    default: {
      const double a = Uniform(rng, -3, 0.5);
      const double b = a + Uniform(rng, 0.01, 3);
      return Distribution::TruncNormal(Uniform(rng, -1, 1),
                                       Uniform(rng, 0.01, 2), a, b);
    }
  }
}

struct Case {
  PortableRequest request;
  int dist_kind = 0;
  bool huge = false;
};

// A full shape and, most of the time, a box of it; the box stays under
// max_elements.
void RandomShape(Rng& rng, int64_t max_elements, Case* c) {
  PortableRequest& r = c->request;
  const int64_t roll = Between(rng, 0, 99);
  if (roll < 5) {  // huge full tensor, small box: 64-bit element indices
    c->huge = true;
    r.shape = Between(rng, 0, 1)
                  ? std::vector<int64_t>{int64_t{1} << 20, int64_t{1} << 20}
                  : std::vector<int64_t>{int64_t{3} << 31, 5};
    Box box{{0, 0}, {0, 0}};
    for (int d = 0; d < 2; ++d) {
      box.length[d] = std::min<int64_t>(r.shape[d], LogSize(rng, 200));
      box.offset[d] = Between(rng, 0, r.shape[d] - box.length[d]);
    }
    r.box = box;
    return;
  }
  const int rank = roll < 10   ? 0
                   : roll < 35 ? 1
                   : roll < 75 ? 2
                   : roll < 92 ? 3
                               : 4;
  int64_t budget = max_elements;
  r.shape.clear();
  for (int d = 0; d < rank; ++d) {
    const int64_t cap = std::max<int64_t>(1, budget);
    int64_t size = Between(rng, 0, 39) == 0
                       ? 0
                       : LogSize(rng, std::min<int64_t>(cap, 4096));
    r.shape.push_back(size);
    budget = size == 0 ? budget : budget / size;
  }
  std::shuffle(r.shape.begin(), r.shape.end(), rng);
  if (Between(rng, 0, 9) < 4) {
    r.box.reset();
    return;
  }
  Box box{std::vector<int64_t>(rank), std::vector<int64_t>(rank)};
  for (int d = 0; d < rank; ++d) {
    const int64_t size = r.shape[d];
    box.offset[d] = Between(rng, 0, size);
    const int64_t rest = size - box.offset[d];
    box.length[d] = rest == 0 ? 0 : Between(rng, 1, rest);
    if (Between(rng, 0, 19) == 0) box.length[d] = 0;
  }
  r.box = box;
}

Case RandomCase(Rng& rng, int64_t max_elements) {
  for (;;) {
    Case c;
    PortableRequest& r = c.request;
    r.seed = rng();
    r.name_hash = rng();
    r.dtype = kDTypes[Between(rng, 0, std::size(kDTypes) - 1)];
    c.dist_kind = static_cast<int>(Between(rng, 0, 3));
    r.dist = RandomDistribution(rng, c.dist_kind);
    RandomShape(rng, max_elements, &c);
    if (ValidatePortableRequest(r).ok()) return c;
  }
}

std::optional<CpuPath> PathNamed(const std::string& name) {
  for (CpuPath p :
       {CpuPath::kAuto, CpuPath::kScalar, CpuPath::kAvx2, CpuPath::kAvx512}) {
    if (name == CpuPathName(p)) return p;
  }
  return std::nullopt;
}

bool Runs(CpuPath path) {
  if (path == CpuPath::kAuto) return true;
  const std::vector<CpuPath> paths = AvailableCpuPaths();
  return std::find(paths.begin(), paths.end(), path) != paths.end();
}

std::string Quote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += (c == '\n' ? ' ' : c);
  }
  return out + "\"";
}

std::string Ints(const std::vector<int64_t>& values) {
  return absl::StrCat("[", absl::StrJoin(values, ", "), "]");
}

std::string Describe(const Case& c, int index) {
  const PortableRequest& r = c.request;
  std::string out = absl::StrCat(
      "{\"case\": ", index, ", \"dtype\": \"", spec::Name(r.dtype),
      "\", \"dist\": \"", kDistNames[c.dist_kind], "\", \"seed\": ", r.seed,
      ", \"name_hash\": ", r.name_hash, ", \"a\": ", r.dist.a,
      ", \"b\": ", r.dist.b, ", \"mean\": ", r.dist.mean,
      ", \"std\": ", r.dist.std, ", \"value\": ", r.dist.value,
      ", \"shape\": ", Ints(r.shape));
  if (r.box.has_value()) {
    absl::StrAppend(&out, ", \"box_offset\": ", Ints(r.box->offset),
                    ", \"box_length\": ", Ints(r.box->length));
  }
  return out;
}

std::string Counts(const std::map<std::string, int>& counts) {
  return absl::StrCat("{",
                      absl::StrJoin(counts, ", ",
                                    [](std::string* out, const auto& kv) {
                                      absl::StrAppend(out, "\"", kv.first,
                                                      "\": ", kv.second);
                                    }),
                      "}");
}

int Run() {
  const std::string target = absl::GetFlag(FLAGS_target);
  const bool on_cuda = target == "cuda";
  std::optional<CpuPath> target_path;
  if (!on_cuda) {
    target_path = PathNamed(target);
    if (!target_path) {
      std::printf("{\"error\": \"unknown --target %s\"}\n", target.c_str());
      return 1;
    }
  }
  std::string reference_name = absl::GetFlag(FLAGS_reference);
  if (reference_name.empty()) reference_name = on_cuda ? "auto" : "scalar";
  const std::optional<CpuPath> reference = PathNamed(reference_name);
  if (!reference) {
    std::printf("{\"error\": \"unknown --reference %s\"}\n",
                reference_name.c_str());
    return 1;
  }
  if (on_cuda) {
    const absl::StatusOr<int> devices = PortableCudaDeviceCount();
    if (!devices.ok()) {
      std::printf("{\"error\": %s}\n",
                  Quote(std::string(devices.status().message())).c_str());
      return 2;
    }
  } else if (!Runs(*target_path) || !Runs(*reference)) {
    std::printf("{\"error\": \"this CPU cannot run the %s path\"}\n",
                target.c_str());
    return 2;
  }
  // Name the path auto resolves to (the widest this CPU runs).
  auto resolved = [](CpuPath p) {
    return CpuPathName(p == CpuPath::kAuto ? AvailableCpuPaths().back() : p);
  };

  Rng rng(absl::GetFlag(FLAGS_seed));
  const int cases = absl::GetFlag(FLAGS_cases);
  const int64_t max_elements = absl::GetFlag(FLAGS_max_elements);
  std::map<std::string, int> by_dtype, by_dist, by_rank;
  int boxed = 0, empty = 0, huge = 0, mismatches = 0;
  int64_t compared_bytes = 0;
  std::vector<std::string> failures;
  for (int i = 0; i < cases; ++i) {
    const Case c = RandomCase(rng, max_elements);
    const PortableRequest& r = c.request;
    ++by_dtype[std::string(spec::Name(r.dtype))];
    ++by_dist[kDistNames[c.dist_kind]];
    ++by_rank[absl::StrCat(r.shape.size())];
    boxed += r.box.has_value();
    huge += c.huge;
    const int64_t bytes = *PortableOutputBytes(r);
    empty += bytes == 0;
    std::string want(static_cast<size_t>(bytes), '\0');
    std::string got(static_cast<size_t>(bytes), '\x5A');
    absl::Status status =
        FillPortable(r, want.data(), FillOptions{0, *reference});
    if (status.ok()) {
      status = on_cuda
                   ? FillPortableCudaToHost(r, got.data(),
                                            absl::GetFlag(FLAGS_device))
                   : FillPortable(r, got.data(), FillOptions{0, *target_path});
    }
    compared_bytes += bytes;
    if (!status.ok() || got != want) {
      ++mismatches;
      if (failures.size() < 5) {
        std::string why;
        if (!status.ok()) {
          why = absl::StrCat(", \"error\": ", Quote(status.ToString()));
        } else {
          const size_t at = static_cast<size_t>(
              std::mismatch(got.begin(), got.end(), want.begin()).first -
              got.begin());
          why = absl::StrCat(", \"first_byte\": ", at);
        }
        failures.push_back(Describe(c, i) + why + "}");
      }
    }
  }
  std::printf(
      "{\"target\": \"%s\", \"reference\": \"%s\", \"cases\": %d, "
      "\"mismatches\": %d, \"compared_bytes\": %lld, \"boxed\": %d, "
      "\"empty\": %d, \"huge\": %d, \"by_dtype\": %s, \"by_dist\": %s, "
      "\"by_rank\": %s, \"failures\": [%s]}\n",
      on_cuda ? "cuda" : resolved(*target_path), resolved(*reference), cases,
      mismatches, static_cast<long long>(compared_bytes), boxed, empty, huge,
      Counts(by_dtype).c_str(), Counts(by_dist).c_str(),
      Counts(by_rank).c_str(), absl::StrJoin(failures, ", ").c_str());
  return mismatches == 0 ? 0 : 1;
}

}  // namespace
}  // namespace materializer::init::portable

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return materializer::init::portable::Run();
}
