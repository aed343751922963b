#ifndef MATERIALIZER_SERVER_INIT_SCHEMES_H_
#define MATERIALIZER_SERVER_INIT_SCHEMES_H_

// The init schemes a request can name (InitScheme in the proto): what their
// parameters must satisfy, which dtypes they apply to, and how they read in
// messages. Semantics follow torch.nn.init; docs/init.md has each one's
// formula and its Python equivalent.

#include <string>

#include "absl/status/status.h"
#include "materializer/v1/materializer.pb.h"
#include "server/spec/tensor_desc.h"

namespace materializer::init {

// Defaults of the optional parameters, as in torch.nn.init.
struct UniformParams {
  double a = 0.0;
  double b = 1.0;
};
struct NormalParams {
  double mean = 0.0;
  double std = 1.0;
};
UniformParams GetParams(const v1::Uniform& uniform);
NormalParams GetParams(const v1::Normal& normal);

// Checks what does not depend on the tensor: a scheme is set, parameters
// are finite, std >= 0, a <= b. INVALID_ARGUMENT with a reason like
// "normal.std is -1; it must be >= 0" (the caller adds the field path).
absl::Status CheckSchemeParameters(const v1::InitScheme& scheme);

// Checks that `scheme` can fill `tensor`: random schemes need a floating
// dtype; constants and bounds must be representable in the dtype.
absl::Status CheckSchemeForTensor(const v1::InitScheme& scheme,
                                  const spec::TensorDesc& tensor);

// Whether the scheme draws random numbers (and so uses the tensor's seed).
bool IsRandom(const v1::InitScheme& scheme);

// "zeros", "constant(val=0.5)", "uniform(a=-0.1, b=0.1)",
// "normal(mean=0, std=0.02)".
std::string DescribeScheme(const v1::InitScheme& scheme);

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_SCHEMES_H_
