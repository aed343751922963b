#include "server/init/schemes.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/init/values.h"
#include "server/common/quote.h"
#include "server/spec/limits.h"

namespace materializer::init {
namespace {

using spec::DType;

constexpr const char* kSchemeNames =
    "zeros, ones, constant, uniform, normal, trunc_normal, xavier_uniform, "
    "xavier_normal, kaiming_uniform, kaiming_normal, orthogonal, eye, dirac, "
    "sparse, module_default, empty, arange, rope_inv_freq, values, norm_of";

constexpr const char* kRopeTypes = "default, linear, dynamic, llama3, yarn";

absl::Status Invalid(const std::string& message) {
  return absl::InvalidArgumentError(message);
}

absl::Status Finite(absl::string_view field, double value) {
  if (std::isfinite(value)) return absl::OkStatus();
  return Invalid(
      absl::StrCat(field, " is ", ShortNumber(value), "; it must be finite"));
}

absl::Status Positive(absl::string_view field, double value) {
  if (absl::Status s = Finite(field, value); !s.ok()) return s;
  if (value > 0) return absl::OkStatus();
  return Invalid(
      absl::StrCat(field, " is ", ShortNumber(value), "; it must be > 0"));
}

std::string ShapeText(const spec::TensorDesc& tensor) {
  return absl::StrCat("[", absl::StrJoin(tensor.full_shape(), ", "), "]");
}

absl::Status CheckGain(const v1::Gain& gain, absl::string_view field) {
  return ResolveGain(gain, field).status();
}

// torch's xavier_* scale a range or a std by the gain: a negative gain
// makes torch refuse while filling (uniform_ with from > to, normal_ with a
// negative std), so it is refused here.
absl::Status CheckXavierGain(const v1::Gain& gain, absl::string_view field) {
  absl::StatusOr<double> value = ResolveGain(gain, field);
  if (!value.ok()) return value.status();
  if (*value < 0) {
    return Invalid(absl::StrCat(
        field, ".value is ", ShortNumber(*value),
        "; it must be >= 0 (torch scales the bound or std by the gain and "
        "refuses a negative one)"));
  }
  return absl::OkStatus();
}

absl::Status CheckKaiming(absl::string_view name, bool has_a, double a,
                          const std::string& mode,
                          const std::string& nonlinearity) {
  if (has_a) {
    if (absl::Status s = Finite(absl::StrCat(name, ".a"), a); !s.ok()) {
      return s;
    }
  }
  if (absl::StatusOr<FanMode> m = ParseFanMode(mode); !m.ok()) {
    return Invalid(absl::StrCat(name, ".mode: ", m.status().message()));
  }
  if (absl::StatusOr<double> g =
          CalculateGain(nonlinearity.empty() ? "leaky_relu" : nonlinearity, a);
      !g.ok()) {
    return Invalid(absl::StrCat(name, ".nonlinearity: ", g.status().message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<RopeType> ParseRopeType(const std::string& type) {
  if (type.empty() || type == "default") return RopeType::kDefault;
  if (type == "linear") return RopeType::kLinear;
  if (type == "dynamic") return RopeType::kDynamic;
  if (type == "llama3") return RopeType::kLlama3;
  if (type == "yarn") return RopeType::kYarn;
  return Invalid(absl::StrCat("rope_inv_freq.scaling.type is ", Quote(type),
                              "; use one of ", kRopeTypes));
}

absl::Status CheckRope(const v1::RopeInvFreq& rope) {
  if (rope.has_base()) {
    if (absl::Status s = Positive("rope_inv_freq.base", rope.base()); !s.ok()) {
      return s;
    }
  }
  if (rope.has_dim() && rope.dim() < 1) {
    return Invalid(
        absl::StrCat("rope_inv_freq.dim is ", rope.dim(), "; it must be >= 1"));
  }
  const v1::RopeScaling& scaling = rope.scaling();
  absl::StatusOr<RopeType> type = ParseRopeType(scaling.type());
  if (!type.ok()) return type.status();
  const std::string prefix =
      absl::StrCat("rope_inv_freq.scaling (", scaling.type(), ")");
  switch (*type) {
    case RopeType::kDefault:
      return absl::OkStatus();
    case RopeType::kDynamic:
      // Dynamic NTK rescales only past max_position_embeddings, at run time.
      return Finite(absl::StrCat(prefix, ".factor"), scaling.factor());
    case RopeType::kLinear:
      return Positive(absl::StrCat(prefix, ".factor"), scaling.factor());
    case RopeType::kLlama3: {
      if (absl::Status s =
              Positive(absl::StrCat(prefix, ".factor"), scaling.factor());
          !s.ok()) {
        return s;
      }
      const double low =
          scaling.has_low_freq_factor() ? scaling.low_freq_factor() : 1.0;
      const double high =
          scaling.has_high_freq_factor() ? scaling.high_freq_factor() : 4.0;
      if (absl::Status s =
              Positive(absl::StrCat(prefix, ".low_freq_factor"), low);
          !s.ok()) {
        return s;
      }
      if (absl::Status s =
              Positive(absl::StrCat(prefix, ".high_freq_factor"), high);
          !s.ok()) {
        return s;
      }
      if (high <= low) {
        return Invalid(
            absl::StrCat(prefix, ".high_freq_factor is ", ShortNumber(high),
                         " and low_freq_factor is ", ShortNumber(low),
                         "; high_freq_factor must be > low_freq_factor"));
      }
      break;
    }
    case RopeType::kYarn: {
      if (absl::Status s =
              Positive(absl::StrCat(prefix, ".factor"), scaling.factor());
          !s.ok()) {
        return s;
      }
      if (scaling.has_beta_fast()) {
        if (absl::Status s = Positive(absl::StrCat(prefix, ".beta_fast"),
                                      scaling.beta_fast());
            !s.ok()) {
          return s;
        }
      }
      if (scaling.has_beta_slow()) {
        if (absl::Status s = Positive(absl::StrCat(prefix, ".beta_slow"),
                                      scaling.beta_slow());
            !s.ok()) {
          return s;
        }
      }
      if (rope.has_base() && rope.base() == 1.0) {
        return Invalid(
            absl::StrCat("rope_inv_freq.base is 1; yarn divides by log(base)"));
      }
      break;
    }
  }
  if (scaling.original_max_position_embeddings() <= 0) {
    return Invalid(absl::StrCat(prefix, ".original_max_position_embeddings is ",
                                scaling.original_max_position_embeddings(),
                                "; it must be > 0"));
  }
  return absl::OkStatus();
}

std::string GainText(const v1::Gain& gain) {
  switch (gain.kind_case()) {
    case v1::Gain::kValue:
      return ShortNumber(gain.value());
    case v1::Gain::kNonlinearity:
      if (gain.has_param()) {
        return absl::StrCat(gain.nonlinearity(), "(", ShortNumber(gain.param()),
                            ")");
      }
      return gain.nonlinearity();
    case v1::Gain::KIND_NOT_SET:
      break;
  }
  return "1";
}

std::string RopeText(const v1::RopeInvFreq& rope) {
  std::string text = absl::StrCat(
      "rope_inv_freq(base=", ShortNumber(rope.has_base() ? rope.base() : 1e4));
  if (rope.has_dim()) absl::StrAppend(&text, ", dim=", rope.dim());
  const v1::RopeScaling& s = rope.scaling();
  absl::StatusOr<RopeType> type = ParseRopeType(s.type());
  if (type.ok()) {
    switch (*type) {
      case RopeType::kDefault:
        break;
      case RopeType::kLinear:
      case RopeType::kDynamic:
        absl::StrAppend(&text, ", scaling=", s.type(),
                        "(factor=", ShortNumber(s.factor()), ")");
        break;
      case RopeType::kLlama3:
        absl::StrAppend(
            &text, ", scaling=llama3(factor=", ShortNumber(s.factor()),
            ", low_freq_factor=",
            ShortNumber(s.has_low_freq_factor() ? s.low_freq_factor() : 1.0),
            ", high_freq_factor=",
            ShortNumber(s.has_high_freq_factor() ? s.high_freq_factor() : 4.0),
            ", original_max_position_embeddings=",
            s.original_max_position_embeddings(), ")");
        break;
      case RopeType::kYarn:
        absl::StrAppend(
            &text, ", scaling=yarn(factor=", ShortNumber(s.factor()),
            ", original_max_position_embeddings=",
            s.original_max_position_embeddings(), ", beta_fast=",
            ShortNumber(s.has_beta_fast() ? s.beta_fast() : 32.0),
            ", beta_slow=",
            ShortNumber(s.has_beta_slow() ? s.beta_slow() : 1.0), ")");
        break;
    }
  }
  return absl::StrCat(text, ")");
}

template <typename Kaiming>
std::string KaimingText(absl::string_view name, const Kaiming& k) {
  return absl::StrCat(
      name, "(a=", ShortNumber(k.has_a() ? k.a() : 0.0),
      ", mode=", k.mode().empty() ? "fan_in" : k.mode(), ", nonlinearity=",
      k.nonlinearity().empty() ? "leaky_relu" : k.nonlinearity(), ")");
}

// xavier and kaiming compute fan in and fan out.
absl::Status CheckFanScheme(const v1::InitScheme& scheme,
                            const spec::TensorDesc& tensor) {
  if (tensor.full_shape().size() >= 2) return absl::OkStatus();
  return Invalid(absl::StrCat(DescribeScheme(scheme),
                              " needs a tensor with at least 2 dimensions (it "
                              "computes fan in and fan out); the tensor has "
                              "shape ",
                              ShapeText(tensor)));
}

absl::Status CheckArange(const spec::TensorDesc& tensor) {
  if (tensor.dtype == DType::kBool) {
    return Invalid(
        "arange cannot fill a bool tensor (torch.arange has no bool kernel)");
  }
  return absl::OkStatus();
}

absl::Status CheckRopeForTensor(const v1::RopeInvFreq& rope,
                                const spec::TensorDesc& tensor) {
  if (tensor.full_shape().size() != 1) {
    return Invalid(absl::StrCat(
        "rope_inv_freq needs a 1-D tensor (dim / 2 frequencies); the tensor "
        "has shape ",
        ShapeText(tensor)));
  }
  if (tensor.full_shape()[0] > spec::kMaxRopeFrequencies) {
    return Invalid(absl::StrCat("rope_inv_freq fills at most ",
                                spec::kMaxRopeFrequencies,
                                " frequencies (rotary dimensions are in the "
                                "hundreds); the tensor has shape ",
                                ShapeText(tensor)));
  }
  const RopeParams p = GetParams(rope, tensor.full_shape()[0]);
  const int64_t expected = (p.dim + 1) / 2;  // len(range(0, dim, 2))
  if (tensor.full_shape()[0] != expected) {
    return Invalid(absl::StrCat("rope_inv_freq with dim ", p.dim, " gives ",
                                expected,
                                " frequencies (torch.arange(0, dim, 2)); the "
                                "tensor has shape ",
                                ShapeText(tensor)));
  }
  if (p.type == RopeType::kYarn && p.dim % 2 != 0) {
    return Invalid(
        absl::StrCat("rope_inv_freq yarn needs an even dim; dim is ", p.dim));
  }
  return absl::OkStatus();
}

}  // namespace

std::string ShortNumber(double value) {
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    return absl::StrFormat("%.0f", value);  // 500000, not 5e+05
  }
  for (int precision = 1; precision <= 17; ++precision) {
    std::string text = absl::StrFormat("%.*g", precision, value);
    if (std::strtod(text.c_str(), nullptr) == value) return text;
  }
  return absl::StrFormat("%.17g", value);
}

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

TruncNormalParams GetParams(const v1::TruncNormal& t) {
  TruncNormalParams params;
  if (t.has_mean()) params.mean = t.mean();
  if (t.has_std()) params.std = t.std();
  if (t.has_a()) params.a = t.a();
  if (t.has_b()) params.b = t.b();
  return params;
}

SparseParams GetParams(const v1::Sparse& sparse) {
  SparseParams params;
  params.sparsity = sparse.sparsity();
  if (sparse.has_std()) params.std = sparse.std();
  return params;
}

ArangeParams GetParams(const v1::Arange& arange) {
  ArangeParams params;
  if (arange.has_start()) params.start = arange.start();
  if (arange.has_step()) params.step = arange.step();
  return params;
}

KaimingParams GetKaimingParams(double a, const std::string& mode,
                               const std::string& nonlinearity) {
  KaimingParams params;
  params.a = a;
  params.mode = ParseFanMode(mode).value_or(FanMode::kFanIn);
  if (!nonlinearity.empty()) params.nonlinearity = nonlinearity;
  return params;
}

int64_t GetGroups(const v1::Dirac& dirac) {
  return dirac.has_groups() ? dirac.groups() : 1;
}

RopeParams GetParams(const v1::RopeInvFreq& rope, int64_t length) {
  RopeParams p;
  if (rope.has_base()) p.base = rope.base();
  p.dim = rope.has_dim() ? rope.dim() : 2 * length;
  const v1::RopeScaling& s = rope.scaling();
  p.type = ParseRopeType(s.type()).value_or(RopeType::kDefault);
  p.factor = s.factor();
  if (s.has_low_freq_factor()) p.low_freq_factor = s.low_freq_factor();
  if (s.has_high_freq_factor()) p.high_freq_factor = s.high_freq_factor();
  p.original_max_position_embeddings = s.original_max_position_embeddings();
  if (s.has_beta_fast()) p.beta_fast = s.beta_fast();
  if (s.has_beta_slow()) p.beta_slow = s.beta_slow();
  return p;
}

absl::Status CheckSchemeParameters(const v1::InitScheme& scheme) {
  switch (scheme.scheme_case()) {
    case v1::InitScheme::kZeros:
    case v1::InitScheme::kOnes:
    case v1::InitScheme::kEye:
    case v1::InitScheme::kModuleDefault:
    case v1::InitScheme::kEmpty:
      return absl::OkStatus();
    case v1::InitScheme::kConstant:
      return Finite("constant.val", scheme.constant().val());
    case v1::InitScheme::kUniform: {
      const UniformParams p = GetParams(scheme.uniform());
      if (absl::Status s = Finite("uniform.a", p.a); !s.ok()) return s;
      if (absl::Status s = Finite("uniform.b", p.b); !s.ok()) return s;
      if (p.a > p.b) {
        return Invalid(absl::StrCat("uniform.a is ", ShortNumber(p.a),
                                    " and uniform.b is ", ShortNumber(p.b),
                                    "; a must be <= b"));
      }
      return absl::OkStatus();
    }
    case v1::InitScheme::kNormal: {
      const NormalParams p = GetParams(scheme.normal());
      if (absl::Status s = Finite("normal.mean", p.mean); !s.ok()) return s;
      if (absl::Status s = Finite("normal.std", p.std); !s.ok()) return s;
      if (p.std < 0) {
        return Invalid(absl::StrCat("normal.std is ", ShortNumber(p.std),
                                    "; it must be >= 0"));
      }
      return absl::OkStatus();
    }
    case v1::InitScheme::kTruncNormal: {
      const TruncNormalParams p = GetParams(scheme.trunc_normal());
      if (absl::Status s = Finite("trunc_normal.mean", p.mean); !s.ok()) {
        return s;
      }
      if (absl::Status s = Finite("trunc_normal.std", p.std); !s.ok()) {
        return s;
      }
      if (absl::Status s = Finite("trunc_normal.a", p.a); !s.ok()) return s;
      if (absl::Status s = Finite("trunc_normal.b", p.b); !s.ok()) return s;
      if (p.std <= 0) {
        return Invalid(absl::StrCat("trunc_normal.std is ", ShortNumber(p.std),
                                    "; it must be > 0 (torch divides by it)"));
      }
      if (p.a >= p.b) {
        return Invalid(absl::StrCat("trunc_normal.a is ", ShortNumber(p.a),
                                    " and trunc_normal.b is ", ShortNumber(p.b),
                                    "; a must be < b"));
      }
      return absl::OkStatus();
    }
    case v1::InitScheme::kXavierUniform:
      return CheckXavierGain(scheme.xavier_uniform().gain(),
                             "xavier_uniform.gain");
    case v1::InitScheme::kXavierNormal:
      return CheckXavierGain(scheme.xavier_normal().gain(),
                             "xavier_normal.gain");
    case v1::InitScheme::kKaimingUniform: {
      const v1::KaimingUniform& k = scheme.kaiming_uniform();
      return CheckKaiming("kaiming_uniform", k.has_a(), k.a(), k.mode(),
                          k.nonlinearity());
    }
    case v1::InitScheme::kKaimingNormal: {
      const v1::KaimingNormal& k = scheme.kaiming_normal();
      return CheckKaiming("kaiming_normal", k.has_a(), k.a(), k.mode(),
                          k.nonlinearity());
    }
    case v1::InitScheme::kOrthogonal:
      return CheckGain(scheme.orthogonal().gain(), "orthogonal.gain");
    case v1::InitScheme::kDirac: {
      const int64_t groups = GetGroups(scheme.dirac());
      if (groups < 1) {
        return Invalid(
            absl::StrCat("dirac.groups is ", groups, "; it must be >= 1"));
      }
      return absl::OkStatus();
    }
    case v1::InitScheme::kSparse: {
      const SparseParams p = GetParams(scheme.sparse());
      if (absl::Status s = Finite("sparse.sparsity", p.sparsity); !s.ok()) {
        return s;
      }
      if (p.sparsity < 0 || p.sparsity > 1) {
        return Invalid(absl::StrCat("sparse.sparsity is ",
                                    ShortNumber(p.sparsity),
                                    "; it must be in [0, 1]"));
      }
      if (absl::Status s = Finite("sparse.std", p.std); !s.ok()) return s;
      if (p.std < 0) {
        return Invalid(absl::StrCat("sparse.std is ", ShortNumber(p.std),
                                    "; it must be >= 0"));
      }
      return absl::OkStatus();
    }
    case v1::InitScheme::kArange: {
      const ArangeParams p = GetParams(scheme.arange());
      if (absl::Status s = Finite("arange.start", p.start); !s.ok()) return s;
      return Finite("arange.step", p.step);
    }
    case v1::InitScheme::kRopeInvFreq:
      return CheckRope(scheme.rope_inv_freq());
    case v1::InitScheme::kValues:
      return absl::OkStatus();  // checked against the tensor (values.h)
    case v1::InitScheme::kNormOf: {
      // The source and the shape are checked with the request (resolve.cc).
      const v1::NormOf& norm = scheme.norm_of();
      if (norm.tensor().empty()) {
        return Invalid("norm_of.tensor is empty; name the tensor whose norm "
                       "this is");
      }
      if (norm.dim() < -1) {
        return Invalid(absl::StrCat("norm_of.dim is ", norm.dim(),
                                    "; it must be -1 (every element) or a "
                                    "dimension of the source (>= 0)"));
      }
      return absl::OkStatus();
    }
    case v1::InitScheme::SCHEME_NOT_SET:
      break;
  }
  return Invalid(absl::StrCat("no scheme is set; set one of ", kSchemeNames));
}

absl::Status CheckSchemeForTensor(const v1::InitScheme& scheme,
                                  const spec::TensorDesc& tensor) {
  const spec::DTypeInfo& info = spec::Info(tensor.dtype);
  if (info.is_complex) {
    // A complex tensor holds values computed by the trainer's code (a
    // rotary table) or zeros; torch draws complex numbers in its own way
    // (real and imaginary parts each with std / sqrt(2)), which no scheme
    // here reproduces.
    switch (scheme.scheme_case()) {
      case v1::InitScheme::kZeros:
      case v1::InitScheme::kOnes:
      case v1::InitScheme::kEmpty:
      case v1::InitScheme::kConstant:
        return absl::OkStatus();
      case v1::InitScheme::kValues:
        return CheckValues(scheme.values(), tensor);
      default:
        return Invalid(absl::StrCat(
            DescribeScheme(scheme), " is not defined for ", info.name,
            " tensors; they take zeros, ones, constant, empty and values"));
    }
  }
  const bool floating_only =
      IsRandom(scheme) ||
      scheme.scheme_case() == v1::InitScheme::kRopeInvFreq ||
      scheme.scheme_case() == v1::InitScheme::kNormOf;
  if (floating_only && !info.is_floating_point) {
    return Invalid(absl::StrCat(
        DescribeScheme(scheme), " needs a floating-point dtype; the tensor is ",
        info.name,
        " (integer and bool tensors take zeros, ones, constant, eye, dirac, "
        "empty, and arange for integers)"));
  }
  const size_t dims = tensor.full_shape().size();
  switch (scheme.scheme_case()) {
    case v1::InitScheme::kXavierUniform:
    case v1::InitScheme::kXavierNormal:
    case v1::InitScheme::kKaimingUniform:
    case v1::InitScheme::kKaimingNormal:
      return CheckFanScheme(scheme, tensor);
    case v1::InitScheme::kOrthogonal:
      if (dims < 2) {
        return Invalid(absl::StrCat(
            "orthogonal needs a tensor with at least 2 dimensions (trailing "
            "dimensions are flattened); the tensor has shape ",
            ShapeText(tensor)));
      }
      return absl::OkStatus();
    case v1::InitScheme::kEye:
      if (dims != 2) {
        return Invalid(
            absl::StrCat("eye needs a 2-D tensor; the tensor has shape ",
                         ShapeText(tensor)));
      }
      return absl::OkStatus();
    case v1::InitScheme::kSparse:
      if (dims != 2) {
        return Invalid(
            absl::StrCat("sparse needs a 2-D tensor; the tensor has shape ",
                         ShapeText(tensor)));
      }
      return absl::OkStatus();
    case v1::InitScheme::kDirac: {
      if (dims < 3 || dims > 5) {
        return Invalid(absl::StrCat(
            "dirac needs a 3-, 4- or 5-D tensor (a convolution weight); the "
            "tensor has shape ",
            ShapeText(tensor)));
      }
      const int64_t groups = GetGroups(scheme.dirac());
      if (tensor.full_shape()[0] % groups != 0) {
        return Invalid(absl::StrCat("dirac(groups=", groups,
                                    ") needs dimension 0 divisible by groups; "
                                    "the tensor has shape ",
                                    ShapeText(tensor)));
      }
      return absl::OkStatus();
    }
    case v1::InitScheme::kArange:
      return CheckArange(tensor);
    case v1::InitScheme::kRopeInvFreq:
      return CheckRopeForTensor(scheme.rope_inv_freq(), tensor);
    case v1::InitScheme::kValues:
      return CheckValues(scheme.values(), tensor);
    default:
      return absl::OkStatus();
  }
}

bool HasPortableDefinition(const v1::InitScheme& scheme) {
  return !scheme.has_orthogonal() && !scheme.has_sparse();
}

bool IsRandom(const v1::InitScheme& scheme) {
  switch (scheme.scheme_case()) {
    case v1::InitScheme::kUniform:
    case v1::InitScheme::kNormal:
    case v1::InitScheme::kTruncNormal:
    case v1::InitScheme::kXavierUniform:
    case v1::InitScheme::kXavierNormal:
    case v1::InitScheme::kKaimingUniform:
    case v1::InitScheme::kKaimingNormal:
    case v1::InitScheme::kOrthogonal:
    case v1::InitScheme::kSparse:
      return true;
    default:
      return false;
  }
}

std::string DescribeScheme(const v1::InitScheme& scheme) {
  switch (scheme.scheme_case()) {
    case v1::InitScheme::kZeros:
      return "zeros";
    case v1::InitScheme::kOnes:
      return "ones";
    case v1::InitScheme::kConstant:
      return absl::StrCat("constant(val=", ShortNumber(scheme.constant().val()),
                          ")");
    case v1::InitScheme::kUniform: {
      const UniformParams p = GetParams(scheme.uniform());
      return absl::StrCat("uniform(a=", ShortNumber(p.a),
                          ", b=", ShortNumber(p.b), ")");
    }
    case v1::InitScheme::kNormal: {
      const NormalParams p = GetParams(scheme.normal());
      return absl::StrCat("normal(mean=", ShortNumber(p.mean),
                          ", std=", ShortNumber(p.std), ")");
    }
    case v1::InitScheme::kTruncNormal: {
      const TruncNormalParams p = GetParams(scheme.trunc_normal());
      return absl::StrCat("trunc_normal(mean=", ShortNumber(p.mean),
                          ", std=", ShortNumber(p.std),
                          ", a=", ShortNumber(p.a), ", b=", ShortNumber(p.b),
                          ")");
    }
    case v1::InitScheme::kXavierUniform:
      return absl::StrCat("xavier_uniform(gain=",
                          GainText(scheme.xavier_uniform().gain()), ")");
    case v1::InitScheme::kXavierNormal:
      return absl::StrCat(
          "xavier_normal(gain=", GainText(scheme.xavier_normal().gain()), ")");
    case v1::InitScheme::kKaimingUniform:
      return KaimingText("kaiming_uniform", scheme.kaiming_uniform());
    case v1::InitScheme::kKaimingNormal:
      return KaimingText("kaiming_normal", scheme.kaiming_normal());
    case v1::InitScheme::kOrthogonal:
      return absl::StrCat(
          "orthogonal(gain=", GainText(scheme.orthogonal().gain()), ")");
    case v1::InitScheme::kEye:
      return "eye";
    case v1::InitScheme::kDirac:
      return absl::StrCat("dirac(groups=", GetGroups(scheme.dirac()), ")");
    case v1::InitScheme::kSparse: {
      const SparseParams p = GetParams(scheme.sparse());
      return absl::StrCat("sparse(sparsity=", ShortNumber(p.sparsity),
                          ", std=", ShortNumber(p.std), ")");
    }
    case v1::InitScheme::kModuleDefault:
      return "module_default";
    case v1::InitScheme::kEmpty:
      return "empty";
    case v1::InitScheme::kArange: {
      const ArangeParams p = GetParams(scheme.arange());
      return absl::StrCat("arange(start=", ShortNumber(p.start),
                          ", step=", ShortNumber(p.step), ")");
    }
    case v1::InitScheme::kRopeInvFreq:
      return RopeText(scheme.rope_inv_freq());
    case v1::InitScheme::kValues:
      return absl::StrCat("values(", scheme.values().data().size(), " bytes)");
    case v1::InitScheme::kNormOf:
      return absl::StrCat("norm_of(", Quote(scheme.norm_of().tensor(), 64),
                          ", dim=", scheme.norm_of().dim(), ")");
    case v1::InitScheme::SCHEME_NOT_SET:
      break;
  }
  return "(none)";
}

}  // namespace materializer::init
