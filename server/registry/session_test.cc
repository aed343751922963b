#include "server/registry/session.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#include "tests/testing/status_matchers.h"

namespace materializer::registry {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

const absl::Time kT0 = absl::FromUnixSeconds(1000000);

std::shared_ptr<Handle> Bind(SessionTable& sessions, HandleRegistry& registry,
                             const std::string& owner,
                             const std::string& session) {
  std::shared_ptr<Handle> handle;
  HandleSpec spec;
  spec.owner = owner;
  spec.session = session;
  spec.layout.arena_bytes = 256;
  absl::Status status = sessions.WithLiveSession(
      owner, session, [&] { handle = registry.Create(spec); });
  EXPECT_TRUE(status.ok()) << status;
  return handle;
}

TEST(SessionTableTest, HandlesGoWhenTheGracePeriodEnds) {
  HandleRegistry registry;
  SessionTable sessions(&registry, absl::Seconds(5));
  SessionTable::Attached a = sessions.Open("alice", kT0);
  EXPECT_THAT(a.session_id, MatchesRegex("s-[0-9a-f]{32}"));
  EXPECT_THAT(a.resume_token, MatchesRegex("r-[0-9a-f]{32}"));
  Bind(sessions, registry, "alice", a.session_id);
  Bind(sessions, registry, "alice", a.session_id);
  HandleSpec unbound;
  unbound.owner = "alice";
  registry.Create(unbound);
  ASSERT_EQ(registry.size(), 3u);

  sessions.Detach(a.session_id, a.generation, kT0);
  EXPECT_EQ(sessions.Reap(kT0 + absl::Seconds(4)), 0);
  EXPECT_EQ(registry.size(), 3u);
  EXPECT_EQ(sessions.Reap(kT0 + absl::Seconds(5)), 1);
  EXPECT_EQ(registry.size(), 1u);  // only the unbound handle is left
  EXPECT_EQ(sessions.size(), 0u);
  // The ended session can no longer take handles, or be resumed.
  EXPECT_THAT(sessions.WithLiveSession("alice", a.session_id, [] {}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("not found")));
  EXPECT_THAT(sessions.Resume("alice", a.resume_token, kT0).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("expired")));
}

TEST(SessionTableTest, ResumeWithinGraceKeepsTheHandles) {
  HandleRegistry registry;
  SessionTable sessions(&registry, absl::Seconds(5));
  SessionTable::Attached a = sessions.Open("alice", kT0);
  Bind(sessions, registry, "alice", a.session_id);
  sessions.Detach(a.session_id, a.generation, kT0);
  ASSERT_OK_AND_ASSIGN(
      SessionTable::Attached again,
      sessions.Resume("alice", a.resume_token, kT0 + absl::Seconds(3)));
  EXPECT_EQ(again.session_id, a.session_id);
  EXPECT_TRUE(again.resumed);
  // The old stream's late end does not detach the new one.
  sessions.Detach(a.session_id, a.generation, kT0 + absl::Seconds(4));
  EXPECT_EQ(sessions.Reap(kT0 + absl::Seconds(60)), 0);  // attached again
  EXPECT_EQ(registry.size(), 1u);
}

TEST(SessionTableTest, ResumeRefusals) {
  HandleRegistry registry;
  SessionTable sessions(&registry, absl::Seconds(5));
  SessionTable::Attached a = sessions.Open("alice", kT0);
  // Attached right now: one stream at a time.
  EXPECT_THAT(sessions.Resume("alice", a.resume_token, kT0).status(),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       HasSubstr("attached to another stream")));
  sessions.Detach(a.session_id, a.generation, kT0);
  // Another client's token does not exist for bob.
  EXPECT_THAT(sessions.Resume("bob", a.resume_token, kT0).status(),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  EXPECT_THAT(sessions.Resume("alice", "r-nope", kT0).status(),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  // Past the grace period, before the reaper ran: expired all the same.
  EXPECT_THAT(
      sessions.Resume("alice", a.resume_token, kT0 + absl::Seconds(6)).status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("expired")));
}

TEST(SessionTableTest, ZeroGraceReleasesOnDetach) {
  HandleRegistry registry;
  SessionTable sessions(&registry, absl::ZeroDuration());
  SessionTable::Attached a = sessions.Open("alice", kT0);
  Bind(sessions, registry, "alice", a.session_id);
  sessions.Detach(a.session_id, a.generation, kT0);
  EXPECT_EQ(registry.size(), 0u);
  EXPECT_EQ(sessions.size(), 0u);
}

