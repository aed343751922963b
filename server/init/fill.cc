#include "server/init/fill.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ScalarOps.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/diag.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/eye.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/linalg_qr.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/randperm.h>
#include <ATen/ops/rsub.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include "server/init/init_math.h"
#include "server/init/schemes.h"
#include "server/spec/torch_dtype.h"

namespace materializer::init {
namespace {

// Python's math.pi.
constexpr double kPi = 3.141592653589793;

// A Python number where a tensor operand is expected, as Python's argument
// parser passes it to mul_, add_, div, sub, gt, ...: a CPU "wrapped number"
// tensor (double for a float, int64 for an int). Its value enters the
// kernel in the op's compute precision (float for float16 / bfloat16
// tensors), whereas the Scalar overloads of some ops round it to the
// tensor's dtype first (mul_ on float16: a different result).
at::Tensor Num(const at::Scalar& value) {
  return at::native::wrapped_scalar_tensor(value);
}

bool IsFloat8(at::ScalarType type) {
  return type == at::kFloat8_e4m3fn || type == at::kFloat8_e5m2;
}

const at::Generator& Need(const std::optional<at::Generator>& generator) {
  TORCH_CHECK(generator.has_value(), "random init without a generator");
  return *generator;
}

// torch.nn.init._no_grad_trunc_normal_.
void TruncNormal(at::Tensor& t, const TruncNormalParams& p,
                 const at::Generator& g) {
  const TruncNormalRange range =
      TruncNormalUniformRange(p.mean, p.std, p.a, p.b);
  t.uniform_(range.low, range.high, g);
  t.erfinv_();
  t.mul_(Num(p.std * std::sqrt(2.0)));
  t.add_(Num(p.mean));
  t.clamp_(p.a, p.b);
}

// torch.nn.init.orthogonal_ (numel > 0, >= 2 dimensions).
void Orthogonal(at::Tensor& t, double gain, const at::Generator& g) {
  const int64_t rows = t.size(0);
  const int64_t cols = t.numel() / rows;
  at::Tensor flattened = t.new_empty({rows, cols}).normal_(0, 1, g);
  if (rows < cols) flattened.t_();
  at::Tensor q;
  at::Tensor r;
  std::tie(q, r) = at::linalg_qr(flattened);
  at::Tensor d = at::diag(r, 0);
  at::Tensor ph = d.sign();
  q.mul_(ph);
  if (rows < cols) q.t_();
  t.view_as(q).copy_(q);
  t.mul_(Num(gain));
}

// torch.nn.init.dirac_.
void Dirac(at::Tensor& t, int64_t groups) {
  const int64_t dims = t.dim();
  const int64_t out_per_group = t.size(0) / groups;
  const int64_t min_dim = std::min(out_per_group, t.size(1));
  t.zero_();
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t d = 0; d < min_dim; ++d) {
      at::Tensor element = t.select(0, g * out_per_group + d).select(0, d);
      for (int64_t k = 2; k < dims; ++k) {
        element = element.select(0, t.size(k) / 2);
      }
      element.fill_(1);
    }
  }
}

// torch.nn.init.sparse_, with torch.randperm's default generator replaced
// by `permutations` (a CPU generator).
void Sparse(at::Tensor& t, const SparseParams& p, const at::Generator& g,
            const at::Generator& permutations) {
  const int64_t rows = t.size(0);
  const int64_t cols = t.size(1);
  const int64_t num_zeros =
      static_cast<int64_t>(std::ceil(p.sparsity * static_cast<double>(rows)));
  t.normal_(0, p.std, g);
  if (num_zeros == 0) {
    // torch still draws one permutation per column; nothing reads them and
    // the permutation generator is this tensor's own.
    return;
  }
  at::Tensor mask =
      at::zeros({rows, cols}, at::TensorOptions().dtype(at::kBool));
  bool* m = mask.data_ptr<bool>();
  for (int64_t col = 0; col < cols; ++col) {
    at::Tensor perm =
        at::randperm(rows, permutations, at::TensorOptions().dtype(at::kLong));
    const int64_t* row = perm.data_ptr<int64_t>();
    for (int64_t k = 0; k < num_zeros; ++k) m[row[k] * cols + col] = true;
  }
  t.masked_fill_(mask.to(t.device()), 0);
}

