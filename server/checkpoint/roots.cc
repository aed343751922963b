#include "server/checkpoint/roots.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"

namespace materializer::checkpoint {
namespace {

constexpr absl::string_view kField = "checkpoint.path";
constexpr absl::string_view kRootsFlag = "--checkpoint_roots";
constexpr absl::string_view kReadersFlag = "--checkpoint_readers";

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 +
         st.st_mtim.tv_nsec;
}

FileIdentity IdentityOf(const struct stat& st) {
  FileIdentity identity;
  identity.dev = static_cast<uint64_t>(st.st_dev);
  identity.ino = static_cast<uint64_t>(st.st_ino);
  identity.size = static_cast<uint64_t>(st.st_size);
  identity.mtime_ns = MtimeNs(st);
  return identity;
}

bool ValidRootName(absl::string_view name) {
  if (name.empty() || name == "." || name == "..") return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

// Why `component` may not be part of a path inside a root, or "".
std::string ComponentProblem(absl::string_view component) {
  if (component.empty()) return "has an empty component";
  if (component == "." || component == "..") {
    return absl::StrCat("has a ", Quote(component),
                        " component (a path stays inside its root)");
  }
  if (component.size() > kMaxPathComponentBytes) {
    return absl::StrCat("has a component longer than ",
                        kMaxPathComponentBytes, " bytes");
  }
  return "";
}

std::string RealPath(const std::string& path, int* error) {
  std::unique_ptr<char, decltype(&std::free)> real(
      realpath(path.c_str(), nullptr), &std::free);
  if (real == nullptr) {
    *error = errno;
    return "";
  }
  *error = 0;
  return std::string(real.get());
}

// An error about the file `label` names, from errno, without host paths.
absl::Status PathError(int error, absl::string_view label) {
  const std::string where = absl::StrCat(kField, " ", Quote(label));
  switch (error) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(
          absl::StrCat(where, ": no such file or folder"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(absl::StrCat(
          where, ": the server is not allowed to read it (file permissions)"));
    case ELOOP:
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": too many levels of symbolic links"));
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the path is too long once links are "
                              "resolved"));
    default:
      return absl::ErrnoToStatus(error, where);
  }
}

absl::Status ChangedWhileOpening(absl::string_view label) {
  return absl::FailedPreconditionError(absl::StrCat(
      Quote(label), " changed on disk while being opened; try again"));
}

}  // namespace

absl::Status CheckUnchanged(int fd, const FileIdentity& identity,
                            absl::string_view label) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(Quote(label), ": fstat"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size != identity.size || MtimeNs(st) != identity.mtime_ns) {
    return absl::FailedPreconditionError(absl::StrCat(
        Quote(label), " changed on disk while being read (",
        size != identity.size
            ? absl::StrCat(identity.size, " bytes, now ", size)
            : std::string("modified again, same size"),
        "); its bytes are not used"));
  }
  return absl::OkStatus();
}

OpenedFile::OpenedFile(int fd, FileIdentity identity, std::string label)
    : fd_(fd),
      identity_(identity),
      label_(std::move(label)),
      reader_(fd, identity.size, label_) {}

OpenedFile::~OpenedFile() {
  if (fd_ >= 0) close(fd_);
}

OpenedFile::OpenedFile(OpenedFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      identity_(other.identity_),
      label_(std::move(other.label_)),
      reader_(std::move(other.reader_)) {}

OpenedFile& OpenedFile::operator=(OpenedFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    identity_ = other.identity_;
    label_ = std::move(other.label_);
    reader_ = std::move(other.reader_);
  }
  return *this;
}

absl::Status OpenedFile::CheckUnchanged() const {
  return checkpoint::CheckUnchanged(fd_, identity_, label_);
}

