#ifndef MATERIALIZER_SERVER_INIT_RNG_MODE_H_
#define MATERIALIZER_SERVER_INIT_RNG_MODE_H_

#include "materializer/v1/materializer.pb.h"

namespace materializer::init {

// The mode RNG_MODE_UNSPECIFIED stands for: portable, so values do not
// depend on the device, the order of tensors, or how a tensor is sharded.
inline constexpr v1::RngMode kDefaultRngMode = v1::RNG_MODE_PORTABLE;

inline v1::RngMode EffectiveRngMode(v1::RngMode requested) {
  return requested == v1::RNG_MODE_UNSPECIFIED ? kDefaultRngMode : requested;
}

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_RNG_MODE_H_
