#include "client/fetched_chunk.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace materializer::client {
namespace {

constexpr uint32_t kDataField = 2;
constexpr uint32_t kLengthDelimited = 2;

// Reads bytes across a list of slices without joining them.
class SliceCursor {
 public:
  explicit SliceCursor(const std::vector<grpc::Slice>& slices)
      : slices_(slices) {
    SkipEmpty();
  }

  bool done() const { return index_ == slices_.size(); }

  // One byte, also appended to `raw` when it is not null.
  bool ReadByte(uint8_t* byte, std::string* raw) {
    if (done()) return false;
    *byte = slices_[index_].begin()[pos_];
    if (raw != nullptr) raw->push_back(static_cast<char>(*byte));
    ++pos_;
    SkipEmpty();
    return true;
  }

  // A base-128 varint of at most `max_bytes` bytes (protobuf's limits:
  // 10 for a value, 5 for a tag).
  bool ReadVarint(uint64_t* value, int max_bytes, std::string* raw) {
    *value = 0;
    for (int i = 0; i < max_bytes; ++i) {
      uint8_t byte;
      if (!ReadByte(&byte, raw)) return false;
      *value |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }

  // The next `n` bytes as views into the slices (to `views`), or copied
  // onto `copy`; false if fewer remain.
  bool Take(uint64_t n, std::vector<absl::string_view>* views,
            std::string* copy) {
    while (n > 0) {
      if (done()) return false;
      const grpc::Slice& slice = slices_[index_];
      const size_t here = std::min<uint64_t>(n, slice.size() - pos_);
      const char* data =
          reinterpret_cast<const char*>(slice.begin()) + pos_;
      if (views != nullptr) views->emplace_back(data, here);
      if (copy != nullptr) copy->append(data, here);
      pos_ += here;
      n -= here;
      SkipEmpty();
    }
    return true;
  }

 private:
  void SkipEmpty() {
    while (index_ < slices_.size() && pos_ == slices_[index_].size()) {
      ++index_;
      pos_ = 0;
    }
  }

  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  size_t pos_ = 0;
};

absl::Status Malformed(absl::string_view what) {
  return absl::DataLossError(
      absl::StrCat("the server sent a malformed WeightChunk: ", what));
}

}  // namespace

std::string FetchedChunk::CopyData() const {
  std::string out;
  out.reserve(data_size_);
  for (absl::string_view piece : pieces_) out.append(piece.data(), piece.size());
  return out;
}

absl::Status FetchedChunk::Parse(const grpc::ByteBuffer& buffer) {
  fields_.Clear();
  slices_.clear();
  pieces_.clear();
  data_size_ = 0;
  if (!buffer.Dump(&slices_).ok()) return Malformed("unreadable buffer");

  // Every field but `data` is copied, as it arrived, into `rest` and
  // parsed by protobuf (a message's fields may be concatenated), so those
  // fields get protobuf's exact semantics. `data` is singular: the last
  // occurrence wins, as in protobuf.
  std::string rest;
  SliceCursor cursor(slices_);
  while (!cursor.done()) {
    std::string tag_bytes;
    uint64_t tag;
    if (!cursor.ReadVarint(&tag, 5, &tag_bytes)) {
      return Malformed("a truncated or oversized field tag");
    }
    tag &= 0xffffffff;  // as protobuf reads a five-byte tag
    const uint32_t wire_type = tag & 7;
    if ((tag >> 3) == kDataField && wire_type == kLengthDelimited) {
      uint64_t length;
      if (!cursor.ReadVarint(&length, 10, nullptr)) {
        return Malformed("a truncated length of data");
      }
      if (length > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
        return Malformed(absl::StrCat("data of ", length, " bytes"));
      }
      pieces_.clear();
      if (!cursor.Take(length, &pieces_, nullptr)) {
        return Malformed(absl::StrCat("data of ", length,
                                      " bytes runs past the message"));
      }
      data_size_ = length;
      continue;
    }
    rest += tag_bytes;
    uint64_t length = 0;
    switch (wire_type) {
      case 0:  // varint
        if (!cursor.ReadVarint(&length, 10, &rest)) {
          return Malformed("a truncated varint");
        }
        continue;
      case 1:  // fixed64
        length = 8;
        break;
      case 5:  // fixed32
        length = 4;
        break;
      case kLengthDelimited:
        if (!cursor.ReadVarint(&length, 10, &rest)) {
          return Malformed("a truncated length");
        }
        break;
      default:
        return Malformed(absl::StrCat("wire type ", wire_type));
    }
    if (length > static_cast<uint64_t>(std::numeric_limits<int>::max()) ||
        !cursor.Take(length, nullptr, &rest)) {
      return Malformed("a field runs past the message");
    }
  }
  if (!fields_.ParseFromString(rest)) {
    return Malformed("its fields do not parse");
  }
  return absl::OkStatus();
}

}  // namespace materializer::client
