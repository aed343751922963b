#ifndef MATERIALIZER_SERVER_SERVICE_PUBLISHED_FILE_H_
#define MATERIALIZER_SERVER_SERVICE_PUBLISHED_FILE_H_

// A file in memory under a fixed path, whose contents are replaced
// atomically: whoever opens path() reads either the old contents or the
// new, whole. The server hands gRPC's file-watching certificate provider
// these paths rather than the operator's files, so that gRPC only ever
// reads key material the server has checked (tls_files.h), and a
// certificate and its key, kept in one file, change together.
//
// Each version is an anonymous memory file (memfd); the path is
// /proc/self/fd/N, and Replace() moves a new version onto descriptor N
// with one dup3(2). Each version's modification time is at least a second
// later than the previous one's, so a reader that compares times before
// and after reading (as gRPC's provider does, to second precision) notices
// a replacement in between and reads again.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<PublishedFile> file,
//                    PublishedFile::Create("identity", key + cert));
//   provider(file->path(), ...);
//   RETURN_IF_ERROR(file->Replace(new_key + new_cert));
//
// Thread-safe. Linux only.

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace materializer::service {

class PublishedFile {
 public:
  // `name` shows in /proc/PID/fd listings ("memfd:<name>").
  static absl::StatusOr<std::unique_ptr<PublishedFile>> Create(
      absl::string_view name, absl::string_view contents);

  // Closes the descriptor: readers must be done with path() by then.
  ~PublishedFile();
  PublishedFile(const PublishedFile&) = delete;
  PublishedFile& operator=(const PublishedFile&) = delete;

  // "/proc/self/fd/N": meaningful inside this process only.
  const std::string& path() const { return path_; }

  // Makes `contents` what path() reads. Nothing changes on error.
  absl::Status Replace(absl::string_view contents);

 private:
  PublishedFile(std::string name, int fd, int64_t mtime);

  const std::string name_;
  const int fd_;
  const std::string path_;

  absl::Mutex mu_;
  // Guards the modification time (seconds since the epoch) of the version
  // in place, which the next version must exceed.
  int64_t mtime_ ABSL_GUARDED_BY(mu_);
};

}  // namespace materializer::service

#endif  // MATERIALIZER_SERVER_SERVICE_PUBLISHED_FILE_H_
