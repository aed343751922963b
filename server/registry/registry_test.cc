#include "server/registry/registry.h"

#include <set>

#include "absl/strings/str_replace.h"

#include "tests/testing/status_matchers.h"

namespace materializer::registry {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

HandleSpec SpecFor(const char* owner) {
  HandleSpec spec;
  spec.owner = owner;
  spec.device = "cpu";
  spec.layout.arena_bytes = 512;
  return spec;
}

TEST(NewHandleIdTest, IdsAreLongRandomAndDistinct) {
  std::set<std::string> ids;
  for (int i = 0; i < 10000; ++i) {
    const std::string id = NewHandleId();
    ASSERT_THAT(id, MatchesRegex("h-[0-9a-f]{32}"));
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 10000u);
}

TEST(HandleRegistryTest, OnlyTheOwnerSeesAHandle) {
  HandleRegistry registry;
  std::shared_ptr<Handle> h = registry.Create(SpecFor("alice"));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Handle> got,
                       registry.Get("alice", h->id()));
  EXPECT_EQ(got.get(), h.get());

  // Another identity gets the same answer as for an id never issued.
  const absl::Status foreign = registry.Get("bob", h->id()).status();
  const absl::Status unknown = registry.Get("bob", "h-0000").status();
  EXPECT_THAT(foreign, StatusIs(absl::StatusCode::kNotFound, HasSubstr("not found")));
  EXPECT_EQ(std::string(foreign.message()),
            absl::StrReplaceAll(std::string(unknown.message()),
                                {{"h-0000", h->id()}}));
  EXPECT_TRUE(registry.List("bob").empty());
  EXPECT_THAT(registry.Release("bob", h->id()).status(),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  EXPECT_EQ(registry.size(), 1u);
}

TEST(HandleRegistryTest, ReleaseIsIdempotentForTheOwnerOnly) {
  HandleRegistry registry;
  std::shared_ptr<Handle> h = registry.Create(SpecFor("alice"));
  const std::string id = h->id();
  h.reset();
  ASSERT_OK_AND_ASSIGN(ReleaseResult first, registry.Release("alice", id));
  EXPECT_TRUE(first.released);
  EXPECT_EQ(first.freed_bytes, 512u);  // still materializing: its reservation
  ASSERT_OK_AND_ASSIGN(ReleaseResult second, registry.Release("alice", id));
  EXPECT_FALSE(second.released);
  EXPECT_EQ(second.freed_bytes, 0u);
  EXPECT_THAT(registry.Release("bob", id).status(),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  EXPECT_THAT(registry.Get("alice", id).status(),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  EXPECT_EQ(registry.size(), 0u);
}

TEST(HandleRegistryTest, ListIsPerOwnerOldestFirst) {
  HandleRegistry registry;
  auto a1 = registry.Create(SpecFor("alice"));
  auto b1 = registry.Create(SpecFor("bob"));
  auto a2 = registry.Create(SpecFor("alice"));
  std::vector<std::shared_ptr<Handle>> list = registry.List("alice");
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0]->id(), a1->id());
  EXPECT_EQ(list[1]->id(), a2->id());
}

TEST(HandleTest, StateMachine) {
  HandleRegistry registry;
  auto h = registry.Create(SpecFor("alice"));
  EXPECT_EQ(h->state(), v1::HANDLE_STATE_MATERIALIZING);
  EXPECT_EQ(h->arena(), nullptr);
  h->MarkFailed("out of memory");
  EXPECT_EQ(h->state(), v1::HANDLE_STATE_FAILED);
  EXPECT_EQ(h->error(), "out of memory");
  EXPECT_EQ(h->Release(), 0u);  // a failed handle holds nothing
}

}  // namespace
}  // namespace materializer::registry