// Elements per piece of element-wise work done in scratch memory.
constexpr int64_t kChunk = 1 << 16;

// arange's value of linear indices `index` (an int64 tensor):
// index * step + start in float64, or in int64 for integer dtypes, as
// (torch.arange(n, dtype=...) * step + start) computes them.
at::Tensor ArangeValues(const at::Tensor& index, const ArangeParams& p,
                        bool floating) {
  if (floating) {
    return index.to(at::kDouble).mul(Num(p.step)).add(Num(p.start));
  }
  return index.mul(Num(static_cast<int64_t>(p.step)))
      .add(Num(static_cast<int64_t>(p.start)));
}

// (torch.arange(n, dtype=torch.float64) * step + start).to(dtype), or in
// int64 for integer dtypes; computed on the CPU. Element-wise, so it runs in
// cache-sized chunks with the same values. `t` contiguous.
void Arange(at::Tensor& t, const ArangeParams& p) {
  const int64_t n = t.numel();
  const bool floating = at::isFloatingType(t.scalar_type());
  at::Tensor flat = t.view({n});
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t end = std::min(n, begin + kChunk);
    flat.narrow(0, begin, end - begin)
        .copy_(ArangeValues(
            at::arange(begin, end, at::TensorOptions().dtype(at::kLong)), p,
            floating));
  }
}

// arange over a box: `dst` holds the elements whose index in the whole is
// base + sum_d (origin[d] + i_d) * strides[d]. Works in pieces of at most
// kChunk elements (splitting dimension 0, or taking one index of it and
// recursing when a single slice is larger).
void ArangeBox(at::Tensor dst, const ArangeParams& p, int64_t base,
               std::vector<int64_t> origin, std::vector<int64_t> strides) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  const bool floating = at::isFloatingType(dst.scalar_type());
  const at::TensorOptions longs = at::TensorOptions().dtype(at::kLong);
  if (dst.dim() == 0) {
    dst.copy_(ArangeValues(at::full({}, base, longs), p, floating));
    return;
  }
  const int64_t rows = dst.size(0);
  const int64_t inner = n / rows;
  if (inner > kChunk || (dst.dim() == 1 && n > kChunk)) {
    if (dst.dim() == 1) {
      for (int64_t r0 = 0; r0 < rows; r0 += kChunk) {
        const int64_t k = std::min(kChunk, rows - r0);
        ArangeBox(dst.narrow(0, r0, k), p, base, {origin[0] + r0}, strides);
      }
      return;
    }
    const std::vector<int64_t> inner_origin(origin.begin() + 1, origin.end());
    const std::vector<int64_t> inner_strides(strides.begin() + 1,
                                             strides.end());
    for (int64_t r = 0; r < rows; ++r) {
      ArangeBox(dst.select(0, r), p, base + (origin[0] + r) * strides[0],
                inner_origin, inner_strides);
    }
    return;
  }
  const int64_t per_piece = std::max<int64_t>(1, kChunk / inner);
  for (int64_t r0 = 0; r0 < rows; r0 += per_piece) {
    const int64_t k = std::min(per_piece, rows - r0);
    at::Tensor piece = dst.narrow(0, r0, k);
    at::Tensor index = at::full(piece.sizes(), base, longs);
    for (int64_t d = 0; d < piece.dim(); ++d) {
      std::vector<int64_t> along(piece.dim(), 1);
      along[d] = piece.size(d);
      const int64_t first = origin[d] + (d == 0 ? r0 : 0);
      index.add_(at::arange(first, first + piece.size(d), longs)
                     .mul(Num(strides[d]))
                     .view(along));
    }
    piece.copy_(ArangeValues(index, p, floating));
  }
}

