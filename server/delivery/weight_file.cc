#include "server/delivery/weight_file.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "server/delivery/digest.h"

namespace materializer::delivery {
namespace {

const char kZeroPage[WeightFile::kZeroPageBytes] = {};

uint64_t AlignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// Little-endian integers, as zip records and pickles want them.
void PutLE(std::string* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  }
}

// ---------------------------------------------------------------------------
// Pickle (protocol 2), just the opcodes a state_dict needs.
// ---------------------------------------------------------------------------

class Pickle {
 public:
  Pickle() { out_ = "\x80\x02"; }  // PROTO 2

  void Global(absl::string_view module, absl::string_view name) {
    absl::StrAppend(&out_, "c", module, "\n", name, "\n");
  }
  void Mark() { out_ += '('; }
  void Tuple() { out_ += 't'; }
  void EmptyTuple() { out_ += ')'; }
  void Reduce() { out_ += 'R'; }
  void SetItems() { out_ += 'u'; }
  void BinPersId() { out_ += 'Q'; }
  void False() { out_ += '\x89'; }
  void Stop() { out_ += '.'; }
  void String(absl::string_view text) {  // BINUNICODE (names are UTF-8)
    out_ += 'X';
    PutLE(&out_, text.size(), 4);
    out_.append(text.data(), text.size());
  }
  void Int(int64_t value) {
    if (value >= 0 && value < 0x100) {
      out_ += 'K';  // BININT1
      PutLE(&out_, static_cast<uint64_t>(value), 1);
    } else if (value >= 0 && value < 0x10000) {
      out_ += 'M';  // BININT2
      PutLE(&out_, static_cast<uint64_t>(value), 2);
    } else if (value >= INT32_MIN && value <= INT32_MAX) {
      out_ += 'J';  // BININT, signed 32-bit
      PutLE(&out_, static_cast<uint64_t>(static_cast<uint32_t>(value)), 4);
    } else {
      out_ += '\x8a';  // LONG1: length, then two's complement little-endian
      std::string bytes;
      uint64_t bits = static_cast<uint64_t>(value);
      for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>(bits >> (8 * i)));
      // Drop redundant sign bytes (keeps the encoding minimal, as Python's).
      while (bytes.size() > 1) {
        const char last = bytes.back();
        const char before = bytes[bytes.size() - 2];
        const bool redundant = (last == 0 && (before & 0x80) == 0) ||
                               (last == '\xff' && (before & 0x80) != 0);
        if (!redundant) break;
        bytes.pop_back();
      }
      PutLE(&out_, bytes.size(), 1);
      out_ += bytes;
    }
  }
  void IntTuple(const std::vector<int64_t>& values) {
    Mark();
    for (int64_t v : values) Int(v);
    Tuple();
  }

  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// torch's legacy typed-storage class per dtype (what torch.save pickles);
// float8 has none and goes through UntypedStorage and _rebuild_tensor_v3.
const char* TorchStorageClass(spec::DType dtype) {
  switch (dtype) {
    case spec::DType::kFloat32: return "FloatStorage";
    case spec::DType::kFloat64: return "DoubleStorage";
    case spec::DType::kFloat16: return "HalfStorage";
    case spec::DType::kBFloat16: return "BFloat16Storage";
    case spec::DType::kInt8: return "CharStorage";
    case spec::DType::kInt16: return "ShortStorage";
    case spec::DType::kInt32: return "IntStorage";
    case spec::DType::kInt64: return "LongStorage";
    case spec::DType::kUInt8: return "ByteStorage";
    case spec::DType::kBool: return "BoolStorage";
    case spec::DType::kComplex64: return "ComplexFloatStorage";
    case spec::DType::kFloat8E4M3FN:
    case spec::DType::kFloat8E5M2: return nullptr;
  }
  return nullptr;
}

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

// ---------------------------------------------------------------------------
// Zip (stored entries only).
// ---------------------------------------------------------------------------

constexpr uint64_t kMax32 = 0xffffffffu;
constexpr uint64_t kMax16 = 0xffffu;
// Fixed DOS time and date of every entry: 1980-01-01 00:00:00.
constexpr uint16_t kDosTime = 0;
constexpr uint16_t kDosDate = (1 << 5) | 1;
// The extra field torch uses to pad a local header so the data that follows
// is aligned ("FB").
constexpr uint16_t kPaddingExtraId = 0x4246;

struct ZipEntry {
  std::string name;
  // Either literal contents or a source range.
  std::string literal;
  bool from_source = false;
  uint64_t source_offset = 0;
  uint64_t size = 0;
  uint32_t crc32 = 0;
  uint64_t header_offset = 0;  // filled in while writing
  // The tensor this entry's data belongs to, for the file's ranges.
  std::vector<FileRange> ranges;
};

std::string LocalHeader(const ZipEntry& entry, uint64_t header_offset) {
  const bool zip64 = entry.size >= kMax32;
  std::string extra;
  if (zip64) {
    PutLE(&extra, 0x0001, 2);
    PutLE(&extra, 16, 2);
    PutLE(&extra, entry.size, 8);  // uncompressed
    PutLE(&extra, entry.size, 8);  // compressed (stored)
  }
  const uint64_t before_padding =
      header_offset + 30 + entry.name.size() + extra.size() + 4;
  const uint64_t padding =
      AlignUp(before_padding, kFileAlignment) - before_padding;
  PutLE(&extra, kPaddingExtraId, 2);
  PutLE(&extra, padding, 2);
  extra.append(padding, 'Z');

  std::string out;
  PutLE(&out, 0x04034b50, 4);
  PutLE(&out, zip64 ? 45 : 20, 2);  // version needed
  PutLE(&out, 0, 2);                // flags
  PutLE(&out, 0, 2);                // stored
  PutLE(&out, kDosTime, 2);
  PutLE(&out, kDosDate, 2);
  PutLE(&out, entry.crc32, 4);
  PutLE(&out, zip64 ? kMax32 : entry.size, 4);
  PutLE(&out, zip64 ? kMax32 : entry.size, 4);
  PutLE(&out, entry.name.size(), 2);
  PutLE(&out, extra.size(), 2);
  out += entry.name;
  out += extra;
  return out;
}

std::string CentralHeader(const ZipEntry& entry) {
  const bool big_size = entry.size >= kMax32;
  const bool big_offset = entry.header_offset >= kMax32;
  std::string extra;
  if (big_size || big_offset) {
    std::string fields;
    if (big_size) {
      PutLE(&fields, entry.size, 8);
      PutLE(&fields, entry.size, 8);
    }
    if (big_offset) PutLE(&fields, entry.header_offset, 8);
    PutLE(&extra, 0x0001, 2);
    PutLE(&extra, fields.size(), 2);
    extra += fields;
  }
  const int version = big_size || big_offset ? 45 : 20;
  std::string out;
  PutLE(&out, 0x02014b50, 4);
  PutLE(&out, version, 2);  // made by
  PutLE(&out, version, 2);  // needed
  PutLE(&out, 0, 2);        // flags
  PutLE(&out, 0, 2);        // stored
  PutLE(&out, kDosTime, 2);
  PutLE(&out, kDosDate, 2);
  PutLE(&out, entry.crc32, 4);
  PutLE(&out, big_size ? kMax32 : entry.size, 4);
  PutLE(&out, big_size ? kMax32 : entry.size, 4);
  PutLE(&out, entry.name.size(), 2);
  PutLE(&out, extra.size(), 2);
  PutLE(&out, 0, 2);  // comment
  PutLE(&out, 0, 2);  // disk
  PutLE(&out, 0, 2);  // internal attributes
  PutLE(&out, 0, 4);  // external attributes
  PutLE(&out, big_offset ? kMax32 : entry.header_offset, 4);
  out += entry.name;
  out += extra;
  return out;
}

std::string EndRecords(uint64_t entries, uint64_t cd_offset, uint64_t cd_size) {
  const bool zip64 =
      entries >= kMax16 || cd_offset >= kMax32 || cd_size >= kMax32;
  std::string out;
  if (zip64) {
    const uint64_t record_offset = cd_offset + cd_size;
    PutLE(&out, 0x06064b50, 4);
    PutLE(&out, 44, 8);  // size of the rest of this record
    PutLE(&out, 45, 2);
    PutLE(&out, 45, 2);
    PutLE(&out, 0, 4);
    PutLE(&out, 0, 4);
    PutLE(&out, entries, 8);
    PutLE(&out, entries, 8);
    PutLE(&out, cd_size, 8);
    PutLE(&out, cd_offset, 8);
    PutLE(&out, 0x07064b50, 4);  // locator
    PutLE(&out, 0, 4);
    PutLE(&out, record_offset, 8);
    PutLE(&out, 1, 4);
  }
  PutLE(&out, 0x06054b50, 4);
  PutLE(&out, 0, 2);
  PutLE(&out, 0, 2);
  PutLE(&out, zip64 ? kMax16 : entries, 2);
  PutLE(&out, zip64 ? kMax16 : entries, 2);
  PutLE(&out, zip64 ? kMax32 : cd_size, 4);
  PutLE(&out, zip64 ? kMax32 : cd_offset, 4);
  PutLE(&out, 0, 2);  // comment
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------
// WeightFile
// ---------------------------------------------------------------------------

void WeightFile::Builder::Literal(absl::string_view bytes) {
  if (bytes.empty()) return;
  Segment segment;
  segment.offset = file_.size_;
  segment.length = bytes.size();
  segment.kind = Piece::Kind::kLiteral;
  segment.from = file_.literals_.size();
  file_.literals_.append(bytes.data(), bytes.size());
  file_.segments_.push_back(segment);
  file_.size_ += bytes.size();
}

void WeightFile::Builder::Zeros(uint64_t length) {
  if (length == 0) return;
  Segment segment;
  segment.offset = file_.size_;
  segment.length = length;
  segment.kind = Piece::Kind::kZeros;
  file_.segments_.push_back(segment);
  file_.size_ += length;
}

void WeightFile::Builder::Source(uint64_t source_offset, uint64_t length) {
  if (length == 0) return;
  Segment segment;
  segment.offset = file_.size_;
  segment.length = length;
  segment.kind = Piece::Kind::kSource;
  segment.from = source_offset;
  file_.segments_.push_back(segment);
  file_.size_ += length;
}

absl::Status WeightFile::ForEachPiece(
    uint64_t offset, uint64_t length,
    const std::function<absl::Status(const Piece&)>& visit) const {
  if (offset > size_ || length > size_ - offset) {
    return absl::OutOfRangeError(absl::StrCat(
        "bytes [", offset, ", ", offset + length, ") pass the end of the ",
        size_, "-byte file"));
  }
  const uint64_t end = offset + length;
  // The first segment that ends after `offset`.
  auto it = std::upper_bound(
      segments_.begin(), segments_.end(), offset,
      [](uint64_t at, const Segment& s) { return at < s.offset + s.length; });
  for (; offset < end && it != segments_.end(); ++it) {
    const Segment& s = *it;
    const uint64_t from = std::max(offset, s.offset);
    const uint64_t to = std::min(end, s.offset + s.length);
    if (from >= to) continue;
    const uint64_t skip = from - s.offset;
    switch (s.kind) {
      case Piece::Kind::kLiteral: {
        Piece piece;
        piece.kind = Piece::Kind::kLiteral;
        piece.data = literals_.data() + s.from + skip;
        piece.length = to - from;
        absl::Status status = visit(piece);
        if (!status.ok()) return status;
        break;
      }
      case Piece::Kind::kZeros: {
        for (uint64_t at = from; at < to; at += kZeroPageBytes) {
          Piece piece;
          piece.kind = Piece::Kind::kZeros;
          piece.data = kZeroPage;
          piece.length = std::min<uint64_t>(kZeroPageBytes, to - at);
          absl::Status status = visit(piece);
          if (!status.ok()) return status;
        }
        break;
      }
      case Piece::Kind::kSource: {
        Piece piece;
        piece.kind = Piece::Kind::kSource;
        piece.source_offset = s.from + skip;
        piece.length = to - from;
        absl::Status status = visit(piece);
        if (!status.ok()) return status;
        break;
      }
    }
    offset = to;
  }
  return absl::OkStatus();
}

absl::Status WeightFile::Read(uint64_t offset, uint64_t length,
                              const SourceReader& reader,
                              std::string* out) const {
  if (offset > size_ || length > size_ - offset) {
    return absl::OutOfRangeError(absl::StrCat(
        "bytes [", offset, ", ", offset + length, ") pass the end of the ",
        size_, "-byte file"));
  }
  out->reserve(out->size() + length);
  return ForEachPiece(offset, length, [&](const Piece& piece) {
    if (piece.kind != Piece::Kind::kSource) {
      out->append(piece.data, piece.length);
      return absl::OkStatus();
    }
    const size_t at = out->size();
    out->resize(at + piece.length);
    return reader(piece.source_offset, piece.length, out->data() + at);
  });
}

// ---------------------------------------------------------------------------
// Formats
// ---------------------------------------------------------------------------

WeightFile BuildSafetensorsWeightFile(
    const std::vector<SourceTensor>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  // SafetensorsFile orders the tensors; `source_offset` carries the input
  // index through the sort.
  std::vector<FileTensor> plain;
  plain.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    FileTensor t = tensors[i];
    t.source_offset = i;
    plain.push_back(std::move(t));
  }
  const SafetensorsFile st = SafetensorsFile::Build(std::move(plain), metadata);
  WeightFile::Builder builder(v1::WEIGHT_FORMAT_SAFETENSORS);
  builder.Literal(st.header());
  for (size_t k = 0; k < st.tensors().size(); ++k) {
    const FileTensor& t = st.tensors()[k];
    const size_t input = static_cast<size_t>(t.source_offset);
    FileRange range;
    range.name = t.name;
    range.dtype = t.dtype;
    range.shape = t.shape;
    range.offset = builder.size();
    range.nbytes = t.nbytes;
    range.input = input;
    builder.AddRange(std::move(range));
    builder.Source(tensors[input].source_offset, t.nbytes);
  }
  return std::move(builder).Build();
}

WeightFile BuildRawWeightFile(const std::vector<SourceTensor>& tensors) {
  WeightFile::Builder builder(v1::WEIGHT_FORMAT_RAW);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SourceTensor& t = tensors[i];
    builder.Zeros(AlignUp(builder.size(), kFileAlignment) - builder.size());
    FileRange range;
    range.name = t.name;
    range.dtype = t.dtype;
    range.shape = t.shape;
    range.offset = builder.size();
    range.nbytes = t.nbytes;
    range.input = i;
    builder.AddRange(std::move(range));
    builder.Source(t.source_offset, t.nbytes);
  }
  return std::move(builder).Build();
}

