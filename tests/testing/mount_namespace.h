#ifndef MATERIALIZER_TESTS_TESTING_MOUNT_NAMESPACE_H_
#define MATERIALIZER_TESTS_TESTING_MOUNT_NAMESPACE_H_

// Tests that need a tmpfs of their own (a full one, a huge-page one) mount
// it in a child process's private mount namespace, so nothing leaks into
// the machine's mounts whatever the test does:
//
//   const int code = RunInMountNamespace([] {
//     ... mount("tmpfs", dir, "tmpfs", 0, "size=1m") ...
//     return 0;                       // the child's exit code
//   });
//   if (code == kNoMountNamespace) GTEST_SKIP() << "no mount namespace here";
//   ASSERT_LT(code, 128) << "the child died of signal " << code - 128;
//   EXPECT_EQ(code, 0);

#include <cstdint>
#include <functional>

namespace materializer::testing {

// The exit code a child gives when it cannot have a mount namespace (nor a
// user namespace to make one in), or cannot mount: the test is skipped.
inline constexpr int kNoMountNamespace = 77;

// Forks; the child enters a new mount namespace (inside a new user
// namespace where unprivileged), makes every mount private, runs `body` and
// exits with its result. Returns the child's exit code, or 128 + the signal
// that killed it.
int RunInMountNamespace(const std::function<int()>& body);

// Bytes of this process's mappings inside [begin, end) that are mapped
// with 2 MiB entries (ShmemPmdMapped of /proc/self/smaps).
uint64_t HugeMappedBytes(const void* begin, const void* end);

}  // namespace materializer::testing

#endif  // MATERIALIZER_TESTS_TESTING_MOUNT_NAMESPACE_H_
