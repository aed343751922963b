// Export bookkeeping of handles and the registry's forced release.

#include <atomic>

#include "server/registry/handle.h"
#include "server/registry/registry.h"
#include "tests/testing/status_matchers.h"

namespace materializer::registry {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::HasSubstr;

HandleSpec SpecFor(const char* owner) {
  HandleSpec spec;
  spec.owner = owner;
  spec.device = "cpu";
  spec.layout.arena_bytes = 512;
  return spec;
}

ExportRecord Record(const char* id) {
  ExportRecord record;
  record.id = id;
  return record;
}

TEST(HandleExportTest, ReleaseIsRefusedWhileExportedUnlessForced) {
  HandleRegistry registry;
  std::shared_ptr<Handle> h = registry.Create(SpecFor("alice"));
  ASSERT_OK_AND_ASSIGN(uint32_t live, h->AddExport(Record("x-1")));
  EXPECT_EQ(live, 1u);
  EXPECT_THAT(registry.Release("alice", h->id()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("is exported (1 live export, the first x-1)")));
  // Nothing changed: the handle is still there and usable.
  EXPECT_OK(registry.Get("alice", h->id()));
  EXPECT_FALSE(h->released());

  ASSERT_OK_AND_ASSIGN(ReleaseResult forced,
                       registry.Release("alice", h->id(), /*force=*/true));
  EXPECT_TRUE(forced.released);
  EXPECT_TRUE(h->released());
  EXPECT_THAT(registry.Get("alice", h->id()),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  // The export can still be closed (and only by its owner); then the
  // handle is gone for good.
  EXPECT_THAT(registry.GetExported("bob", h->id()),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Handle> draining,
                       registry.GetExported("alice", h->id()));
  ASSERT_OK_AND_ASSIGN(uint32_t remaining, draining->CloseExport("x-1"));
  EXPECT_EQ(remaining, 0u);
  registry.ExportClosed(h->id());
  EXPECT_THAT(registry.GetExported("alice", h->id()),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
}

TEST(HandleExportTest, ClosingTheLastExportAllowsAPlainRelease) {
  HandleRegistry registry;
  std::shared_ptr<Handle> h = registry.Create(SpecFor("alice"));
  ASSERT_OK(h->AddExport(Record("x-1")).status());
  ASSERT_OK(h->AddExport(Record("x-2")).status());
  EXPECT_EQ(h->num_exports(), 2u);
  ASSERT_OK_AND_ASSIGN(uint32_t remaining, h->CloseExport("x-2"));
  EXPECT_EQ(remaining, 1u);
  EXPECT_THAT(h->CloseExport("x-2"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("closed already")));
  ASSERT_OK(h->CloseExport("x-1").status());
  ASSERT_OK_AND_ASSIGN(ReleaseResult released,
                       registry.Release("alice", h->id()));
  EXPECT_TRUE(released.released);
}

TEST(HandleExportTest, AReleasedHandleCannotBeExported) {
  HandleRegistry registry;
  std::shared_ptr<Handle> h = registry.Create(SpecFor("alice"));
  ASSERT_OK(registry.Release("alice", h->id()).status());
  EXPECT_THAT(h->AddExport(Record("x-1")),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("being released")));
}

TEST(HandleExportTest, SessionEndForcesAndLeaseExpirySkipsExportedHandles) {
  HandleRegistry registry;
  HandleSpec bound = SpecFor("alice");
  bound.session = "s-1";
  std::shared_ptr<Handle> in_session = registry.Create(bound);
  HandleSpec leased = SpecFor("alice");
  leased.ttl = absl::Seconds(1);
  std::shared_ptr<Handle> with_lease = registry.Create(leased);
  ASSERT_OK(in_session->AddExport(Record("x-1")).status());
  ASSERT_OK(with_lease->AddExport(Record("x-2")).status());

  registry.ReleaseSession("s-1");
  EXPECT_TRUE(in_session->released());

  const absl::Time later = absl::Now() + absl::Hours(1);
  EXPECT_TRUE(registry.ReleaseExpired(later).empty());
  EXPECT_FALSE(with_lease->released());
  ASSERT_OK(with_lease->CloseExport("x-2").status());
  EXPECT_EQ(registry.ReleaseExpired(later).size(), 1u);
  EXPECT_TRUE(with_lease->released());
}

TEST(HandleDerivedTest, ComputedOnceAndCached) {
  HandleRegistry registry;
  std::shared_ptr<Handle> h = registry.Create(SpecFor("alice"));
  int calls = 0;
  auto compute = [&]() -> absl::StatusOr<Handle::Digests> {
    ++calls;
    return Handle::Digests{"xxh3-128:aa"};
  };
  ASSERT_OK_AND_ASSIGN(auto first, h->TensorDigests(compute));
  ASSERT_OK_AND_ASSIGN(auto second, h->TensorDigests(compute));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(first.get(), second.get());
  // A failed computation is not cached.
  auto failing = []() -> absl::StatusOr<Handle::Crcs> {
    return absl::InternalError("disk on fire");
  };
  EXPECT_THAT(h->TensorCrcs(failing),
              StatusIs(absl::StatusCode::kInternal, ::testing::_));
  ASSERT_OK_AND_ASSIGN(auto crcs, h->TensorCrcs([] {
    return absl::StatusOr<Handle::Crcs>(Handle::Crcs{7});
  }));
  EXPECT_EQ((*crcs)[0], 7u);

  const Handle::FileKey k{1, 2};
  EXPECT_EQ(h->FileDigest(k), "");
  h->SetFileDigest(k, "xxh3-128:bb");
  EXPECT_EQ(h->FileDigest(k), "xxh3-128:bb");
}

TEST(HandleDerivedTest, FileDigestCacheIsBounded) {
  HandleRegistry registry;
  std::shared_ptr<Handle> h = registry.Create(SpecFor("alice"));
  // A client asking for ever different files: the cache keeps the newest.
  for (uint64_t i = 0; i < 10000; ++i) {
    h->SetFileDigest({i, i}, "xxh3-128:" + std::to_string(i));
    ASSERT_LE(h->num_file_digests(), Handle::kMaxFileDigests);
  }
  EXPECT_EQ(h->num_file_digests(), Handle::kMaxFileDigests);
  EXPECT_EQ(h->FileDigest({9999, 9999}), "xxh3-128:9999");
  EXPECT_EQ(h->FileDigest({0, 0}), "");
  // Setting a cached key again does not grow it.
  h->SetFileDigest({9999, 9999}, "xxh3-128:9999");
  EXPECT_EQ(h->num_file_digests(), Handle::kMaxFileDigests);
}

}  // namespace
}  // namespace materializer::registry
