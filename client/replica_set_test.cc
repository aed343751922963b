// The client against several in-process fake replicas: where Materialize
// lands, where each handle call goes, how a replica that goes away is
// reported, and that the others keep serving.

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "grpcpp/grpcpp.h"
#include "materializer/v1/materializer.grpc.pb.h"
#include "server/delivery/digest.h"
#include "server/registry/handle_id.h"
#include "tests/testing/status_matchers.h"

namespace materializer::client {
namespace {

using ::materializer::testing::IsOk;
using ::materializer::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

// In a FakeReplica method: NOT_FOUND unless the replica issued `id`;
// records the call otherwise.
#define RETURN_IF_UNKNOWN(id, method)                            \
  do {                                                           \
    if (!Record(method, id)) {                                   \
      return grpc::Status(                                       \
          grpc::StatusCode::NOT_FOUND,                           \
          absl::StrCat("handle ", id, " not found on ", name_)); \
    }                                                            \
  } while (0)

// One replica: GetServerInfo with a configurable name and free bytes; it
// issues ids "h-<n>@<name>" and records every call it gets as
// "Method handle".
//
// Thread-safe.
class FakeReplica final : public v1::Materializer::Service {
 public:
  explicit FakeReplica(std::string name) : name_(std::move(name)) {}

  void SetRoom(std::vector<std::pair<std::string, uint64_t>> devices) {
    absl::MutexLock lock(&mu_);
    devices_ = std::move(devices);
  }
  void SetAdvertised(std::string address) {
    absl::MutexLock lock(&mu_);
    advertised_ = std::move(address);
  }
  std::vector<std::string> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  void ClearCalls() {
    absl::MutexLock lock(&mu_);
    calls_.clear();
  }
  // The session metadata each Materialize carried.
  std::vector<std::string> sessions_seen() {
    absl::MutexLock lock(&mu_);
    return sessions_seen_;
  }

  grpc::Status GetServerInfo(grpc::ServerContext*,
                             const v1::GetServerInfoRequest*,
                             v1::ServerInfo* info) override {
    absl::MutexLock lock(&mu_);
    calls_.push_back("GetServerInfo");
    info->set_replica(name_);
    info->set_advertised_address(advertised_);
    for (const auto& [device, free] : devices_) {
      v1::DeviceRoom* room = info->add_devices();
      room->set_device(device);
      room->set_free_bytes(free);
    }
    return grpc::Status::OK;
  }

  grpc::Status Plan(grpc::ServerContext*, const v1::PlanRequest*,
                    v1::PlanResponse* response) override {
    Record("Plan", "");
    response->set_placement(name_);
    return grpc::Status::OK;
  }

  grpc::Status Materialize(grpc::ServerContext* context,
                           const v1::MaterializeRequest*,
                           v1::MaterializeResponse* response) override {
    absl::MutexLock lock(&mu_);
    const auto session = context->client_metadata().find(kSessionMetadataKey);
    sessions_seen_.push_back(
        session == context->client_metadata().end()
            ? ""
            : std::string(session->second.data(), session->second.size()));
    const std::string id = absl::StrCat("h-", handles_.size(), "@", name_);
    handles_.push_back(id);
    calls_.push_back(absl::StrCat("Materialize ", id));
    response->set_handle(id);
    return grpc::Status::OK;
  }

