#include "client/client.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "materializer/v1/materializer.grpc.pb.h"
#include "tests/testing/status_matchers.h"

namespace materializer::client {
namespace {

using ::materializer::testing::IsOk;
using ::materializer::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::Eq;
using ::testing::HasSubstr;

// How the fake's FetchWeights misbehaves.
enum class Fault {
  kNone,
  kWrongStart,     // first chunk one byte after the requested offset
  kGap,            // skips a byte after the first chunk
  kTotalChanges,   // total_bytes grows by one in the second chunk
  kPastEnd,        // claims a total smaller than the data it sends
  kStopsEarly,     // ends OK after three chunks
  kNoChunks,       // ends OK without a chunk
  kHoldForCancel,  // after three chunks, repeats the third until cancelled
  kBadDigest,      // the last chunk's digest is of other bytes
  kNoDigest,       // the last chunk carries no digest
};

// An in-memory Materializer: one handle "h-1" whose file is `file`, and
// enough of every other RPC to check the client's wiring. Records what the
// last fetch asked for.
//
// Thread-safe.
class FakeMaterializer final : public v1::Materializer::Service {
 public:
  void SetFile(std::string file) {
    absl::MutexLock lock(&mu_);
    file_ = std::move(file);
  }
  void SetFault(Fault fault) {
    absl::MutexLock lock(&mu_);
    fault_ = fault;
  }
  v1::FetchRequest last_fetch() {
    absl::MutexLock lock(&mu_);
    return last_fetch_;
  }
  // Set once a kHoldForCancel fetch ends: whether it saw the cancellation.
  absl::Notification& held_fetch_done() { return held_fetch_done_; }
  bool held_fetch_saw_cancel() {
    absl::MutexLock lock(&mu_);
    return held_fetch_saw_cancel_;
  }

  grpc::Status Plan(grpc::ServerContext* context,
                    const v1::PlanRequest* request,
                    v1::PlanResponse* response) override {
    for (const v1::TensorSpec& tensor : request->model().tensors()) {
      response->add_tensors()->set_name(tensor.name());
    }
    response->set_placement(request->placement().device());
    return grpc::Status::OK;
  }

  grpc::Status Materialize(grpc::ServerContext* context,
                           const v1::MaterializeRequest* request,
                           v1::MaterializeResponse* response) override {
    if (request->model().tensors().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "model.tensors: the model has no tensors");
    }
    response->set_handle("h-1");
    response->set_num_tensors(request->model().tensors_size());
    response->set_state(request->async() ? v1::HANDLE_STATE_MATERIALIZING
                                         : v1::HANDLE_STATE_READY);
    return grpc::Status::OK;
  }

  grpc::Status Describe(grpc::ServerContext* context,
                        const v1::DescribeRequest* request,
                        v1::HandleInfo* response) override {
    if (request->handle() != "h-1") {
      return grpc::Status(
          grpc::StatusCode::NOT_FOUND,
          absl::StrCat("handle ", request->handle(), " not found"));
    }
    response->set_handle("h-1");
    response->set_owner(Identity(*context));
    return grpc::Status::OK;
  }

  grpc::Status Release(grpc::ServerContext* context,
                       const v1::ReleaseRequest* request,
                       v1::ReleaseResponse* response) override {
    response->set_released(request->handle() == "h-1");
    response->set_freed_bytes(response->released() ? 4096 : 0);
    return grpc::Status::OK;
  }

  grpc::Status ListHandles(grpc::ServerContext* context,
                           const v1::ListHandlesRequest* request,
                           v1::ListHandlesResponse* response) override {
    response->add_handles()->set_handle("h-1");
    return grpc::Status::OK;
  }

  grpc::Status GetStats(grpc::ServerContext* context,
                        const v1::GetStatsRequest* request,
                        v1::GetStatsResponse* response) override {
    response->add_devices()->set_device("cpu");
    response->add_clients()->set_client(Identity(*context));
    return grpc::Status::OK;
  }

