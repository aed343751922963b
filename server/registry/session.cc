#include "server/registry/session.h"

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/common/quote.h"

namespace materializer::registry {
namespace {

// "s-" / "r-" and 32 hex digits from the same CSPRNG as handle ids.
std::string NewId(const char* prefix) {
  std::string id = NewHandleId();  // "h-" + 32 hex
  id[0] = prefix[0];
  return id;
}

}  // namespace

SessionTable::SessionTable(HandleRegistry* registry, absl::Duration grace)
    : registry_(registry), grace_(grace) {}

SessionTable::Attached SessionTable::Open(absl::string_view owner,
                                          absl::Time /*now*/) {
  Attached attached{NewId("s"), NewId("r"), /*generation=*/1,
                    /*resumed=*/false};
  absl::MutexLock lock(&mu_);
  sessions_.emplace(attached.session_id,
                    Session{std::string(owner), attached.resume_token,
                            /*attached=*/true, absl::InfinitePast(),
                            /*generation=*/1});
  by_token_.emplace(attached.resume_token, attached.session_id);
  return attached;
}

absl::StatusOr<SessionTable::Attached> SessionTable::Resume(
    absl::string_view owner, absl::string_view resume_token, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto token = by_token_.find(resume_token);
  if (token == by_token_.end()) {
    return absl::NotFoundError(
        "resume token unknown or expired: the session it named has ended and "
        "its handles were released; attach without a token to start a new "
        "session");
  }
  auto it = sessions_.find(token->second);
  Session& session = it->second;
  if (session.owner != owner ||
      (!session.attached && now - session.detached_at > grace_)) {
    return absl::NotFoundError(
        "resume token unknown or expired: the session it named has ended and "
        "its handles were released; attach without a token to start a new "
        "session");
  }
  if (session.attached) {
    return absl::AlreadyExistsError(absl::StrCat(
        "session ", it->first,
        " is attached to another stream; a session has one stream at a time"));
  }
  session.attached = true;
  session.generation += 1;
  return Attached{it->first, session.resume_token, session.generation,
                  /*resumed=*/true};
}

void SessionTable::Detach(absl::string_view session_id, uint64_t generation,
                          absl::Time now) {
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end() || !it->second.attached ||
        it->second.generation != generation) {
      return;
    }
    it->second.attached = false;
    it->second.detached_at = now;
    if (grace_ > absl::ZeroDuration()) return;
    EndLocked(std::string(session_id));
  }
  // Zero grace: release now, outside our lock.
  registry_->ReleaseSession(session_id);
}

absl::Status SessionTable::WithLiveSession(absl::string_view owner,
                                           absl::string_view session_id,
                                           const std::function<void()>& bind) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || it->second.owner != owner) {
    return absl::NotFoundError(absl::StrCat(
        "session ", Quote(session_id),
        " not found (it ended, or it belongs to another client)"));
  }
  bind();
  return absl::OkStatus();
}

void SessionTable::EndLocked(const std::string& session_id) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  by_token_.erase(it->second.resume_token);
  sessions_.erase(it);
}

int SessionTable::Reap(absl::Time now) {
  std::vector<std::string> ended;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, session] : sessions_) {
      if (!session.attached && now - session.detached_at >= grace_) {
        ended.push_back(id);
      }
    }
    for (const std::string& id : ended) EndLocked(id);
  }
  for (const std::string& id : ended) registry_->ReleaseSession(id);
  return static_cast<int>(ended.size());
}

size_t SessionTable::CountFor(absl::string_view owner) const {
  absl::MutexLock lock(&mu_);
  size_t count = 0;
  for (const auto& [id, session] : sessions_) count += session.owner == owner;
  return count;
}

size_t SessionTable::size() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

}  // namespace materializer::registry
