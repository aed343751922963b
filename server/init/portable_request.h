#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_REQUEST_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_REQUEST_H_

// How a random init scheme becomes a portable kernel request
// (server/init/portable, docs/portable-rng.md): the distribution with its
// parameters computed as torch.nn.init computes them (fans from the shape
// the scheme fills, never a shard's box), the key from (seed, name), the
// stream from the init step. Used by validation and by the fill alike, so
// a request validation accepted is the request the kernels run.
//
//   ASSIGN_OR_RETURN(portable::PortableRequest request,
//                    PortableRequestFor(scheme, target, seed));
//   RETURN_IF_ERROR(CheckPortableRequest(request));  // what the kernels check
//
// Thread-safe: pure functions. No LibTorch.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "materializer/v1/materializer.pb.h"
#include "server/init/portable/box.h"
#include "server/init/portable/portable.h"
#include "server/spec/dtype.h"

namespace materializer::init {

// Where a scheme's values go.
struct PortableTarget {
  // The tensor's full name (the key).
  std::string name;
  spec::DType dtype = spec::DType::kFloat32;
  // The shape the scheme fills (the full tensor, or an init step's
  // region): it numbers the elements and gives the fans.
  std::vector<int64_t> shape;
  // The part to write, in `shape`'s coordinates; none for all of it.
  std::optional<portable::Box> box;
  // Counter word 2: the init step's index (0 for a plain init).
  uint32_t stream = 0;
};

// The request for a random scheme with a portable definition (IsRandom and
// HasPortableDefinition, schemes.h). INVALID_ARGUMENT for any other scheme
// or parameters whose fans or gains cannot be computed.
absl::StatusOr<portable::PortableRequest> PortableRequestFor(
    const v1::InitScheme& scheme, const PortableTarget& target, uint64_t seed);

// Everything FillPortable and FillPortableCuda check before they write:
// dtype, element count (< 2^62), box, parameters in the compute type, and
// a box the kernels can walk (kMaxRank partially covered dimensions).
absl::Status CheckPortableRequest(const portable::PortableRequest& request);

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_REQUEST_H_