absl::StatusOr<CheckpointRoots> CheckpointRoots::Create(
    absl::string_view roots_flag, absl::string_view readers_flag) {
  CheckpointRoots roots;
  auto invalid = [](absl::string_view flag, absl::string_view entry,
                    absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": entry ", Quote(entry), ": ", what));
  };
  if (!absl::StripAsciiWhitespace(roots_flag).empty()) {
    for (absl::string_view raw : absl::StrSplit(roots_flag, ',')) {
      const absl::string_view entry = absl::StripAsciiWhitespace(raw);
      Root root;
      absl::string_view path = entry;
      if (const size_t eq = entry.find('='); eq != absl::string_view::npos) {
        root.name = std::string(absl::StripAsciiWhitespace(entry.substr(0, eq)));
        path = absl::StripAsciiWhitespace(entry.substr(eq + 1));
      } else {
        absl::string_view trimmed = path;
        while (trimmed.size() > 1 && absl::EndsWith(trimmed, "/")) {
          trimmed.remove_suffix(1);
        }
        const size_t slash = trimmed.rfind('/');
        root.name = std::string(slash == absl::string_view::npos
                                    ? trimmed
                                    : trimmed.substr(slash + 1));
      }
      if (path.empty()) return invalid(kRootsFlag, entry, "no path");
      if (!ValidRootName(root.name)) {
        return invalid(kRootsFlag, entry,
                       absl::StrCat("the root name ", Quote(root.name),
                                    " is not [A-Za-z0-9._-]+ (write "
                                    "NAME=PATH to choose one)"));
      }
      if (path[0] != '/') {
        return invalid(kRootsFlag, entry, "the path is not absolute");
      }
      if (roots.FindRoot(root.name) != nullptr) {
        return invalid(kRootsFlag, entry,
                       absl::StrCat("a second root named ", Quote(root.name)));
      }
      int error = 0;
      root.real_path = RealPath(std::string(path), &error);
      if (error != 0) {
        return invalid(kRootsFlag, entry, absl::StrCat(std::strerror(error)));
      }
      struct stat st;
      if (stat(root.real_path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        return invalid(kRootsFlag, entry, "not a folder");
      }
      roots.roots_.push_back(std::move(root));
    }
  }
  if (absl::StripAsciiWhitespace(readers_flag).empty()) return roots;
  absl::flat_hash_set<std::string> named;
  for (absl::string_view raw : absl::StrSplit(readers_flag, ';')) {
    const absl::string_view entry = absl::StripAsciiWhitespace(raw);
    const size_t eq = entry.find('=');
    if (eq == absl::string_view::npos) {
      return invalid(kReadersFlag, entry, "not NAME=IDENTITY|IDENTITY... or "
                                          "NAME=*");
    }
    const std::string name(absl::StripAsciiWhitespace(entry.substr(0, eq)));
    Root* root = nullptr;
    for (Root& r : roots.roots_) {
      if (r.name == name) root = &r;
    }
    if (root == nullptr) {
      return invalid(kReadersFlag, entry,
                     absl::StrCat("no root named ", Quote(name), " in ",
                                  kRootsFlag));
    }
    if (!named.insert(name).second) {
      return invalid(kReadersFlag, entry,
                     absl::StrCat("root ", Quote(name), " named twice"));
    }
    const absl::string_view list = absl::StripAsciiWhitespace(entry.substr(eq + 1));
    if (list == "*") continue;  // everyone, as by default
    root->everyone = false;
    for (absl::string_view id : absl::StrSplit(list, '|')) {
      id = absl::StripAsciiWhitespace(id);
      if (id.empty() || id == "*") {
        return invalid(kReadersFlag, entry,
                       "an empty identity, or '*' among identities");
      }
      root->readers.emplace(id);
    }
  }
  for (const Root& root : roots.roots_) {
    if (!named.contains(root.name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          kReadersFlag, " names no readers for root ", Quote(root.name),
          ": name every root (", root.name, "=* lets every identity read it)"));
    }
  }
  return roots;
}

std::vector<std::string> CheckpointRoots::names() const {
  std::vector<std::string> out;
  for (const Root& root : roots_) out.push_back(root.name);
  return out;
}

const CheckpointRoots::Root* CheckpointRoots::FindRoot(
    absl::string_view name) const {
  for (const Root& root : roots_) {
    if (root.name == name) return &root;
  }
  return nullptr;
}

bool CheckpointRoots::Inside(const Root& root,
                             absl::string_view real_path) const {
  if (root.real_path == "/") return absl::StartsWith(real_path, "/");
  return real_path == root.real_path ||
         (absl::StartsWith(real_path, root.real_path) &&
          real_path.size() > root.real_path.size() &&
          real_path[root.real_path.size()] == '/');
}

absl::StatusOr<ResolvedPath> CheckpointRoots::ResolveHostPath(
    const Root& root, const std::string& host_path, std::string label) const {
  int error = 0;
  const std::string real = RealPath(host_path, &error);
  if (error != 0) return PathError(error, label);
  if (!Inside(root, real)) {
    return absl::PermissionDeniedError(absl::StrCat(
        kField, " ", Quote(label), " leads out of checkpoint root ",
        Quote(root.name), " through a symbolic link"));
  }
  struct stat st;
  if (stat(real.c_str(), &st) != 0) return PathError(errno, label);
  if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kField, " ", Quote(label), " is neither a regular file nor a folder"));
  }
  ResolvedPath out;
  out.root_name = root.name;
  out.absolute_path = real;
  out.is_directory = S_ISDIR(st.st_mode);
  out.label = std::move(label);
  out.dev = st.st_dev;
  out.ino = st.st_ino;
  return out;
}

