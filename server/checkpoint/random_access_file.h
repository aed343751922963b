#ifndef MATERIALIZER_SERVER_CHECKPOINT_RANDOM_ACCESS_FILE_H_
#define MATERIALIZER_SERVER_CHECKPOINT_RANDOM_ACCESS_FILE_H_

// Positional reads of a file of known size: what the checkpoint readers
// need, so they read headers, directories and pickles without loading the
// file whole. FdFile preads an open file (production); StringFile reads
// bytes in memory (tests, fuzz targets).
//
//   FdFile file(opened.fd(), opened.identity().size, opened.label());
//   ASSIGN_OR_RETURN(std::string tail, ReadBytes(file, file.size() - 22, 22));

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace materializer::checkpoint {

// Thread-safe if the implementation's ReadAt is (both below are).
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;

  // The file's size, as it was when the file was opened.
  virtual uint64_t size() const = 0;

  // Reads exactly `length` bytes at `offset` into `dst`. OUT_OF_RANGE if
  // the range passes size(); FAILED_PRECONDITION if the file is shorter
  // than size() now (it changed on disk); the system's error otherwise.
  virtual absl::Status ReadAt(uint64_t offset, uint64_t length,
                              char* dst) const = 0;
};

// Bytes [offset, offset + length) of `file` as a string.
absl::StatusOr<std::string> ReadBytes(const RandomAccessFile& file,
                                      uint64_t offset, uint64_t length);

// pread(2) over a file descriptor it does not own, which must stay open
// while this object is used. `label` names the file in error messages
// (never a host path a client should not see).
class FdFile final : public RandomAccessFile {
 public:
  FdFile(int fd, uint64_t size, std::string label)
      : fd_(fd), size_(size), label_(std::move(label)) {}

  uint64_t size() const override { return size_; }
  absl::Status ReadAt(uint64_t offset, uint64_t length,
                      char* dst) const override;

 private:
  int fd_;
  uint64_t size_;
  std::string label_;
};

// Reads bytes it does not own, which must outlive it.
class StringFile final : public RandomAccessFile {
 public:
  explicit StringFile(absl::string_view bytes) : bytes_(bytes) {}

  uint64_t size() const override { return bytes_.size(); }
  absl::Status ReadAt(uint64_t offset, uint64_t length,
                      char* dst) const override;

 private:
  const absl::string_view bytes_;
};

}  // namespace materializer::checkpoint

#endif  // MATERIALIZER_SERVER_CHECKPOINT_RANDOM_ACCESS_FILE_H_