  grpc::Status Describe(grpc::ServerContext*,
                        const v1::DescribeRequest* request,
                        v1::HandleInfo* response) override {
    RETURN_IF_UNKNOWN(request->handle(), "Describe");
    response->set_handle(request->handle());
    response->set_device(name_);
    return grpc::Status::OK;
  }
  grpc::Status Release(grpc::ServerContext*, const v1::ReleaseRequest* request,
                       v1::ReleaseResponse* response) override {
    RETURN_IF_UNKNOWN(request->handle(), "Release");
    response->set_released(true);
    return grpc::Status::OK;
  }
  grpc::Status Renew(grpc::ServerContext*, const v1::RenewRequest* request,
                     v1::RenewResponse*) override {
    RETURN_IF_UNKNOWN(request->handle(), "Renew");
    return grpc::Status::OK;
  }
  grpc::Status DescribeFile(grpc::ServerContext*,
                            const v1::FetchRequest* request,
                            v1::FileLayout*) override {
    RETURN_IF_UNKNOWN(request->handle(), "DescribeFile");
    return grpc::Status::OK;
  }
  grpc::Status ExportHandle(grpc::ServerContext*,
                            const v1::ExportRequest* request,
                            v1::ExportResponse* response) override {
    RETURN_IF_UNKNOWN(request->handle(), "ExportHandle");
    response->set_export_id(absl::StrCat("x-0-", request->handle()));
    return grpc::Status::OK;
  }
  grpc::Status CloseExport(grpc::ServerContext*,
                           const v1::CloseExportRequest* request,
                           v1::CloseExportResponse*) override {
    const std::string& id = request->export_id();
    RETURN_IF_UNKNOWN(id.substr(id.find("-h-") + 1), "CloseExport");
    return grpc::Status::OK;
  }
  grpc::Status FetchWeights(
      grpc::ServerContext*, const v1::FetchRequest* request,
      grpc::ServerWriter<v1::WeightChunk>* writer) override {
    RETURN_IF_UNKNOWN(request->handle(), "FetchWeights");
    // An empty file: one empty chunk with the digest of no bytes.
    v1::WeightChunk chunk;
    chunk.set_digest(delivery::FormatDigest(delivery::Hasher().Finish()));
    writer->Write(chunk);
    return grpc::Status::OK;
  }
  grpc::Status ListHandles(grpc::ServerContext*, const v1::ListHandlesRequest*,
                           v1::ListHandlesResponse* response) override {
    absl::MutexLock lock(&mu_);
    calls_.push_back("ListHandles");
    for (const std::string& id : handles_) {
      response->add_handles()->set_handle(id);
    }
    return grpc::Status::OK;
  }
  grpc::Status GetStats(grpc::ServerContext*, const v1::GetStatsRequest*,
                        v1::GetStatsResponse* response) override {
    response->add_devices()->set_device(absl::StrCat(name_, "-cpu"));
    return grpc::Status::OK;
  }
  grpc::Status Attach(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::AttachResponse, v1::AttachRequest>* stream)
      override {
    v1::AttachRequest request;
    if (!stream->Read(&request)) return grpc::Status::OK;
    v1::AttachResponse response;
    response.set_session_id(absl::StrCat("s-", name_));
    stream->Write(response);
    while (stream->Read(&request)) {
    }
    return grpc::Status::OK;
  }

 private:
  bool Record(const std::string& method, const std::string& id) {
    absl::MutexLock lock(&mu_);
    const bool known = id.empty() || std::find(handles_.begin(), handles_.end(),
                                               id) != handles_.end();
    if (known)
      calls_.push_back(id.empty() ? method : absl::StrCat(method, " ", id));
    return known;
  }

