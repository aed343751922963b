#ifndef MATERIALIZER_SERVER_INIT_SCHEMES_H_
#define MATERIALIZER_SERVER_INIT_SCHEMES_H_

// The init schemes a request can name (InitScheme in the proto): their
// parameters with torch.nn.init's defaults, what the parameters and the
// tensor must satisfy, and how a scheme reads in messages. Semantics follow
// torch.nn.init; docs/init.md has each one's formula and its exact Python
// equivalent. No LibTorch here: everything is checked before anything is
// allocated.
//
//   RETURN_IF_ERROR(CheckSchemeParameters(scheme));        // any tensor
//   RETURN_IF_ERROR(CheckSchemeForTensor(scheme, tensor)); // this tensor
//
// Thread-safe: pure functions.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "materializer/v1/materializer.pb.h"
#include "server/init/init_math.h"
#include "server/spec/tensor_desc.h"

namespace materializer::init {

// Parameters with their defaults filled in, as in torch.nn.init.
struct UniformParams {
  double a = 0.0;
  double b = 1.0;
};
struct NormalParams {
  double mean = 0.0;
  double std = 1.0;
};
struct TruncNormalParams {
  double mean = 0.0;
  double std = 1.0;
  double a = -2.0;
  double b = 2.0;
};
struct KaimingParams {
  double a = 0.0;
  FanMode mode = FanMode::kFanIn;
  std::string nonlinearity = "leaky_relu";
};
struct SparseParams {
  double sparsity = 0.0;
  double std = 0.01;
};
struct ArangeParams {
  double start = 0.0;
  double step = 1.0;
};

enum class RopeType { kDefault, kLinear, kDynamic, kLlama3, kYarn };
struct RopeParams {
  double base = 10000.0;
  // Rotary dimension; 0 until resolved against a tensor (twice its length).
  int64_t dim = 0;
  RopeType type = RopeType::kDefault;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

UniformParams GetParams(const v1::Uniform& uniform);
NormalParams GetParams(const v1::Normal& normal);
TruncNormalParams GetParams(const v1::TruncNormal& trunc_normal);
SparseParams GetParams(const v1::Sparse& sparse);
ArangeParams GetParams(const v1::Arange& arange);
// Kaiming parameters; the mode must have passed CheckSchemeParameters.
KaimingParams GetKaimingParams(double a, const std::string& mode,
                               const std::string& nonlinearity);
int64_t GetGroups(const v1::Dirac& dirac);
// `length` is the tensor's number of elements (the default dim is twice
// it). The scaling type must have passed CheckSchemeParameters.
RopeParams GetParams(const v1::RopeInvFreq& rope, int64_t length);

// Checks what does not depend on the tensor: a scheme is set, parameters are
// finite, std >= 0 (> 0 for trunc_normal), a <= b (a < b for trunc_normal),
// xavier gains >= 0, known nonlinearity and mode names, groups >= 1,
// sparsity in [0, 1], RoPE scaling parameters. INVALID_ARGUMENT with a reason
// like "normal.std is -1; it must be >= 0" (the caller adds the field path).
absl::Status CheckSchemeParameters(const v1::InitScheme& scheme);

// Checks that `scheme` can fill `tensor` (its full shape): random schemes
// need a floating dtype; fan-based schemes and orthogonal need >= 2
// dimensions, eye and sparse 2, dirac 3 to 5; arange no bool; RoPE needs a
// 1-D tensor of ceil(dim / 2) elements (at most kMaxRopeFrequencies);
// values the tensor's size and no NaN (values.h). Whether the values fit the
// dtype is CheckValueRange's (value_range.h). module_default is checked with
// its module (module_plan.h).
absl::Status CheckSchemeForTensor(const v1::InitScheme& scheme,
                                  const spec::TensorDesc& tensor);

// Whether `scheme` has a definition in RNG_MODE_PORTABLE: every scheme but
// orthogonal and sparse, which need the whole matrix at once (a QR, a
// permutation per column) and so cannot give a shard its slice.
bool HasPortableDefinition(const v1::InitScheme& scheme);

// Whether the scheme draws random numbers from the tensor's own generator.
// module_default draws from its module's generator and is not counted here.
bool IsRandom(const v1::InitScheme& scheme);

// "zeros", "constant(val=0.5)", "uniform(a=-0.1, b=0.1)",
// "normal(mean=0, std=0.02)", "xavier_uniform(gain=relu)", ...
std::string DescribeScheme(const v1::InitScheme& scheme);

// The largest finite value of a floating dtype (double's for the others).
double MaxFinite(spec::DType dtype);

// Shortest text that reads back as the same double, for messages.
std::string ShortNumber(double value);

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_SCHEMES_H_
