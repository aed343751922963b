#include "server/init/derived_fill.h"

#include <ATen/ScalarOps.h>
#include <ATen/ops/add.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/expm1.h>
#include <ATen/ops/log.h>
#include <ATen/ops/log1p.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/norm_except_dim.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/reciprocal.h>
#include <ATen/ops/rsub.h>
#include <ATen/ops/softplus.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/sub.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "server/init/portable/elementwise.h"

namespace materializer::init {
namespace {

using portable::ElementwiseKind;
using portable::ElementwiseOpDesc;

// A Python float where a tensor operand is expected, as Python's argument
// parser passes it (see fill.cc: the Scalar overloads would round it to
// the tensor's dtype first for some ops).
at::Tensor Num(double value) {
  return at::native::wrapped_scalar_tensor(at::Scalar(value));
}

at::Tensor TorchOp(const ElementwiseOpDesc& op, const at::Tensor& x,
                   const at::Tensor* y) {
  switch (op.kind) {
    case ElementwiseKind::kAdd:
      return at::add(x, y != nullptr ? *y : Num(op.c));
    case ElementwiseKind::kSub:
      if (y != nullptr) return at::sub(x, *y);
      // Python's `c - x` is Tensor.__rsub__: torch.rsub(x, c).
      return op.constant_first ? at::rsub(x, at::Scalar(op.c))
                               : at::sub(x, Num(op.c));
    case ElementwiseKind::kMul:
      return at::mul(x, y != nullptr ? *y : Num(op.c));
    case ElementwiseKind::kDiv:
      if (y != nullptr) return at::div(x, *y);
      // torch.full_like(x, c) / x. (Python's own `c / x` runs
      // x.reciprocal() * c, which the SDK records as RECIPROCAL, MUL.)
      return op.constant_first ? at::div(Num(op.c), x) : at::div(x, Num(op.c));
    case ElementwiseKind::kPow:
      return at::pow(x, at::Scalar(op.c));  // `x ** c`
    case ElementwiseKind::kNeg:
      return at::neg(x);
    case ElementwiseKind::kExp:
      return at::exp(x);
    case ElementwiseKind::kLog:
      return at::log(x);
    case ElementwiseKind::kExpm1:
      return at::expm1(x);
    case ElementwiseKind::kLog1p:
      return at::log1p(x);
    case ElementwiseKind::kSqrt:
      return at::sqrt(x);
    case ElementwiseKind::kReciprocal:
      return at::reciprocal(x);
    case ElementwiseKind::kClamp: {
      std::optional<at::Scalar> lo, hi;
      if (op.has_min) lo = at::Scalar(op.min);
      if (op.has_max) hi = at::Scalar(op.max);
      return at::clamp(x, lo, hi);
    }
    case ElementwiseKind::kSoftplus:
      return at::softplus(x, /*beta=*/1, /*threshold=*/20);
  }
  TORCH_CHECK(false, "unknown elementwise op");
  return x;  // not reached (debug builds do not see TORCH_CHECK's throw)
}

// The op written into x itself (x is not read again): the same kernel as
// TorchOp without a new tensor. False where torch has no in-place form.
bool TorchOpInPlace(const ElementwiseOpDesc& op, at::Tensor& x,
                    const at::Tensor* y) {
  switch (op.kind) {
    case ElementwiseKind::kAdd:
      x.add_(y != nullptr ? *y : Num(op.c));
      return true;
    case ElementwiseKind::kSub:
      if (op.constant_first && y == nullptr) return false;
      x.sub_(y != nullptr ? *y : Num(op.c));
      return true;
    case ElementwiseKind::kMul:
      x.mul_(y != nullptr ? *y : Num(op.c));
      return true;
    case ElementwiseKind::kDiv:
      if (op.constant_first && y == nullptr) return false;
      x.div_(y != nullptr ? *y : Num(op.c));
      return true;
    case ElementwiseKind::kNeg:
      x.neg_();
      return true;
    case ElementwiseKind::kExp:
      x.exp_();
      return true;
    case ElementwiseKind::kLog:
      x.log_();
      return true;
    case ElementwiseKind::kExpm1:
      x.expm1_();
      return true;
    case ElementwiseKind::kLog1p:
      x.log1p_();
      return true;
    case ElementwiseKind::kSqrt:
      x.sqrt_();
      return true;
    case ElementwiseKind::kReciprocal:
      x.reciprocal_();
      return true;
    default:
      return false;
  }
}

}  // namespace

namespace {

at::Tensor RunWhole(const at::Tensor& leaf, const ParsedElementwise& program);

}  // namespace

// Large leaves run the program chunk by chunk, so each op's operands stay
// in cache. The bits are those of the whole: every op is elementwise, and
// ATen's vectorized loops run whole vectors over each contiguous range and
// their scalar code only on a range's last partial vector, so chunks whose
// length is a multiple of every vector width (the grain torch's own
// parallel loops cut at, 32768, is one) leave that to the final chunk, as
// the whole tensor does.
at::Tensor RunElementwiseTorch(const at::Tensor& leaf,
                               const ParsedElementwise& program) {
  constexpr int64_t kChunk = int64_t{1} << 18;
  if (leaf.numel() <= 2 * kChunk || !leaf.is_contiguous()) {
    return RunWhole(leaf, program);
  }
  // The leaf is the caller's scratch: each chunk's result is written back
  // over it (ops keep the compute dtype).
  at::Tensor flat = leaf.view({-1});
  for (int64_t start = 0; start < flat.numel(); start += kChunk) {
    at::Tensor chunk = flat.narrow(0, start, std::min(kChunk, flat.numel() - start));
    at::Tensor part = RunWhole(chunk, program);
    if (!part.is_same(chunk)) chunk.copy_(part);
  }
  return leaf;
}

namespace {

at::Tensor RunWhole(const at::Tensor& leaf, const ParsedElementwise& program) {
  std::vector<at::Tensor> values = {leaf};
  values.reserve(program.ops.size() + 1);
  // A value is dropped after its last read, so its memory is reused by the
  // allocator for the next op's result (the same kernels, the same bits).
  std::vector<size_t> last_read(program.ops.size() + 1, 0);
  for (size_t k = 0; k < program.ops.size(); ++k) {
    last_read[program.ops[k].x] = k;
    if (program.ops[k].y >= 0) last_read[program.ops[k].y] = k;
  }
  for (size_t k = 0; k < program.ops.size(); ++k) {
    const ElementwiseOpDesc& op = program.ops[k];
    const at::Tensor* y = op.y >= 0 ? &values[op.y] : nullptr;
    if (last_read[op.x] == k && op.y != static_cast<int64_t>(op.x) &&
        TorchOpInPlace(op, values[op.x], y)) {
      values.push_back(std::move(values[op.x]));
      values[op.x] = at::Tensor();
    } else {
      values.push_back(TorchOp(op, values[op.x], y));
    }
    for (size_t v = 0; v + 1 < values.size(); ++v) {
      if (last_read[v] == k && values[v].defined()) values[v] = at::Tensor();
    }
  }
  return values.back();
}

}  // namespace

at::Tensor NormExceptDimTorch(const at::Tensor& source, int64_t dim) {
  return at::norm_except_dim(source, 2, dim);
}

at::Tensor RunElementwisePortable(const at::Tensor& leaf,
                                  const ParsedElementwise& program,
                                  int threads) {
  TORCH_CHECK(leaf.device().is_cpu(), "portable programs run on the CPU");
  const bool wide = program.compute == spec::DType::kFloat64;
  // The leaf's own dtype in, the result's out: no float64 copy of either.
  const at::Tensor in = leaf.to(wide ? at::kDouble : at::kFloat).contiguous();
  at::Tensor out = in;  // in place: each block is read before it is written
  if (wide) {
    portable::RunElementwise(program.ops, in.const_data_ptr<double>(),
                                out.mutable_data_ptr<double>(), in.numel(),
                                threads);
  } else {
    portable::RunElementwise(program.ops, in.const_data_ptr<float>(),
                                out.mutable_data_ptr<float>(), in.numel(),
                                threads);
  }
  return out;
}

namespace {

// sums[j] += x^2 over `data`, a row-major [outer, size, inner] array, in
// row-major order.
template <typename T>
void Squares(const T* data, int64_t outer, int64_t size, int64_t inner,
             int64_t first, std::vector<double>& sums) {
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < size; ++j) {
      double s = sums[first + j];
      const T* row = data + (o * size + j) * inner;
      for (int64_t k = 0; k < inner; ++k) {
        const double x = static_cast<double>(row[k]);
        s = s + x * x;
      }
      sums[first + j] = s;
    }
  }
}

}  // namespace