  grpc::Status FetchWeights(
      grpc::ServerContext* context, const v1::FetchRequest* request,
      grpc::ServerWriter<v1::WeightChunk>* writer) override {
    std::string file;
    Fault fault;
    {
      absl::MutexLock lock(&mu_);
      last_fetch_ = *request;
      file = file_;
      fault = fault_;
    }
    if (request->handle() != "h-1") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such handle");
    }
    if (request->offset() > file.size()) {
      return grpc::Status(
          grpc::StatusCode::OUT_OF_RANGE,
          absl::StrCat("offset ", request->offset(), " is past the end of the ",
                       file.size(), "-byte file"));
    }
    if (fault == Fault::kNoChunks) return grpc::Status::OK;
    const uint64_t chunk_bytes =
        request->chunk_bytes() == 0 ? 1024 : request->chunk_bytes();
    uint64_t position = request->offset();
    if (fault == Fault::kWrongStart) ++position;
    int sent = 0;
    do {
      v1::WeightChunk chunk;
      chunk.set_offset(position);
      chunk.set_data(file.substr(position, chunk_bytes));
      chunk.set_total_bytes(file.size());
      if (fault == Fault::kTotalChanges && sent == 1) {
        chunk.set_total_bytes(file.size() + 1);
      }
      if (fault == Fault::kPastEnd) chunk.set_total_bytes(position + 1);
      if (position + chunk.data().size() == file.size()) {
        const std::string hashed =
            fault == Fault::kBadDigest ? file + "!" : file;
        if (fault != Fault::kNoDigest) {
          chunk.set_digest(delivery::FormatDigest(
              delivery::HashBytes(hashed.data(), hashed.size())));
        }
      }
      if (!writer->Write(chunk)) {
        // The client may cancel while the first chunks are still in flight.
        if (fault == Fault::kHoldForCancel) EndHeldFetch(context, true);
        return grpc::Status(grpc::StatusCode::CANCELLED, "write failed");
      }
      position += chunk.data().size();
      if (fault == Fault::kGap && sent == 0) ++position;
      ++sent;
      if (sent == 3 && fault == Fault::kStopsEarly) return grpc::Status::OK;
      if (sent == 3 && fault == Fault::kHoldForCancel) {
        // Keep writing (the same chunk) until the cancel shows, either as a
        // failed write or on the context.
        const absl::Time give_up = absl::Now() + absl::Seconds(50);
        bool write_failed = false;
        while (!context->IsCancelled() && absl::Now() < give_up) {
          if (!writer->Write(chunk)) {
            write_failed = true;
            break;
          }
          absl::SleepFor(absl::Milliseconds(5));
        }
        EndHeldFetch(context, write_failed);
        return grpc::Status::OK;
      }
    } while (position < file.size());
    return grpc::Status::OK;
  }

 private:
  // A failed write after the client stopped reading is the cancel, seen
  // from the stream.
  void EndHeldFetch(grpc::ServerContext* context, bool write_failed) {
    absl::MutexLock lock(&mu_);
    held_fetch_saw_cancel_ = write_failed || context->IsCancelled();
    held_fetch_done_.Notify();
  }

  static std::string Identity(const grpc::ServerContext& context) {
    const auto& metadata = context.client_metadata();
    const auto it = metadata.find(kClientMetadataKey);
    if (it == metadata.end()) return "anonymous";
    return std::string(it->second.data(), it->second.size());
  }

  absl::Mutex mu_;
  // Guards file_, fault_, last_fetch_ and held_fetch_saw_cancel_.
  std::string file_ ABSL_GUARDED_BY(mu_);
  Fault fault_ ABSL_GUARDED_BY(mu_) = Fault::kNone;
  v1::FetchRequest last_fetch_ ABSL_GUARDED_BY(mu_);
  bool held_fetch_saw_cancel_ ABSL_GUARDED_BY(mu_) = false;
  absl::Notification held_fetch_done_;
};

