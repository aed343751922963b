#ifndef MATERIALIZER_SERVER_SPEC_META_CHECK_H_
#define MATERIALIZER_SERVER_SPEC_META_CHECK_H_

#include <vector>

#include "absl/status/status.h"
#include "server/common/cancel.h"
#include "server/spec/tensor_desc.h"

namespace materializer::spec {

// Builds every tensor as a LibTorch meta tensor (shape and dtype, no
// storage) and checks that torch agrees with our arithmetic: element count,
// byte size and contiguity. Touches no memory beyond the tensor headers.
// INTERNAL if torch disagrees (a bug in the dtype table, never user input).
// CANCELLED once `cancelled` says the caller is gone (polled between
// tensors).
absl::Status CheckAgainstMetaTensors(const std::vector<TensorDesc>& tensors,
                                     const Cancelled& cancelled = {});

}  // namespace materializer::spec

#endif  // MATERIALIZER_SERVER_SPEC_META_CHECK_H_
