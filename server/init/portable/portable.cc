#include "server/init/portable/portable.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/init/portable/cpu_kernels.h"
#include "server/init/portable/generate.h"
#include "server/init/portable/host_math.h"
#include "server/init/seed.h"
#include "server/spec/limits.h"

namespace materializer::init::portable {
namespace {

constexpr double kSqrt2 = 0x1.6a09e667f3bcdp+0;
constexpr double kInvSqrt2 = 0x1.6a09e667f3bcdp-1;
constexpr int64_t kMaxElements =
    static_cast<int64_t>(spec::kMaxPortableElements);
constexpr int64_t kMinElementsPerThread = int64_t{1} << 16;

std::optional<Format> FormatOf(spec::DType dtype) {
  switch (dtype) {
    case spec::DType::kFloat32:
      return Format::kFloat32;
    case spec::DType::kFloat64:
      return Format::kFloat64;
    case spec::DType::kBFloat16:
      return Format::kBFloat16;
    case spec::DType::kFloat16:
      return Format::kFloat16;
    case spec::DType::kFloat8E4M3FN:
      return Format::kFloat8E4M3FN;
    case spec::DType::kFloat8E5M2:
      return Format::kFloat8E5M2;
    default:
      return std::nullopt;
  }
}

Dist DistOf(Distribution::Kind kind) {
  switch (kind) {
    case Distribution::Kind::kConstant:
      return Dist::kConstant;
    case Distribution::Kind::kUniform:
      return Dist::kUniform;
    case Distribution::Kind::kNormal:
      return Dist::kNormal;
    case Distribution::Kind::kTruncNormal:
      return Dist::kTruncNormal;
  }
  return Dist::kConstant;
}

absl::Status CheckFinite(const char* what, double value) {
  if (!std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is ", value, "; it must be finite"));
  }
  return absl::OkStatus();
}

absl::Status CheckDistribution(const Distribution& dist) {
  switch (dist.kind) {
    case Distribution::Kind::kConstant:
      return CheckFinite("constant value", dist.value);
    case Distribution::Kind::kUniform:
      if (absl::Status s = CheckFinite("uniform.a", dist.a); !s.ok()) return s;
      if (absl::Status s = CheckFinite("uniform.b", dist.b); !s.ok()) return s;
      if (!(dist.a <= dist.b)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "uniform.a (", dist.a, ") must be <= uniform.b (", dist.b, ")"));
      }
      if (!std::isfinite(dist.b - dist.a)) {
        return absl::InvalidArgumentError("uniform: b - a overflows");
      }
      return absl::OkStatus();
    case Distribution::Kind::kNormal:
      if (absl::Status s = CheckFinite("normal.mean", dist.mean); !s.ok()) {
        return s;
      }
      if (absl::Status s = CheckFinite("normal.std", dist.std); !s.ok()) {
        return s;
      }
      if (!(dist.std >= 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("normal.std is ", dist.std, "; it must be >= 0"));
      }
      return absl::OkStatus();
    case Distribution::Kind::kTruncNormal:
      for (auto [what, value] : {std::pair{"trunc_normal.mean", dist.mean},
                                 std::pair{"trunc_normal.std", dist.std},
                                 std::pair{"trunc_normal.a", dist.a},
                                 std::pair{"trunc_normal.b", dist.b}}) {
        if (absl::Status s = CheckFinite(what, value); !s.ok()) return s;
      }
      if (!(dist.std > 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("trunc_normal.std is ", dist.std, "; it must be > 0"));
      }
      if (!(dist.a < dist.b)) {
        return absl::InvalidArgumentError(
            absl::StrCat("trunc_normal.a (", dist.a,
                         ") must be < trunc_normal.b (", dist.b, ")"));
      }
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown distribution");
}

absl::StatusOr<int64_t> CheckedNumel(absl::Span<const int64_t> shape) {
  int64_t numel = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape[", d, "] is ", shape[d]));
    }
  }
  for (int64_t size : shape) {
    if (size == 0) return 0;
  }
  for (int64_t size : shape) {
    if (numel > kMaxElements / size) {
      return absl::InvalidArgumentError(
          "tensor has 2^62 or more elements; the portable counter space "
          "ends there");
    }
    numel *= size;
  }
  if (numel >= kMaxElements) {
    return absl::InvalidArgumentError(
        "tensor has 2^62 or more elements; the portable counter space ends "
        "there");
  }
  return numel;
}