  const std::string name_;
  absl::Mutex mu_;
  // Guards every member below.
  std::vector<std::pair<std::string, uint64_t>> devices_
      ABSL_GUARDED_BY(mu_) = {{"cpu", 1000}};
  std::string advertised_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> handles_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> sessions_seen_ ABSL_GUARDED_BY(mu_);
};

struct Running {
  std::unique_ptr<FakeReplica> fake;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

Running Start(const std::string& name) {
  Running r;
  r.fake = std::make_unique<FakeReplica>(name);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(r.fake.get());
  r.server = builder.BuildAndStart();
  r.address = absl::StrCat("127.0.0.1:", port);
  return r;
}

void Stop(Running& r) {
  // Cancels the long-lived Attach streams at once.
  if (r.server == nullptr) return;
  r.server->Shutdown(std::chrono::system_clock::now());
  r.server.reset();
}

v1::MaterializeRequest Model() {
  v1::MaterializeRequest request;
  request.mutable_model()->add_tensors()->set_name("w");
  return request;
}

class ReplicaSetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"r0", "r1", "r2"})
      replicas_.push_back(Start(name));
    replicas_[0].fake->SetRoom({{"cpu", 1000}});
    replicas_[1].fake->SetRoom({{"cpu", 3000}});
    replicas_[2].fake->SetRoom({{"cpu", 2000}, {"cuda:0", 500}});
  }
  void TearDown() override {
    client_.reset();
    for (Running& r : replicas_) Stop(r);
  }

  std::string Target(std::vector<int> which = {0, 1, 2}) const {
    std::vector<std::string> addresses;
    for (int i : which) addresses.push_back(replicas_[i].address);
    return absl::StrJoin(addresses, ",");
  }

  Client& Connect(const std::string& target, bool session = false) {
    ClientOptions options;
    options.target = target;
    options.session = session;
    options.timeout = absl::Seconds(20);
    options.discovery_timeout = absl::Seconds(5);
    client_ = Client::Connect(options).value();
    return *client_;
  }

  std::vector<Running> replicas_;
  std::unique_ptr<Client> client_;
};

TEST_F(ReplicaSetTest, MaterializeGoesToTheReplicaWithTheMostRoom) {
  Client& client = Connect(Target());
  ASSERT_OK_AND_ASSIGN(v1::MaterializeResponse made,
                       client.Materialize(Model()));
  EXPECT_THAT(made.handle(), EndsWith("@r1"));

  replicas_[1].fake->SetRoom({{"cpu", 10}});
  ASSERT_OK_AND_ASSIGN(made, client.Materialize(Model()));
  EXPECT_THAT(made.handle(), EndsWith("@r2"));  // asked again each time

  v1::MaterializeRequest on_gpu = Model();
  on_gpu.mutable_placement()->set_device("cuda");
  ASSERT_OK_AND_ASSIGN(made, client.Materialize(on_gpu));
  EXPECT_THAT(made.handle(), EndsWith("@r2"));  // the only one with a GPU
  replicas_[0].fake->SetRoom({{"cpu", 1}, {"cuda:0", 900}});
  ASSERT_OK_AND_ASSIGN(made, client.Materialize(on_gpu));
  EXPECT_THAT(made.handle(), EndsWith("@r0"));

  v1::PlanRequest plan;
  plan.mutable_placement()->set_device("cpu");
  ASSERT_OK_AND_ASSIGN(v1::PlanResponse planned, client.Plan(plan));
  EXPECT_EQ(planned.placement(), "r2");  // the fake answers with its name
}

TEST_F(ReplicaSetTest, EveryCallNamingAHandleGoesToItsReplica) {
  Client& client = Connect(Target());
  const std::string on_r1 = client.Materialize(Model()).value().handle();
  replicas_[1].fake->SetRoom({{"cpu", 10}});
  const std::string on_r2 = client.Materialize(Model()).value().handle();
  ASSERT_THAT(on_r1, EndsWith("@r1"));
  ASSERT_THAT(on_r2, EndsWith("@r2"));
  for (Running& r : replicas_) r.fake->ClearCalls();

  // A fresh client knows no replica yet: it finds them from the ids.
  Client& fresh = Connect(Target());
  for (const std::string& handle : {on_r1, on_r2}) {
    ASSERT_OK_AND_ASSIGN(v1::HandleInfo info, fresh.Describe(handle));
    EXPECT_EQ(info.device(), registry::ReplicaOfId(handle));
    EXPECT_THAT(fresh.Renew(handle), IsOk());
    v1::FetchRequest fetch;
    fetch.set_handle(handle);
    EXPECT_THAT(fresh.DescribeFile(fetch), IsOk());
    EXPECT_THAT(
        fresh.Fetch(fetch,
                    [](const FetchedChunk&) { return absl::OkStatus(); }),
        IsOk());
    ASSERT_OK_AND_ASSIGN(v1::ExportResponse exported,
                         fresh.ExportHandle(handle));
    EXPECT_THAT(fresh.CloseExport(exported.export_id()), IsOk());
    EXPECT_THAT(fresh.Release(handle), IsOk());
  }
  auto handle_calls = [](FakeReplica& fake) {
    std::vector<std::string> out;
    for (const std::string& call : fake.calls()) {
      if (call != "GetServerInfo") out.push_back(call);
    }
    return out;
  };
  EXPECT_THAT(handle_calls(*replicas_[0].fake), IsEmpty());
  for (int i : {1, 2}) {
    const std::string& h = i == 1 ? on_r1 : on_r2;
    EXPECT_THAT(handle_calls(*replicas_[i].fake),
                ElementsAre("Describe " + h, "Renew " + h, "DescribeFile " + h,
                            "FetchWeights " + h, "ExportHandle " + h,
                            "CloseExport " + h, "Release " + h));
  }
  // Discovery ran once, on the first call; the rest went straight through.
  int discoveries = 0;
  for (Running& r : replicas_) {
    for (const std::string& call : r.fake->calls()) {
      discoveries += call == "GetServerInfo";
    }
  }
  EXPECT_EQ(discoveries, 3);
}