void AccumulateSquares(const at::Tensor& piece, int64_t dim, int64_t first,
                       std::vector<double>& sums) {
  // Element (o, j, k) of the piece seen as [outer, size, inner] around
  // `dim` adds to sums[first + j] (first only along dimension 0).
  int64_t outer = 1, size = 1, inner = 1;
  if (dim >= 0) {
    size = piece.size(dim);
    for (int64_t d = 0; d < dim; ++d) outer *= piece.size(d);
    for (int64_t d = dim + 1; d < piece.dim(); ++d) inner *= piece.size(d);
  } else {
    inner = piece.numel();
  }
  const int64_t offset = dim == 0 ? first : 0;
  const at::Tensor host = piece.device().is_cpu() ? piece : piece.cpu();
  const at::Tensor c = host.scalar_type() == at::kFloat ||
                               host.scalar_type() == at::kDouble
                           ? host.contiguous()
                           : host.to(at::kDouble).contiguous();
  if (c.scalar_type() == at::kFloat) {
    Squares(c.const_data_ptr<float>(), outer, size, inner, offset, sums);
  } else {
    Squares(c.const_data_ptr<double>(), outer, size, inner, offset, sums);
  }
}

at::Tensor SqrtOfSums(const std::vector<double>& sums,
                      const std::vector<int64_t>& shape) {
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(at::kDouble));
  double* o = out.mutable_data_ptr<double>();
  for (int64_t j = 0; j < out.numel(); ++j) o[j] = std::sqrt(sums[j]);
  return out;
}

}  // namespace materializer::init
