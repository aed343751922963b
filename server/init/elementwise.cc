#include "server/init/elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/init/init_math.h"
#include "server/init/schemes.h"
#include "server/init/value_range.h"

namespace materializer::init {
namespace {

using portable::ElementwiseKind;
using portable::ElementwiseOpDesc;
using spec::DType;

absl::Status Invalid(absl::string_view reason) {
  return absl::InvalidArgumentError(reason);
}

std::string OpPath(size_t k) { return absl::StrCat("map.ops[", k, "]"); }

// Units in the last place of 1 in the dtype's arithmetic.
double Epsilon(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return 0x1p-52;
    case DType::kFloat16:
      return 0x1p-10;
    case DType::kBFloat16:
      return 0x1p-7;
    default:
      return 0x1p-23;  // float32 (and what narrow dtypes compute in)
  }
}

bool Contains(Interval v, double x) { return v.lo <= x && x <= v.hi; }

std::string Text(Interval v) {
  return absl::StrCat("[", ShortNumber(v.lo), ", ", ShortNumber(v.hi), "]");
}

absl::StatusOr<ElementwiseKind> KindOf(v1::ElementwiseOp::Kind kind) {
  switch (kind) {
    case v1::ElementwiseOp::ADD:
      return ElementwiseKind::kAdd;
    case v1::ElementwiseOp::SUB:
      return ElementwiseKind::kSub;
    case v1::ElementwiseOp::MUL:
      return ElementwiseKind::kMul;
    case v1::ElementwiseOp::DIV:
      return ElementwiseKind::kDiv;
    case v1::ElementwiseOp::POW:
      return ElementwiseKind::kPow;
    case v1::ElementwiseOp::NEG:
      return ElementwiseKind::kNeg;
    case v1::ElementwiseOp::EXP:
      return ElementwiseKind::kExp;
    case v1::ElementwiseOp::LOG:
      return ElementwiseKind::kLog;
    case v1::ElementwiseOp::EXPM1:
      return ElementwiseKind::kExpm1;
    case v1::ElementwiseOp::LOG1P:
      return ElementwiseKind::kLog1p;
    case v1::ElementwiseOp::SQRT:
      return ElementwiseKind::kSqrt;
    case v1::ElementwiseOp::RECIPROCAL:
      return ElementwiseKind::kReciprocal;
    case v1::ElementwiseOp::CLAMP:
      return ElementwiseKind::kClamp;
    case v1::ElementwiseOp::SOFTPLUS:
      return ElementwiseKind::kSoftplus;
    default:
      return Invalid(absl::StrCat(
          "kind is ", static_cast<int>(kind),
          "; it must be one of ADD, SUB, MUL, DIV, POW, NEG, EXP, LOG, EXPM1, "
          "LOG1P, SQRT, RECIPROCAL, CLAMP, SOFTPLUS"));
  }
}

bool IsBinary(ElementwiseKind kind) {
  return kind == ElementwiseKind::kAdd || kind == ElementwiseKind::kSub ||
         kind == ElementwiseKind::kMul || kind == ElementwiseKind::kDiv;
}

const char* KindName(ElementwiseKind kind) {
  switch (kind) {
    case ElementwiseKind::kAdd:
      return "+";
    case ElementwiseKind::kSub:
      return "-";
    case ElementwiseKind::kMul:
      return "*";
    case ElementwiseKind::kDiv:
      return "/";
    case ElementwiseKind::kPow:
      return "**";
    case ElementwiseKind::kNeg:
      return "neg";
    case ElementwiseKind::kExp:
      return "exp";
    case ElementwiseKind::kLog:
      return "log";
    case ElementwiseKind::kExpm1:
      return "expm1";
    case ElementwiseKind::kLog1p:
      return "log1p";
    case ElementwiseKind::kSqrt:
      return "sqrt";
    case ElementwiseKind::kReciprocal:
      return "reciprocal";
    case ElementwiseKind::kClamp:
      return "clamp";
    case ElementwiseKind::kSoftplus:
      return "softplus";
  }
  return "?";
}

double Softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }

// The bounds of one op's result, or why it could be inf or NaN.
absl::StatusOr<Interval> OpBounds(const ElementwiseOpDesc& op, Interval x,
                                  Interval y) {
  switch (op.kind) {
    case ElementwiseKind::kAdd:
      return Interval{x.lo + y.lo, x.hi + y.hi};
    case ElementwiseKind::kSub:
      if (op.constant_first && op.y < 0) return Interval{y.lo - x.hi, y.hi - x.lo};
      return Interval{x.lo - y.hi, x.hi - y.lo};
    case ElementwiseKind::kMul: {
      const double p[] = {x.lo * y.lo, x.lo * y.hi, x.hi * y.lo, x.hi * y.hi};
      return Interval{*std::min_element(p, p + 4), *std::max_element(p, p + 4)};
    }
    case ElementwiseKind::kDiv:
    case ElementwiseKind::kReciprocal: {
      Interval num = y, den = x;  // c / x, 1 / x
      if (op.kind == ElementwiseKind::kReciprocal) {
        num = {1.0, 1.0};
      } else if (!(op.constant_first && op.y < 0)) {
        num = x;
        den = y;
      }
      if (Contains(den, 0.0)) {
        return Invalid(absl::StrCat("divides by values in ", Text(den),
                                    ", which holds 0 (inf or NaN)"));
      }
      const double q[] = {num.lo / den.lo, num.lo / den.hi, num.hi / den.lo,
                          num.hi / den.hi};
      return Interval{*std::min_element(q, q + 4), *std::max_element(q, q + 4)};
    }
    case ElementwiseKind::kPow: {
      const double c = op.c;
      const bool integer = c == std::floor(c);
      if (!integer && x.lo < 0) {
        return Invalid(absl::StrCat("raises values in ", Text(x),
                                    " to the non-integer power ", ShortNumber(c),
                                    ": negative bases give NaN"));
      }
      if (c < 0 && Contains(x, 0.0)) {
        return Invalid(absl::StrCat("raises values in ", Text(x),
                                    " to the negative power ", ShortNumber(c),
                                    ": 0 gives inf"));
      }
      if (c == 0) return Interval{1.0, 1.0};
      // |x| ** c is monotone in |x| on each side of 0; the extremes are at
      // the interval's ends, or 0 when it holds 0.
      std::vector<double> cand = {std::pow(x.lo, c), std::pow(x.hi, c)};
      if (Contains(x, 0.0)) cand.push_back(0.0);
      return Interval{*std::min_element(cand.begin(), cand.end()),
                      *std::max_element(cand.begin(), cand.end())};
    }
    case ElementwiseKind::kNeg:
      return Interval{-x.hi, -x.lo};
    case ElementwiseKind::kExp:
      return Interval{std::exp(x.lo), std::exp(x.hi)};
    case ElementwiseKind::kExpm1:
      return Interval{std::expm1(x.lo), std::expm1(x.hi)};
    case ElementwiseKind::kLog:
      if (x.lo <= 0) {
        return Invalid(absl::StrCat("takes log of values in ", Text(x),
                                    ", which reach <= 0 (-inf or NaN)"));
      }
      return Interval{std::log(x.lo), std::log(x.hi)};
    case ElementwiseKind::kLog1p:
      if (x.lo <= -1) {
        return Invalid(absl::StrCat("takes log1p of values in ", Text(x),
                                    ", which reach <= -1 (-inf or NaN)"));
      }
      return Interval{std::log1p(x.lo), std::log1p(x.hi)};
    case ElementwiseKind::kSqrt:
      if (x.lo < 0) {
        return Invalid(absl::StrCat("takes sqrt of values in ", Text(x),
                                    ", which reach below 0 (NaN)"));
      }
      return Interval{std::sqrt(x.lo), std::sqrt(x.hi)};
    case ElementwiseKind::kClamp: {
      Interval v = x;
      if (op.has_min) v = {std::max(v.lo, op.min), std::max(v.hi, op.min)};
      if (op.has_max) v = {std::min(v.lo, op.max), std::min(v.hi, op.max)};
      return v;
    }
    case ElementwiseKind::kSoftplus:
      return Interval{Softplus(x.lo), Softplus(x.hi)};
  }
  return Invalid("unknown op");
}