// 10000 bytes that differ at every position within a 251-byte cycle, so a
// misplaced chunk shows up in the contents.
std::string TestFile() {
  std::string file(10000, '\0');
  for (size_t i = 0; i < file.size(); ++i) file[i] = static_cast<char>(i % 251);
  return file;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteAll(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);
    fake_.SetFile(TestFile());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    target_ = absl::StrCat("127.0.0.1:", port);
    client_ = Connect("");
    ASSERT_NE(client_, nullptr);

    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = tmp != nullptr ? tmp : "/tmp";
  }

  void TearDown() override { server_->Shutdown(); }

  std::unique_ptr<Client> Connect(const std::string& name) {
    ClientOptions options;
    options.target = target_;
    options.client_name = name;
    options.session = false;  // the fake server has no Attach
    options.timeout = absl::Seconds(30);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    EXPECT_THAT(client, IsOk());
    return client.ok() ? std::move(client).value() : nullptr;
  }

  // A fresh path for this test's output file.
  std::string OutPath() const {
    const ::testing::TestInfo* info =
        ::testing::UnitTest::GetInstance()->current_test_info();
    return absl::StrCat(dir_, "/", info->name(), ".safetensors");
  }

  // Fetches h-1 from `offset`, collecting the chunks' data.
  absl::StatusOr<uint64_t> FetchAll(uint64_t offset, uint32_t chunk_bytes,
                                    std::string* data, int* chunks = nullptr) {
    v1::FetchRequest request;
    request.set_handle("h-1");
    request.set_offset(offset);
    request.set_chunk_bytes(chunk_bytes);
    absl::StatusOr<FetchResult> result =
        client_->Fetch(request, [&](const FetchedChunk& chunk) {
          data->append(chunk.CopyData());
          if (chunks != nullptr) ++*chunks;
          return absl::OkStatus();
        });
    if (!result.ok()) return result.status();
    return result->total_bytes;
  }

  FakeMaterializer fake_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
  std::unique_ptr<Client> client_;
  std::string dir_;
};

TEST(FromGrpcStatusTest, KeepsCodeAndMessage) {
  EXPECT_OK(FromGrpcStatus(grpc::Status::OK));
  for (int code = 1; code <= 16; ++code) {
    const absl::Status status = FromGrpcStatus(
        grpc::Status(static_cast<grpc::StatusCode>(code), "why"));
    EXPECT_EQ(static_cast<int>(status.code()), code);
    EXPECT_EQ(status.message(), "why");
  }
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                        "model.tensors[3]: bad")),
            absl::InvalidArgumentError("model.tensors[3]: bad"));
}

TEST(ConnectTest, RejectsBadOptions) {
  ClientOptions empty_target;
  empty_target.target = "";
  EXPECT_THAT(Client::Connect(empty_target),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("target is empty")));

  ClientOptions bad_name;
  bad_name.client_name = "alice\n";
  EXPECT_THAT(Client::Connect(bad_name),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("printable ASCII")));

  ClientOptions no_time;
  no_time.timeout = absl::ZeroDuration();
  EXPECT_THAT(Client::Connect(no_time),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("timeout must be positive")));

  ClientOptions no_bytes;
  no_bytes.max_message_bytes = 0;
  EXPECT_THAT(Client::Connect(no_bytes),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("max_message_bytes")));
}

