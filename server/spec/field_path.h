#ifndef MATERIALIZER_SERVER_SPEC_FIELD_PATH_H_
#define MATERIALIZER_SERVER_SPEC_FIELD_PATH_H_

// How error messages name a tensor of the request: its field path and its
// name, e.g. `model.tensors[3] ("h.0.attn.weight")`. Every message about a
// tensor starts with this, so clients can find the entry either way.

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace materializer::spec {

inline std::string TensorPath(int index, absl::string_view name) {
  return absl::StrCat("model.tensors[", index, "] (\"", name, "\")");
}

}  // namespace materializer::spec

#endif  // MATERIALIZER_SERVER_SPEC_FIELD_PATH_H_