TEST(SessionTableTest, ForeignSessionsCannotBeBoundTo) {
  HandleRegistry registry;
  SessionTable sessions(&registry, absl::Seconds(5));
  SessionTable::Attached a = sessions.Open("alice", kT0);
  bool ran = false;
  EXPECT_THAT(sessions.WithLiveSession("bob", a.session_id, [&] { ran = true; }),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  EXPECT_FALSE(ran);
}

TEST(HandleLeaseTest, UnusedHandlesExpireAndUseRenews) {
  HandleRegistry registry;
  HandleSpec spec;
  spec.owner = "alice";
  spec.ttl = absl::Seconds(30);
  std::shared_ptr<Handle> h = registry.Create(spec);
  const absl::Time created = h->created();
  EXPECT_EQ(h->lease_expiry(), created + absl::Seconds(30));
  EXPECT_TRUE(registry.ReleaseExpired(created + absl::Seconds(29)).empty());
  h->Renew(created + absl::Seconds(20));
  EXPECT_TRUE(registry.ReleaseExpired(created + absl::Seconds(45)).empty());
  EXPECT_EQ(registry.ReleaseExpired(created + absl::Seconds(50)).size(), 1u);
  EXPECT_EQ(registry.size(), 0u);

  HandleSpec forever;
  forever.owner = "alice";
  registry.Create(forever);
  // A thousand years on, still there.
  EXPECT_TRUE(
      registry.ReleaseExpired(absl::Now() + absl::Hours(24 * 365 * 1000))
          .empty());
}

// Records what the table reports.
class RecordingObserver : public SessionObserver {
 public:
  void SessionOpened(absl::string_view owner, absl::string_view session_id,
                     bool resumed) override {
    opened.push_back(absl::StrCat(owner, " ", session_id, resumed ? " resumed" : ""));
  }
  void SessionEnded(const SessionEnd& end) override { ended.push_back(end); }
  std::vector<std::string> opened;
  std::vector<SessionEnd> ended;
};

TEST(SessionObserverTest, ReportsOpensResumesAndWhatEachEndReleased) {
  HandleRegistry registry;
  RecordingObserver observer;
  SessionTable sessions(&registry, absl::Seconds(5), &observer);
  SessionTable::Attached a = sessions.Open("alice", kT0);
  std::shared_ptr<Handle> h1 = Bind(sessions, registry, "alice", a.session_id);
  std::shared_ptr<Handle> h2 = Bind(sessions, registry, "alice", a.session_id);
  sessions.Detach(a.session_id, a.generation, kT0);
  ASSERT_OK_AND_ASSIGN(SessionTable::Attached again,
                       sessions.Resume("alice", a.resume_token, kT0));
  EXPECT_THAT(observer.opened,
              ElementsAre("alice " + a.session_id,
                          "alice " + a.session_id + " resumed"));
  EXPECT_TRUE(observer.ended.empty());

  sessions.Detach(a.session_id, again.generation, kT0 + absl::Seconds(1));
  sessions.Reap(kT0 + absl::Seconds(7));
  ASSERT_EQ(observer.ended.size(), 1u);
  const SessionObserver::SessionEnd& end = observer.ended[0];
  EXPECT_EQ(end.session_id, a.session_id);
  EXPECT_EQ(end.owner, "alice");
  std::vector<std::string> ids = {h1->id(), h2->id()};
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(end.handles, ids);
  EXPECT_EQ(end.freed_bytes, 2u * 256);  // Bind declares 256-byte arenas
  EXPECT_EQ(end.since_detach, absl::Seconds(6));
}

TEST(SessionObserverTest, ZeroGraceEndsAtDetach) {
  HandleRegistry registry;
  RecordingObserver observer;
  SessionTable sessions(&registry, absl::ZeroDuration(), &observer);
  SessionTable::Attached a = sessions.Open("bob", kT0);
  std::shared_ptr<Handle> h = Bind(sessions, registry, "bob", a.session_id);
  sessions.Detach(a.session_id, a.generation, kT0);
  ASSERT_EQ(observer.ended.size(), 1u);
  EXPECT_THAT(observer.ended[0].handles, ElementsAre(h->id()));
  EXPECT_EQ(observer.ended[0].since_detach, absl::ZeroDuration());
  EXPECT_EQ(registry.size(), 0u);
}

}  // namespace
}  // namespace materializer::registry