WeightFile BuildTorchWeightFile(const std::vector<SourceTensor>& tensors) {
  // Storages: one per tensor, or per group of tied tensors, numbered in
  // order of first appearance.
  std::map<int64_t, size_t> storage_of_group;
  std::vector<size_t> storage_of(tensors.size());
  std::vector<size_t> storages;  // input index of each storage's tensor
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t group = tensors[i].group;
    if (group >= 0) {
      auto [it, inserted] = storage_of_group.emplace(group, storages.size());
      if (inserted) storages.push_back(i);
      storage_of[i] = it->second;
    } else {
      storage_of[i] = storages.size();
      storages.push_back(i);
    }
  }

  // data.pkl: OrderedDict(name -> _rebuild_tensor_v2(storage, 0, size,
  // stride, False, OrderedDict())), storages as persistent ids
  // ('storage', type, key, 'cpu', numel), as torch.save writes it.
  Pickle pickle;
  pickle.Global("collections", "OrderedDict");
  pickle.EmptyTuple();
  pickle.Reduce();
  pickle.Mark();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SourceTensor& t = tensors[i];
    const char* storage_class = TorchStorageClass(t.dtype);
    const uint32_t itemsize = spec::ItemSize(t.dtype);
    pickle.String(t.name);
    pickle.Global("torch._utils", storage_class != nullptr
                                      ? "_rebuild_tensor_v2"
                                      : "_rebuild_tensor_v3");
    pickle.Mark();
    pickle.Mark();
    pickle.String("storage");
    if (storage_class != nullptr) {
      pickle.Global("torch", storage_class);
    } else {
      pickle.Global("torch.storage", "UntypedStorage");
    }
    pickle.String(absl::StrCat(storage_of[i]));
    pickle.String("cpu");
    // Typed storages count elements; an untyped one counts bytes.
    const uint64_t storage_bytes = tensors[storages[storage_of[i]]].nbytes;
    pickle.Int(static_cast<int64_t>(
        storage_class != nullptr ? storage_bytes / itemsize : storage_bytes));
    pickle.Tuple();
    pickle.BinPersId();
    pickle.Int(0);  // storage offset
    pickle.IntTuple(t.shape);
    pickle.IntTuple(ContiguousStrides(t.shape));
    pickle.False();  // requires_grad
    pickle.Global("collections", "OrderedDict");
    pickle.EmptyTuple();
    pickle.Reduce();  // backward hooks
    if (storage_class == nullptr) {
      pickle.Global("torch", spec::Name(t.dtype));
    }
    pickle.Tuple();
    pickle.Reduce();
  }
  pickle.SetItems();
  pickle.Stop();

  std::vector<ZipEntry> entries;
  auto literal_entry = [&](std::string name, std::string contents) {
    ZipEntry entry;
    entry.name = absl::StrCat("archive/", name);
    entry.size = contents.size();
    entry.crc32 = Crc32(contents.data(), contents.size());
    entry.literal = std::move(contents);
    entries.push_back(std::move(entry));
  };
  literal_entry("data.pkl", pickle.Take());
  literal_entry(".format_version", "1");
  literal_entry(".storage_alignment", absl::StrCat(kFileAlignment));
  literal_entry("byteorder", "little");
  for (size_t s = 0; s < storages.size(); ++s) {
    const SourceTensor& root = tensors[storages[s]];
    ZipEntry entry;
    entry.name = absl::StrCat("archive/data/", s);
    entry.from_source = true;
    entry.source_offset = root.source_offset;
    entry.size = root.nbytes;
    entry.crc32 = root.crc32;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (storage_of[i] != s) continue;
      FileRange range;
      range.name = tensors[i].name;
      range.dtype = tensors[i].dtype;
      range.shape = tensors[i].shape;
      range.nbytes = tensors[i].nbytes;
      range.input = i;
      entry.ranges.push_back(std::move(range));
    }
    entries.push_back(std::move(entry));
  }
  literal_entry("version", "3\n");

  WeightFile::Builder builder(v1::WEIGHT_FORMAT_TORCH);
  std::vector<FileRange> ranges;
  for (ZipEntry& entry : entries) {
    entry.header_offset = builder.size();
    builder.Literal(LocalHeader(entry, entry.header_offset));
    if (entry.from_source) {
      for (FileRange& range : entry.ranges) {
        range.offset = builder.size();
        ranges.push_back(std::move(range));
      }
      builder.Source(entry.source_offset, entry.size);
    } else {
      builder.Literal(entry.literal);
    }
  }
  const uint64_t cd_offset = builder.size();
  std::string central;
  for (const ZipEntry& entry : entries) central += CentralHeader(entry);
  builder.Literal(central);
  builder.Literal(EndRecords(entries.size(), cd_offset, central.size()));
  // File order; tied tensors (one storage) in state_dict order.
  std::stable_sort(ranges.begin(), ranges.end(),
                   [](const FileRange& a, const FileRange& b) {
                     return a.offset < b.offset;
                   });
  for (FileRange& range : ranges) builder.AddRange(std::move(range));
  return std::move(builder).Build();
}

absl::StatusOr<WeightFile> BuildWeightFile(
    v1::WeightFormat format, const std::vector<SourceTensor>& tensors,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  switch (format) {
    case v1::WEIGHT_FORMAT_UNSPECIFIED:
    case v1::WEIGHT_FORMAT_SAFETENSORS:
      return BuildSafetensorsWeightFile(tensors, metadata);
    case v1::WEIGHT_FORMAT_TORCH:
      return BuildTorchWeightFile(tensors);
    case v1::WEIGHT_FORMAT_RAW:
      return BuildRawWeightFile(tensors);
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "format: unknown format ", static_cast<int>(format),
          "; expected WEIGHT_FORMAT_SAFETENSORS, WEIGHT_FORMAT_TORCH or "
          "WEIGHT_FORMAT_RAW"));
  }
}

}  // namespace materializer::delivery
