#include "server/engine/engine.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "google/protobuf/text_format.h"
#include "server/delivery/digest.h"
#include "tests/testing/status_matchers.h"

namespace materializer::engine {
namespace {

using ::materializer::testing::IsOk;
using ::materializer::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

template <typename T>
T Parse(const std::string& text) {
  T message;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &message))
      << text;
  return message;
}

constexpr char kSmallModel[] = R"pb(
  model {
    tensors { name: "fc.weight" shape: [ 64, 32 ] dtype: "float32" }
    tensors { name: "fc.bias" shape: [ 64 ] dtype: "float32" }
    tensors {
      name: "rope.inv_freq"
      shape: [ 16 ]
      dtype: "float32"
      kind: TENSOR_KIND_BUFFER
      persistent: false
    }
    init_rules {
      pattern: "*.bias"
      init { zeros {} }
    }
    init_rules {
      pattern: "*"
      init { normal { std: 0.02 } }
    }
    seed: 7
  }
)pb";

class EngineTest : public ::testing::Test {
 protected:
  explicit EngineTest(uint64_t capacity = uint64_t{1} << 30) {
    memory::DeviceConfig cpu;
    cpu.name = "cpu";
    cpu.capacity_bytes = capacity;
    pool_ = memory::DevicePool::Create({cpu}).value();
    workers_ = std::make_unique<ThreadPool>(1);
    engine_ = std::make_unique<Engine>(pool_.get(), &registry_, workers_.get());
  }

  ~EngineTest() override { workers_.reset(); }  // drain before the engine

  void ExpectNothingHeld() {
    const memory::PoolSnapshot s = pool_->Snapshot();
    EXPECT_EQ(s.total.reserved_bytes, 0u);
    EXPECT_EQ(s.total.in_use_bytes, 0u);
    EXPECT_EQ(s.total.handles, 0u);
  }

  // Reads a whole fetch into one string.
  absl::StatusOr<std::string> FetchAll(const Caller& caller,
                                       const std::string& handle,
                                       uint64_t offset = 0,
                                       uint32_t chunk = 0) {
    v1::FetchRequest request;
    request.set_handle(handle);
    request.set_offset(offset);
    request.set_chunk_bytes(chunk);
    absl::StatusOr<std::unique_ptr<delivery::WeightStream>> stream =
        engine_->OpenFetch(caller, request);
    if (!stream.ok()) return stream.status();
    std::string out;
    v1::WeightChunk c;
    while (!(*stream)->done()) {
      absl::Status status = (*stream)->Next(&c);
      if (!status.ok()) return status;
      if (c.offset() != offset + out.size()) {
        return absl::InternalError("chunk out of order");
      }
      out += c.data();
    }
    return out;
  }

  const Caller alice_{"alice", "", false};
  const Caller bob_{"bob", "", false};
  std::unique_ptr<memory::DevicePool> pool_;
  registry::HandleRegistry registry_;
  std::unique_ptr<ThreadPool> workers_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineTest, PlanReportsBytesAndAllocatesNothing) {
  ASSERT_OK_AND_ASSIGN(
      v1::PlanResponse plan,
      engine_->Plan(alice_, Parse<v1::PlanRequest>(kSmallModel)));
  EXPECT_EQ(plan.tensor_bytes(), (64 * 32 + 64 + 16) * 4u);
  EXPECT_EQ(plan.arena_bytes(), 8192u + 256u + 256u);
  EXPECT_EQ(plan.largest_tensor(), "fc.weight");
  EXPECT_EQ(plan.largest_tensor_bytes(), 8192u);
  ASSERT_EQ(plan.by_dtype_size(), 1);
  EXPECT_EQ(plan.by_dtype(0).dtype(), "float32");
  EXPECT_EQ(plan.by_dtype(0).tensors(), 3u);
  EXPECT_EQ(plan.placement(), "cpu");
  ASSERT_EQ(plan.devices_size(), 1);
  EXPECT_TRUE(plan.devices(0).fits());
  EXPECT_EQ(plan.tensors(1).init(), "zeros [rule 0 \"*.bias\"]");
  ExpectNothingHeld();
  EXPECT_EQ(registry_.size(), 0u);
}

