#include "server/checkpoint/torch_archive.h"

#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/checkpoint/pickle.h"
#include "server/checkpoint/zip.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"
#include "server/spec/dtype.h"

namespace materializer::checkpoint {
namespace {

using spec::DType;

constexpr uint64_t kMaxBytes = uint64_t{std::numeric_limits<int64_t>::max()};
constexpr absl::string_view kUntypedStorage = "torch.storage.UntypedStorage";

// The typed storage classes torch.save pickles for the dtypes the service
// holds.
std::optional<DType> DTypeOfStorageClass(absl::string_view name) {
  static constexpr std::pair<absl::string_view, DType> kClasses[] = {
      {"torch.FloatStorage", DType::kFloat32},
      {"torch.DoubleStorage", DType::kFloat64},
      {"torch.HalfStorage", DType::kFloat16},
      {"torch.BFloat16Storage", DType::kBFloat16},
      {"torch.CharStorage", DType::kInt8},
      {"torch.ShortStorage", DType::kInt16},
      {"torch.IntStorage", DType::kInt32},
      {"torch.LongStorage", DType::kInt64},
      {"torch.ByteStorage", DType::kUInt8},
      {"torch.BoolStorage", DType::kBool},
      {"torch.ComplexFloatStorage", DType::kComplex64},
  };
  for (const auto& [class_name, dtype] : kClasses) {
    if (name == class_name) return dtype;
  }
  return std::nullopt;
}

struct Storage {
  uint64_t offset = 0;  // of its data in the file
  uint64_t size = 0;    // bytes
  uint32_t crc32 = 0;   // the zip entry's
};

class ArchiveReader {
 public:
  ArchiveReader(const RandomAccessFile& file, absl::string_view label)
      : file_(file), label_(label) {}

  absl::StatusOr<std::vector<CheckpointTensor>> Read() {
    absl::StatusOr<ZipDirectory> directory = ReadZipDirectory(file_, label_);
    if (!directory.ok()) return NotAZip(directory.status());
    directory_ = *std::move(directory);
    if (directory_.entries.empty()) {
      return Invalid("an empty zip archive, not a torch.save archive");
    }
    const std::string& first = directory_.entries[0].name;
    const size_t slash = first.find('/');
    if (slash == std::string::npos) {
      return Invalid(absl::StrCat("not a torch.save archive: its first entry ",
                                  Quote(first), " is not in a folder"));
    }
    prefix_ = first.substr(0, slash + 1);
    for (const ZipEntry& entry : directory_.entries) {
      by_name_.emplace(entry.name, &entry);
    }
    RETURN_IF_ERROR(CheckByteOrder());
    ASSIGN_OR_RETURN(const std::string pickle, ReadPickle());
    absl::StatusOr<std::vector<PickledTensor>> pickled =
        ReadStateDictPickle(pickle);
    if (!pickled.ok()) {
      return Invalid(absl::StrCat(prefix_, pickled.status().message()));
    }
    std::vector<CheckpointTensor> out;
    out.reserve(pickled->size());
    for (const PickledTensor& p : *pickled) {
      ASSIGN_OR_RETURN(CheckpointTensor tensor, Locate(p));
      out.push_back(std::move(tensor));
    }
    return out;
  }

 private:
  absl::Status Invalid(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(label_, ": ", what));
  }

  absl::Status TensorError(const PickledTensor& t,
                           absl::string_view what) const {
    return Invalid(absl::StrCat("tensor ", Quote(t.name), ": ", what));
  }

