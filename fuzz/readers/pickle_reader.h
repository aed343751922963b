#ifndef MATERIALIZER_FUZZ_READERS_PICKLE_READER_H_
#define MATERIALIZER_FUZZ_READERS_PICKLE_READER_H_

// Reads the data.pkl of a torch.save archive holding a state_dict: an
// OrderedDict of tensors rebuilt by torch._utils._rebuild_tensor_v2 (or v3
// for dtypes without a typed storage class) over persistent-id storages.
// A small pickle machine (protocol 2 opcodes, the ones such a pickle uses,
// memo included) that builds objects and then matches the state_dict
// shape; anything else is INVALID_ARGUMENT. Independent of the writer in
// server/delivery, so the fuzz targets can check written files against it.
//
//   ASSIGN_OR_RETURN(std::vector<PickledTensor> tensors,
//                    ReadStateDictPickle(data_pkl));

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace materializer::fuzz {

struct PickledTensor {
  std::string name;
  // "_rebuild_tensor_v2" or "_rebuild_tensor_v3".
  std::string rebuild;
  // The storage's persistent id: ('storage', <module>.<class>, key,
  // location, size).
  std::string storage_class;  // e.g. "torch.FloatStorage"
  std::string storage_key;    // archive/data/<key>
  std::string location;       // e.g. "cpu"
  int64_t storage_size = 0;   // elements (typed) or bytes (untyped)
  int64_t storage_offset = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  bool requires_grad = false;
  // v3 only: the dtype global, e.g. "torch.float8_e4m3fn".
  std::string dtype;
};

// The state_dict's tensors, in dict order.
absl::StatusOr<std::vector<PickledTensor>> ReadStateDictPickle(
    absl::string_view pickle);

}  // namespace materializer::fuzz

#endif  // MATERIALIZER_FUZZ_READERS_PICKLE_READER_H_