TEST(ConnectTest, UnreachableServerIsUnavailable) {
  ClientOptions options;
  // Port 1 on loopback: nothing listens there in a test sandbox.
  options.target = "127.0.0.1:1";
  options.session = false;
  options.timeout = absl::Seconds(5);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client,
                       Client::Connect(options));
  EXPECT_THAT(client->ListHandles(),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

TEST_F(ClientTest, SendsClientNameAsMetadata) {
  ASSERT_OK_AND_ASSIGN(const v1::HandleInfo anonymous,
                       client_->Describe("h-1"));
  EXPECT_EQ(anonymous.owner(), "anonymous");

  std::unique_ptr<Client> alice = Connect("alice");
  ASSERT_NE(alice, nullptr);
  ASSERT_OK_AND_ASSIGN(const v1::HandleInfo info, alice->Describe("h-1"));
  EXPECT_EQ(info.owner(), "alice");
  ASSERT_OK_AND_ASSIGN(const auto each, alice->GetStats());
  ASSERT_EQ(each.size(), 1u);  // one server
  ASSERT_OK_AND_ASSIGN(const v1::GetStatsResponse stats, each[0].result);
  ASSERT_EQ(stats.clients_size(), 1);
  EXPECT_EQ(stats.clients(0).client(), "alice");
}

TEST_F(ClientTest, ServerErrorsKeepCodeAndMessage) {
  EXPECT_THAT(
      client_->Describe("h-missing"),
      StatusIs(absl::StatusCode::kNotFound, Eq("handle h-missing not found")));
  EXPECT_THAT(client_->Materialize(v1::MaterializeRequest()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       Eq("model.tensors: the model has no tensors")));
}

TEST_F(ClientTest, UnaryCallsReturnTheServersResponses) {
  v1::PlanRequest plan_request;
  plan_request.mutable_model()->add_tensors()->set_name("fc.weight");
  plan_request.mutable_placement()->set_device("cpu");
  ASSERT_OK_AND_ASSIGN(const v1::PlanResponse plan,
                       client_->Plan(plan_request));
  ASSERT_EQ(plan.tensors_size(), 1);
  EXPECT_EQ(plan.tensors(0).name(), "fc.weight");
  EXPECT_EQ(plan.placement(), "cpu");

  v1::MaterializeRequest request;
  *request.mutable_model() = plan_request.model();
  request.set_async(true);
  ASSERT_OK_AND_ASSIGN(const v1::MaterializeResponse made,
                       client_->Materialize(request));
  EXPECT_EQ(made.handle(), "h-1");
  EXPECT_EQ(made.state(), v1::HANDLE_STATE_MATERIALIZING);

  ASSERT_OK_AND_ASSIGN(const HandleList list, client_->ListHandles());
  ASSERT_EQ(list.handles.handles_size(), 1);
  EXPECT_EQ(list.handles.handles(0).handle(), "h-1");
  EXPECT_TRUE(list.failed.empty());

  ASSERT_OK_AND_ASSIGN(const v1::ReleaseResponse released,
                       client_->Release("h-1"));
  EXPECT_TRUE(released.released());
  EXPECT_EQ(released.freed_bytes(), 4096u);
}

TEST_F(ClientTest, HealthNamesTheServingStatus) {
  ASSERT_OK_AND_ASSIGN(const auto serving, client_->Health());
  ASSERT_EQ(serving.size(), 1u);
  EXPECT_THAT(serving[0].result, IsOk());
  EXPECT_EQ(serving[0].result.value_or(""), "SERVING");
  EXPECT_EQ(serving[0].address, target_);
  server_->GetHealthCheckService()->SetServingStatus(false);
  ASSERT_OK_AND_ASSIGN(const auto not_serving, client_->Health());
  ASSERT_EQ(not_serving.size(), 1u);
  EXPECT_EQ(not_serving[0].result.value_or(""), "NOT_SERVING");
}

TEST_F(ClientTest, FetchDeliversEveryByteInOrder) {
  std::string data;
  int chunks = 0;
  ASSERT_OK_AND_ASSIGN(const uint64_t total, FetchAll(0, 1024, &data, &chunks));
  EXPECT_EQ(total, 10000u);
  EXPECT_EQ(chunks, 10);
  EXPECT_EQ(data, TestFile());
}

TEST_F(ClientTest, FetchFromAnOffsetReturnsTheWholeFileSize) {
  std::string data;
  ASSERT_OK_AND_ASSIGN(const uint64_t total, FetchAll(5000, 4096, &data));
  EXPECT_EQ(total, 10000u);
  EXPECT_EQ(data, TestFile().substr(5000));
}

TEST_F(ClientTest, FetchAtTheEndGetsOneEmptyChunk) {
  std::string data;
  int chunks = 0;
  ASSERT_OK_AND_ASSIGN(const uint64_t total,
                       FetchAll(10000, 0, &data, &chunks));
  EXPECT_EQ(total, 10000u);
  EXPECT_EQ(chunks, 1);
  EXPECT_EQ(data, "");
}

TEST_F(ClientTest, FetchPastTheEndIsTheServersError) {
  std::string data;
  EXPECT_THAT(FetchAll(10001, 0, &data),
              StatusIs(absl::StatusCode::kOutOfRange,
                       Eq("offset 10001 is past the end of the 10000-byte "
                          "file")));
}

TEST_F(ClientTest, FetchRejectsStreamsThatAreNotContiguous) {
  struct Case {
    Fault fault;
    std::string message;
    int chunks_accepted;
  };
  const std::vector<Case> cases = {
      {Fault::kWrongStart,
       "fetch of h-1: the first chunk starts at byte 1001, but the fetch "
       "asked for byte 1000",
       0},
      {Fault::kGap,
       "fetch of h-1: a chunk starts at byte 2025, but the previous one ended "
       "at byte 2024",
       1},
      {Fault::kTotalChanges,
       "fetch of h-1: total_bytes changed from 10000 to 10001 at byte 2024", 1},
      {Fault::kPastEnd,
       "fetch of h-1: the chunk of 1024 bytes at byte 1000 runs past the end "
       "of the 1001-byte file",
       0},
      {Fault::kStopsEarly,
       "fetch of h-1: the stream ended at byte 4072 of 10000", 3},
      {Fault::kNoChunks,
       "fetch of h-1: the server ended the stream without sending a chunk", 0},
  };
  for (const Case& c : cases) {
    fake_.SetFault(c.fault);
    std::string data;
    int chunks = 0;
    EXPECT_THAT(FetchAll(1000, 1024, &data, &chunks),
                StatusIs(absl::StatusCode::kDataLoss, Eq(c.message)));
    // The bad chunk never reaches the callback.
    EXPECT_EQ(chunks, c.chunks_accepted) << c.message;
    EXPECT_EQ(data, TestFile().substr(1000, 1024 * c.chunks_accepted))
        << c.message;
  }
}

TEST_F(ClientTest, CallbackErrorCancelsTheCallAndIsReturnedUnchanged) {
  fake_.SetFault(Fault::kHoldForCancel);
  v1::FetchRequest request;
  request.set_handle("h-1");
  request.set_chunk_bytes(100);
  int chunks = 0;
  const absl::StatusOr<FetchResult> total =
      client_->Fetch(request, [&](const FetchedChunk& chunk) {
        if (++chunks == 2) return absl::ResourceExhaustedError("disk full");
        return absl::OkStatus();
      });
  EXPECT_THAT(total,
              StatusIs(absl::StatusCode::kResourceExhausted, Eq("disk full")));
  EXPECT_EQ(chunks, 2);
  // The server learns of the cancel, rather than streaming on until the
  // deadline.
  ASSERT_TRUE(fake_.held_fetch_done().WaitForNotificationWithTimeout(
      absl::Seconds(60)));
  EXPECT_TRUE(fake_.held_fetch_saw_cancel());
}

TEST_F(ClientTest, ConcurrentCallsShareOneClient) {
  std::vector<std::thread> threads;
  std::vector<std::string> data(8);
  std::vector<absl::Status> statuses(8);
  for (size_t i = 0; i < data.size(); ++i) {
    threads.emplace_back(
        [&, i] { statuses[i] = FetchAll(0, 512, &data[i]).status(); });
  }
  for (std::thread& thread : threads) thread.join();
  for (size_t i = 0; i < data.size(); ++i) {
    EXPECT_OK(statuses[i]);
    EXPECT_EQ(data[i], TestFile());
  }
}

TEST_F(ClientTest, FetchToFileWritesTheFileAndReportsProgress) {
  const std::string path = OutPath();
  std::vector<std::pair<uint64_t, uint64_t>> progress;
  FetchFileOptions options;
  options.chunk_bytes = 4096;
  options.include_non_persistent = true;
  options.progress = [&](uint64_t done, uint64_t total) {
    progress.emplace_back(done, total);
  };
  ASSERT_OK(FetchToFile(*client_, "h-1", path, options));
  EXPECT_EQ(ReadAll(path), TestFile());
  EXPECT_FALSE(Exists(path + ".partial"));
  EXPECT_THAT(progress, ElementsAre(std::make_pair(0u, 10000u),
                                    std::make_pair(4096u, 10000u),
                                    std::make_pair(8192u, 10000u),
                                    std::make_pair(10000u, 10000u)));
  const v1::FetchRequest request = fake_.last_fetch();
  EXPECT_EQ(request.handle(), "h-1");
  EXPECT_EQ(request.format(), v1::WEIGHT_FORMAT_SAFETENSORS);
  EXPECT_EQ(request.offset(), 0u);
  EXPECT_EQ(request.chunk_bytes(), 4096u);
  EXPECT_TRUE(request.include_non_persistent());
}

TEST_F(ClientTest, FetchToFileResumesFromThePartialFile) {
  const std::string path = OutPath();
  WriteAll(path + ".partial", TestFile().substr(0, 4000));
  std::vector<std::pair<uint64_t, uint64_t>> progress;
  FetchFileOptions options;
  options.resume = true;
  options.chunk_bytes = 4000;
  options.progress = [&](uint64_t done, uint64_t total) {
    progress.emplace_back(done, total);
  };
  ASSERT_OK(FetchToFile(*client_, "h-1", path, options));
  EXPECT_EQ(fake_.last_fetch().offset(), 4000u);
  EXPECT_EQ(ReadAll(path), TestFile());
  EXPECT_FALSE(Exists(path + ".partial"));
  EXPECT_THAT(progress, ElementsAre(std::make_pair(4000u, 10000u),
                                    std::make_pair(8000u, 10000u),
                                    std::make_pair(10000u, 10000u)));
}

TEST_F(ClientTest, FetchToFileWithoutResumeStartsOver) {
  const std::string path = OutPath();
  WriteAll(path + ".partial", std::string(20000, 'x'));
  ASSERT_OK(FetchToFile(*client_, "h-1", path, FetchFileOptions()));
  EXPECT_EQ(fake_.last_fetch().offset(), 0u);
  EXPECT_EQ(ReadAll(path), TestFile());
}

TEST_F(ClientTest, FetchToFileKeepsThePartialFileForALaterResume) {
  const std::string path = OutPath();
  fake_.SetFault(Fault::kStopsEarly);
  FetchFileOptions options;
  options.chunk_bytes = 1000;
  EXPECT_THAT(FetchToFile(*client_, "h-1", path, options),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("ended at byte 3000 of 10000")));
  EXPECT_FALSE(Exists(path));
  EXPECT_EQ(ReadAll(path + ".partial"), TestFile().substr(0, 3000));

  fake_.SetFault(Fault::kNone);
  options.resume = true;
  ASSERT_OK(FetchToFile(*client_, "h-1", path, options));
  EXPECT_EQ(fake_.last_fetch().offset(), 3000u);
  EXPECT_EQ(ReadAll(path), TestFile());
}