TEST_F(EngineTest, MaterializeFetchReleaseLeavesTheLedgerAtZero) {
  ASSERT_OK_AND_ASSIGN(
      v1::MaterializeResponse m,
      engine_->Materialize(alice_, Parse<v1::MaterializeRequest>(kSmallModel)));
  EXPECT_EQ(m.state(), v1::HANDLE_STATE_READY);
  EXPECT_EQ(m.device(), "cpu");
  EXPECT_EQ(m.num_tensors(), 3u);
  EXPECT_GT(m.timings().total_us(), 0u);
  EXPECT_EQ(pool_->Snapshot().total.in_use_bytes, m.arena_bytes());

  ASSERT_OK_AND_ASSIGN(std::string file, FetchAll(alice_, m.handle()));
  // Resume: any suffix equals the same suffix of the whole file, whatever
  // the chunk size.
  for (uint64_t offset : {uint64_t{0}, uint64_t{5}, uint64_t{100},
                          uint64_t{file.size() - 1}, uint64_t{file.size()}}) {
    ASSERT_OK_AND_ASSIGN(std::string part,
                         FetchAll(alice_, m.handle(), offset, 97));
    EXPECT_EQ(part, file.substr(offset)) << offset;
  }
  // The non-persistent buffer is left out by default.
  EXPECT_EQ(file.find("rope.inv_freq"), std::string::npos);
  EXPECT_NE(file.find("fc.weight"), std::string::npos);

  ASSERT_OK_AND_ASSIGN(v1::ReleaseResponse r,
                       engine_->Release(alice_, Parse<v1::ReleaseRequest>(
                                                    "handle: \"" + m.handle() +
                                                    "\"")));
  EXPECT_TRUE(r.released());
  EXPECT_EQ(r.freed_bytes(), m.arena_bytes());
  ExpectNothingHeld();
}

