// End to end through gRPC: materialize the GPT-2-small example (124M
// parameters), fetch it, parse the safetensors bytes, check every tensor,
// release, and check that the ledger is back to zero.

#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "server/init/seed.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_server.h"

namespace materializer {
namespace {

using testing::TestServer;

struct FileTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Parses a safetensors file: header JSON -> name -> entry; *data_start is
// the offset of the data section.
std::map<std::string, FileTensor> ParseSafetensors(const std::string& file,
                                                   size_t* data_start) {
  std::map<std::string, FileTensor> out;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) {
    n = (n << 8) | static_cast<unsigned char>(file[i]);
  }
  EXPECT_EQ((8 + n) % 8, 0u) << "header not 8-aligned";
  google::protobuf::Struct header;
  const auto status = google::protobuf::util::JsonStringToMessage(
      file.substr(8, n), &header);
  EXPECT_TRUE(status.ok()) << status.ToString();
  for (const auto& [name, value] : header.fields()) {
    if (name == "__metadata__") continue;
    const auto& fields = value.struct_value().fields();
    FileTensor t;
    t.dtype = fields.at("dtype").string_value();
    for (const auto& d : fields.at("shape").list_value().values()) {
      t.shape.push_back(static_cast<int64_t>(d.number_value()));
    }
    t.begin = static_cast<uint64_t>(
        fields.at("data_offsets").list_value().values(0).number_value());
    t.end = static_cast<uint64_t>(
        fields.at("data_offsets").list_value().values(1).number_value());
    out[name] = t;
  }
  *data_start = 8 + n;
  return out;
}

TEST(EndToEndTest, Gpt2SmallMaterializeFetchRelease) {
  TestServer server;
  auto stub = server.Stub();

  v1::MaterializeRequest request;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  testing::ReadRunfile("examples/gpt2-small.json"), &request)
                  .ok());
  // 148 parameters plus lm_head.weight, tied to transformer.wte.weight.
  ASSERT_EQ(request.model().tensors_size(), 149);

  v1::MaterializeResponse materialized;
  {
    grpc::ClientContext context;
    TestServer::Identify(context, "trainer");
    grpc::Status status = stub->Materialize(&context, request, &materialized);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  EXPECT_EQ(materialized.state(), v1::HANDLE_STATE_READY);
  EXPECT_EQ(materialized.num_tensors(), 149u);
  EXPECT_EQ(materialized.tensor_bytes(), 124439808u * 4u);  // tie counted once
  EXPECT_EQ(server.Stats("trainer").in_use_bytes(), materialized.arena_bytes());

  // Fetch in default-sized chunks; they must arrive in order and add up.
  std::string file;
  {
    grpc::ClientContext context;
    TestServer::Identify(context, "trainer");
    v1::FetchRequest fetch;
    fetch.set_handle(materialized.handle());
    auto reader = stub->FetchWeights(&context, fetch);
    v1::WeightChunk chunk;
    uint64_t total = 0;
    while (reader->Read(&chunk)) {
      ASSERT_EQ(chunk.offset(), file.size());
      ASSERT_LE(chunk.data().size(), (4u << 20) - (4u << 10));
      total = chunk.total_bytes();
      file += chunk.data();
    }
    grpc::Status status = reader->Finish();
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(file.size(), total);
  }

  size_t data_start = 0;
  const std::map<std::string, FileTensor> tensors =
      ParseSafetensors(file, &data_start);
  ASSERT_EQ(tensors.size(), 149u);
  uint64_t covered = 0;
  for (const v1::TensorSpec& spec : request.model().tensors()) {
    SCOPED_TRACE(spec.name());
    ASSERT_EQ(tensors.count(spec.name()), 1u);
    const FileTensor& t = tensors.at(spec.name());
    EXPECT_EQ(t.dtype, "F32");
    EXPECT_EQ(t.shape, std::vector<int64_t>(spec.shape().begin(),
                                            spec.shape().end()));
    const uint64_t numel = (t.end - t.begin) / 4;
    covered += t.end - t.begin;
    at::Tensor values =
        at::from_blob(file.data() + data_start + t.begin,
                      {static_cast<int64_t>(numel)}, at::kFloat)
            .clone();
    const std::string& name = spec.name();
    if (name.find(".ln_") != std::string::npos &&
        name.find(".weight") != std::string::npos) {
      EXPECT_TRUE(values.eq(1).all().item<bool>());
    } else if (name.size() > 5 && name.substr(name.size() - 5) == ".bias") {
      EXPECT_TRUE(values.eq(0).all().item<bool>());
    } else {
      // normal(0, 0.02): the mean's standard error is 0.02 / sqrt(numel).
      const double se = 0.02 / std::sqrt(static_cast<double>(numel));
      EXPECT_NEAR(values.mean().item<double>(), 0.0, 6 * se);
      EXPECT_NEAR(values.std().item<double>(), 0.02, 0.02 * 0.01 + 6 * se);
    }
  }
  // No gaps, no overlap; the tied lm_head is written as its own copy.
  EXPECT_EQ(covered, (124439808u + 50257u * 768u) * 4u);
  {
    const FileTensor& wte = tensors.at("transformer.wte.weight");
    const FileTensor& head = tensors.at("lm_head.weight");
    EXPECT_EQ(std::memcmp(file.data() + data_start + wte.begin,
                          file.data() + data_start + head.begin,
                          wte.end - wte.begin),
              0);
  }

  // One tensor bit for bit against torch with the documented seed.
  {
    const FileTensor& t = tensors.at("transformer.h.0.attn.c_attn.weight");
    at::Generator g = at::make_generator<at::CPUGeneratorImpl>();
    g.set_current_seed(init::DeriveSeed(request.model().seed(),
                                        "transformer.h.0.attn.c_attn.weight"));
    at::Tensor expected = at::empty({768, 2304}, at::kFloat).normal_(0, 0.02, g);
    EXPECT_EQ(std::memcmp(file.data() + data_start + t.begin,
                          expected.const_data_ptr(), t.end - t.begin),
              0);
  }

  v1::ReleaseResponse released;
  {
    grpc::ClientContext context;
    TestServer::Identify(context, "trainer");
    v1::ReleaseRequest release;
    release.set_handle(materialized.handle());
    ASSERT_TRUE(stub->Release(&context, release, &released).ok());
  }
  EXPECT_EQ(released.freed_bytes(), materialized.arena_bytes());
  EXPECT_TRUE(TestServer::AllZero(server.Stats("trainer")))
      << server.Stats("trainer").DebugString();
}

}  // namespace
}  // namespace materializer
