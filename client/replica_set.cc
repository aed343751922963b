#include "client/replica_set.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/grpc_status.h"
#include "client/routing.h"
#include "server/common/status_macros.h"
#include "server/registry/handle_id.h"

namespace materializer::client {

Replica::Replica(
    std::string name, std::string address,
    std::shared_ptr<grpc::Channel> channel,
    std::function<void(grpc::ClientContext*, absl::Duration)> prepare)
    : name_(std::move(name)),
      address_(std::move(address)),
      channel_(std::move(channel)),
      prepare_(std::move(prepare)),
      stub_(v1::Materializer::NewStub(channel_)),
      health_stub_(grpc::health::v1::Health::NewStub(channel_)) {}

Replica::~Replica() {
  absl::MutexLock lock(&mu_);
  session_.reset();
}

SessionKeeper& Replica::session() {
  absl::MutexLock lock(&mu_);
  if (session_ == nullptr) {
    session_ = std::make_unique<SessionKeeper>(
        stub_.get(), [this](grpc::ClientContext* context) {
          prepare_(context, absl::InfiniteDuration());
        });
  }
  return *session_;
}

std::string Replica::Describe() const {
  if (name_.empty()) return absl::StrCat("the server at ", address_);
  return absl::StrCat("replica ", name_, " (", address_, ")");
}

ReplicaSet::ReplicaSet(std::string target, ChannelFactory make_channel,
                       Prepare prepare, absl::Duration discovery_timeout)
    : target_(std::move(target)),
      make_channel_(std::move(make_channel)),
      prepare_(std::move(prepare)),
      discovery_timeout_(discovery_timeout) {}

void ReplicaSet::Resolve() {
  {
    absl::MutexLock lock(&mu_);
    if (resolved_) return;
  }
  // A target that does not parse or resolve is left to gRPC as one server:
  // its first call then fails with gRPC's own words.
  absl::StatusOr<Resolved> resolved = ResolveTarget(target_);
  const bool several =
      resolved.ok() &&
      resolved->endpoints.size() + resolved->failures.size() > 1;
  std::shared_ptr<grpc::Channel> channel;
  if (!several) channel = make_channel_(Endpoint{target_, ""});
  absl::MutexLock lock(&mu_);
  if (resolved_) return;
  resolved_ = true;
  single_ = !several;
  if (single_) {
    only_ =
        std::make_shared<Replica>("", target_, std::move(channel), prepare_);
  }
}

bool ReplicaSet::single() {
  Resolve();
  absl::MutexLock lock(&mu_);
  return single_;
}

std::shared_ptr<grpc::Channel> ReplicaSet::ChannelFor(
    const Endpoint& endpoint) {
  const std::string key =
      absl::StrCat(endpoint.address, "|", endpoint.tls_name);
  {
    absl::MutexLock lock(&mu_);
    auto it = channels_.find(key);
    if (it != channels_.end()) return it->second;
  }
  std::shared_ptr<grpc::Channel> channel = make_channel_(endpoint);
  absl::MutexLock lock(&mu_);
  return channels_.emplace(key, std::move(channel)).first->second;
}

std::shared_ptr<Replica> ReplicaSet::Adopt(const v1::ServerInfo& info,
                                           const Endpoint& endpoint) {
  // A named replica is dialed at the address it advertises, which stays
  // valid when it restarts elsewhere; otherwise where it was found.
  const Endpoint dial =
      !info.replica().empty() && !info.advertised_address().empty()
          ? Endpoint{info.advertised_address(), ""}
          : endpoint;
  {
    absl::MutexLock lock(&mu_);
    auto& table = info.replica().empty() ? unnamed_ : by_name_;
    const std::string& key =
        info.replica().empty() ? endpoint.address : info.replica();
    auto it = table.find(key);
    if (it != table.end() && it->second->address() == dial.address) {
      return it->second;
    }
  }
  auto replica = std::make_shared<Replica>(info.replica(), dial.address,
                                           ChannelFor(dial), prepare_);
  absl::MutexLock lock(&mu_);
  auto& table = info.replica().empty() ? unnamed_ : by_name_;
  const std::string& key =
      info.replica().empty() ? endpoint.address : info.replica();
  auto it = table.find(key);
  if (it != table.end() && it->second->address() == dial.address) {
    return it->second;  // another thread adopted it meanwhile
  }
  table[key] = replica;
  return replica;
}

absl::StatusOr<std::vector<Discovered>> ReplicaSet::Discover() {
  Resolve();
  std::vector<Endpoint> endpoints;
  std::vector<absl::Status> lookup_failures;
  std::shared_ptr<Replica> only;
  {
    absl::MutexLock lock(&mu_);
    only = only_;
  }
  if (only != nullptr) {
    endpoints.push_back(Endpoint{target_, ""});
  } else {
    ASSIGN_OR_RETURN(Resolved resolved, ResolveTarget(target_));
    endpoints = std::move(resolved.endpoints);
    lookup_failures = std::move(resolved.failures);
  }

  std::vector<Discovered> found(endpoints.size());
  std::vector<std::thread> askers;
  for (size_t i = 0; i < endpoints.size(); ++i) {
    askers.emplace_back([&, i] {
      Discovered& out = found[i];
      out.address = endpoints[i].address;
      v1::Materializer::Stub* stub = nullptr;
      std::unique_ptr<v1::Materializer::Stub> own;
      if (only != nullptr) {
        stub = &only->stub();
      } else {
        own = v1::Materializer::NewStub(ChannelFor(endpoints[i]));
        stub = own.get();
      }
      grpc::ClientContext context;
      prepare_(&context, discovery_timeout_);
      const grpc::Status status =
          stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &out.info);
      if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
        // A server from before GetServerInfo: one unnamed replica.
        out.info.Clear();
      } else if (!status.ok()) {
        out.status = FromGrpcStatus(status);
        return;
      }
      out.replica = only != nullptr ? only : Adopt(out.info, endpoints[i]);
    });
  }
  for (std::thread& asker : askers) asker.join();
  for (absl::Status& failure : lookup_failures) {
    Discovered missing;
    missing.status = std::move(failure);
    found.push_back(std::move(missing));
  }
  return found;
}

