#include "fuzz/readers/safetensors_reader.h"

#include "absl/status/status.h"
#include "server/checkpoint/checkpoint_tensor.h"
#include "server/checkpoint/random_access_file.h"
#include "server/checkpoint/safetensors_header.h"
#include "server/spec/dtype.h"

namespace materializer::fuzz {

absl::StatusOr<SafetensorsContents> ReadSafetensors(absl::string_view file) {
  SafetensorsContents contents;
  absl::StatusOr<std::vector<checkpoint::CheckpointTensor>> tensors =
      checkpoint::ReadSafetensorsTensors(checkpoint::StringFile(file),
                                         "safetensors file",
                                         &contents.metadata);
  if (!tensors.ok()) return tensors.status();
  for (int i = 0; i < 8; ++i) {
    contents.header_length |= uint64_t{static_cast<unsigned char>(file[i])}
                              << (8 * i);
  }
  contents.data_start = 8 + contents.header_length;
  for (const checkpoint::CheckpointTensor& t : *tensors) {
    SafetensorsEntry entry;
    entry.name = t.name;
    entry.dtype = spec::Info(t.dtype).safetensors_name;
    entry.shape.assign(t.shape.begin(), t.shape.end());
    entry.begin = t.offset - contents.data_start;
    entry.end = entry.begin + t.nbytes;
    contents.tensors.push_back(std::move(entry));
  }
  return contents;
}

}  // namespace materializer::fuzz