TEST_F(EngineTest, OtherClientsCannotSeeAHandle) {
  ASSERT_OK_AND_ASSIGN(
      v1::MaterializeResponse m,
      engine_->Materialize(alice_, Parse<v1::MaterializeRequest>(kSmallModel)));
  v1::DescribeRequest describe;
  describe.set_handle(m.handle());
  EXPECT_THAT(engine_->Describe(bob_, describe).status(),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  EXPECT_THAT(FetchAll(bob_, m.handle()).status(),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  v1::ReleaseRequest release;
  release.set_handle(m.handle());
  EXPECT_THAT(engine_->Release(bob_, release).status(),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  EXPECT_EQ(engine_->ListHandles(bob_).handles_size(), 0);
  EXPECT_EQ(engine_->GetStats(bob_).clients_size(), 0);
  EXPECT_EQ(engine_->ListHandles(alice_).handles_size(), 1);
  EXPECT_THAT(engine_->Describe(alice_, describe), IsOk());
}

TEST_F(EngineTest, FetchWhileStillMetaIsFailedPrecondition) {
  // Occupy the only worker so the async materialization has to wait.
  absl::Notification unblock;
  workers_->Schedule([&] { unblock.WaitForNotification(); });
  v1::MaterializeRequest request = Parse<v1::MaterializeRequest>(kSmallModel);
  request.set_async(true);
  ASSERT_OK_AND_ASSIGN(v1::MaterializeResponse m,
                       engine_->Materialize(alice_, request));
  EXPECT_EQ(m.state(), v1::HANDLE_STATE_MATERIALIZING);
  // Reserved, not yet in use.
  EXPECT_EQ(pool_->Snapshot().total.reserved_bytes, m.arena_bytes());

  EXPECT_THAT(FetchAll(alice_, m.handle()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("still materializing"),
                             HasSubstr("meta tensors"))));
  v1::DescribeRequest describe;
  describe.set_handle(m.handle());
  ASSERT_OK_AND_ASSIGN(v1::HandleInfo info, engine_->Describe(alice_, describe));
  EXPECT_EQ(info.state(), v1::HANDLE_STATE_MATERIALIZING);
  EXPECT_EQ(info.tensors(0).device(), "meta");

  unblock.Notify();
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (engine_->Describe(alice_, describe)->state() !=
             v1::HANDLE_STATE_READY &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_OK_AND_ASSIGN(info, engine_->Describe(alice_, describe));
  EXPECT_EQ(info.state(), v1::HANDLE_STATE_READY);
  EXPECT_EQ(info.tensors(0).device(), "cpu");
  EXPECT_THAT(FetchAll(alice_, m.handle()), IsOk());
}

// A model no machine can map: 2^50 bytes passes any capacity check we set
// but exceeds the 47-bit user address space.
constexpr char kUnmappable[] = R"pb(
  model {
    tensors { name: "huge" shape: [ 1125899906842624 ] dtype: "uint8" }
    init_rules {
      pattern: "*"
      init { zeros {} }
    }
  }
)pb";

class HugeCapacityEngineTest : public EngineTest {
 protected:
  HugeCapacityEngineTest() : EngineTest(uint64_t{1} << 62) {}
};

TEST_F(HugeCapacityEngineTest, AllocationFailureRollsBackCompletely) {
  EXPECT_THAT(
      engine_->Materialize(alice_, Parse<v1::MaterializeRequest>(kUnmappable))
          .status(),
      StatusIs(absl::StatusCode::kResourceExhausted,
               HasSubstr("cannot map")));
  ExpectNothingHeld();
  EXPECT_EQ(registry_.size(), 0u);
}

TEST_F(HugeCapacityEngineTest, AsyncFailureLeavesAFailedHandleHoldingNothing) {
  v1::MaterializeRequest request = Parse<v1::MaterializeRequest>(kUnmappable);
  request.set_async(true);
  ASSERT_OK_AND_ASSIGN(v1::MaterializeResponse m,
                       engine_->Materialize(alice_, request));
  v1::DescribeRequest describe;
  describe.set_handle(m.handle());
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (engine_->Describe(alice_, describe)->state() ==
             v1::HANDLE_STATE_MATERIALIZING &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_OK_AND_ASSIGN(v1::HandleInfo info, engine_->Describe(alice_, describe));
  EXPECT_EQ(info.state(), v1::HANDLE_STATE_FAILED);
  EXPECT_THAT(info.error(), HasSubstr("cannot map"));
  EXPECT_THAT(FetchAll(alice_, m.handle()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("materialization failed"),
                             HasSubstr("meta tensors"))));
  ExpectNothingHeld();
  v1::ReleaseRequest release;
  release.set_handle(m.handle());
  ASSERT_OK_AND_ASSIGN(v1::ReleaseResponse r, engine_->Release(alice_, release));
  EXPECT_TRUE(r.released());
  EXPECT_EQ(r.freed_bytes(), 0u);
}

TEST_F(EngineTest, ReleaseDuringAsyncMaterializationFreesWhenItFinishes) {
  absl::Notification unblock;
  workers_->Schedule([&] { unblock.WaitForNotification(); });
  v1::MaterializeRequest request = Parse<v1::MaterializeRequest>(kSmallModel);
  request.set_async(true);
  ASSERT_OK_AND_ASSIGN(v1::MaterializeResponse m,
                       engine_->Materialize(alice_, request));
  v1::ReleaseRequest release;
  release.set_handle(m.handle());
  ASSERT_OK_AND_ASSIGN(v1::ReleaseResponse r, engine_->Release(alice_, release));
  EXPECT_EQ(r.freed_bytes(), m.arena_bytes());
  unblock.Notify();
  workers_.reset();  // wait for the worker to finish
  ExpectNothingHeld();
}

TEST_F(EngineTest, UnknownFormatAndOffsetPastTheEnd) {
  ASSERT_OK_AND_ASSIGN(
      v1::MaterializeResponse m,
      engine_->Materialize(alice_, Parse<v1::MaterializeRequest>(kSmallModel)));
  v1::FetchRequest fetch;
  fetch.set_handle(m.handle());
  fetch.set_format(static_cast<v1::WeightFormat>(42));
  EXPECT_THAT(engine_->OpenFetch(alice_, fetch).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("format")));
  EXPECT_THAT(FetchAll(alice_, m.handle(), 1u << 30).status(),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("offset")));
}