TEST_F(ClientTest, FetchToFileResumeFromAPartialFileLongerThanTheFile) {
  const std::string path = OutPath();
  WriteAll(path + ".partial", std::string(12000, 'x'));
  FetchFileOptions options;
  options.resume = true;
  EXPECT_THAT(FetchToFile(*client_, "h-1", path, options),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("which holds 12000 bytes: it is not a prefix "
                                 "of this handle's file")));
  EXPECT_FALSE(Exists(path));
}

TEST_F(ClientTest, FetchToFileOfAnUnknownHandleLeavesNoFileBehind) {
  const std::string path = OutPath();
  EXPECT_THAT(FetchToFile(*client_, "h-typo", path, FetchFileOptions()),
              StatusIs(absl::StatusCode::kNotFound, Eq("no such handle")));
  EXPECT_FALSE(Exists(path));
  EXPECT_FALSE(Exists(path + ".partial"));
}

TEST_F(ClientTest, FetchVerifiesTheDigestOfTheWholeFile) {
  v1::FetchRequest request;
  request.set_handle("h-1");
  request.set_chunk_bytes(3000);
  ASSERT_OK_AND_ASSIGN(const FetchResult good,
                       client_->Fetch(request, [](const FetchedChunk&) {
                         return absl::OkStatus();
                       }));
  EXPECT_TRUE(good.verified);
  EXPECT_EQ(good.digest, delivery::FormatDigest(delivery::HashBytes(
                             TestFile().data(), TestFile().size())));

  fake_.SetFault(Fault::kBadDigest);
  EXPECT_THAT(
      client_->Fetch(request,
                     [](const FetchedChunk&) { return absl::OkStatus(); }),
      StatusIs(absl::StatusCode::kDataLoss,
               HasSubstr("but the server's is xxh3-128:")));
  fake_.SetFault(Fault::kNoDigest);
  EXPECT_THAT(
      client_->Fetch(request,
                     [](const FetchedChunk&) { return absl::OkStatus(); }),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("sent no digest")));
}

