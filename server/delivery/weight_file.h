#ifndef MATERIALIZER_SERVER_DELIVERY_WEIGHT_FILE_H_
#define MATERIALIZER_SERVER_DELIVERY_WEIGHT_FILE_H_

// The file a fetch streams, described without its bytes: a list of
// segments, each either literal bytes the file owns (headers, a pickle, zip
// records), zero padding, or a range of the source (the handle's arena).
// Every format is built this way, so every format has its size and every
// tensor's byte range before the first byte is sent, any range can be
// produced again (resume), and a range can be sent without copying the
// tensor bytes (the pieces point into the arena).
//
//   ASSIGN_OR_RETURN(WeightFile file, BuildWeightFile(format, tensors, meta));
//   RETURN_IF_ERROR(file.ForEachPiece(offset, length, [&](const Piece& p) {
//     ...  // p.data (literal or zeros) or p.source_offset (arena)
//   }));
//
// Formats (docs/delivery.md):
//   safetensors  8-byte length, JSON header padded to 8, tensors back to back
//                ordered by element size then name.
//   torch        the zip archive torch.save writes ("archive/data.pkl",
//                "archive/data/<n>", ...), stored entries, fixed times, every
//                entry's data on a 64-byte boundary; zip64 records where
//                sizes or offsets need them.
//   raw          the tensors' bytes, each on a 64-byte boundary, no header.

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "materializer/v1/materializer.pb.h"
#include "server/delivery/safetensors.h"

namespace materializer::delivery {

// One tensor's place in a built file.
struct FileRange {
  std::string name;
  spec::DType dtype = spec::DType::kFloat32;
  std::vector<int64_t> shape;
  // Byte range of the tensor's data in the file.
  uint64_t offset = 0;
  uint64_t nbytes = 0;
  // Index of the tensor in the list the file was built from.
  size_t input = 0;
};

struct Piece {
  enum class Kind { kLiteral, kZeros, kSource };
  Kind kind = Kind::kLiteral;
  // kLiteral and kZeros: the bytes (owned by the file, or a static page of
  // zeros), valid while the WeightFile lives.
  const char* data = nullptr;
  // kSource: where the bytes start in the source.
  uint64_t source_offset = 0;
  uint64_t length = 0;
};

// Immutable once built; thread-safe to read.
class WeightFile {
 public:
  // Appends segments in file order; defined below.
  class Builder;

  WeightFile() = default;

  v1::WeightFormat format() const { return format_; }
  uint64_t size() const { return size_; }
  // Every written tensor, in file order.
  const std::vector<FileRange>& ranges() const { return ranges_; }

  // Calls `visit` with the pieces that make up bytes [offset, offset +
  // length), in order, splitting segments at the range's ends. Zero pieces
  // are at most kZeroPageBytes long. OUT_OF_RANGE if the range passes the
  // end of the file; the first error of `visit` is returned.
  absl::Status ForEachPiece(
      uint64_t offset, uint64_t length,
      const std::function<absl::Status(const Piece&)>& visit) const;

  // Appends bytes [offset, offset + length) to *out, reading source pieces
  // through `reader`.
  absl::Status Read(uint64_t offset, uint64_t length,
                    const SourceReader& reader, std::string* out) const;

  static constexpr uint64_t kZeroPageBytes = 4096;

 private:
  struct Segment {
    uint64_t offset = 0;  // in the file
    uint64_t length = 0;
    Piece::Kind kind = Piece::Kind::kLiteral;
    // kLiteral: offset into literals_; kSource: offset into the source.
    uint64_t from = 0;
  };

  v1::WeightFormat format_ = v1::WEIGHT_FORMAT_SAFETENSORS;
  uint64_t size_ = 0;
  std::string literals_;
  std::vector<Segment> segments_;
  std::vector<FileRange> ranges_;
};

// Appends segments in file order.
class WeightFile::Builder {
 public:
  explicit Builder(v1::WeightFormat format) { file_.format_ = format; }
  uint64_t size() const { return file_.size_; }
  void Literal(absl::string_view bytes);
  void Zeros(uint64_t length);
  void Source(uint64_t source_offset, uint64_t length);
  // Records the tensor whose data starts at the current end of the file
  // (call just before Source).
  void AddRange(FileRange range) { file_.ranges_.push_back(std::move(range)); }
  WeightFile Build() && { return std::move(file_); }

 private:
  WeightFile file_;
};

// A tensor to write. `group`: tensors with the same group >= 0 share one
// storage (tied weights): the torch format pickles them over one storage;
// safetensors and raw write each one's bytes. `crc32` (of the tensor's
// bytes) is needed by the torch format only.
struct SourceTensor : FileTensor {
  int64_t group = -1;
  uint32_t crc32 = 0;
};

// Builds the file of `format` (UNSPECIFIED means safetensors). `metadata`
// goes into the safetensors "__metadata__" and is ignored by the others.
absl::StatusOr<WeightFile> BuildWeightFile(
    v1::WeightFormat format, const std::vector<SourceTensor>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata);

// The pieces of BuildWeightFile, exposed for tests.
WeightFile BuildSafetensorsWeightFile(
    const std::vector<SourceTensor>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata);
WeightFile BuildRawWeightFile(const std::vector<SourceTensor>& tensors);
WeightFile BuildTorchWeightFile(const std::vector<SourceTensor>& tensors);

// Alignment of each tensor's data in the raw and torch formats (torch.save
// aligns storages to 64 bytes too).
inline constexpr uint64_t kFileAlignment = 64;

}  // namespace materializer::delivery

#endif  // MATERIALIZER_SERVER_DELIVERY_WEIGHT_FILE_H_
