#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_PORTABLE_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_PORTABLE_H_

// Portable init: tensor values that depend only on (seed, tensor name,
// element index in the full tensor), bit for bit the same on every CPU
// path and on CUDA, in any order, for the full tensor or any box of it.
// The algorithm (Philox4x32-10 plus exactly specified transforms) is in
// docs/portable-rng.md; tests/python/portable_ref.py is an independent
// NumPy implementation that the tests hold this one to.
//
// Example: rows [256, 512) of a (1024, 768) bfloat16 weight, N(0, 0.02):
//
//   PortableRequest r;
//   r.seed = 1234;
//   r.name_hash = NameHash("h.0.attn.c_attn.weight");
//   r.dtype = spec::DType::kBFloat16;
//   r.dist = Distribution::Normal(0.0, 0.02);
//   r.shape = {1024, 768};
//   r.box = Box{{256, 0}, {256, 768}};
//   std::vector<uint16_t> out(256 * 768);
//   RETURN_IF_ERROR(FillPortable(r, out.data()));
//
// The bytes equal rows 256..511 of the same request without a box.
// Schemes map onto the four distributions (the caller computes fans from
// the FULL shape, never the box's):
//   zeros/ones/constant(v)         Constant(v)
//   uniform(a, b)                  Uniform(a, b)
//   normal(mean, std)              Normal(mean, std)
//   trunc_normal(mean, std, a, b)  TruncNormal(mean, std, a, b)
//   xavier_uniform(gain)           Uniform(-g sqrt(6/(fi+fo)), +...)
//   xavier_normal(gain)            Normal(0, g sqrt(2/(fi+fo)))
//   kaiming_uniform(a, mode, nl)   Uniform(-g sqrt(3/fan), +...)
//   kaiming_normal(a, mode, nl)    Normal(0, g / sqrt(fan))
// orthogonal and sparse have no portable definition (docs/portable-rng.md,
// "What is not portable").

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/init/portable/box.h"
#include "server/init/portable/kernel_params.h"
#include "server/spec/dtype.h"

namespace materializer::init::portable {

// What to draw. Parameters are doubles, as in torch.nn.init; the kernel
// uses them rounded to the compute type (float32, or float64 for float64
// tensors) after the host-side setup in MakeKernelParams.
struct Distribution {
  enum class Kind { kConstant, kUniform, kNormal, kTruncNormal };
  Kind kind = Kind::kConstant;
  double value = 0;  // constant
  double a = 0;      // uniform: [a, b); trunc_normal: bounds [a, b]
  double b = 0;
  double mean = 0;  // normal, trunc_normal
  double std = 0;

  static Distribution Constant(double value);
  static Distribution Uniform(double a, double b);
  static Distribution Normal(double mean, double std);
  static Distribution TruncNormal(double mean, double std, double a, double b);
};

struct PortableRequest {
  uint64_t seed = 0;
  // NameHash(tensor name): the tensor's identity in the key.
  uint64_t name_hash = 0;
  // Counter word 2. 0 for every scheme today; a scheme needing a second
  // independent draw per element would use 1.
  uint32_t stream = 0;
  // float32, float64, float16, bfloat16, float8_e4m3fn or float8_e5m2.
  spec::DType dtype = spec::DType::kFloat32;
  Distribution dist;
  // The FULL tensor's shape: it defines every element's linear index.
  std::vector<int64_t> shape;
  // The part to write; none means the whole tensor.
  std::optional<Box> box;
};

// 64-bit FNV-1a of the name's bytes (init::Fnv1a64, docs/init.md).
uint64_t NameHash(absl::string_view name);

// The Philox key of a tensor: s = SplitMix64(seed ^ SplitMix64(name_hash)),
// key = (low 32 bits of s, high 32 bits). For name_hash = NameHash(name), s
// is init::DeriveSeed(seed, name), the seed torch mode gives the tensor's
// generator.
struct PhiloxKey {
  uint32_t key0 = 0;
  uint32_t key1 = 0;
};
PhiloxKey TensorKey(uint64_t seed, uint64_t name_hash);

// Checks the request: a supported dtype, finite parameters (a <= b,
// std >= 0 for normal, std > 0 and a < b for trunc_normal), parameters that
// fit the compute type, a valid box, fewer than 2^62 elements.
// INVALID_ARGUMENT with the reason otherwise.
absl::Status ValidatePortableRequest(const PortableRequest& request);

// Bytes FillPortable writes: elements of the box times the item size.
absl::StatusOr<int64_t> PortableOutputBytes(const PortableRequest& request);

// The host-side setup every kernel (CPU or CUDA) starts from: key, and the
// distribution's parameters rounded to the compute type.
absl::StatusOr<KernelParams> MakeKernelParams(const PortableRequest& request);

// The CPU kernels. kAuto picks the widest this CPU supports.
enum class CpuPath { kAuto, kScalar, kAvx2, kAvx512 };
const char* CpuPathName(CpuPath path);
// The paths this CPU (and build) can run, kScalar first.
std::vector<CpuPath> AvailableCpuPaths();

struct FillOptions {
  // Threads to split the box across; 0: std::thread::hardware_concurrency.
  // Boxes under 64 Ki elements per thread use fewer. The bytes do not
  // depend on it.
  int threads = 0;
  CpuPath path = CpuPath::kAuto;
};

// Writes the box's elements to `out`, row-major over the box, dense
// (PortableOutputBytes(request) bytes, any alignment). Blocks until done.
// Thread-safe (no shared state); `out` is borrowed for the call.
absl::Status FillPortable(const PortableRequest& request, void* out,
                          const FillOptions& options = {});

}  // namespace materializer::init::portable

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_PORTABLE_H_
