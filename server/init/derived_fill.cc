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

#include <cmath>
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
      // Python's `c / x` is Tensor.__rtruediv__: x.reciprocal() * c.
      return op.constant_first ? at::mul(at::reciprocal(x), Num(op.c))
                               : at::div(x, Num(op.c));
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
}

}  // namespace

at::Tensor RunElementwiseTorch(const at::Tensor& leaf,
                               const ParsedElementwise& program) {
  std::vector<at::Tensor> values = {leaf};
  values.reserve(program.ops.size() + 1);
  for (const ElementwiseOpDesc& op : program.ops) {
    values.push_back(TorchOp(op, values[op.x],
                             op.y >= 0 ? &values[op.y] : nullptr));
  }
  return values.back();
}

at::Tensor NormExceptDimTorch(const at::Tensor& source, int64_t dim) {
  return at::norm_except_dim(source, 2, dim);
}

at::Tensor RunElementwisePortable(const at::Tensor& leaf,
                                  const ParsedElementwise& program,
                                  int threads) {
  TORCH_CHECK(leaf.device().is_cpu(), "portable programs run on the CPU");
  const at::Tensor wide = leaf.to(at::kDouble).contiguous();
  at::Tensor out = at::empty(wide.sizes(), wide.options());
  portable::RunElementwiseF64(program.ops, wide.const_data_ptr<double>(),
                              out.mutable_data_ptr<double>(), wide.numel(),
                              threads);
  if (program.compute == spec::DType::kFloat64) return out;
  return out.to(at::kFloat);  // round to nearest, ties to even
}

at::Tensor NormExceptDimPortable(const at::Tensor& source, int64_t dim) {
  const at::Tensor wide = source.to(at::kDouble).contiguous();
  const double* data = wide.const_data_ptr<double>();
  const int64_t n = wide.numel();
  std::vector<int64_t> shape(wide.sizes().begin(), wide.sizes().end());
  // Element i's index along `dim`: (i / inner) % size.
  int64_t inner = 1, size = 1;
  if (dim >= 0) {
    size = shape[dim];
    for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  }
  std::vector<double> sums(std::max<int64_t>(size, 1), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = dim >= 0 ? (i / inner) % size : 0;
    sums[j] = sums[j] + data[i] * data[i];
  }
  std::vector<int64_t> out_shape;
  if (dim >= 0) {
    out_shape.assign(shape.size(), 1);
    out_shape[dim] = size;
  }
  at::Tensor out = at::empty(out_shape, wide.options());
  double* o = out.mutable_data_ptr<double>();
  for (int64_t j = 0; j < out.numel(); ++j) o[j] = std::sqrt(sums[j]);
  return out;
}

}  // namespace materializer::init