absl::StatusOr<std::vector<Discovered>> ReplicaSet::Reachable() {
  ASSIGN_OR_RETURN(std::vector<Discovered> found, Discover());
  std::vector<Discovered> reachable;
  std::vector<Discovered> failed;
  for (Discovered& entry : found) {
    if (entry.replica == nullptr) {
      failed.push_back(std::move(entry));
      continue;
    }
    // Several addresses of one replica (IPv4 and IPv6 of a pod): once.
    const bool seen = std::any_of(
        reachable.begin(), reachable.end(),
        [&](const Discovered& r) { return r.replica == entry.replica; });
    if (!seen) reachable.push_back(std::move(entry));
  }
  std::stable_sort(reachable.begin(), reachable.end(),
                   [](const Discovered& a, const Discovered& b) {
                     return a.replica->name() < b.replica->name();
                   });
  for (Discovered& entry : failed) reachable.push_back(std::move(entry));
  return reachable;
}

std::string ReplicaSet::Summary(const std::vector<Discovered>& discovered) {
  std::vector<std::string> answered;
  std::vector<std::string> silent;
  for (const Discovered& entry : discovered) {
    if (entry.replica != nullptr) {
      answered.push_back(
          entry.replica->name().empty()
              ? absl::StrCat("an unnamed server at ", entry.address)
              : absl::StrCat(entry.replica->name(), " at ", entry.address));
    } else {
      silent.push_back(entry.address.empty()
                           ? std::string(entry.status.message())
                           : absl::StrCat(entry.address, " did not answer (",
                                          entry.status.message(), ")"));
    }
  }
  std::string summary =
      answered.empty() ? std::string("no replica answered")
                       : absl::StrCat("found ", absl::StrJoin(answered, ", "));
  if (!silent.empty())
    absl::StrAppend(&summary, "; ", absl::StrJoin(silent, "; "));
  return summary;
}

