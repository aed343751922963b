#include "server/checkpoint/roots.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "tests/testing/status_matchers.h"

namespace materializer::checkpoint {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// The test's temporary folder, without a trailing '/'.
std::string TempFolder() {
  std::string dir = ::testing::TempDir();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// base/
//   models/                       root "models"
//     llama/model.safetensors     "weights"
//     llama/alias.safetensors  -> model.safetensors      (inside)
//     llama/sub/
//     llama/escape             -> ../../outside/secret   (out of the root)
//     linkdir                  -> llama                  (inside)
//     outdir                   -> ../outside             (out of the root)
//     fifo
//   scratch/                      root "scratch", alice and bob only
//     notes
//   outside/secret
class RootsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = TempFolder() + "/roots_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (const char* dir : {"", "/models", "/models/llama", "/models/llama/sub",
                            "/scratch", "/outside"}) {
      ASSERT_EQ(mkdir((base_ + dir).c_str(), 0755), 0) << dir;
    }
    WriteFile(base_ + "/models/llama/model.safetensors", "weights");
    WriteFile(base_ + "/scratch/notes", "notes");
    WriteFile(base_ + "/outside/secret", "secret");
    ASSERT_EQ(symlink("model.safetensors",
                      (base_ + "/models/llama/alias.safetensors").c_str()),
              0);
    ASSERT_EQ(symlink("../../outside/secret",
                      (base_ + "/models/llama/escape").c_str()),
              0);
    ASSERT_EQ(symlink("llama", (base_ + "/models/linkdir").c_str()), 0);
    ASSERT_EQ(symlink("../outside", (base_ + "/models/outdir").c_str()), 0);
    ASSERT_EQ(mkfifo((base_ + "/models/fifo").c_str(), 0644), 0);
    ASSERT_OK_AND_ASSIGN(
        roots_, CheckpointRoots::Create(
                    "models=" + base_ + "/models, " + base_ + "/scratch/",
                    "scratch=alice|bob; models=*"));
  }

  // Resolve as `identity`; the message never shows a host path.
  absl::StatusOr<ResolvedPath> Resolve(absl::string_view path,
                                       absl::string_view identity = "carol") {
    absl::StatusOr<ResolvedPath> resolved = roots_.Resolve(path, identity);
    EXPECT_THAT(std::string(resolved.status().message()),
                Not(HasSubstr(base_)));
    return resolved;
  }

  std::string base_;
  CheckpointRoots roots_;
};

TEST_F(RootsTest, ResolvesFilesAndFoldersInsideARoot) {
  EXPECT_THAT(roots_.names(), ElementsAre("models", "scratch"));
  ASSERT_OK_AND_ASSIGN(ResolvedPath file,
                       Resolve("models/llama/model.safetensors"));
  EXPECT_EQ(file.root_name, "models");
  EXPECT_EQ(file.label, "models/llama/model.safetensors");
  EXPECT_FALSE(file.is_directory);
  ASSERT_OK_AND_ASSIGN(ResolvedPath dir, Resolve("models/llama"));
  EXPECT_TRUE(dir.is_directory);
  ASSERT_OK_AND_ASSIGN(ResolvedPath root, Resolve("models"));
  EXPECT_TRUE(root.is_directory);
  // Links that stay inside the root resolve to their target.
  ASSERT_OK_AND_ASSIGN(ResolvedPath alias,
                       Resolve("models/llama/alias.safetensors"));
  EXPECT_EQ(alias.absolute_path, file.absolute_path);
  EXPECT_EQ(alias.label, "models/llama/alias.safetensors");
  ASSERT_OK_AND_ASSIGN(ResolvedPath through,
                       Resolve("models/linkdir/model.safetensors"));
  EXPECT_EQ(through.absolute_path, file.absolute_path);
}

TEST_F(RootsTest, RefusesMalformedPaths) {
  const std::pair<std::string, std::string> cases[] = {
      {"", "checkpoint.path is empty"},
      {"/etc/passwd", "checkpoint.path \"/etc/passwd\" is absolute"},
      {"models/../outside/secret", "has a \"..\" component"},
      {"models/llama/..", "has a \"..\" component"},
      {"models/./llama", "has a \".\" component"},
      {"models//llama", "has an empty component"},
      {"models/llama/", "has an empty component"},
      {std::string("models/a\0b", 10), "holds a NUL byte"},
      {"models/" + std::string(4096, 'a'), "is longer than 4096 bytes"},
      {"models/" + std::string(256, 'a'), "longer than 255 bytes"},
      {"weights/llama", "names no checkpoint root \"weights\" (roots: "
                        "models)"},
  };
  for (const auto& [path, reason] : cases) {
    EXPECT_THAT(Resolve(path), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr(reason)))
        << path;
  }
}

