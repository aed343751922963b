#include "server/init/schemes.h"

#include <cmath>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace materializer::init {
namespace {

using spec::DType;

std::string Num(double value) { return absl::StrFormat("%.17g", value); }

// Shortest text that reads back as the same double, for messages.
std::string Short(double value) {
  for (int precision = 1; precision <= 17; ++precision) {
    std::string text = absl::StrFormat("%.*g", precision, value);
    if (std::strtod(text.c_str(), nullptr) == value) return text;
  }
  return Num(value);
}

absl::Status Finite(const char* field, double value) {
  if (std::isfinite(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " is ", Short(value), "; it must be finite"));
}

// Largest finite value of a floating dtype.
double MaxFinite(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return 65504.0;
    case DType::kBFloat16:
      return 3.3895313892515355e38;
    case DType::kFloat32:
      return std::numeric_limits<float>::max();
    case DType::kFloat8E4M3FN:
      return 448.0;
    case DType::kFloat8E5M2:
      return 57344.0;
    default:
      return std::numeric_limits<double>::max();
  }
}

// Range of an integer dtype.
void IntRange(DType dtype, double* lo, double* hi) {
  switch (dtype) {
    case DType::kInt8:
      *lo = -128;
      *hi = 127;
      return;
    case DType::kInt16:
      *lo = -32768;
      *hi = 32767;
      return;
    case DType::kInt32:
      *lo = -2147483648.0;
      *hi = 2147483647.0;
      return;
    case DType::kInt64:
      *lo = -9223372036854775808.0;
      *hi = 9223372036854775807.0;
      return;
    case DType::kUInt8:
      *lo = 0;
      *hi = 255;
      return;
    case DType::kBool:
      *lo = 0;
      *hi = 1;
      return;
    default:
      *lo = -std::numeric_limits<double>::max();
      *hi = std::numeric_limits<double>::max();
  }
}

absl::Status Representable(const char* field, double value,
                           const spec::TensorDesc& tensor) {
  const spec::DTypeInfo& info = spec::Info(tensor.dtype);
  if (info.is_floating_point) {
    if (std::fabs(value) > MaxFinite(tensor.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " is ", Short(value), ", which overflows ", info.name,
          " (largest finite value ", Short(MaxFinite(tensor.dtype)), ")"));
    }
    return absl::OkStatus();
  }
  double lo = 0;
  double hi = 0;
  IntRange(tensor.dtype, &lo, &hi);
  if (value != std::floor(value) || value < lo || value > hi) {
    // int64's bounds are not exact doubles; 2^63 itself is out of range.
    return absl::InvalidArgumentError(absl::StrCat(
        field, " is ", Short(value), ", which ", info.name,
        " cannot represent (integers in [", Short(lo), ", ", Short(hi),
        "])"));
  }
  if (tensor.dtype == DType::kInt64 && value >= 9223372036854775808.0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", Short(value), ", which overflows int64"));
  }
  return absl::OkStatus();
}

}  // namespace

UniformParams GetParams(const v1::Uniform& uniform) {
  UniformParams params;
  if (uniform.has_a()) params.a = uniform.a();
  if (uniform.has_b()) params.b = uniform.b();
  return params;
}

NormalParams GetParams(const v1::Normal& normal) {
  NormalParams params;
  if (normal.has_mean()) params.mean = normal.mean();
  if (normal.has_std()) params.std = normal.std();
  return params;
}

absl::Status CheckSchemeParameters(const v1::InitScheme& scheme) {
  switch (scheme.scheme_case()) {
    case v1::InitScheme::kZeros:
    case v1::InitScheme::kOnes:
      return absl::OkStatus();
    case v1::InitScheme::kConstant:
      return Finite("constant.val", scheme.constant().val());
    case v1::InitScheme::kUniform: {
      const UniformParams p = GetParams(scheme.uniform());
      if (absl::Status s = Finite("uniform.a", p.a); !s.ok()) return s;
      if (absl::Status s = Finite("uniform.b", p.b); !s.ok()) return s;
      if (p.a > p.b) {
        return absl::InvalidArgumentError(
            absl::StrCat("uniform.a is ", Short(p.a), " and uniform.b is ",
                         Short(p.b), "; a must be <= b"));
      }
      return absl::OkStatus();
    }
    case v1::InitScheme::kNormal: {
      const NormalParams p = GetParams(scheme.normal());
      if (absl::Status s = Finite("normal.mean", p.mean); !s.ok()) return s;
      if (absl::Status s = Finite("normal.std", p.std); !s.ok()) return s;
      if (p.std < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "normal.std is ", Short(p.std), "; it must be >= 0"));
      }
      return absl::OkStatus();
    }
    case v1::InitScheme::SCHEME_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "no scheme is set; set one of zeros, ones, constant, uniform, normal");
}

absl::Status CheckSchemeForTensor(const v1::InitScheme& scheme,
                                  const spec::TensorDesc& tensor) {
  const spec::DTypeInfo& info = spec::Info(tensor.dtype);
  if (IsRandom(scheme) && !info.is_floating_point) {
    return absl::InvalidArgumentError(absl::StrCat(
        DescribeScheme(scheme), " needs a floating-point dtype; the tensor is ",
        info.name, " (use zeros, ones or constant)"));
  }
  switch (scheme.scheme_case()) {
    case v1::InitScheme::kConstant:
      return Representable("constant.val", scheme.constant().val(), tensor);
    case v1::InitScheme::kUniform: {
      const UniformParams p = GetParams(scheme.uniform());
      if (absl::Status s = Representable("uniform.a", p.a, tensor); !s.ok()) {
        return s;
      }
      if (absl::Status s = Representable("uniform.b", p.b, tensor); !s.ok()) {
        return s;
      }
      // torch: uniform_ expects to - from <= the dtype's largest value.
      if (p.b - p.a > MaxFinite(tensor.dtype)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "uniform.b - uniform.a is ", Short(p.b - p.a), ", which overflows ",
            info.name));
      }
      return absl::OkStatus();
    }
    default:
      return absl::OkStatus();
  }
}

bool IsRandom(const v1::InitScheme& scheme) {
  return scheme.scheme_case() == v1::InitScheme::kUniform ||
         scheme.scheme_case() == v1::InitScheme::kNormal;
}

std::string DescribeScheme(const v1::InitScheme& scheme) {
  switch (scheme.scheme_case()) {
    case v1::InitScheme::kZeros:
      return "zeros";
    case v1::InitScheme::kOnes:
      return "ones";
    case v1::InitScheme::kConstant:
      return absl::StrCat("constant(val=", Short(scheme.constant().val()),
                          ")");
    case v1::InitScheme::kUniform: {
      const UniformParams p = GetParams(scheme.uniform());
      return absl::StrCat("uniform(a=", Short(p.a), ", b=", Short(p.b), ")");
    }
    case v1::InitScheme::kNormal: {
      const NormalParams p = GetParams(scheme.normal());
      return absl::StrCat("normal(mean=", Short(p.mean), ", std=",
                          Short(p.std), ")");
    }
    case v1::InitScheme::SCHEME_NOT_SET:
      break;
  }
  return "(none)";
}

}  // namespace materializer::init