// Whether v is a value of the dtype (float16 is not checked: never).
bool Representable(double v, DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return true;
    case DType::kFloat32:
      return static_cast<double>(static_cast<float>(v)) == v;
    case DType::kBFloat16: {
      const float f = static_cast<float>(v);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      return static_cast<double>(f) == v && (u & 0xffffu) == 0;
    }
    default:
      return false;
  }
}

}  // namespace

DType PortableLeafDtype(const ParsedElementwise& program) {
  return program.compute == DType::kFloat64 ? DType::kFloat64
                                            : DType::kFloat32;
}

Interval Widen(Interval v, DType dtype) {
  const double e = 4 * Epsilon(dtype);
  return {v.lo - std::fabs(v.lo) * e, v.hi + std::fabs(v.hi) * e};
}

absl::StatusOr<ParsedElementwise> ParseElementwise(const v1::Elementwise& map,
                                                   DType tensor_dtype) {
  ParsedElementwise out;
  if (map.dtype().empty()) {
    out.compute = tensor_dtype;
  } else {
    std::optional<DType> dtype = spec::ParseDType(map.dtype());
    if (!dtype.has_value()) {
      return Invalid(absl::StrCat("map.dtype is \"", map.dtype(),
                                  "\"; it must be a floating dtype: float32, "
                                  "float64, float16 or bfloat16"));
    }
    out.compute = *dtype;
  }
  if (out.compute != DType::kFloat32 && out.compute != DType::kFloat64 &&
      out.compute != DType::kFloat16 && out.compute != DType::kBFloat16) {
    return Invalid(absl::StrCat(
        map.dtype().empty() ? "map.dtype is unset and the tensor is "
                            : "map.dtype is ",
        spec::Name(out.compute),
        "; a program computes in float32, float64, float16 or bfloat16"));
  }
  if (!spec::Info(tensor_dtype).is_floating_point) {
    return Invalid(absl::StrCat("map: the tensor is ", spec::Name(tensor_dtype),
                                "; derived values need a floating dtype"));
  }
  if (map.ops_size() == 0) return Invalid("map.ops is empty; give at least one op");
  if (map.ops_size() > kMaxElementwiseOps) {
    return Invalid(absl::StrCat("map.ops has ", map.ops_size(),
                                " ops; the limit is ", kMaxElementwiseOps));
  }
  for (int k = 0; k < map.ops_size(); ++k) {
    const v1::ElementwiseOp& in = map.ops(k);
    const std::string path = OpPath(k);
    absl::StatusOr<ElementwiseKind> kind = KindOf(in.kind());
    if (!kind.ok()) return Invalid(absl::StrCat(path, ".", kind.status().message()));
    ElementwiseOpDesc op;
    op.kind = *kind;
    if (in.x() > static_cast<uint32_t>(k)) {
      return Invalid(absl::StrCat(path, ".x is ", in.x(),
                                  "; an op reads value 0 (the init's) or an "
                                  "earlier op's (at most ", k, ")"));
    }
    op.x = in.x();
    const bool binary = IsBinary(op.kind);
    if (binary) {
      if (in.other_case() == v1::ElementwiseOp::OTHER_NOT_SET) {
        return Invalid(absl::StrCat(path, ": ", KindName(op.kind),
                                    " needs a second operand (y or c)"));
      }
      if (in.has_y()) {
        if (in.y() > static_cast<uint32_t>(k)) {
          return Invalid(absl::StrCat(path, ".y is ", in.y(),
                                      "; it must be an earlier value (at most ",
                                      k, ")"));
        }
        op.y = in.y();
      }
      op.constant_first = in.constant_first();
    } else if (op.kind == ElementwiseKind::kPow) {
      if (!in.has_c()) {
        return Invalid(absl::StrCat(path, ": POW takes a constant exponent c"));
      }
    } else if (in.other_case() != v1::ElementwiseOp::OTHER_NOT_SET) {
      return Invalid(absl::StrCat(path, ": ", KindName(op.kind),
                                  " takes one operand; y and c must be unset"));
    }
    if (in.has_c()) {
      if (!std::isfinite(in.c())) {
        return Invalid(absl::StrCat(path, ".c is ", ShortNumber(in.c()),
                                    "; constants must be finite"));
      }
      op.c = in.c();
    }
    if (in.constant_first() && !(binary && in.has_c() &&
                                 (op.kind == ElementwiseKind::kSub ||
                                  op.kind == ElementwiseKind::kDiv))) {
      return Invalid(absl::StrCat(path,
                                  ".constant_first applies to SUB and DIV "
                                  "with a constant c only"));
    }
    if (op.kind == ElementwiseKind::kClamp) {
      if (!in.has_min() && !in.has_max()) {
        return Invalid(absl::StrCat(path, ": CLAMP needs min, max or both"));
      }
      for (const auto& [name, set, value] :
           {std::tuple<const char*, bool, double>{"min", in.has_min(), in.min()},
            {"max", in.has_max(), in.max()}}) {
        if (set && !std::isfinite(value)) {
          return Invalid(absl::StrCat(path, ".", name, " is ",
                                      ShortNumber(value), "; it must be finite"));
        }
      }
      if (in.has_min() && in.has_max() && in.min() > in.max()) {
        return Invalid(absl::StrCat(path, ": min ", ShortNumber(in.min()),
                                    " is above max ", ShortNumber(in.max())));
      }
      op.has_min = in.has_min();
      op.has_max = in.has_max();
      op.min = in.min();
      op.max = in.max();
    } else if (in.has_min() || in.has_max()) {
      return Invalid(absl::StrCat(path, ": min and max apply to CLAMP only"));
    }
    out.ops.push_back(op);
  }
  return out;
}