TEST_F(RootsTest, RefusesLinksOutOfTheRootMissingFilesAndSpecialFiles) {
  EXPECT_THAT(Resolve("models/llama/escape"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("checkpoint.path \"models/llama/escape\" "
                                 "leads out of checkpoint root \"models\"")));
  EXPECT_THAT(Resolve("models/outdir/secret"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("leads out of checkpoint root")));
  EXPECT_THAT(Resolve("models/outdir"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("leads out of checkpoint root")));
  EXPECT_THAT(Resolve("models/llama/missing.safetensors"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("\"models/llama/missing.safetensors\": no "
                                 "such file or folder")));
  EXPECT_THAT(Resolve("models/llama/model.safetensors/x"),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  EXPECT_THAT(Resolve("models/fifo"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("neither a regular file nor a folder")));
}

TEST_F(RootsTest, OnlyListedIdentitiesReadARestrictedRoot) {
  EXPECT_THAT(Resolve("scratch/notes", "carol"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("client \"carol\" may not read checkpoint "
                                 "root \"scratch\"")));
  // Refused before the file system is asked: no difference for a missing
  // file.
  EXPECT_THAT(Resolve("scratch/missing", "carol"),
              StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  EXPECT_OK(Resolve("scratch/notes", "alice"));
  EXPECT_OK(Resolve("scratch/notes", "bob"));
  EXPECT_OK(Resolve("models/llama", "carol"));
  // Listing roots in an error shows only the readable ones.
  EXPECT_THAT(Resolve("x/y", "alice"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("(roots: models, scratch)")));
}

TEST_F(RootsTest, OpensFilesAndFilesInAFolder) {
  ASSERT_OK_AND_ASSIGN(ResolvedPath file,
                       Resolve("models/llama/model.safetensors"));
  ASSERT_OK_AND_ASSIGN(OpenedFile opened, roots_.OpenFile(file, ""));
  EXPECT_EQ(opened.size(), 7u);
  EXPECT_EQ(opened.label(), "models/llama/model.safetensors");
  ASSERT_OK_AND_ASSIGN(std::string bytes, ReadBytes(opened.file(), 0, 7));
  EXPECT_EQ(bytes, "weights");
  EXPECT_TRUE(fcntl(opened.fd(), F_GETFD) & FD_CLOEXEC);
  struct stat st;
  ASSERT_EQ(stat((base_ + "/models/llama/model.safetensors").c_str(), &st), 0);
  EXPECT_EQ(opened.identity().ino, static_cast<uint64_t>(st.st_ino));

  ASSERT_OK_AND_ASSIGN(ResolvedPath dir, Resolve("models/llama"));
  ASSERT_OK_AND_ASSIGN(OpenedFile in_dir,
                       roots_.OpenFile(dir, "alias.safetensors"));
  EXPECT_EQ(in_dir.label(), "models/llama/alias.safetensors");
  EXPECT_EQ(in_dir.identity().ino, opened.identity().ino);
  // Moving keeps one owner of the descriptor.
  OpenedFile moved = std::move(in_dir);
  EXPECT_EQ(in_dir.fd(), -1);
  ASSERT_OK_AND_ASSIGN(bytes, ReadBytes(moved.file(), 0, 7));
  EXPECT_EQ(bytes, "weights");
}

TEST_F(RootsTest, OpenFileRefusesFoldersNamesAndEscapes) {
  ASSERT_OK_AND_ASSIGN(ResolvedPath dir, Resolve("models/llama"));
  ASSERT_OK_AND_ASSIGN(ResolvedPath file,
                       Resolve("models/llama/model.safetensors"));
  EXPECT_THAT(roots_.OpenFile(dir, ""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"models/llama\" is a folder; a file was "
                                 "expected")));
  EXPECT_THAT(roots_.OpenFile(dir, "sub"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"models/llama/sub\" is a folder")));
  EXPECT_THAT(roots_.OpenFile(file, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is a file; a folder was expected")));
  for (const char* name : {"..", ".", "a/b", "../llama/model.safetensors"}) {
    EXPECT_THAT(roots_.OpenFile(dir, name),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("checkpoint.path")))
        << name;
  }
  EXPECT_THAT(roots_.OpenFile(dir, "missing"),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("models/llama/missing"),
                             Not(HasSubstr(base_)))));
  EXPECT_THAT(roots_.OpenFile(dir, "escape"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr("leads out of checkpoint root"),
                             Not(HasSubstr(base_)))));
}

