#ifndef MATERIALIZER_SERVER_DELIVERY_SAFETENSORS_H_
#define MATERIALIZER_SERVER_DELIVERY_SAFETENSORS_H_

// The safetensors file of a handle, produced as a byte range at a time
// without ever assembling the whole file.
//
// Format (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header length N, N bytes of JSON (padded with spaces to a
// multiple of 8), then the tensors' bytes back to back with no gaps.
// Tensors are ordered by element size, largest first, then by name; with an
// 8-aligned header that keeps every tensor naturally aligned in the file.
// The layout is a pure function of the tensor list, so the file size is
// known before the first byte and any range can be re-read (resume).
//
//   SafetensorsFile file = SafetensorsFile::Build(entries);
//   RETURN_IF_ERROR(file.Read(offset, length, reader, &out));

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/spec/dtype.h"

namespace materializer::delivery {

struct FileTensor {
  std::string name;
  spec::DType dtype = spec::DType::kFloat32;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  // Where the bytes come from: an offset in the source (the arena).
  uint64_t source_offset = 0;
};

// Copies source bytes [offset, offset + length) to dst.
using SourceReader =
    std::function<absl::Status(uint64_t offset, uint64_t length, void* dst)>;

// Immutable after Build; thread-safe to read.
class SafetensorsFile {
 public:
  // `metadata` goes into "__metadata__" (string to string), sorted by key.
  static SafetensorsFile Build(
      std::vector<FileTensor> tensors,
      const std::vector<std::pair<std::string, std::string>>& metadata = {});

  uint64_t size() const { return header_.size() + data_bytes_; }
  // The 8-byte length prefix plus the padded JSON.
  const std::string& header() const { return header_; }
  // In file order, with data offsets relative to the data section.
  const std::vector<FileTensor>& tensors() const { return tensors_; }
  const std::vector<uint64_t>& data_offsets() const { return data_offsets_; }

  // Appends file bytes [offset, offset + length) to *out. OUT_OF_RANGE if
  // the range passes the end of the file.
  absl::Status Read(uint64_t offset, uint64_t length,
                    const SourceReader& reader, std::string* out) const;

 private:
  std::string header_;
  std::vector<FileTensor> tensors_;
  std::vector<uint64_t> data_offsets_;  // start of each tensor in the data
  uint64_t data_bytes_ = 0;
};

// JSON string literal for `text` (quotes included, escapes as needed).
std::string JsonQuote(absl::string_view text);

}  // namespace materializer::delivery

#endif  // MATERIALIZER_SERVER_DELIVERY_SAFETENSORS_H_