// Strides of a contiguous tensor of `shape` (torch's: sizes of 0 count as
// 1).
std::vector<int64_t> ContiguousStrides(at::IntArrayRef shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * std::max<int64_t>(shape[d + 1], 1);
  }
  return strides;
}

// The bytes of a values scheme as a CPU tensor of `shape` and `type`
// (borrowed: the scheme must outlive it).
at::Tensor ValuesTensor(const v1::Values& values, at::IntArrayRef shape,
                        at::ScalarType type) {
  TORCH_CHECK(static_cast<int64_t>(values.data().size()) ==
                  c10::multiply_integers(shape) *
                      static_cast<int64_t>(at::elementSize(type)),
              "values of ", values.data().size(), " bytes for shape ", shape);
  return at::from_blob(const_cast<char*>(values.data().data()), shape,
                       at::TensorOptions().dtype(type));
}

// 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)),
// spelled the way Python evaluates it: `x / dim` is a division by a wrapped
// integer, `base ** x` is torch.pow(base, x) and `1.0 / y` is
// y.reciprocal() * 1.0 (Tensor.__rtruediv__).
at::Tensor PosFreqs(double base, int64_t dim) {
  at::Tensor exponent =
      at::arange(0, dim, 2, at::TensorOptions().dtype(at::kLong))
          .to(at::kFloat)
          .div(Num(dim));
  return at::pow(base, exponent);
}

at::Tensor Reciprocal(const at::Tensor& x, const at::Scalar& numerator) {
  return x.reciprocal().mul(Num(numerator));
}

void Orthogonal(at::Tensor& t, const v1::Orthogonal& o,
                const at::Generator& g) {
  Orthogonal(t, ResolveGain(o.gain(), "gain").value(), g);
}