absl::StatusOr<ResolvedPath> CheckpointRoots::Resolve(
    absl::string_view request_path, absl::string_view identity) const {
  auto invalid = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(kField, " ", Quote(request_path), " ", what));
  };
  if (request_path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kField, " is empty; name a root and a path in it, e.g. "
                "\"models/llama\""));
  }
  if (request_path.size() > kMaxRequestPathBytes) {
    return invalid(absl::StrCat("is longer than ", kMaxRequestPathBytes,
                                " bytes"));
  }
  if (request_path.find('\0') != absl::string_view::npos) {
    return invalid("holds a NUL byte");
  }
  if (request_path[0] == '/') {
    return invalid(
        "is absolute; name a root and a path in it, e.g. \"models/llama\"");
  }
  const std::vector<absl::string_view> components =
      absl::StrSplit(request_path, '/');
  for (absl::string_view component : components) {
    if (const std::string problem = ComponentProblem(component);
        !problem.empty()) {
      return invalid(problem);
    }
  }
  const Root* root = FindRoot(components[0]);
  if (root == nullptr) {
    std::vector<absl::string_view> readable;
    for (const Root& r : roots_) {
      if (r.everyone || r.readers.contains(identity)) readable.push_back(r.name);
    }
    return invalid(absl::StrCat(
        "names no checkpoint root ", Quote(components[0]), " (roots: ",
        readable.empty() ? "none" : absl::StrJoin(readable, ", "), ")"));
  }
  if (!root->everyone && !root->readers.contains(identity)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "client ", Quote(identity), " may not read checkpoint root ",
        Quote(root->name), " (", kReadersFlag, ")"));
  }
  std::string host_path = root->real_path;
  for (size_t i = 1; i < components.size(); ++i) {
    absl::StrAppend(&host_path, "/", components[i]);
  }
  return ResolveHostPath(*root, host_path, std::string(request_path));
}

absl::StatusOr<OpenedFile> CheckpointRoots::OpenFile(
    const ResolvedPath& path, absl::string_view name_in_dir) const {
  const Root* root = FindRoot(path.root_name);
  if (root == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("no checkpoint root named ", Quote(path.root_name)));
  }
  ResolvedPath target;
  if (name_in_dir.empty()) {
    if (path.is_directory) {
      return absl::InvalidArgumentError(absl::StrCat(
          kField, " ", Quote(path.label), " is a folder; a file was expected"));
    }
    target = path;
  } else {
    const std::string label = absl::StrCat(path.label, "/", name_in_dir);
    if (!path.is_directory) {
      return absl::InvalidArgumentError(absl::StrCat(
          kField, " ", Quote(path.label), " is a file; a folder was expected"));
    }
    std::string problem = ComponentProblem(name_in_dir);
    if (problem.empty() && name_in_dir.find('/') != absl::string_view::npos) {
      problem = "is not a plain file name";
    }
    if (problem.empty() && name_in_dir.find('\0') != absl::string_view::npos) {
      problem = "holds a NUL byte";
    }
    if (!problem.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(kField, " ", Quote(label), " ", problem));
    }
    ASSIGN_OR_RETURN(target,
                     ResolveHostPath(*root,
                                     absl::StrCat(path.absolute_path, "/",
                                                  name_in_dir),
                                     label));
    if (target.is_directory) {
      return absl::InvalidArgumentError(absl::StrCat(
          kField, " ", Quote(label), " is a folder; a file was expected"));
    }
  }
  // O_NOFOLLOW: the resolved path has no link left, unless one was swapped
  // in. O_NONBLOCK: a FIFO swapped in does not block the open.
  const int fd = open(target.absolute_path.c_str(),
                      O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    if (errno == ELOOP) return ChangedWhileOpening(target.label);
    return PathError(errno, target.label);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int error = errno;
    close(fd);
    return absl::ErrnoToStatus(error, Quote(target.label));
  }
  OpenedFile file(fd, IdentityOf(st), target.label);
  if (!S_ISREG(st.st_mode) || st.st_dev != target.dev ||
      st.st_ino != target.ino) {
    return ChangedWhileOpening(target.label);
  }
  // The kernel's own name for what was opened must still be in the root
  // (a component swapped for a link between realpath and open).
  char link[4096 + 1];
  const std::string proc = absl::StrCat("/proc/self/fd/", fd);
  const ssize_t n = readlink(proc.c_str(), link, sizeof(link) - 1);
  if (n > 0 && static_cast<size_t>(n) < sizeof(link) - 1 &&
      !Inside(*root, absl::string_view(link, static_cast<size_t>(n)))) {
    return absl::PermissionDeniedError(absl::StrCat(
        kField, " ", Quote(target.label), " leads out of checkpoint root ",
        Quote(root->name)));
  }
  return file;
}

}  // namespace materializer::checkpoint