absl::StatusOr<Interval> LeafBounds(const v1::InitScheme& scheme,
                                    const spec::TensorDesc& target) {
  if (target.full_numel() == 0) return Interval{0.0, 0.0};
  switch (scheme.scheme_case()) {
    case v1::InitScheme::kZeros:
      return Interval{0.0, 0.0};
    case v1::InitScheme::kOnes:
      return Interval{1.0, 1.0};
    case v1::InitScheme::kConstant:
      return Interval{scheme.constant().val(), scheme.constant().val()};
    case v1::InitScheme::kEye:
    case v1::InitScheme::kDirac:
      return Interval{0.0, 1.0};
    case v1::InitScheme::kUniform: {
      const UniformParams p = GetParams(scheme.uniform());
      return Interval{p.a, p.b};
    }
    case v1::InitScheme::kNormal: {
      const NormalParams p = GetParams(scheme.normal());
      return Interval{p.mean - kNormalDrawBound * p.std,
                      p.mean + kNormalDrawBound * p.std};
    }
    case v1::InitScheme::kTruncNormal: {
      const TruncNormalParams p = GetParams(scheme.trunc_normal());
      return Interval{p.a, p.b};
    }
    case v1::InitScheme::kSparse: {
      const double bound = kNormalDrawBound * GetParams(scheme.sparse()).std;
      return Interval{-bound, bound};
    }
    case v1::InitScheme::kOrthogonal: {
      absl::StatusOr<double> gain =
          ResolveGain(scheme.orthogonal().gain(), "gain");
      if (!gain.ok()) return gain.status();
      return Interval{-2 * std::fabs(*gain), 2 * std::fabs(*gain)};
    }
    case v1::InitScheme::kXavierUniform:
    case v1::InitScheme::kXavierNormal:
    case v1::InitScheme::kKaimingUniform:
    case v1::InitScheme::kKaimingNormal: {
      absl::StatusOr<FanSpread> spread =
          FanSchemeSpread(scheme, target.full_shape());
      if (!spread.ok()) return spread.status();
      const double bound = spread->uniform ? UniformBoundForStd(spread->std)
                                           : kNormalDrawBound * spread->std;
      return Interval{-bound, bound};
    }
    case v1::InitScheme::kArange: {
      const ArangeParams p = GetParams(scheme.arange());
      const double last =
          p.start + static_cast<double>(target.full_numel() - 1) * p.step;
      return Interval{std::min(p.start, last), std::max(p.start, last)};
    }
    case v1::InitScheme::kRopeInvFreq:
      // Frequencies lie in (0, 1], rescaled by at most 1 / factor.
      return Interval{0.0, 1.0 / std::min(1.0, GetParams(scheme.rope_inv_freq(),
                                                         1).factor)};
    default:
      return Invalid(absl::StrCat(
          DescribeScheme(scheme),
          " cannot start an elementwise program (map): it starts from a "
          "draw, a fill, arange, eye, dirac, rope_inv_freq or norm_of; send "
          "values you computed as they are"));
  }
}

