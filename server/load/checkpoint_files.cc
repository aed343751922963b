#include "server/load/checkpoint_files.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/checkpoint/checkpoint_tensor.h"
#include "server/checkpoint/random_access_file.h"
#include "server/checkpoint/roots.h"
#include "server/checkpoint/safetensors_header.h"
#include "server/checkpoint/shard_index.h"
#include "server/checkpoint/torch_archive.h"
#include "server/common/status_macros.h"

namespace materializer::load {
namespace {

using checkpoint::CheckpointRoots;
using checkpoint::CheckpointTensor;
using checkpoint::OpenedFile;
using checkpoint::ResolvedPath;

constexpr char kIndexName[] = "model.safetensors.index.json";
constexpr char kSafetensorsName[] = "model.safetensors";
constexpr char kTorchName[] = "pytorch_model.bin";

// An opened, confined file as the cache reads it.
class OpenedSource : public FileSource {
 public:
  explicit OpenedSource(OpenedFile file) : file_(std::move(file)) {
    key_.device = file_.identity().dev;
    key_.inode = file_.identity().ino;
    key_.size = file_.identity().size;
    key_.mtime_ns = file_.identity().mtime_ns;
  }
  const FileKey& key() const override { return key_; }
  const std::string& label() const override { return file_.label(); }
  absl::Status ReadAt(uint64_t offset, uint64_t length,
                      void* dst) const override {
    return file_.file().ReadAt(offset, length, static_cast<char*>(dst));
  }
  absl::Status Check() const override { return file_.CheckUnchanged(); }
  const OpenedFile& opened() const { return file_; }

 private:
  OpenedFile file_;
  FileKey key_;
};

enum class Format { kSafetensors, kTorch };

// By name: *.safetensors, else a torch zip (pytorch_model.bin, *.pt).
Format FormatOf(absl::string_view name) {
  return absl::EndsWith(name, ".safetensors") ? Format::kSafetensors
                                              : Format::kTorch;
}

// Adds `file`'s tensors to `ckpt` (keys unique across files).
absl::Status AddFile(OpenedFile opened, Format format, Checkpoint* ckpt) {
  auto source = std::make_unique<OpenedSource>(std::move(opened));
  const OpenedFile& file = source->opened();
  std::vector<CheckpointTensor> tensors;
  if (format == Format::kSafetensors) {
    ASSIGN_OR_RETURN(tensors,
                     checkpoint::ReadSafetensorsTensors(file.file(), file.label()));
  } else {
    ASSIGN_OR_RETURN(tensors,
                     checkpoint::ReadTorchArchive(file.file(), file.label()));
  }
  const int index = static_cast<int>(ckpt->files.size());
  for (CheckpointTensor& t : tensors) {
    auto [it, inserted] = ckpt->entry_of_key.emplace(
        t.name, static_cast<int>(ckpt->entries.size()));
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          ckpt->path, ": tensor ", t.name, " is in both ",
          ckpt->files[ckpt->entries[it->second].file]->label(), " and ",
          file.label()));
    }
    CheckpointEntry entry;
    entry.key = std::move(t.name);
    entry.file = index;
    entry.dtype = t.dtype;
    entry.shape = std::move(t.shape);
    entry.offset = t.offset;
    entry.nbytes = t.nbytes;
    entry.crc32 = t.crc32;
    ckpt->entries.push_back(std::move(entry));
  }
  ckpt->files.push_back(std::move(source));
  ckpt->formats.push_back(format == Format::kSafetensors ? "safetensors"
                                                         : "torch");
  return absl::OkStatus();
}

// A sharded safetensors checkpoint: the index in `folder`, and each file it
// names there. Every tensor the index lists must be in the file it names.
absl::Status AddSharded(const CheckpointRoots& roots, const ResolvedPath& folder,
                        OpenedFile index_file, Checkpoint* ckpt) {
  ASSIGN_OR_RETURN(checkpoint::ShardIndex index,
                   checkpoint::ReadShardIndex(index_file.file(),
                                              index_file.label()));
  for (const std::string& name : index.files) {
    ASSIGN_OR_RETURN(OpenedFile file, roots.OpenFile(folder, name));
    RETURN_IF_ERROR(AddFile(std::move(file), Format::kSafetensors, ckpt));
  }
  for (const auto& [tensor, file] : index.weight_map) {
    auto it = ckpt->entry_of_key.find(tensor);
    const std::string& holder =
        it == ckpt->entry_of_key.end()
            ? std::string()
            : ckpt->files[ckpt->entries[it->second].file]->label();
    if (it == ckpt->entry_of_key.end() || !absl::EndsWith(holder, "/" + file)) {
      return absl::InvalidArgumentError(absl::StrCat(
          index_file.label(), ": tensor ", tensor, " is listed in ", file,
          it == ckpt->entry_of_key.end() ? ", which does not hold it"
                                         : absl::StrCat(", but is in ", holder)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Checkpoint>> RootsOpener::Open(
    const std::string& path, const std::string& identity) const {
  ASSIGN_OR_RETURN(ResolvedPath resolved, roots_->Resolve(path, identity));
  auto ckpt = std::make_shared<Checkpoint>();
  ckpt->path = path;
  if (!resolved.is_directory) {
    ASSIGN_OR_RETURN(OpenedFile file, roots_->OpenFile(resolved, ""));
    if (absl::EndsWith(path, ".index.json")) {
      // The index names files beside it.
      const std::string folder_path = path.substr(0, path.rfind('/'));
      ASSIGN_OR_RETURN(ResolvedPath folder,
                       roots_->Resolve(folder_path, identity));
      RETURN_IF_ERROR(AddSharded(*roots_, folder, std::move(file), ckpt.get()));
    } else {
      RETURN_IF_ERROR(AddFile(std::move(file), FormatOf(path), ckpt.get()));
    }
    return ckpt;
  }
  // A folder, as save_pretrained writes one; its config.json rides along
  // for clients that build the model from it.
  absl::StatusOr<OpenedFile> config = roots_->OpenFile(resolved, "config.json");
  if (config.ok() && config->size() <= kMaxConfigBytes) {
    ASSIGN_OR_RETURN(ckpt->config_json,
                     checkpoint::ReadBytes(config->file(), 0, config->size()));
  } else if (!config.ok() && !absl::IsNotFound(config.status())) {
    return config.status();
  }
  absl::StatusOr<OpenedFile> index = roots_->OpenFile(resolved, kIndexName);
  if (index.ok()) {
    RETURN_IF_ERROR(AddSharded(*roots_, resolved, std::move(*index), ckpt.get()));
    return ckpt;
  }
  if (!absl::IsNotFound(index.status())) return index.status();
  for (const char* name : {kSafetensorsName, kTorchName}) {
    absl::StatusOr<OpenedFile> file = roots_->OpenFile(resolved, name);
    if (file.ok()) {
      RETURN_IF_ERROR(AddFile(std::move(*file), FormatOf(name), ckpt.get()));
      return ckpt;
    }
    if (!absl::IsNotFound(file.status())) return file.status();
  }
  return absl::NotFoundError(absl::StrCat(
      "checkpoint.path: ", path, " is a folder holding none of ", kIndexName,
      ", ", kSafetensorsName, ", ", kTorchName));
}

}  // namespace materializer::load