// The fill in t's own dtype (or the wide dtype chosen by Fill).
void FillNative(at::Tensor& t, const v1::InitScheme& scheme,
                const std::optional<at::Generator>& generator,
                const std::optional<at::Generator>& permutations) {
  switch (scheme.scheme_case()) {
    case v1::InitScheme::kZeros:
      t.zero_();
      return;
    case v1::InitScheme::kOnes:
      t.fill_(1);
      return;
    case v1::InitScheme::kConstant:
      t.fill_(scheme.constant().val());
      return;
    case v1::InitScheme::kUniform: {
      const UniformParams p = GetParams(scheme.uniform());
      t.uniform_(p.a, p.b, Need(generator));
      return;
    }
    case v1::InitScheme::kNormal: {
      const NormalParams p = GetParams(scheme.normal());
      t.normal_(p.mean, p.std, Need(generator));
      return;
    }
    case v1::InitScheme::kTruncNormal:
      TruncNormal(t, GetParams(scheme.trunc_normal()), Need(generator));
      return;
    case v1::InitScheme::kXavierUniform:
    case v1::InitScheme::kXavierNormal: {
      const bool uniform = scheme.has_xavier_uniform();
      const Fans fans = FanInAndFanOut(t.sizes().vec()).value();
      const double gain = ResolveGain(uniform ? scheme.xavier_uniform().gain()
                                              : scheme.xavier_normal().gain(),
                                      "gain")
                              .value();
      const double std = XavierStd(fans, gain);
      if (uniform) {
        const double a = UniformBoundForStd(std);
        t.uniform_(-a, a, Need(generator));
      } else {
        t.normal_(0.0, std, Need(generator));
      }
      return;
    }
    case v1::InitScheme::kKaimingUniform:
    case v1::InitScheme::kKaimingNormal: {
      const bool uniform = scheme.has_kaiming_uniform();
      const KaimingParams p =
          uniform ? GetKaimingParams(scheme.kaiming_uniform().a(),
                                     scheme.kaiming_uniform().mode(),
                                     scheme.kaiming_uniform().nonlinearity())
                  : GetKaimingParams(scheme.kaiming_normal().a(),
                                     scheme.kaiming_normal().mode(),
                                     scheme.kaiming_normal().nonlinearity());
      const Fans fans = FanInAndFanOut(t.sizes().vec()).value();
      const int64_t fan =
          p.mode == FanMode::kFanIn ? fans.fan_in : fans.fan_out;
      const double std =
          KaimingStd(fan, CalculateGain(p.nonlinearity, p.a).value());
      if (uniform) {
        const double bound = UniformBoundForStd(std);
        t.uniform_(-bound, bound, Need(generator));
      } else {
        t.normal_(0, std, Need(generator));
      }
      return;
    }
    case v1::InitScheme::kOrthogonal:
      Orthogonal(t, scheme.orthogonal(), Need(generator));
      return;
    case v1::InitScheme::kEye:
      at::eye_out(t, t.size(0), t.size(1));
      return;
    case v1::InitScheme::kDirac:
      Dirac(t, GetGroups(scheme.dirac()));
      return;
    case v1::InitScheme::kSparse:
      TORCH_CHECK(permutations.has_value(), "sparse without permutations");
      Sparse(t, GetParams(scheme.sparse()), Need(generator), *permutations);
      return;
    case v1::InitScheme::kEmpty:
      // CPU arenas are fresh anonymous pages (zeros from the kernel). A
      // CUDA arena is a cudaMalloc of its own, and cudaMalloc does not
      // clear memory: it may hold bytes a released handle (another
      // client's) left there, so it is zeroed.
      if (!t.device().is_cpu()) t.zero_();
      return;
    case v1::InitScheme::kArange:
      if (t.is_contiguous()) {
        Arange(t, GetParams(scheme.arange()));
      } else {  // an init step's region: t[region].copy_(arange(...))
        ArangeBox(t, GetParams(scheme.arange()), 0,
                  std::vector<int64_t>(t.dim(), 0),
                  ContiguousStrides(t.sizes()));
      }
      return;
    case v1::InitScheme::kValues:
      t.copy_(ValuesTensor(scheme.values(), t.sizes(), t.scalar_type()));
      return;
    case v1::InitScheme::kRopeInvFreq:
      t.copy_(RopeInvFreq(GetParams(scheme.rope_inv_freq(), t.numel())));
      return;
    case v1::InitScheme::kModuleDefault:  // filled per module (FillModule)
    case v1::InitScheme::kNormOf:         // reads its source (derived_fill)
    case v1::InitScheme::SCHEME_NOT_SET:
      break;
  }
  TORCH_CHECK(false, "no per-tensor init scheme to fill with: ",
              DescribeScheme(scheme));
}

// Whether `scheme` on dtype `type` is computed in float32 and rounded.
bool ViaFloat32(const v1::InitScheme& scheme, at::ScalarType type) {
  if (scheme.has_arange() || scheme.has_rope_inv_freq() || scheme.has_empty() ||
      scheme.has_values()) {
    return false;  // they cast on their own, or copy bytes
  }
  if (IsFloat8(type)) return true;
  // LAPACK's geqrf has no float16 / bfloat16 kernel.
  return scheme.has_orthogonal() &&
         (type == at::kHalf || type == at::kBFloat16);
}

}  // namespace

at::Generator MakeGenerator(const at::Device& device, uint64_t seed) {
  at::Generator generator =
      device.is_cuda()
          ? at::detail::getCUDAHooks().getNewGenerator(device.index())
          : at::make_generator<at::CPUGeneratorImpl>();
  // The same call Python's Generator.manual_seed makes.
  generator.set_current_seed(seed);
  return generator;
}

