#ifndef MATERIALIZER_SERVER_CHECKPOINT_TORCH_ARCHIVE_H_
#define MATERIALIZER_SERVER_CHECKPOINT_TORCH_ARCHIVE_H_

// The tensors of a torch.save archive (pytorch_model.bin, *.pt, *.pth): a
// zip of stored entries "<prefix>/data.pkl" (the pickled state_dict),
// "<prefix>/byteorder", and one "<prefix>/data/<key>" per storage. Read
// with positional reads: the zip's end records and central directory
// (zip.h), data.pkl (at most kMaxTorchPickleBytes, CRC checked) and the
// local header of each storage that a tensor uses; tensor bytes are not
// read. data.pkl goes through a pickle machine that never runs pickled
// code (pickle.h).
//
//   FdFile file(opened.fd(), opened.size(), opened.label());
//   ASSIGN_OR_RETURN(std::vector<CheckpointTensor> tensors,
//                    ReadTorchArchive(file, opened.label()));
//
// Each tensor's range is its bytes inside its storage's entry (storage
// offset applied). Tensors sharing a storage (tied weights, views) get
// equal or overlapping ranges. A tensor that is its whole storage carries
// the entry's CRC-32 (CheckpointTensor::crc32), for the loader to check. Refused, INVALID_ARGUMENT naming the file
// (and the tensor where there is one): a file that is not a zip (the
// legacy pre-1.6 torch.save format included), a TorchScript archive, a
// compressed entry, a big-endian archive, a value that is not a tensor
// (nested dicts of a training checkpoint, extra state), a storage class or
// dtype the service does not hold (complex, quantized, uint16...), a
// tensor that is not contiguous (its strides are not those of its shape
// in row-major order), a tensor outside its storage, a storage whose entry
// is missing or has another size than its pickle says.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/checkpoint/checkpoint_tensor.h"
#include "server/checkpoint/random_access_file.h"

namespace materializer::checkpoint {

// The largest data.pkl read (a 100,000-tensor state_dict pickles to about
// 10 MB).
inline constexpr uint64_t kMaxTorchPickleBytes = uint64_t{64} << 20;

// The archive's tensors in state_dict order.
absl::StatusOr<std::vector<CheckpointTensor>> ReadTorchArchive(
    const RandomAccessFile& file, absl::string_view label);

}  // namespace materializer::checkpoint

#endif  // MATERIALIZER_SERVER_CHECKPOINT_TORCH_ARCHIVE_H_