TEST_F(ReplicaSetTest, ListHandlesMergesEveryReplica) {
  Client& client = Connect(Target());
  std::vector<std::string> made;
  for (int i = 0; i < 3; ++i) {
    // Each replica in turn has the most room.
    for (int j = 0; j < 3; ++j) {
      replicas_[j].fake->SetRoom({{"cpu", j == i ? 100u : 1u}});
    }
    made.push_back(client.Materialize(Model()).value().handle());
  }
  ASSERT_OK_AND_ASSIGN(HandleList list, client.ListHandles());
  std::vector<std::string> listed;
  for (const v1::HandleSummary& h : list.handles.handles()) {
    listed.push_back(h.handle());
  }
  EXPECT_THAT(listed, UnorderedElementsAre(made[0], made[1], made[2]));
  EXPECT_THAT(list.failed, IsEmpty());
}

TEST_F(ReplicaSetTest, AReplicaThatStopsAnsweringIsNamedAndOthersKeepServing) {
  Client& client = Connect(Target());
  replicas_[1].fake->SetRoom({{"cpu", 1}});
  const std::string on_r2 = client.Materialize(Model()).value().handle();
  replicas_[2].fake->SetRoom({{"cpu", 1}});
  const std::string on_r0 = client.Materialize(Model()).value().handle();
  ASSERT_THAT(on_r2, EndsWith("@r2"));
  ASSERT_THAT(on_r0, EndsWith("@r0"));

  Stop(replicas_[2]);
  EXPECT_THAT(client.Describe(on_r2),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("replica r2 (" + replicas_[2].address +
                                 ") did not answer")));
  EXPECT_THAT(client.Describe(on_r0), IsOk());
  ASSERT_OK_AND_ASSIGN(HandleList list, client.ListHandles());
  ASSERT_EQ(list.handles.handles_size(), 1);
  EXPECT_EQ(list.handles.handles(0).handle(), on_r0);
  ASSERT_EQ(list.failed.size(), 1u);
  EXPECT_EQ(list.failed[0].address, replicas_[2].address);
  // New work goes to those that answer.
  ASSERT_OK_AND_ASSIGN(v1::MaterializeResponse made,
                       client.Materialize(Model()));
  EXPECT_THAT(made.handle(), ::testing::Not(EndsWith("@r2")));

  // A client that never met r2 cannot tell gone from silent: UNAVAILABLE.
  Client& fresh = Connect(Target());
  EXPECT_THAT(
      fresh.Describe(on_r2),
      StatusIs(absl::StatusCode::kUnavailable,
               AllOf(HasSubstr("held by replica r2"),
                     HasSubstr(replicas_[2].address + " did not answer"))));
}