namespace {

// The first refusal of our credentials among the answers, if any: then the
// credentials are the problem, not the replicas.
absl::Status Refusal(const std::vector<Discovered>& found) {
  for (const Discovered& entry : found) {
    const absl::StatusCode code = entry.status.code();
    if (code == absl::StatusCode::kUnauthenticated ||
        code == absl::StatusCode::kPermissionDenied) {
      return entry.status;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::shared_ptr<Replica>>> ReplicaSet::ForId(
    absl::string_view id) {
  Resolve();
  const std::string name(registry::ReplicaOfId(id));
  {
    absl::MutexLock lock(&mu_);
    if (single_) return std::vector<std::shared_ptr<Replica>>{only_};
    if (!name.empty()) {
      auto it = by_name_.find(name);
      if (it != by_name_.end()) {
        return std::vector<std::shared_ptr<Replica>>{it->second};
      }
    }
  }
  ASSIGN_OR_RETURN(const std::vector<Discovered> found, Reachable());
  std::vector<std::shared_ptr<Replica>> candidates;
  bool all_answered = true;
  for (const Discovered& entry : found) {
    if (entry.replica == nullptr) {
      all_answered = false;
    } else if (name.empty() || entry.replica->name() == name) {
      candidates.push_back(entry.replica);
    }
  }
  if (!candidates.empty()) return candidates;
  RETURN_IF_ERROR(Refusal(found));
  if (name.empty()) {
    return absl::UnavailableError(
        absl::StrCat("no replica at ", target_, " answered: ", Summary(found)));
  }
  const std::string why = absl::StrCat("\"", id, "\" is held by replica ", name,
                                       ", which is not among the "
                                       "replicas at ",
                                       target_, " (", Summary(found), ")");
  if (all_answered) {
    return absl::NotFoundError(
        absl::StrCat(why,
                     ": the replica has gone away, and its handles "
                     "with it"));
  }
  return absl::UnavailableError(
      absl::StrCat(why, ": it may be one that did not answer; try again"));
}

absl::StatusOr<std::shared_ptr<Replica>> ReplicaSet::ForPlacement(
    const v1::Placement& placement) {
  Resolve();
  {
    absl::MutexLock lock(&mu_);
    if (single_) return only_;
  }
  ASSIGN_OR_RETURN(const std::vector<Discovered> found, Reachable());
  std::vector<v1::ServerInfo> infos;
  std::vector<std::shared_ptr<Replica>> replicas;
  for (const Discovered& entry : found) {
    if (entry.replica == nullptr) continue;
    infos.push_back(entry.info);
    replicas.push_back(entry.replica);
  }
  if (replicas.empty()) {
    RETURN_IF_ERROR(Refusal(found));
    return absl::UnavailableError(
        absl::StrCat("no replica at ", target_, " answered: ", Summary(found)));
  }
  return replicas[ChooseReplica(infos, placement)];
}

absl::Status ReplicaSet::Explain(const Replica& replica,
                                 const absl::Status& status) {
  if (status.code() != absl::StatusCode::kUnavailable &&
      status.code() != absl::StatusCode::kDeadlineExceeded) {
    return status;
  }
  if (single()) return status;
  absl::StatusOr<std::vector<Discovered>> found = Reachable();
  if (found.ok() && !replica.name().empty()) {
    bool all_answered = true;
    bool present = false;
    for (const Discovered& entry : *found) {
      if (entry.replica == nullptr) all_answered = false;
      if (entry.replica != nullptr && entry.replica->name() == replica.name()) {
        present = true;
      }
    }
    if (!present && all_answered) {
      return absl::NotFoundError(
          absl::StrCat(replica.Describe(),
                       " is gone: it is no longer among the replicas "
                       "at ",
                       target_, " (", Summary(*found),
                       "), and its handles went "
                       "with it"));
    }
  }
  return absl::Status(
      status.code(),
      absl::StrCat(replica.Describe(), " did not answer: ", status.message()));
}

absl::Status ReplicaSet::ExplainNotFound(Replica& replica, absl::string_view id,
                                         const absl::Status& status) {
  if (status.code() != absl::StatusCode::kNotFound) return status;
  const std::string holder(registry::ReplicaOfId(id));
  if (holder.empty() || replica.name() == holder) return status;
  std::string answered_as = replica.name();
  bool known = !answered_as.empty();
  if (!known) {
    // The one server of a single address: which replica is it?
    grpc::ClientContext context;
    prepare_(&context, discovery_timeout_);
    v1::ServerInfo info;
    known = replica.stub()
                .GetServerInfo(&context, v1::GetServerInfoRequest(), &info)
                .ok();
    answered_as = info.replica();
    // It is the replica the id names: the handle itself is gone.
    if (known && answered_as == holder) return status;
  }
  const std::string asked =
      !answered_as.empty() ? absl::StrCat("replica ", answered_as)
      : known              ? std::string("a server without a replica name")
                           : std::string(
                                 "a server that did not say which replica "
                                              "it is");
  return absl::NotFoundError(absl::StrCat(
      status.message(), "; \"", id, "\" names replica ", holder, ", but ",
      replica.address(), " is ", asked,
      ": a handle lives only on the replica that made it; connect to ", holder,
      "'s address, or give every replica's address (a "
      "comma-separated list, or a headless Service's name)"));
}

}  // namespace materializer::client
