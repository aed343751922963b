#ifndef MATERIALIZER_SERVER_CHECKPOINT_ROOTS_H_
#define MATERIALIZER_SERVER_CHECKPOINT_ROOTS_H_

// The folders the server may read checkpoints from (--checkpoint_roots),
// who may read which (--checkpoint_readers), and the confinement of every
// path a request names to its root.
//
//   ASSIGN_OR_RETURN(CheckpointRoots roots, CheckpointRoots::Create(
//       "models=/data/models,scratch=/srv/scratch", "scratch=alice|bob;models=*"));
//   ASSIGN_OR_RETURN(ResolvedPath dir, roots.Resolve("models/llama", caller));
//   ASSIGN_OR_RETURN(OpenedFile index,
//                    roots.OpenFile(dir, "model.safetensors.index.json"));
//   ... read index.file() ...
//   RETURN_IF_ERROR(index.CheckUnchanged());  // after the bytes are read
//
// A request path is "NAME/rel/path": the root's name, then a path inside
// it. It is refused (INVALID_ARGUMENT naming `checkpoint.path` and the
// reason) when it is empty, absolute, longer than kMaxRequestPathBytes,
// holds a NUL byte, an empty component ("a//b", a trailing '/'), "." or
// "..", or names no root. Symbolic links are resolved: the result must be
// inside the root's own resolved path (a link within the root is fine; one
// leading out of it is PERMISSION_DENIED), and a regular file or a
// folder. A missing file is NOT_FOUND; an identity that may not read the
// root is PERMISSION_DENIED (checked before the file system is looked at,
// so it learns nothing about the root's contents). Messages name the
// request path ("models/llama/x"), never the host path.
//
// Opening re-checks what Resolve found: the file is opened without
// following a final link, must be a regular file with the same device and
// inode, and (where /proc is mounted) the opened descriptor's own path
// must still be inside the root, so a swap between the check and the open
// is refused rather than followed.
//
// CheckpointRoots is immutable once created and thread-safe.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/checkpoint/random_access_file.h"

namespace materializer::checkpoint {

// Longest request path (PATH_MAX), and longest component (NAME_MAX).
inline constexpr size_t kMaxRequestPathBytes = 4096;
inline constexpr size_t kMaxPathComponentBytes = 255;

struct ResolvedPath {
  std::string root_name;
  // The resolved host path, inside the root. Never put it in a message.
  std::string absolute_path;
  bool is_directory = false;
  // The request path ("NAME/rel"), for messages.
  std::string label;
  // What stat(2) found at Resolve; OpenFile checks the opened file is it.
  dev_t dev = 0;
  ino_t ino = 0;
};

// What the server read against: a file's identity and version.
struct FileIdentity {
  uint64_t dev = 0;
  uint64_t ino = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
};

// FAILED_PRECONDITION "<label> changed on disk while being read" if the
// file open as `fd` no longer has the size and mtime of `identity`.
absl::Status CheckUnchanged(int fd, const FileIdentity& identity,
                            absl::string_view label);

// An open regular file (O_RDONLY | O_CLOEXEC), closed on destruction.
// Move-only. Reads through file() are thread-safe.
class OpenedFile {
 public:
  OpenedFile(int fd, FileIdentity identity, std::string label);
  ~OpenedFile();
  OpenedFile(OpenedFile&& other) noexcept;
  OpenedFile& operator=(OpenedFile&& other) noexcept;
  OpenedFile(const OpenedFile&) = delete;
  OpenedFile& operator=(const OpenedFile&) = delete;

  int fd() const { return fd_; }
  const FileIdentity& identity() const { return identity_; }
  uint64_t size() const { return identity_.size; }
  // "NAME/rel/file", for messages.
  const std::string& label() const { return label_; }
  // Positional reads of this file; valid while this object lives.
  const RandomAccessFile& file() const { return reader_; }

  // CheckUnchanged on this file.
  absl::Status CheckUnchanged() const;

 private:
  int fd_ = -1;
  FileIdentity identity_;
  std::string label_;
  FdFile reader_;
};

class CheckpointRoots {
 public:
  // `roots`: "NAME=PATH,NAME=PATH,..."; a bare "PATH" is named after its
  // last component. Names are unique and [A-Za-z0-9._-]+ (not "." or
  // ".."); paths are absolute and must be existing folders (stored
  // resolved). Empty: no roots (every Resolve fails).
  // `readers`: "NAME=ID|ID|...;NAME=*;..." naming every root; empty: every
  // identity may read every root.
  // INVALID_ARGUMENT naming the flag and the entry otherwise.
  static absl::StatusOr<CheckpointRoots> Create(absl::string_view roots,
                                                absl::string_view readers);

  bool empty() const { return roots_.empty(); }
  // The roots' names, in flag order.
  std::vector<std::string> names() const;

  // The file or folder `request_path` names, checked as the header says.
  absl::StatusOr<ResolvedPath> Resolve(absl::string_view request_path,
                                       absl::string_view identity) const;

  // Opens the file `path` resolved to (`name_in_dir` empty; INVALID_ARGUMENT
  // if it is a folder), or the file `name_in_dir` (a plain name: no '/',
  // not "." or "..") in the folder it resolved to, confined to the same
  // root. NOT_FOUND if missing; FAILED_PRECONDITION if the file changed
  // between Resolve and the open.
  absl::StatusOr<OpenedFile> OpenFile(const ResolvedPath& path,
                                      absl::string_view name_in_dir) const;

 private:
  struct Root {
    std::string name;
    std::string real_path;
    bool everyone = true;
    absl::flat_hash_set<std::string> readers;
  };

  const Root* FindRoot(absl::string_view name) const;
  bool Inside(const Root& root, absl::string_view real_path) const;
  // realpath + confinement + stat, for a host path under `root`.
  absl::StatusOr<ResolvedPath> ResolveHostPath(const Root& root,
                                               const std::string& host_path,
                                               std::string label) const;

  std::vector<Root> roots_;
};

}  // namespace materializer::checkpoint

#endif  // MATERIALIZER_SERVER_CHECKPOINT_ROOTS_H_