absl::StatusOr<Interval> CheckElementwiseBounds(
    const ParsedElementwise& program, Interval leaf, DType tensor_dtype) {
  const double max_compute = MaxFinite(program.compute);
  // The leaf's bounds hold exactly where they are values of the compute
  // dtype (uniform(1, 16)'s 1 stays 1, so log's result stays >= 0); else
  // rounding into it may cross them by half a unit.
  std::vector<Interval> values = {
      Representable(leaf.lo, program.compute) &&
              Representable(leaf.hi, program.compute)
          ? leaf
          : Widen(leaf, program.compute)};
  for (size_t k = 0; k < program.ops.size(); ++k) {
    const ElementwiseOpDesc& op = program.ops[k];
    const Interval x = values[op.x];
    const Interval y = op.y >= 0 ? values[op.y] : Interval{op.c, op.c};
    absl::StatusOr<Interval> r = OpBounds(op, x, y);
    if (!r.ok()) {
      return Invalid(absl::StrCat(OpPath(k), " (", KindName(op.kind), ") ",
                                  r.status().message()));
    }
    const Interval v = Widen(*r, program.compute);
    if (!(std::isfinite(v.lo) && std::isfinite(v.hi)) ||
        std::fabs(v.lo) > max_compute || std::fabs(v.hi) > max_compute) {
      return Invalid(absl::StrCat(
          OpPath(k), " (", KindName(op.kind), ") can reach ", Text(*r),
          ", beyond ", spec::Name(program.compute),
          "'s largest finite value ", ShortNumber(max_compute), " (inf)"));
    }
    values.push_back(v);
  }
  const Interval out = values.back();
  const double max_tensor = MaxFinite(tensor_dtype);
  if (std::fabs(out.lo) > max_tensor || std::fabs(out.hi) > max_tensor) {
    return Invalid(absl::StrCat("map: the result can reach ", Text(out),
                                ", beyond ", spec::Name(tensor_dtype),
                                "'s largest finite value ",
                                ShortNumber(max_tensor)));
  }
  return out;
}

std::string DescribeElementwise(const ParsedElementwise& program) {
  std::vector<std::string> parts;
  for (size_t k = 0; k < program.ops.size(); ++k) {
    const ElementwiseOpDesc& op = program.ops[k];
    std::string text =
        op.x == k ? std::string() : absl::StrCat("v", op.x, " ");
    const char* name = KindName(op.kind);
    if (IsBinary(op.kind)) {
      const std::string other =
          op.y >= 0 ? absl::StrCat("v", op.y) : ShortNumber(op.c);
      absl::StrAppend(&text, op.constant_first ? absl::StrCat(other, name)
                                               : absl::StrCat(name, other));
    } else if (op.kind == ElementwiseKind::kPow) {
      absl::StrAppend(&text, "**", ShortNumber(op.c));
    } else if (op.kind == ElementwiseKind::kClamp) {
      std::vector<std::string> bounds;
      if (op.has_min) bounds.push_back("min=" + ShortNumber(op.min));
      if (op.has_max) bounds.push_back("max=" + ShortNumber(op.max));
      absl::StrAppend(&text, "clamp(", absl::StrJoin(bounds, ", "), ")");
    } else {
      absl::StrAppend(&text, name);
    }
    parts.push_back(std::move(text));
  }
  return absl::StrCat("map[", spec::Name(program.compute), ": ",
                      absl::StrJoin(parts, ", "), "]");
}

}  // namespace materializer::init