TEST_F(RootsTest, AFileReplacedAfterResolveIsNotOpened) {
  const std::string path = base_ + "/models/llama/model.safetensors";
  ASSERT_OK_AND_ASSIGN(ResolvedPath file,
                       Resolve("models/llama/model.safetensors"));
  WriteFile(path + ".new", "other weights");
  ASSERT_EQ(std::rename((path + ".new").c_str(), path.c_str()), 0);
  EXPECT_THAT(roots_.OpenFile(file, ""),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("\"models/llama/model.safetensors\" changed "
                                 "on disk while being opened")));
}

TEST_F(RootsTest, CheckUnchangedSeesSizeAndMtime) {
  const std::string path = base_ + "/models/llama/model.safetensors";
  ASSERT_OK_AND_ASSIGN(ResolvedPath file,
                       Resolve("models/llama/model.safetensors"));
  ASSERT_OK_AND_ASSIGN(OpenedFile opened, roots_.OpenFile(file, ""));
  EXPECT_OK(opened.CheckUnchanged());
  // Rewritten in place, same size, another mtime.
  struct timespec times[2] = {{0, UTIME_OMIT}, {12345, 678}};
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  EXPECT_THAT(opened.CheckUnchanged(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("\"models/llama/model.safetensors\" changed "
                                 "on disk while being read (modified again")));
  {
    std::ofstream out(path, std::ios::binary | std::ios::app);
    out << "more";
  }
  EXPECT_THAT(CheckUnchanged(opened.fd(), opened.identity(), opened.label()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("changed on disk while being read (7 "
                                 "bytes, now 11)")));
}

TEST(CheckpointRootsCreateTest, ParsesAndRefusesFlagValues) {
  const std::string base = TempFolder() + "/create";
  ASSERT_EQ(mkdir(base.c_str(), 0755), 0);
  ASSERT_EQ(mkdir((base + "/m.v-1_x").c_str(), 0755), 0);
  WriteFile(base + "/file", "x");
  ASSERT_OK_AND_ASSIGN(CheckpointRoots none, CheckpointRoots::Create("", ""));
  EXPECT_TRUE(none.empty());
  EXPECT_THAT(none.Resolve("models/x", "a"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("(roots: none)")));
  ASSERT_OK_AND_ASSIGN(CheckpointRoots bare,
                       CheckpointRoots::Create(base + "/m.v-1_x", ""));
  EXPECT_THAT(bare.names(), ElementsAre("m.v-1_x"));
  const std::pair<std::pair<std::string, std::string>, std::string> cases[] = {
      {{"a=" + base + ",a=" + base, ""}, "a second root named \"a\""},
      {{"a b=" + base, ""}, "is not [A-Za-z0-9._-]+"},
      {{"..=" + base, ""}, "is not [A-Za-z0-9._-]+"},
      {{"/", ""}, "the root name \"\""},
      {{"a=relative/path", ""}, "the path is not absolute"},
      {{"a=", ""}, "no path"},
      {{"a=" + base + "/missing", ""}, "No such file or directory"},
      {{"a=" + base + "/file", ""}, "not a folder"},
      {{"a=" + base + ",b=" + base, "a=*"},
       "--checkpoint_readers names no readers for root \"b\""},
      {{"a=" + base, "a=*;c=x"}, "no root named \"c\""},
      {{"a=" + base, "a=*;a=x"}, "root \"a\" named twice"},
      {{"a=" + base, "a=x||y"}, "an empty identity"},
      {{"a=" + base, "a"}, "not NAME=IDENTITY"},
  };
  for (const auto& [flags, reason] : cases) {
    EXPECT_THAT(CheckpointRoots::Create(flags.first, flags.second),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(reason)))
        << flags.first << " / " << flags.second;
  }
}

}  // namespace
}  // namespace materializer::checkpoint