TEST_F(ClientTest, FetchFromAnOffsetVerifiesOnlyWithThePrefixDigest) {
  v1::FetchRequest request;
  request.set_handle("h-1");
  request.set_offset(4000);
  auto ignore = [](const FetchedChunk&) { return absl::OkStatus(); };
  ASSERT_OK_AND_ASSIGN(FetchResult unverified, client_->Fetch(request, ignore));
  EXPECT_FALSE(unverified.verified);

  delivery::Hasher prefix;
  prefix.Update(TestFile().substr(0, 4000));
  ASSERT_OK_AND_ASSIGN(FetchResult verified,
                       client_->Fetch(request, ignore, &prefix));
  EXPECT_TRUE(verified.verified);

  delivery::Hasher wrong;
  wrong.Update(std::string(4000, 'x'));
  EXPECT_THAT(client_->Fetch(request, ignore, &wrong),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("digest")));
}

TEST_F(ClientTest, FetchToFilePassesFormatAndFiltersAndReturnsTheDigest) {
  const std::string path = OutPath();
  FetchFileOptions options;
  options.format = v1::WEIGHT_FORMAT_TORCH;
  options.include = {"a.*", "b.*"};
  options.exclude = {"*.bias"};
  options.write_ties_once = true;
  ASSERT_OK_AND_ASSIGN(const FetchResult result,
                       FetchToFile(*client_, "h-1", path, options));
  EXPECT_TRUE(result.verified);
  EXPECT_EQ(result.total_bytes, 10000u);
  const v1::FetchRequest request = fake_.last_fetch();
  EXPECT_EQ(request.format(), v1::WEIGHT_FORMAT_TORCH);
  EXPECT_THAT(request.include(), ElementsAre("a.*", "b.*"));
  EXPECT_THAT(request.exclude(), ElementsAre("*.bias"));
  EXPECT_TRUE(request.write_ties_once());
}

TEST_F(ClientTest, FetchToFileRemovesAResumedFileWhoseDigestIsWrong) {
  const std::string path = OutPath();
  // A prefix of the right length with a flipped byte: the transfer looks
  // fine, only the digest can tell.
  std::string corrupt = TestFile().substr(0, 4000);
  corrupt[17] ^= 1;
  WriteAll(path + ".partial", corrupt);
  FetchFileOptions options;
  options.resume = true;
  EXPECT_THAT(FetchToFile(*client_, "h-1", path, options),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("fetch again from the start")));
  EXPECT_FALSE(Exists(path));
  EXPECT_FALSE(Exists(path + ".partial"));
}

TEST_F(ClientTest, FetchToFileReportsAnUnwritableDirectory) {
  EXPECT_THAT(
      FetchToFile(*client_, "h-1", dir_ + "/no/such/dir/out.safetensors",
                  FetchFileOptions()),
      StatusIs(absl::StatusCode::kNotFound,
               HasSubstr("opening " + dir_ +
                         "/no/such/dir/out.safetensors.partial")));
}

}  // namespace
}  // namespace materializer::client
