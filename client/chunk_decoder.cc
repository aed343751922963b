#include "client/chunk_decoder.h"

#include <cstddef>

#include "absl/strings/str_cat.h"

namespace materializer::client {
namespace {

constexpr uint64_t kDataField = 2;
constexpr int kLengthDelimited = 2;

// Reads the bytes of a list of slices in order, across slice boundaries.
class SliceCursor {
 public:
  explicit SliceCursor(const std::vector<grpc::Slice>& slices)
      : slices_(slices) {
    SkipEmpty();
  }

  bool done() const { return index_ == slices_.size(); }

  // A base-128 varint of at most 10 bytes; its bytes are appended to *raw
  // when raw is not null. False when truncated or over 64 bits.
  bool Varint(uint64_t* value, std::string* raw) {
    uint64_t result = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (done()) return false;
      const uint8_t byte = Current()[0];
      Advance(1);
      if (raw != nullptr) raw->push_back(static_cast<char>(byte));
      if (shift == 63 && byte > 1) return false;
      result |= uint64_t{byte & 0x7fu} << shift;
      if ((byte & 0x80u) == 0) {
        *value = result;
        return true;
      }
    }
    return false;
  }

  // The next `n` bytes: appended to *views as views into the slices, or
  // copied to the end of *raw. False (having consumed what there was) when
  // fewer than n bytes are left.
  bool Take(uint64_t n, std::vector<absl::string_view>* views,
            std::string* raw) {
    while (n > 0) {
      if (done()) return false;
      const size_t available = slices_[index_].size() - offset_;
      const size_t take = n < available ? static_cast<size_t>(n) : available;
      if (views != nullptr) {
        views->emplace_back(Current(), take);
      } else {
        raw->append(Current(), take);
      }
      Advance(take);
      n -= take;
    }
    return true;
  }

 private:
  const char* Current() const {
    return reinterpret_cast<const char*>(slices_[index_].begin()) + offset_;
  }
  // `n` is at most what is left of the current slice.
  void Advance(size_t n) {
    offset_ += n;
    if (offset_ == slices_[index_].size()) {
      ++index_;
      offset_ = 0;
      SkipEmpty();
    }
  }
  void SkipEmpty() {
    while (index_ < slices_.size() && slices_[index_].size() == 0) ++index_;
  }

  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  size_t offset_ = 0;
};

absl::Status NotAChunk(absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("a FetchWeights message is not a WeightChunk: ", why));
}

}  // namespace

absl::Status DecodeWeightChunk(const grpc::ByteBuffer& received,
                               DecodedChunk* chunk) {
  chunk->data.clear();
  chunk->data_size = 0;
  chunk->slices.clear();
  chunk->fields.Clear();
  // Dump shares the slices (a reference each), it does not copy them. A
  // buffer that holds nothing is the empty message (every field default).
  if (received.Valid()) {
    if (grpc::Status dumped = received.Dump(&chunk->slices); !dumped.ok()) {
      return NotAChunk(dumped.error_message());
    }
  }
  SliceCursor cursor(chunk->slices);
  std::string others;  // every field but data, as it was encoded
  while (!cursor.done()) {
    const size_t field_start = others.size();
    uint64_t key = 0;
    if (!cursor.Varint(&key, &others)) return NotAChunk("a truncated key");
    const uint64_t field = key >> 3;
    const int wire_type = static_cast<int>(key & 7);
    if (field == 0) return NotAChunk("field number 0");
    if (field == kDataField && wire_type == kLengthDelimited) {
      others.resize(field_start);  // data is kept as views, not re-encoded
      uint64_t length = 0;
      if (!cursor.Varint(&length, nullptr)) {
        return NotAChunk("a truncated data length");
      }
      chunk->data.clear();  // a repeated singular field: the last one wins
      if (!cursor.Take(length, &chunk->data, nullptr)) {
        return NotAChunk(
            absl::StrCat("data of ", length, " bytes runs past its end"));
      }
      chunk->data_size = length;
      continue;
    }
    switch (wire_type) {
      case 0: {
        uint64_t value = 0;
        if (!cursor.Varint(&value, &others)) {
          return NotAChunk(absl::StrCat("field ", field, ": a bad varint"));
        }
        break;
      }
      case 1:
        if (!cursor.Take(8, nullptr, &others)) {
          return NotAChunk(absl::StrCat("field ", field, " is truncated"));
        }
        break;
      case kLengthDelimited: {
        uint64_t length = 0;
        if (!cursor.Varint(&length, &others) ||
            !cursor.Take(length, nullptr, &others)) {
          return NotAChunk(absl::StrCat("field ", field, " is truncated"));
        }
        break;
      }
      case 5:
        if (!cursor.Take(4, nullptr, &others)) {
          return NotAChunk(absl::StrCat("field ", field, " is truncated"));
        }
        break;
      default:
        return NotAChunk(
            absl::StrCat("field ", field, " has wire type ", wire_type));
    }
  }
  if (!chunk->fields.ParseFromString(others)) {
    return NotAChunk("its fields other than data do not parse");
  }
  return absl::OkStatus();
}

}  // namespace materializer::client
