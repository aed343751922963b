#ifndef MATERIALIZER_SERVER_CHECKPOINT_SHARD_INDEX_H_
#define MATERIALIZER_SERVER_CHECKPOINT_SHARD_INDEX_H_

// The index of a sharded checkpoint, as Hugging Face's save_pretrained
// writes it (model.safetensors.index.json; pytorch_model.bin.index.json
// has the same form):
//
//   {"metadata": {"total_size": 3000},
//    "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors",
//                   "model.embed_tokens.weight": "model-00001-of-...", ...}}
//
//   ASSIGN_OR_RETURN(ShardIndex index, ReadShardIndex(file, label));
//   for (const std::string& shard : index.files) ...  // in the index's folder
//
// Strict JSON (json.h). "weight_map" is required and maps each tensor name
// to a string; "metadata" and any other top-level member are checked as
// JSON and otherwise ignored. A file name must be a plain name in the
// index's own folder: not empty, no '/', no NUL, not "." or "..", at most
// 255 bytes. Every error is INVALID_ARGUMENT and starts with the label.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/checkpoint/random_access_file.h"

namespace materializer::checkpoint {

// The largest index file read (a 100,000-tensor model's index is ~10 MB).
inline constexpr uint64_t kMaxShardIndexBytes = uint64_t{64} << 20;

struct ShardIndex {
  // Tensor name -> file name.
  std::map<std::string, std::string> weight_map;
  // The distinct file names, sorted.
  std::vector<std::string> files;
};

absl::StatusOr<ShardIndex> ParseShardIndex(absl::string_view json,
                                           absl::string_view label);

// Reads all of `file` (at most kMaxShardIndexBytes) and parses it.
absl::StatusOr<ShardIndex> ReadShardIndex(const RandomAccessFile& file,
                                          absl::string_view label);

}  // namespace materializer::checkpoint

#endif  // MATERIALIZER_SERVER_CHECKPOINT_SHARD_INDEX_H_
