#ifndef MATERIALIZER_SERVER_CHECKPOINT_PICKLE_H_
#define MATERIALIZER_SERVER_CHECKPOINT_PICKLE_H_

// Reads the data.pkl of a torch.save archive holding a state_dict: a dict
// or OrderedDict of tensors rebuilt by torch._utils._rebuild_tensor_v2 (or
// _v3, for dtypes without a typed storage class; or wrapped in
// _rebuild_parameter) over persistent-id storages.
//
// A small pickle machine that never runs pickled code: it knows the data
// opcodes of protocols 2 to 5 (what torch.save and Python's pickler write
// for such objects: ints, floats, strings, bytes, tuples, lists, dicts,
// memo, framing), records GLOBAL and STACK_GLOBAL as names, REDUCE and
// BUILD as inert records, and then matches the result against the
// state_dict shape. An OrderedDict's BUILD state (the `_metadata` that
// Module.state_dict() attaches) is accepted and ignored. Any other opcode,
// a value that is not a tensor, or a pickle past the limits below is
// INVALID_ARGUMENT "data.pkl: <what>".
//
//   ASSIGN_OR_RETURN(std::vector<PickledTensor> tensors,
//                    ReadStateDictPickle(data_pkl));
//
// Thread-safe (no shared state).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace materializer::checkpoint {

// The most objects a pickle may build, and memo entries it may set (a
// 100,000-tensor state_dict builds about 1.5 million of each); bounds the
// memory a hostile pickle costs to a few hundred MB.
inline constexpr uint64_t kMaxPickleObjects = uint64_t{4} << 20;

struct PickledTensor {
  std::string name;
  // "_rebuild_tensor_v2" or "_rebuild_tensor_v3".
  std::string rebuild;
  // Wrapped in torch._utils._rebuild_parameter (an nn.Parameter).
  bool parameter = false;
  // The storage's persistent id: ('storage', <module>.<class>, key,
  // location, size).
  std::string storage_class;  // e.g. "torch.FloatStorage"
  std::string storage_key;    // the archive's data/<key>
  std::string location;       // e.g. "cpu"
  int64_t storage_size = 0;   // elements (typed) or bytes (untyped)
  int64_t storage_offset = 0;  // elements
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  bool requires_grad = false;
  // v3 only: the dtype global, e.g. "torch.float8_e4m3fn".
  std::string dtype;
};

// The state_dict's tensors, in dict order. Keys are unique strings.
absl::StatusOr<std::vector<PickledTensor>> ReadStateDictPickle(
    absl::string_view pickle);

}  // namespace materializer::checkpoint

#endif  // MATERIALIZER_SERVER_CHECKPOINT_PICKLE_H_