// The distribution's parameters in double (the float64 compute type).
DistParams<double> DoubleParams(const Distribution& dist) {
  DistParams<double> p;
  switch (dist.kind) {
    case Distribution::Kind::kConstant:
      p.shift = dist.value;
      break;
    case Distribution::Kind::kUniform:
      p.scale = dist.b - dist.a;
      p.shift = dist.a;
      break;
    case Distribution::Kind::kNormal:
      p.scale = dist.std;
      p.shift = dist.mean;
      break;
    case Distribution::Kind::kTruncNormal: {
      const double alpha = (dist.a - dist.mean) / dist.std;
      const double beta = (dist.b - dist.mean) / dist.std;
      p.lo = PortableErf(alpha * kInvSqrt2);
      const double hi = PortableErf(beta * kInvSqrt2);
      p.width = hi - p.lo;
      p.scale = dist.std * kSqrt2;
      p.shift = dist.mean;
      p.clamp_lo = dist.a;
      p.clamp_hi = dist.b;
      break;
    }
  }
  return p;
}

absl::StatusOr<DistParams<float>> FloatParams(const DistParams<double>& d) {
  DistParams<float> f;
  const std::pair<double, float*> fields[] = {
      {d.scale, &f.scale}, {d.shift, &f.shift},       {d.lo, &f.lo},
      {d.width, &f.width}, {d.clamp_lo, &f.clamp_lo}, {d.clamp_hi, &f.clamp_hi},
  };
  for (const auto& [value, field] : fields) {
    *field = static_cast<float>(value);
    if (!std::isfinite(*field)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a distribution parameter (", value,
          ") is outside float32's range, the compute type of this dtype"));
    }
  }
  return f;
}

bool CpuHas(CpuPath path) {
#if defined(__x86_64__)
  switch (path) {
    case CpuPath::kScalar:
      return true;
    case CpuPath::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             internal::Avx2FillRun(Dist::kUniform, Format::kFloat32) != nullptr;
    case CpuPath::kAvx512:
      return __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("fma") &&
             internal::Avx512FillRun(Dist::kUniform, Format::kFloat32) !=
                 nullptr;
    case CpuPath::kAuto:
      return true;
  }
  return false;
#else
  return path == CpuPath::kScalar || path == CpuPath::kAuto;
#endif
}

internal::FillRunFn KernelFor(CpuPath path, Dist dist, Format format) {
  switch (path) {
    case CpuPath::kAvx512:
      return internal::Avx512FillRun(dist, format);
    case CpuPath::kAvx2:
      return internal::Avx2FillRun(dist, format);
    default:
      return internal::ScalarFillRun(dist, format);
  }
}

}  // namespace

Distribution Distribution::Constant(double value) {
  Distribution d;
  d.kind = Kind::kConstant;
  d.value = value;
  return d;
}
Distribution Distribution::Uniform(double a, double b) {
  Distribution d;
  d.kind = Kind::kUniform;
  d.a = a;
  d.b = b;
  return d;
}
Distribution Distribution::Normal(double mean, double std) {
  Distribution d;
  d.kind = Kind::kNormal;
  d.mean = mean;
  d.std = std;
  return d;
}
Distribution Distribution::TruncNormal(double mean, double std, double a,
                                       double b) {
  Distribution d;
  d.kind = Kind::kTruncNormal;
  d.mean = mean;
  d.std = std;
  d.a = a;
  d.b = b;
  return d;
}

uint64_t NameHash(absl::string_view name) { return Fnv1a64(name); }

PhiloxKey TensorKey(uint64_t seed, uint64_t name_hash) {
  const uint64_t s = SplitMix64(seed ^ SplitMix64(name_hash));
  return PhiloxKey{static_cast<uint32_t>(s), static_cast<uint32_t>(s >> 32)};
}

absl::Status ValidatePortableRequest(const PortableRequest& request) {
  return MakeKernelParams(request).status();
}