void Fill(at::Tensor& t, const v1::InitScheme& scheme,
          const std::optional<at::Generator>& generator,
          const std::optional<at::Generator>& permutations) {
  if (t.numel() == 0) return;
  if (ViaFloat32(scheme, t.scalar_type())) {
    at::Tensor wide = at::empty(t.sizes(), t.options().dtype(at::kFloat));
    FillNative(wide, scheme, generator, permutations);
    t.copy_(wide);
    return;
  }
  FillNative(t, scheme, generator, permutations);
}

void FillBox(at::Tensor& dst, const v1::InitScheme& scheme,
             const std::vector<int64_t>& shape, const portable::Box& box) {
  if (dst.numel() == 0) return;
  switch (scheme.scheme_case()) {
    case v1::InitScheme::kValues: {
      at::Tensor part = ValuesTensor(scheme.values(), shape, dst.scalar_type());
      for (size_t d = 0; d < shape.size(); ++d) {
        part =
            part.narrow(static_cast<int64_t>(d), box.offset[d], box.length[d]);
      }
      dst.copy_(part);
      return;
    }
    case v1::InitScheme::kArange:
      ArangeBox(dst, GetParams(scheme.arange()), 0, box.offset,
                ContiguousStrides(shape));
      return;
    case v1::InitScheme::kRopeInvFreq:
      dst.copy_(RopeInvFreq(GetParams(scheme.rope_inv_freq(), shape[0]))
                    .narrow(0, box.offset[0], box.length[0]));
      return;
    case v1::InitScheme::kEye:
    case v1::InitScheme::kDirac: {
      // Zeros with ones where the whole has them, written in float32 (no
      // float8 kernels) and copied: 0 and 1 are exact in every dtype.
      at::Tensor part = at::zeros(dst.sizes(), dst.options().dtype(at::kFloat));
      if (scheme.has_eye()) {
        // (box.offset[0] + i, box.offset[1] + j) with both equal:
        // j = i + (offset[0] - offset[1]), a diagonal of the box.
        part.diagonal(box.offset[0] - box.offset[1]).fill_(1);
      } else {
        // torch.nn.init.dirac_'s ones, those inside the box.
        const int64_t groups = GetGroups(scheme.dirac());
        const int64_t out_per_group = shape[0] / groups;
        const int64_t min_dim = std::min(out_per_group, shape[1]);
        for (int64_t g = 0; g < groups; ++g) {
          for (int64_t d = 0; d < min_dim; ++d) {
            std::vector<int64_t> at = {g * out_per_group + d, d};
            for (size_t k = 2; k < shape.size(); ++k) {
              at.push_back(shape[k] / 2);
            }
            bool inside = true;
            at::Tensor element = part;
            for (size_t k = 0; k < at.size() && inside; ++k) {
              const int64_t i = at[k] - box.offset[k];
              inside = i >= 0 && i < box.length[k];
              if (inside) element = element.select(0, i);
            }
            if (inside) element.fill_(1);
          }
        }
      }
      dst.copy_(part);
      return;
    }
    default:
      // zeros, ones, constant, empty: the same value everywhere.
      Fill(dst, scheme, std::nullopt);
      return;
  }
}

void FillModule(const ModulePlan& plan, std::vector<at::Tensor>& views,
                const at::Device& device, const at::Generator& generator) {
  const std::optional<at::Generator> g = generator;
  for (const ModuleSlot& slot : plan.slots) {
    if (slot.write) {
      at::Tensor& view = views[slot.tensor];
      Fill(view, slot.op, g);
      if (plan.padding_idx.has_value() && slot.local_name == "weight" &&
          view.numel() > 0) {
        // Embedding._fill_padding_idx_with_zero.
        view.select(0, *plan.padding_idx).fill_(0);
      }
    } else if (slot.consume) {
      at::Tensor scratch =
          at::empty(slot.shape, at::TensorOptions()
                                    .dtype(spec::ToScalarType(slot.dtype))
                                    .device(device));
      Fill(scratch, slot.op, g);
    }
  }
}

