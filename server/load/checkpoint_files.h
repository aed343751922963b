#ifndef MATERIALIZER_SERVER_LOAD_CHECKPOINT_FILES_H_
#define MATERIALIZER_SERVER_LOAD_CHECKPOINT_FILES_H_

// An opened checkpoint: its files (open, identified, confined to a root)
// and every tensor they hold, by key. CheckpointOpener turns a request's
// path into one; RootsOpener is the server's (--checkpoint_roots, the
// readers of server/checkpoint), tests may use their own.
//
//   RootsOpener opener(&roots);
//   ASSIGN_OR_RETURN(std::shared_ptr<const Checkpoint> ckpt,
//                    opener.Open("models/gpt2", identity));
//
// A Checkpoint is immutable once opened and thread-safe to read; its files
// stay open while it lives.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "server/load/range_cache.h"
#include "server/spec/dtype.h"

namespace materializer::checkpoint {
class CheckpointRoots;
}  // namespace materializer::checkpoint

namespace materializer::load {

struct CheckpointEntry {
  std::string key;
  // Index into Checkpoint::files.
  int file = 0;
  spec::DType dtype = spec::DType::kFloat32;
  std::vector<int64_t> shape;
  // The tensor's bytes in its file (row-major, contiguous).
  uint64_t offset = 0;
  uint64_t nbytes = 0;
  // As CheckpointTensor::crc32.
  std::optional<uint32_t> crc32;
};

struct Checkpoint {
  // As the request named it ("ROOT/relative/path").
  std::string path;
  std::vector<std::unique_ptr<FileSource>> files;
  // Per file: "safetensors" or "torch".
  std::vector<std::string> formats;
  std::vector<CheckpointEntry> entries;
  absl::flat_hash_map<std::string, int> entry_of_key;
  // A folder's config.json (at most kMaxConfigBytes), else "".
  std::string config_json;
};

inline constexpr uint64_t kMaxConfigBytes = uint64_t{1} << 20;

class CheckpointOpener {
 public:
  virtual ~CheckpointOpener() = default;
  // The checkpoint at `path` as `identity` may read it: INVALID_ARGUMENT
  // (a malformed path or file), PERMISSION_DENIED, NOT_FOUND, each naming
  // the path as the request gave it (never the host's).
  virtual absl::StatusOr<std::shared_ptr<const Checkpoint>> Open(
      const std::string& path, const std::string& identity) const = 0;
};

// The server's opener: paths under --checkpoint_roots; a folder is read as
// model.safetensors.index.json (sharded), else model.safetensors, else
// pytorch_model.bin.
class RootsOpener : public CheckpointOpener {
 public:
  // `roots` is borrowed and outlives the opener.
  explicit RootsOpener(const checkpoint::CheckpointRoots* roots)
      : roots_(roots) {}
  absl::StatusOr<std::shared_ptr<const Checkpoint>> Open(
      const std::string& path, const std::string& identity) const override;

 private:
  const checkpoint::CheckpointRoots* roots_;
};

}  // namespace materializer::load

#endif  // MATERIALIZER_SERVER_LOAD_CHECKPOINT_FILES_H_
