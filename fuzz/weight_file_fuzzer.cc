// Fuzz target: the file writers of server/delivery (safetensors, the
// torch.save zip, raw) checked against readers written independently
// (fuzz/readers). The input describes a small handle: tensors with names
// the server accepts (quotes, backslashes and all), dtypes, shapes (zero
// sizes and 0-d included), ties, safetensors metadata; their bytes are a
// pattern in a fake arena.
//
// Properties, for each format:
//   - the whole file, any range of it, and the concatenated pieces of
//     ForEachPiece are the same bytes; the size is the announced size;
//   - the reader accepts the file, and finds every tensor with its name,
//     dtype, shape and bytes (the arena's bytes at its offset); tied tensors
//     share one storage in the torch format; the metadata reads back;
//   - every range the file reports (ranges()) holds the tensor's bytes.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "fuzz/check.h"
#include "fuzz/readers/pickle_reader.h"
#include "fuzz/readers/safetensors_reader.h"
#include "fuzz/readers/zip_reader.h"
#include "server/delivery/digest.h"
#include "server/delivery/weight_file.h"
#include "server/spec/dtype.h"
#include "server/spec/validate.h"

namespace materializer::fuzz {
namespace {

using delivery::SourceTensor;
using delivery::WeightFile;
using spec::DType;

constexpr int kNumDTypes = 12;
constexpr uint64_t kArenaAlignment = 256;

// Consumes the input a byte at a time; zeros once it runs out.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  bool empty() const { return pos_ >= size_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Printable ASCII without the space, which is what names may hold.
std::string Name(Input& in) {
  const int length = 1 + in.Byte() % 24;
  std::string name;
  for (int i = 0; i < length; ++i) {
    name.push_back(static_cast<char>(0x21 + in.Byte() % 94));
  }
  return name;
}

// Byte i of the fake arena.
char ArenaByte(uint64_t i) {
  return static_cast<char>((i * 131 + (i >> 8) * 7 + 3) & 0xff);
}

absl::Status ReadArena(uint64_t offset, uint64_t length, void* dst) {
  char* out = static_cast<char*>(dst);
  for (uint64_t i = 0; i < length; ++i) out[i] = ArenaByte(offset + i);
  return absl::OkStatus();
}

std::string ArenaBytes(uint64_t offset, uint64_t length) {
  std::string out(length, '\0');
  ReadArena(offset, length, out.data()).IgnoreError();
  return out;
}

struct Handle {
  std::vector<SourceTensor> tensors;
  std::vector<std::pair<std::string, std::string>> metadata;
};

Handle MakeHandle(Input& in) {
  Handle handle;
  const int count = in.Byte() % 9;
  std::set<std::string> names;
  std::map<int64_t, size_t> root_of_group;
  uint64_t arena_end = 0;
  for (int i = 0; i < count; ++i) {
    SourceTensor t;
    t.name = Name(in);
    t.dtype = static_cast<DType>(in.Byte() % kNumDTypes);
    const int rank = in.Byte() % 5;
    for (int d = 0; d < rank; ++d) t.shape.push_back(in.Byte() % 7);
    const uint8_t tie = in.Byte() % 4;
    if (!spec::NameProblem(t.name).empty() || !names.insert(t.name).second) {
      continue;  // the server never holds such a tensor
    }
    t.group = static_cast<int64_t>(handle.tensors.size());
    if (tie >= 2) {
      // Tied to the first tensor of tie group `tie`: same storage, shape
      // and dtype, as the server's ties are.
      auto [it, first] = root_of_group.emplace(tie, handle.tensors.size());
      if (!first) {
        const SourceTensor& root = handle.tensors[it->second];
        t.dtype = root.dtype;
        t.shape = root.shape;
        t.group = root.group;
        t.nbytes = root.nbytes;
        t.source_offset = root.source_offset;
        t.crc32 = root.crc32;
        handle.tensors.push_back(std::move(t));
        continue;
      }
    }
    uint64_t numel = 1;
    for (int64_t s : t.shape) numel *= static_cast<uint64_t>(s);
    t.nbytes = numel * spec::ItemSize(t.dtype);
    t.source_offset = arena_end;
    arena_end = (arena_end + t.nbytes + kArenaAlignment - 1) /
                kArenaAlignment * kArenaAlignment;
    const std::string bytes = ArenaBytes(t.source_offset, t.nbytes);
    t.crc32 = delivery::Crc32(bytes.data(), bytes.size());
    handle.tensors.push_back(std::move(t));
  }
  const int pairs = in.Byte() % 3;
  std::set<std::string> keys;
  for (int i = 0; i < pairs; ++i) {
    std::string key = Name(in);
    std::string value = Name(in);
    if (keys.insert(key).second) handle.metadata.emplace_back(key, value);
  }
  return handle;
}

std::string Describe(const SourceTensor& t) {
  return absl::StrCat("\"", t.name, "\" ", spec::Name(t.dtype), " [",
                      absl::StrJoin(t.shape, ","), "]");
}

// The file as one string three ways, which must agree.
std::string WholeFile(const WeightFile& file, Input& in) {
  std::string whole;
  const absl::Status read = file.Read(0, file.size(), ReadArena, &whole);
  FUZZ_CHECK(read.ok()) << read;
  FUZZ_CHECK(whole.size() == file.size())
      << "read " << whole.size() << " bytes of a " << file.size()
      << "-byte file";
  std::string pieces;
  const absl::Status visited = file.ForEachPiece(
      0, file.size(), [&](const delivery::Piece& piece) {
        if (piece.kind == delivery::Piece::Kind::kSource) {
          pieces += ArenaBytes(piece.source_offset, piece.length);
        } else {
          if (piece.kind == delivery::Piece::Kind::kZeros) {
            FUZZ_CHECK(std::all_of(piece.data, piece.data + piece.length,
                                   [](char c) { return c == 0; }))
                << "a zero piece holds non-zero bytes";
          }
          pieces.append(piece.data, piece.length);
        }
        return absl::OkStatus();
      });
  FUZZ_CHECK(visited.ok()) << visited;
  FUZZ_CHECK(pieces == whole) << "ForEachPiece and Read disagree";
  // A few ranges, as a resumed fetch reads them.
  for (int i = 0; i < 4; ++i) {
    const uint64_t offset =
        file.size() == 0 ? 0 : (in.Byte() * 257u + in.Byte()) % (file.size() + 1);
    const uint64_t length = (in.Byte() * 131u) % (file.size() - offset + 1);
    std::string part;
    const absl::Status status = file.Read(offset, length, ReadArena, &part);
    FUZZ_CHECK(status.ok()) << status;
    FUZZ_CHECK(part == whole.substr(offset, length))
        << "bytes [" << offset << ", +" << length << ") differ from the "
        << "same slice of the whole file";
  }
  std::string none;
  FUZZ_CHECK(!file.Read(file.size(), 1, ReadArena, &none).ok())
      << "a read past the end succeeded";
  return whole;
}

// Every reported range holds its tensor's bytes.
void CheckRanges(const WeightFile& file, const std::string& whole,
                 const Handle& handle) {
  for (const delivery::FileRange& range : file.ranges()) {
    FUZZ_CHECK(range.input < handle.tensors.size());
    const SourceTensor& t = handle.tensors[range.input];
    FUZZ_CHECK(range.name == t.name && range.dtype == t.dtype &&
               range.shape == t.shape && range.nbytes == t.nbytes)
        << "range of " << range.name << " describes another tensor than "
        << Describe(t);
    FUZZ_CHECK(range.offset <= whole.size() &&
               range.nbytes <= whole.size() - range.offset)
        << "range of " << t.name << " passes the end";
    FUZZ_CHECK(whole.substr(range.offset, range.nbytes) ==
               ArenaBytes(t.source_offset, t.nbytes))
        << "range of " << Describe(t) << " holds other bytes";
  }
}

void CheckSafetensors(const Handle& handle, Input& in) {
  const WeightFile file =
      delivery::BuildSafetensorsWeightFile(handle.tensors, handle.metadata);
  const std::string whole = WholeFile(file, in);
  CheckRanges(file, whole, handle);
  FUZZ_CHECK(file.ranges().size() == handle.tensors.size());
  absl::StatusOr<SafetensorsContents> contents = ReadSafetensors(whole);
  FUZZ_CHECK(contents.ok()) << "the reader refuses the file: "
                            << contents.status();
  FUZZ_CHECK(contents->data_start % 8 == 0)
      << "header of " << contents->data_start << " bytes is not 8-aligned";
  std::vector<std::pair<std::string, std::string>> metadata = handle.metadata;
  std::sort(metadata.begin(), metadata.end());
  FUZZ_CHECK(contents->metadata == metadata) << "metadata differs";
  FUZZ_CHECK(contents->tensors.size() == handle.tensors.size())
      << contents->tensors.size() << " tensors read, "
      << handle.tensors.size() << " written";
  for (const SourceTensor& t : handle.tensors) {
    auto it = std::find_if(contents->tensors.begin(), contents->tensors.end(),
                           [&](const SafetensorsEntry& e) {
                             return e.name == t.name;
                           });
    FUZZ_CHECK(it != contents->tensors.end()) << Describe(t) << " is missing";
    FUZZ_CHECK(it->dtype == spec::Info(t.dtype).safetensors_name)
        << Describe(t) << " read as " << it->dtype;
    FUZZ_CHECK(std::equal(it->shape.begin(), it->shape.end(), t.shape.begin(),
                          t.shape.end(),
                          [](uint64_t a, int64_t b) {
                            return a == static_cast<uint64_t>(b);
                          }))
        << Describe(t) << " read with another shape";
    FUZZ_CHECK(whole.substr(contents->data_start + it->begin,
                            it->end - it->begin) ==
               ArenaBytes(t.source_offset, t.nbytes))
        << Describe(t) << " reads back other bytes";
    // Naturally aligned in the file (the format's promise to mmap users).
    FUZZ_CHECK((contents->data_start + it->begin) % spec::ItemSize(t.dtype) ==
               0)
        << Describe(t) << " is not aligned to its element size";
  }
}

void CheckTorch(const Handle& handle, Input& in) {
  const WeightFile file = delivery::BuildTorchWeightFile(handle.tensors);
  const std::string whole = WholeFile(file, in);
  CheckRanges(file, whole, handle);
  absl::StatusOr<std::vector<ZipEntryView>> entries = ReadZip(whole);
  FUZZ_CHECK(entries.ok()) << "the zip reader refuses the file: "
                           << entries.status();
  std::map<std::string, const ZipEntryView*> by_name;
  for (const ZipEntryView& e : *entries) {
    FUZZ_CHECK(e.data_offset % delivery::kFileAlignment == 0)
        << "entry " << e.name << " data at " << e.data_offset;
    by_name[e.name] = &e;
  }
  auto contents = [&](const std::string& name) {
    auto it = by_name.find(name);
    FUZZ_CHECK(it != by_name.end()) << "no entry " << name;
    return whole.substr(it->second->data_offset, it->second->size);
  };
  FUZZ_CHECK(contents("archive/byteorder") == "little");
  FUZZ_CHECK(contents("archive/version") == "3\n");
  absl::StatusOr<std::vector<PickledTensor>> pickled =
      ReadStateDictPickle(contents("archive/data.pkl"));
  FUZZ_CHECK(pickled.ok()) << "the pickle reader refuses data.pkl: "
                           << pickled.status();
  FUZZ_CHECK(pickled->size() == handle.tensors.size())
      << pickled->size() << " tensors in data.pkl, "
      << handle.tensors.size() << " written";
  std::map<int64_t, std::string> key_of_group;
  std::set<std::string> keys;
  for (size_t i = 0; i < handle.tensors.size(); ++i) {
    const SourceTensor& t = handle.tensors[i];
    const PickledTensor& p = (*pickled)[i];
    FUZZ_CHECK(p.name == t.name) << "entry " << i << " is \"" << p.name
                                 << "\", expected " << Describe(t);
    FUZZ_CHECK(p.location == "cpu" && p.storage_offset == 0 &&
               !p.requires_grad)
        << Describe(t);
    FUZZ_CHECK(p.shape == t.shape) << Describe(t) << " pickled with another shape";
    // Contiguous strides (a size-0 dimension counts as 1).
    int64_t stride = 1;
    for (size_t d = t.shape.size(); d-- > 0;) {
      FUZZ_CHECK(p.stride.size() == t.shape.size() && p.stride[d] == stride)
          << Describe(t) << " has non-contiguous strides";
      stride *= std::max<int64_t>(t.shape[d], 1);
    }
    const bool float8 =
        t.dtype == DType::kFloat8E4M3FN || t.dtype == DType::kFloat8E5M2;
    if (float8) {
      FUZZ_CHECK(p.rebuild == "_rebuild_tensor_v3" &&
                 p.storage_class == "torch.storage.UntypedStorage" &&
                 p.dtype == absl::StrCat("torch.", spec::Name(t.dtype)) &&
                 p.storage_size == static_cast<int64_t>(t.nbytes))
          << Describe(t) << " pickled as " << p.rebuild << " "
          << p.storage_class << " " << p.dtype;
    } else {
      FUZZ_CHECK(p.rebuild == "_rebuild_tensor_v2" &&
                 p.storage_size * spec::ItemSize(t.dtype) ==
                     static_cast<int64_t>(t.nbytes))
          << Describe(t) << " pickled as " << p.rebuild << " storage of "
          << p.storage_size;
    }
    // One storage per tie group; its entry holds the root's bytes.
    auto [it, first] = key_of_group.emplace(t.group, p.storage_key);
    FUZZ_CHECK(it->second == p.storage_key)
        << Describe(t) << " does not share its tie group's storage";
    if (first) {
      FUZZ_CHECK(keys.insert(p.storage_key).second)
          << "two tie groups share storage " << p.storage_key;
    }
    FUZZ_CHECK(contents("archive/data/" + p.storage_key) ==
               ArenaBytes(t.source_offset, t.nbytes))
        << Describe(t) << ": storage " << p.storage_key
        << " holds other bytes";
  }
}

void CheckRaw(const Handle& handle, Input& in) {
  const WeightFile file = delivery::BuildRawWeightFile(handle.tensors);
  const std::string whole = WholeFile(file, in);
  CheckRanges(file, whole, handle);
  FUZZ_CHECK(file.ranges().size() == handle.tensors.size());
  uint64_t end = 0;
  for (const delivery::FileRange& range : file.ranges()) {
    FUZZ_CHECK(range.offset % delivery::kFileAlignment == 0 &&
               range.offset >= end &&
               range.offset - end < delivery::kFileAlignment)
        << range.name << " at " << range.offset << " after " << end;
    FUZZ_CHECK(whole.substr(end, range.offset - end) ==
               std::string(range.offset - end, '\0'))
        << "padding before " << range.name << " is not zeros";
    end = range.offset + range.nbytes;
  }
  FUZZ_CHECK(end == whole.size()) << "bytes after the last tensor";
}

}  // namespace
}  // namespace materializer::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace materializer::fuzz;
  Input in(data, size);
  const Handle handle = MakeHandle(in);
  CheckSafetensors(handle, in);
  CheckTorch(handle, in);
  CheckRaw(handle, in);
  return 0;
}