at::Tensor RopeInvFreq(const RopeParams& p) {
  const int64_t dim = p.dim;
  switch (p.type) {
    case RopeType::kDefault:
    case RopeType::kDynamic:  // rescales only past the original context
      return Reciprocal(PosFreqs(p.base, dim), 1.0);
    case RopeType::kLinear: {
      at::Tensor inv_freq = Reciprocal(PosFreqs(p.base, dim), 1.0);
      inv_freq.div_(Num(p.factor));
      return inv_freq;
    }
    case RopeType::kLlama3: {
      const at::Tensor inv_freq = Reciprocal(PosFreqs(p.base, dim), 1.0);
      const int64_t old_context_len = p.original_max_position_embeddings;
      const double low_freq_wavelen =
          static_cast<double>(old_context_len) / p.low_freq_factor;
      const double high_freq_wavelen =
          static_cast<double>(old_context_len) / p.high_freq_factor;
      const at::Tensor wavelen = Reciprocal(inv_freq, 2 * kPi);
      at::Tensor inv_freq_llama =
          at::where(wavelen.gt(Num(low_freq_wavelen)),
                    inv_freq.div(Num(p.factor)), inv_freq);
      const at::Tensor smooth_factor =
          Reciprocal(wavelen, old_context_len)
              .sub(Num(p.low_freq_factor))
              .div(Num(p.high_freq_factor - p.low_freq_factor));
      const at::Tensor smoothed_inv_freq =
          at::rsub(smooth_factor, 1)
              .mul(inv_freq_llama)
              .div(Num(p.factor))
              .add(smooth_factor.mul(inv_freq_llama));
      const at::Tensor is_medium_freq =
          wavelen.lt(Num(high_freq_wavelen))
              .bitwise_not()
              .mul(wavelen.gt(Num(low_freq_wavelen)).bitwise_not());
      return at::where(is_medium_freq, smoothed_inv_freq, inv_freq_llama);
    }
    case RopeType::kYarn: {
      const at::Tensor pos_freqs = PosFreqs(p.base, dim);
      const at::Tensor inv_freq_extrapolation = Reciprocal(pos_freqs, 1.0);
      const at::Tensor inv_freq_interpolation =
          Reciprocal(pos_freqs.mul(Num(p.factor)), 1.0);
      auto correction_dim = [&](double num_rotations) {
        const double max_position =
            static_cast<double>(p.original_max_position_embeddings);
        return (static_cast<double>(dim) *
                LibmLog(max_position / (num_rotations * 2 * kPi))) /
               (2 * LibmLog(p.base));
      };
      const int64_t low = std::max<int64_t>(
          static_cast<int64_t>(std::floor(correction_dim(p.beta_fast))), 0);
      const int64_t high = std::min<int64_t>(
          static_cast<int64_t>(std::ceil(correction_dim(p.beta_slow))),
          dim - 1);
      // linear_ramp_factor(low, high, dim // 2); `max - min` is an int
      // unless it was nudged by 0.001.
      at::Tensor linear =
          at::arange(dim / 2, at::TensorOptions().dtype(at::kFloat))
              .sub(Num(low));
      if (low == high) {
        linear = linear.div(
            Num(static_cast<double>(high) + 0.001 - static_cast<double>(low)));
      } else {
        linear = linear.div(Num(high - low));
      }
      const at::Tensor ramp = at::clamp(linear, 0, 1);
      const at::Tensor extrapolation_factor = at::rsub(ramp, 1);
      return inv_freq_interpolation.mul(at::rsub(extrapolation_factor, 1))
          .add(inv_freq_extrapolation.mul(extrapolation_factor));
    }
  }
  TORCH_CHECK(false, "unknown RoPE scaling");
  return at::Tensor();  // not reached; unoptimized builds cannot tell
}

}  // namespace materializer::init