  // A zip error, with a hint for the legacy format (a bare pickle).
  absl::Status NotAZip(const absl::Status& status) const {
    if (!absl::IsInvalidArgument(status)) return status;
    if (file_.size() >= 2) {
      char magic[2];
      if (file_.ReadAt(0, 2, magic).ok() &&
          static_cast<unsigned char>(magic[0]) == 0x80) {
        return Invalid(
            "a pickle, not a zip archive: the legacy torch.save format "
            "(before PyTorch 1.6, or _use_new_zipfile_serialization=False), "
            "which is not read; save it again with a current torch.save, or "
            "as safetensors");
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(
        status.message(), " (not a torch.save archive)"));
  }

  const ZipEntry* Find(absl::string_view name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : it->second;
  }

  absl::StatusOr<std::string> ReadEntry(const ZipEntry& entry) const {
    ASSIGN_OR_RETURN(const uint64_t offset,
                     ZipEntryDataOffset(file_, directory_, entry, label_));
    ASSIGN_OR_RETURN(std::string bytes, ReadBytes(file_, offset, entry.size));
    if (ZipCrc32(bytes) != entry.crc32) {
      return Invalid(absl::StrCat("zip entry ", Quote(entry.name),
                                  " fails its CRC check (a damaged file)"));
    }
    return bytes;
  }

  absl::Status CheckByteOrder() const {
    const ZipEntry* entry = Find(absl::StrCat(prefix_, "byteorder"));
    if (entry == nullptr) return absl::OkStatus();  // as torch.load: little
    if (entry->size > 16) return Invalid("a byteorder entry of over 16 bytes");
    ASSIGN_OR_RETURN(const std::string order, ReadEntry(*entry));
    if (order == "little") return absl::OkStatus();
    if (order == "big") {
      return Invalid(
          "a big-endian archive (byteorder \"big\"); the server reads "
          "little-endian tensors only: save it again on a little-endian "
          "machine, or as safetensors");
    }
    return Invalid(absl::StrCat("unknown byteorder ", Quote(order)));
  }

  absl::StatusOr<std::string> ReadPickle() const {
    const ZipEntry* entry = Find(absl::StrCat(prefix_, "data.pkl"));
    if (entry == nullptr) {
      if (Find(absl::StrCat(prefix_, "constants.pkl")) != nullptr) {
        return Invalid(
            "a TorchScript archive (torch.jit.save), not a torch.save "
            "state_dict");
      }
      return Invalid(absl::StrCat("no ", Quote(absl::StrCat(prefix_, "data.pkl")),
                                  " (not a torch.save archive)"));
    }
    if (entry->size > kMaxTorchPickleBytes) {
      return Invalid(absl::StrCat("data.pkl of ", entry->size,
                                  " bytes is larger than the limit of ",
                                  kMaxTorchPickleBytes, " bytes"));
    }
    return ReadEntry(*entry);
  }

  absl::StatusOr<Storage> FindStorage(const PickledTensor& t) {
    auto it = storages_.find(t.storage_key);
    if (it != storages_.end()) return it->second;
    const std::string name = absl::StrCat(prefix_, "data/", t.storage_key);
    const ZipEntry* entry = Find(name);
    if (entry == nullptr) {
      return TensorError(t, absl::StrCat("its storage ", Quote(name),
                                         " is not in the archive"));
    }
    Storage storage;
    ASSIGN_OR_RETURN(storage.offset,
                     ZipEntryDataOffset(file_, directory_, *entry, label_));
    storage.size = entry->size;
    storage.crc32 = entry->crc32;
    storages_.emplace(t.storage_key, storage);
    return storage;
  }

  absl::StatusOr<DType> TensorDType(const PickledTensor& t) const {
    if (t.rebuild == "_rebuild_tensor_v2") {
      const std::optional<DType> dtype = DTypeOfStorageClass(t.storage_class);
      if (!dtype.has_value()) {
        return TensorError(t, absl::StrCat("storage class ",
                                           Quote(t.storage_class),
                                           " is of a dtype the service does "
                                           "not hold (it holds ",
                                           spec::KnownDTypeNames(), ")"));
      }
      return *dtype;
    }
    const std::optional<DType> dtype = spec::ParseDType(t.dtype);
    if (!dtype.has_value() || !absl::StartsWith(t.dtype, "torch.")) {
      return TensorError(t, absl::StrCat("dtype ", Quote(t.dtype),
                                         " is one the service does not hold "
                                         "(it holds ",
                                         spec::KnownDTypeNames(), ")"));
    }
    return *dtype;
  }

  // Bytes per element of the storage's class.
  absl::StatusOr<uint64_t> StorageItemSize(const PickledTensor& t) const {
    if (t.storage_class == kUntypedStorage) return 1;
    const std::optional<DType> dtype = DTypeOfStorageClass(t.storage_class);
    if (!dtype.has_value()) {
      return TensorError(t, absl::StrCat("unknown storage class ",
                                         Quote(t.storage_class)));
    }
    return spec::ItemSize(*dtype);
  }

  absl::StatusOr<CheckpointTensor> Locate(const PickledTensor& t) {
    CheckpointTensor tensor;
    tensor.name = t.name;
    ASSIGN_OR_RETURN(tensor.dtype, TensorDType(t));
    const uint64_t itemsize = spec::ItemSize(tensor.dtype);
    if (t.shape.size() > kMaxCheckpointRank) {
      return TensorError(t, absl::StrCat("more than ", kMaxCheckpointRank,
                                         " dimensions"));
    }
    if (t.stride.size() != t.shape.size()) {
      return TensorError(t, "its stride and size have different lengths");
    }
    // Element count, and contiguity as torch defines it: row-major strides,
    // ignoring dimensions of size 1; any strides when there are no elements.
    unsigned __int128 numel = 1;
    for (int64_t size : t.shape) {
      if (size < 0) return TensorError(t, "a negative size");
      numel *= static_cast<uint64_t>(size);
      if (numel > kMaxBytes) numel = kMaxBytes + 1;
    }
    bool empty = false;
    for (int64_t size : t.shape) empty = empty || size == 0;
    if (empty) numel = 0;
    if (numel * itemsize > kMaxBytes) {
      return TensorError(t, "2^63 bytes or more");
    }
    if (numel > 0) {
      int64_t expected = 1;
      for (size_t d = t.shape.size(); d-- > 0;) {
        if (t.shape[d] != 1 && t.stride[d] != expected) {
          return TensorError(
              t, absl::StrCat("not contiguous (size [",
                              absl::StrJoin(t.shape, ", "), "], stride [",
                              absl::StrJoin(t.stride, ", "),
                              "]); save it after .contiguous()"));
        }
        expected *= t.shape[d];  // below 2^63: numel is
      }
    }
    tensor.shape = t.shape;
    tensor.nbytes = static_cast<uint64_t>(numel) * itemsize;

    ASSIGN_OR_RETURN(const uint64_t storage_itemsize, StorageItemSize(t));
    ASSIGN_OR_RETURN(const Storage storage, FindStorage(t));
    if (t.storage_size < 0 ||
        static_cast<unsigned __int128>(t.storage_size) * storage_itemsize !=
            storage.size) {
      return TensorError(t, absl::StrCat("its storage ", Quote(t.storage_key),
                                         " holds ", storage.size,
                                         " bytes, not the ", t.storage_size,
                                         " elements of ", storage_itemsize,
                                         " bytes its pickle says"));
    }
    if (t.storage_offset < 0) {
      return TensorError(t, "a negative storage offset");
    }
    const unsigned __int128 begin =
        static_cast<unsigned __int128>(t.storage_offset) * itemsize;
    if (begin + tensor.nbytes > storage.size) {
      return TensorError(
          t, absl::StrCat("its ", tensor.nbytes, " bytes at storage offset ",
                          t.storage_offset, " pass the end of its ",
                          storage.size, "-byte storage ",
                          Quote(t.storage_key)));
    }
    tensor.offset = storage.offset + static_cast<uint64_t>(begin);
    if (begin == 0 && tensor.nbytes == storage.size) {
      tensor.crc32 = storage.crc32;
    }
    return tensor;
  }

  const RandomAccessFile& file_;
  const absl::string_view label_;
  ZipDirectory directory_;
  // "<prefix>/": the folder every entry is in.
  std::string prefix_;
  absl::flat_hash_map<absl::string_view, const ZipEntry*> by_name_;
  absl::flat_hash_map<std::string, Storage> storages_;
};

}  // namespace

absl::StatusOr<std::vector<CheckpointTensor>> ReadTorchArchive(
    const RandomAccessFile& file, absl::string_view label) {
  return ArchiveReader(file, label).Read();
}

}  // namespace materializer::checkpoint
