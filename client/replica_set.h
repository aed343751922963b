#ifndef MATERIALIZER_CLIENT_REPLICA_SET_H_
#define MATERIALIZER_CLIENT_REPLICA_SET_H_

// The servers behind a client's target, and a connection to each.
//
// A target with one address (targets.h) is one server: every call goes to
// it and nothing is discovered. A target with several addresses is a set
// of replicas: GetServerInfo at each address says which replica answers
// there and where it advertises itself (ServerInfo.advertised_address,
// dialed from then on; the address it was found at otherwise). Calls are
// routed with the rules of routing.h; the reasons are in
// docs/architecture.md, "Scale-out".
//
//   ReplicaSet replicas(target, make_channel, prepare, absl::Seconds(5));
//   ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Replica>> to,
//                    replicas.ForId(handle));
//   ... call to[0]->stub() ...; on error: replicas.Explain(*to[0], status)

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/session.h"
#include "client/targets.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "materializer/v1/materializer.grpc.pb.h"

namespace materializer::client {

// One server: its name, its address, stubs over one channel, and the
// session this client holds there.
//
// Thread-safe.
class Replica {
 public:
  // `prepare` adds identity metadata (and, for a finite timeout, a
  // deadline) to a context; the session's Attach calls use it.
  Replica(std::string name, std::string address,
          std::shared_ptr<grpc::Channel> channel,
          std::function<void(grpc::ClientContext*, absl::Duration)> prepare);
  ~Replica();

  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  // The replica's name; "" for a single server, or for a replica started
  // without one.
  const std::string& name() const { return name_; }
  // The address it is dialed at.
  const std::string& address() const { return address_; }

  v1::Materializer::Stub& stub() { return *stub_; }
  // The channel itself, for calls made without the generated stub (a
  // fetch reads its chunks as raw buffers).
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  grpc::health::v1::Health::Stub& health() { return *health_stub_; }

  // The session this client holds on this replica (an Attach stream),
  // opened on first use and kept until the Replica is destroyed.
  SessionKeeper& session();

  // "replica r1 (10.0.0.5:50051)", or "the server at ADDRESS" without a
  // name.
  std::string Describe() const;

 private:
  const std::string name_;
  const std::string address_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::function<void(grpc::ClientContext*, absl::Duration)> prepare_;
  const std::unique_ptr<v1::Materializer::Stub> stub_;
  const std::unique_ptr<grpc::health::v1::Health::Stub> health_stub_;

  absl::Mutex mu_;
  // Guards session_; declared after the stubs it uses, so it ends first.
  std::unique_ptr<SessionKeeper> session_ ABSL_GUARDED_BY(mu_);
};

// What GetServerInfo at one address said, or why it could not be asked.
struct Discovered {
  std::string address;  // where it was asked
  // The replica that answered (null when it did not), and its answer.
  std::shared_ptr<Replica> replica;
  v1::ServerInfo info;
  absl::Status status;
};

// Thread-safe.
class ReplicaSet {
 public:
  using ChannelFactory =
      std::function<std::shared_ptr<grpc::Channel>(const Endpoint&)>;
  using Prepare = std::function<void(grpc::ClientContext*, absl::Duration)>;

  // `make_channel` opens a channel with the client's credentials and
  // arguments; `prepare` as for Replica; GetServerInfo calls are given
  // `discovery_timeout`.
  ReplicaSet(std::string target, ChannelFactory make_channel, Prepare prepare,
             absl::Duration discovery_timeout);

  ReplicaSet(const ReplicaSet&) = delete;
  ReplicaSet& operator=(const ReplicaSet&) = delete;

  // True when the target is one server (decided on first use, once).
  bool single();

  // Where a call naming `id` (a handle or export id) goes: the one server;
  // or the replica the id names (discovered again if this client has not
  // met it yet); or, for an id that names no replica, every replica in
  // turn (ids from servers started without a replica name). NOT_FOUND when
  // every address of the target answered and none is the named replica
  // (it went away, and its handles with it); UNAVAILABLE when some did not
  // answer. Both name the replica.
  absl::StatusOr<std::vector<std::shared_ptr<Replica>>> ForId(
      absl::string_view id);

  // Where Materialize and Plan for `placement` go: the one server, or the
  // replica with the most room (routing.h), asked now. UNAVAILABLE when no
  // address of the target answered.
  absl::StatusOr<std::shared_ptr<Replica>> ForPlacement(
      const v1::Placement& placement);

  // GetServerInfo at every address of the target now, in parallel; one
  // entry per address, in target order (the one server's entry when
  // single; an older server without GetServerInfo answers with an empty
  // info). Errors: the target's (INVALID_ARGUMENT).
  absl::StatusOr<std::vector<Discovered>> Discover();

  // The replicas that answered Discover(), sorted by name, plus an entry
  // with a null replica for each address that did not.
  absl::StatusOr<std::vector<Discovered>> Reachable();

  // The status to return after a call to `replica` failed with `status`.
  // An UNAVAILABLE (or DEADLINE_EXCEEDED) from one of several replicas is
  // checked against a fresh discovery: NOT_FOUND when every address
  // answered and none was this replica (it is gone), else UNAVAILABLE;
  // both name the replica. Other statuses come back unchanged.
  absl::Status Explain(const Replica& replica, const absl::Status& status);

  // The status to return after `replica` answered NOT_FOUND for `id` (a
  // handle or export id). When the id names a replica and `replica` is
  // another one (a single address that reaches a different replica, or a
  // load-balanced address), the message says which replica the id names
  // and how to reach it; `replica` is asked its name (GetServerInfo) if it
  // was not found by discovery. Otherwise `status` comes back unchanged.
  absl::Status ExplainNotFound(Replica& replica, absl::string_view id,
                               const absl::Status& status);

  const std::string& target() const { return target_; }

 private:
  // Decides single vs several, once.
  void Resolve();
  // The channel for `endpoint`, reusing an open one.
  std::shared_ptr<grpc::Channel> ChannelFor(const Endpoint& endpoint);
  // The replica object for `info` found at `endpoint`, reusing a known one.
  std::shared_ptr<Replica> Adopt(const v1::ServerInfo& info,
                                 const Endpoint& endpoint);
  // "r0 at A, r2 at B; C did not answer (reason)" for messages.
  static std::string Summary(const std::vector<Discovered>& discovered);

  const std::string target_;
  const ChannelFactory make_channel_;
  const Prepare prepare_;
  const absl::Duration discovery_timeout_;

  absl::Mutex mu_;
  // Guards every member below.
  bool resolved_ ABSL_GUARDED_BY(mu_) = false;
  bool single_ ABSL_GUARDED_BY(mu_) = true;
  // The one server, when single.
  std::shared_ptr<Replica> only_ ABSL_GUARDED_BY(mu_);
  // Named replicas met so far (kept after they stop answering, so calls
  // for their handles can say what happened), and unnamed ones by address.
  std::map<std::string, std::shared_ptr<Replica>> by_name_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<Replica>> unnamed_ ABSL_GUARDED_BY(mu_);
  // Channels by "address|tls name".
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace materializer::client

#endif  // MATERIALIZER_CLIENT_REPLICA_SET_H_