absl::StatusOr<KernelParams> MakeKernelParams(const PortableRequest& request) {
  const std::optional<Format> format = FormatOf(request.dtype);
  if (!format.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "portable init fills floating dtypes (float32, float64, float16, "
        "bfloat16, float8_e4m3fn, float8_e5m2); not ",
        spec::Name(request.dtype)));
  }
  absl::StatusOr<int64_t> numel = CheckedNumel(request.shape);
  if (!numel.ok()) return numel.status();
  if (request.box.has_value()) {
    if (absl::Status s = ValidateBox(request.shape, *request.box); !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = CheckDistribution(request.dist); !s.ok()) return s;

  KernelParams k;
  const PhiloxKey key = TensorKey(request.seed, request.name_hash);
  k.key0 = key.key0;
  k.key1 = key.key1;
  k.stream = request.stream;
  k.dist = DistOf(request.dist.kind);
  k.format = *format;
  k.d = DoubleParams(request.dist);
  if (k.format != Format::kFloat64) {
    absl::StatusOr<DistParams<float>> f = FloatParams(k.d);
    if (!f.ok()) return f.status();
    k.f = *f;
  }
  return k;
}

absl::StatusOr<int64_t> PortableOutputBytes(const PortableRequest& request) {
  absl::StatusOr<int64_t> numel = CheckedNumel(request.shape);
  if (!numel.ok()) return numel.status();
  int64_t elements = *numel;
  if (request.box.has_value()) {
    if (absl::Status s = ValidateBox(request.shape, *request.box); !s.ok()) {
      return s;
    }
    elements = NumElements(*request.box);
  }
  return elements * spec::ItemSize(request.dtype);
}

const char* CpuPathName(CpuPath path) {
  switch (path) {
    case CpuPath::kAuto:
      return "auto";
    case CpuPath::kScalar:
      return "scalar";
    case CpuPath::kAvx2:
      return "avx2";
    case CpuPath::kAvx512:
      return "avx512";
  }
  return "?";
}

std::vector<CpuPath> AvailableCpuPaths() {
  std::vector<CpuPath> paths;
  for (CpuPath path : {CpuPath::kScalar, CpuPath::kAvx2, CpuPath::kAvx512}) {
    if (CpuHas(path)) paths.push_back(path);
  }
  return paths;
}

absl::Status FillPortable(const PortableRequest& request, void* out,
                          const FillOptions& options) {
  absl::StatusOr<KernelParams> params = MakeKernelParams(request);
  if (!params.ok()) return params.status();
  const Box box =
      request.box.has_value() ? *request.box : FullBox(request.shape);
  absl::StatusOr<RunLayout> layout_or = MakeRunLayout(request.shape, box);
  if (!layout_or.ok()) return layout_or.status();
  const RunLayout layout = *layout_or;

  CpuPath path = options.path;
  if (path == CpuPath::kAuto) path = AvailableCpuPaths().back();
  if (!CpuHas(path)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this CPU cannot run the ", CpuPathName(path), " portable kernel"));
  }
  const internal::FillRunFn fill =
      KernelFor(path, params->dist, params->format);
  if (fill == nullptr) {
    return absl::InternalError("portable: no kernel for this distribution");
  }

  const int64_t total = layout.num_runs * layout.run_len;
  if (total == 0) return absl::OkStatus();
  const int64_t item_size = spec::ItemSize(request.dtype);
  char* const bytes = static_cast<char*>(out);

  // Elements [begin, end) of the box, in box order, run by run.
  auto fill_range = [&](int64_t begin, int64_t end) {
    int64_t p = begin;
    while (p < end) {
      const int64_t run = p / layout.run_len;
      const int64_t offset = p - run * layout.run_len;
      const int64_t n = std::min(layout.run_len - offset, end - p);
      fill(*params, RunStart(layout, run) + offset, n, bytes + p * item_size);
      p += n;
    }
  };

  int64_t threads = options.threads > 0
                        ? options.threads
                        : std::max(1u, std::thread::hardware_concurrency());
  threads = std::max<int64_t>(
      1, std::min(threads,
                  (total + kMinElementsPerThread - 1) / kMinElementsPerThread));
  if (threads == 1) {
    fill_range(0, total);
    return absl::OkStatus();
  }
  // Contiguous shares; every element's value depends only on its index,
  // so the split cannot change the bytes.
  std::vector<std::thread> workers;
  workers.reserve(threads - 1);
  auto share = [&](int64_t t) {
    return total / threads * t + std::min(t, total % threads);
  };
  for (int64_t t = 1; t < threads; ++t) {
    workers.emplace_back(fill_range, share(t), share(t + 1));
  }
  fill_range(share(0), share(1));
  for (std::thread& worker : workers) worker.join();
  return absl::OkStatus();
}

}  // namespace materializer::init::portable