TEST_F(EngineTest, TensorDigestsFollowTheBytesWithoutAFileHash) {
  ASSERT_OK_AND_ASSIGN(
      v1::MaterializeResponse m,
      engine_->Materialize(alice_, Parse<v1::MaterializeRequest>(kSmallModel)));
  v1::FetchRequest fetch;
  fetch.set_handle(m.handle());
  fetch.set_format(v1::WEIGHT_FORMAT_RAW);
  fetch.set_digest(v1::FETCH_DIGEST_TENSORS);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<delivery::WeightStream> stream,
                       engine_->OpenFetch(alice_, fetch));
  std::string data;
  std::vector<std::pair<std::string, std::string>> sent;
  v1::WeightChunk chunk;
  while (!stream->done()) {
    ASSERT_OK(stream->Next(&chunk));
    EXPECT_EQ(chunk.digest(), "");
    data += chunk.data();
    for (const v1::TensorDigest& d : chunk.tensor_digests()) {
      sent.emplace_back(d.name(), d.digest());
    }
  }
  // Each tensor's digest is of its bytes in what was sent, in file order.
  ASSERT_OK_AND_ASSIGN(v1::FileLayout layout,
                       engine_->DescribeFile(alice_, fetch));
  EXPECT_EQ(layout.digest(), "") << "DescribeFile hashed the file";
  ASSERT_EQ(static_cast<int>(sent.size()), layout.entries_size());
  ASSERT_EQ(data.size(), layout.total_bytes());
  for (int k = 0; k < layout.entries_size(); ++k) {
    const v1::FileEntry& entry = layout.entries(k);
    const std::string expected = delivery::FormatDigest(
        delivery::HashBytes(data.data() + entry.offset(), entry.nbytes()));
    EXPECT_EQ(sent[k].first, entry.name());
    EXPECT_EQ(sent[k].second, expected) << entry.name();
    EXPECT_EQ(entry.digest(), expected) << entry.name();
  }
  // Neither the stream nor DescribeFile made a pass for a file digest; a
  // fetch that asks for one does.
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<registry::Handle> handle,
                       registry_.Get("alice", m.handle()));
  EXPECT_EQ(handle->num_file_digests(), 0u);
  fetch.set_digest(v1::FETCH_DIGEST_FILE);
  ASSERT_OK_AND_ASSIGN(v1::FileLayout with_file,
                       engine_->DescribeFile(alice_, fetch));
  EXPECT_EQ(with_file.digest(), delivery::FormatDigest(delivery::HashBytes(
                                    data.data(), data.size())));
  EXPECT_EQ(handle->num_file_digests(), 1u);

  // A fetch dropped right after it opened stops its digest computation
  // (the stream's end joins it) and holds nothing afterwards.
  fetch.set_digest(v1::FETCH_DIGEST_TENSORS);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<delivery::WeightStream> dropped,
                       engine_->OpenFetch(alice_, fetch));
  dropped.reset();

  fetch.set_digest(static_cast<v1::FetchDigest>(9));
  EXPECT_THAT(engine_->OpenFetch(alice_, fetch).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("digest: unknown value 9")));
  EXPECT_THAT(engine_->DescribeFile(alice_, fetch).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("digest: unknown value 9")));
}

}  // namespace
}  // namespace materializer::engine