TEST_F(ReplicaSetTest, AReplicaNoLongerInTheTargetIsGone) {
  Client& client = Connect(Target());
  replicas_[1].fake->SetRoom({{"cpu", 1}});
  const std::string on_r2 = client.Materialize(Model()).value().handle();
  ASSERT_THAT(on_r2, EndsWith("@r2"));
  // The Service's addresses no longer include r2 (its pod was deleted).
  Client& later = Connect(Target({0, 1}));
  EXPECT_THAT(
      later.Describe(on_r2),
      StatusIs(absl::StatusCode::kNotFound,
               AllOf(HasSubstr("held by replica r2"), HasSubstr("gone away"))));
}

TEST_F(ReplicaSetTest, EachReplicaMaterializedOnHoldsASession) {
  Client& client = Connect(Target(), /*session=*/true);
  const std::string on_r1 = client.Materialize(Model()).value().handle();
  replicas_[1].fake->SetRoom({{"cpu", 1}});
  const std::string on_r2 = client.Materialize(Model()).value().handle();
  EXPECT_THAT(replicas_[1].fake->sessions_seen(), ElementsAre("s-r1"));
  EXPECT_THAT(replicas_[2].fake->sessions_seen(), ElementsAre("s-r2"));
  EXPECT_EQ(client.SessionIdOf(on_r2).value_or(""), "s-r2");
  EXPECT_THAT(client.SessionId(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("SessionIdOf")));
}

TEST_F(ReplicaSetTest, AReplicaIsDialedAtTheAddressItAdvertises) {
  // r0 is found at one address and advertises another: a second server
  // that answers as r0 too.
  Running elsewhere = Start("r0");
  replicas_[0].fake->SetAdvertised(elsewhere.address);
  replicas_[0].fake->SetRoom({{"cpu", 1u << 20}});
  elsewhere.fake->SetAdvertised(elsewhere.address);
  Client& client = Connect(Target());
  ASSERT_OK_AND_ASSIGN(v1::MaterializeResponse made,
                       client.Materialize(Model()));
  EXPECT_EQ(made.handle(), "h-0@r0");
  EXPECT_THAT(elsewhere.fake->calls(), ElementsAre("Materialize h-0@r0"));
  Stop(elsewhere);
}

TEST(SingleServerTest, OneAddressIsUsedAsItIsWithoutDiscovery) {
  Running only = Start("r0");
  ClientOptions options;
  options.target = only.address;
  options.session = false;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client,
                       Client::Connect(options));
  ASSERT_OK_AND_ASSIGN(v1::MaterializeResponse made,
                       client->Materialize(Model()));
  EXPECT_THAT(client->Describe(made.handle()), IsOk());
  // An id naming another replica is still sent to the one server; its
  // NOT_FOUND then says which replica the id names, and which one answered.
  EXPECT_THAT(
      client->Describe("h-9@elsewhere"),
      StatusIs(absl::StatusCode::kNotFound,
               AllOf(HasSubstr("not found on r0"),
                     HasSubstr("\"h-9@elsewhere\" names replica elsewhere, "
                               "but " +
                               only.address + " is replica r0"),
                     HasSubstr("connect to elsewhere's address"))));
  EXPECT_THAT(
      only.fake->calls(),
      ElementsAre("Materialize h-0@r0", "Describe h-0@r0", "GetServerInfo"));
  // A fetch too.
  v1::FetchRequest fetch;
  fetch.set_handle("h-9@elsewhere");
  EXPECT_THAT(
      client->Fetch(fetch,
                    [](const FetchedChunk&) { return absl::OkStatus(); }),
      StatusIs(absl::StatusCode::kNotFound,
               HasSubstr("names replica elsewhere")));
  // An id of this very replica that it no longer holds: plain NOT_FOUND.
  EXPECT_THAT(client->Describe("h-7@r0"),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("not found on r0"),
                             Not(HasSubstr("names replica")))));
  client.reset();
  Stop(only);
}

}  // namespace
}  // namespace materializer::client
