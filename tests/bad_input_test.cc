// Every bad-input case of the API, through gRPC: the status code, a message
// that names the field or tensor and the reason, and a ledger that stays at
// zero (nothing allocated, nothing registered).

#include <string>
#include <vector>

#include "google/protobuf/util/json_util.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_server.h"

namespace materializer {
namespace {

using testing::TestServer;
using ::testing::HasSubstr;

struct Case {
  const char* title;
  // MaterializeRequest in proto3 JSON.
  std::string json;
  grpc::StatusCode code;
  std::vector<std::string> message_parts;
};

std::string Tensor(const std::string& name, const std::string& shape,
                   const std::string& dtype = "float32") {
  return "{\"name\": \"" + name + "\", \"shape\": " + shape +
         ", \"dtype\": \"" + dtype + "\"}";
}

std::string Model(const std::vector<std::string>& tensors,
                  const std::string& rules =
                      R"([{"pattern": "*", "init": {"zeros": {}}}])") {
  std::string joined;
  for (const std::string& t : tensors) {
    joined += (joined.empty() ? "" : ", ") + t;
  }
  return "{\"model\": {\"tensors\": [" + joined + "], \"initRules\": " + rules +
         "}}";
}

std::vector<Case> Cases() {
  std::string deep = "[";
  for (int i = 0; i < 17; ++i) deep += i ? ", 1" : "1";
  deep += "]";
  return {
      {"negative dimension",
       Model({Tensor("h.0.w", "[3, -4]")}),
       grpc::StatusCode::INVALID_ARGUMENT,
       {"model.tensors[0] (\"h.0.w\")", "shape[1] is -4"}},
      {"too many dimensions",
       Model({Tensor("deep", deep)}),
       grpc::StatusCode::INVALID_ARGUMENT,
       {"\"deep\"", "17 dimensions; the limit is 16"}},
      {"element count overflows 64 bits",
       Model({Tensor("huge", "[4294967296, 4294967296, 4]", "int8")}),
       grpc::StatusCode::INVALID_ARGUMENT,
       {"\"huge\"", "more than 2^63-1 elements"}},
      {"byte size overflows 64 bits",
       Model({Tensor("big", "[4611686018427387904]", "float32")}),
       grpc::StatusCode::INVALID_ARGUMENT,
       {"\"big\"", "more than 2^63-1 bytes"}},
      {"total above the pool's capacity",
       Model({Tensor("a", "[1073741824]"), Tensor("b", "[1073741824]")}),
       grpc::StatusCode::RESOURCE_EXHAUSTED,
       {"needs 8.00 GiB (8589934592 bytes)", "4.00 GiB (4294967296 bytes)"}},
      {"duplicate tensor names",
       Model({Tensor("w", "[1]"), Tensor("w", "[2]")}),
       grpc::StatusCode::INVALID_ARGUMENT,
       {"model.tensors[1] (\"w\")", "duplicate name", "model.tensors[0]"}},
      {"empty name",
       Model({Tensor("", "[1]")}),
       grpc::StatusCode::INVALID_ARGUMENT,
       {"model.tensors[0]", "name is empty"}},
      {"malformed name",
       Model({Tensor("a..b", "[1]")}),
       grpc::StatusCode::INVALID_ARGUMENT,
       {"\"a..b\"", "empty dot-separated component"}},
      {"unknown dtype",
       Model({Tensor("w", "[1]", "float33")}),
       grpc::StatusCode::INVALID_ARGUMENT,
       {"\"w\"", "unknown dtype \"float33\""}},
      {"std < 0",
       Model({Tensor("w", "[4]")},
             R"([{"pattern": "*", "init": {"normal": {"std": -0.5}}}])"),
       grpc::StatusCode::INVALID_ARGUMENT,
       {"model.init_rules[0] (\"*\")", "normal.std is -0.5; it must be >= 0"}},
      {"NaN parameter",
       Model({Tensor("w", "[4]")},
             R"([{"pattern": "*", "init": {"normal": {"mean": "NaN"}}}])"),
       grpc::StatusCode::INVALID_ARGUMENT,
       {"model.init_rules[0]", "normal.mean is nan; it must be finite"}},
      {"low > high",
       Model({Tensor("w", "[4]")},
             R"([{"pattern": "*", "init": {"uniform": {"a": 2, "b": 1}}}])"),
       grpc::StatusCode::INVALID_ARGUMENT,
       {"model.init_rules[0]", "a must be <= b"}},
      {"tensors no rule covers",
       Model({Tensor("a.weight", "[4]"), Tensor("a.bias", "[4]"),
              Tensor("rope.inv_freq", "[2]")},
             R"([{"pattern": "*.bias", "init": {"zeros": {}}}])"),
       grpc::StatusCode::INVALID_ARGUMENT,
       {"2 tensors have no init", "\"a.weight\", \"rope.inv_freq\""}},
      {"random init on an integer tensor",
       Model({Tensor("ids", "[4]", "int64")},
             R"([{"pattern": "*", "init": {"normal": {}}}])"),
       grpc::StatusCode::INVALID_ARGUMENT,
       {"\"ids\"", "needs a floating-point dtype"}},
      // Issue 10, item 5: cases Plan accepted and Materialize failed on
      // (INTERNAL) or filled with inf/NaN; now refused by validation.
      {"strides overflow without elements",
       Model({Tensor("w", "[0, 4294967296, 4294967296]")}),
       grpc::StatusCode::INVALID_ARGUMENT,
       {"model.tensors[0] (\"w\")", "strides of more than 2^63-1"}},
      {"xavier with a negative gain",
       Model(
           {Tensor("w", "[4, 8]")},
           R"([{"pattern": "*", "init": {"xavierUniform": {"gain": {"value": -1}}}}])"),
       grpc::StatusCode::INVALID_ARGUMENT,
       {"model.init_rules[0]",
        "xavier_uniform.gain.value is -1; it must be >= 0"}},
      {"normal std that overflows float32, torch mode",
       R"({"model": {"rng": "RNG_MODE_TORCH", "tensors": [{"name": "w",
            "shape": [4, 8], "dtype": "float32",
            "init": {"normal": {"std": 1e308}}}]}})",
       grpc::StatusCode::INVALID_ARGUMENT,
       {"model.tensors[0] (\"w\").init", "normal.mean and normal.std",
        "beyond float32's largest finite value"}},
      {"normal std that overflows float32, portable mode",
       R"({"model": {"tensors": [{"name": "w", "shape": [4, 8],
            "dtype": "float32", "init": {"normal": {"std": 1e308}}}]}})",
       grpc::StatusCode::INVALID_ARGUMENT,
       {"model.tensors[0] (\"w\").init", "normal.mean and normal.std"}},
      {"trunc_normal std that overflows, empty shard",
       R"({"model": {"tensors": [{"name": "w", "shape": [2, 8],
            "dtype": "bfloat16", "init": {"truncNormal": {"std": 1e308}},
            "shard": {"split": {"dim": 0, "index": 3, "count": 4}}}]}})",
       grpc::StatusCode::INVALID_ARGUMENT,
       {"model.tensors[0] (\"w\").init", "trunc_normal.std"}},
      {"sparse std that overflows, torch mode",
       R"({"model": {"rng": "RNG_MODE_TORCH", "tensors": [{"name": "w",
            "shape": [4, 8], "dtype": "float16",
            "init": {"sparse": {"sparsity": 0.5, "std": 1e308}}}]}})",
       grpc::StatusCode::INVALID_ARGUMENT,
       {"model.tensors[0] (\"w\").init", "sparse.std"}},
      {"portable shard of a tensor with 2^62 elements",
       R"({"model": {"tensors": [{"name": "w", "shape": ["4611686018427387904"],
            "dtype": "float8_e4m3fn", "init": {"normal": {}},
            "shard": {"box": [{"offset": 0, "length": 8}]}}]}})",
       grpc::StatusCode::INVALID_ARGUMENT,
       {"model.tensors[0] (\"w\")", "RNG_MODE_PORTABLE",
        "2^62 or more elements"}},
      // Issue 10, item 7: the documents and the server agree.
      {"name with a quote",
       Model({Tensor("a\\\"b", "[1]")}),
       grpc::StatusCode::INVALID_ARGUMENT,
       {"model.tensors[0]", "without spaces, quotes or backslashes"}},
      {"model without tensors",
       R"({"model": {"seed": "1"}})",
       grpc::StatusCode::INVALID_ARGUMENT,
       {"model.tensors: the model has no tensors"}},
      // Issue 11, item 3: init steps and literal values.
      {"values of the wrong size",
       R"({"model": {"tensors": [{"name": "w", "shape": [2, 2],
            "dtype": "float32", "init": {"values": {"data": "AAAAAA=="}}}]}})",
       grpc::StatusCode::INVALID_ARGUMENT,
       {"model.tensors[0] (\"w\").init", "values.data has 4 bytes",
        "needs 16"}},
      {"init step region out of bounds",
       R"({"model": {"tensors": [{"name": "w", "shape": [2, 2],
            "dtype": "float32", "initSteps": [{"init": {"zeros": {}}},
            {"init": {"ones": {}}, "region": [{"offset": 1, "length": 2},
                                              {"offset": 0, "length": 2}]}]}]}})",
       grpc::StatusCode::INVALID_ARGUMENT,
       {"model.tensors[0] (\"w\").init_steps[1]",
        "region[0] is offset 1 length 2"}},
      {"module_default as an init step",
       R"({"model": {"tensors": [{"name": "fc.weight", "shape": [2, 2],
            "dtype": "float32", "moduleType": "Linear",
            "initSteps": [{"init": {"moduleDefault": {}}}]}]}})",
       grpc::StatusCode::INVALID_ARGUMENT,
       {"model.tensors[0] (\"fc.weight\").init_steps[0]",
        "module_default cannot be a step"}},
      {"init and init steps together",
       R"({"model": {"tensors": [{"name": "w", "shape": [2], "dtype": "float32",
            "init": {"zeros": {}}, "initSteps": [{"init": {"ones": {}}}]}]}})",
       grpc::StatusCode::INVALID_ARGUMENT,
       {"model.tensors[0] (\"w\")", "has both init and init_steps"}},
      {"unknown placement device",
       R"({"model": {"tensors": [{"name": "w", "shape": [1], "dtype": "float32"}],
            "initRules": [{"pattern": "*", "init": {"ones": {}}}]},
           "placement": {"device": "cuda:9"}})",
       grpc::StatusCode::INVALID_ARGUMENT,
       {"placement.device", "\"cuda:9\" is not a device"}},
  };
}

class BadInputTest : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() { server_ = new TestServer("4GiB"); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static TestServer* server_;
};

TestServer* BadInputTest::server_ = nullptr;

TEST_P(BadInputTest, GetsItsStatusAndAllocatesNothing) {
  const Case& c = GetParam();
  v1::MaterializeRequest request;
  const auto parsed =
      google::protobuf::util::JsonStringToMessage(c.json, &request);
  ASSERT_TRUE(parsed.ok()) << parsed.ToString() << c.json;
  auto stub = server_->Stub();
  {
    grpc::ClientContext context;
    TestServer::Identify(context, "alice");
    v1::MaterializeResponse response;
    grpc::Status status = stub->Materialize(&context, request, &response);
    EXPECT_EQ(status.error_code(), c.code) << status.error_message();
    for (const std::string& part : c.message_parts) {
      EXPECT_THAT(status.error_message(), HasSubstr(part));
    }
  }
  // Plan validates the same way; a model that is merely too big is not an
  // error there but a "fits nowhere" answer.
  {
    grpc::ClientContext context;
    TestServer::Identify(context, "alice");
    v1::PlanRequest plan_request;
    *plan_request.mutable_model() = request.model();
    *plan_request.mutable_placement() = request.placement();
    v1::PlanResponse plan;
    grpc::Status status = stub->Plan(&context, plan_request, &plan);
    if (c.code == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ASSERT_TRUE(status.ok()) << status.error_message();
      EXPECT_EQ(plan.placement(), "");
      EXPECT_FALSE(plan.devices(0).fits());
    } else {
      EXPECT_EQ(status.error_code(), c.code) << status.error_message();
    }
  }
  const v1::GetStatsResponse stats = server_->Stats("alice");
  EXPECT_TRUE(TestServer::AllZero(stats)) << stats.DebugString();
  EXPECT_EQ(stats.devices(0).peak_bytes(), 0u);  // never even reserved
  grpc::ClientContext context;
  TestServer::Identify(context, "alice");
  v1::ListHandlesResponse handles;
  ASSERT_TRUE(stub->ListHandles(&context, {}, &handles).ok());
  EXPECT_EQ(handles.handles_size(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    AllCases, BadInputTest, ::testing::ValuesIn(Cases()),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name;
      for (char c : std::string(info.param.title)) {
        name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      }
      return name;
    });

TEST(BadInputEdgeTest, RuleThatMatchesNothingIsAWarningAndSucceeds) {
  TestServer server;
  v1::MaterializeRequest request;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  Model({Tensor("w", "[4]")},
                        R"([{"pattern": "*.gamma", "init": {"ones": {}}},
                            {"pattern": "*", "init": {"zeros": {}}}])"),
                  &request)
                  .ok());
  grpc::ClientContext context;
  v1::MaterializeResponse response;
  ASSERT_TRUE(server.Stub()->Materialize(&context, request, &response).ok());
  ASSERT_EQ(response.warnings_size(), 1);
  EXPECT_THAT(response.warnings(0),
              HasSubstr("model.init_rules[0] (\"*.gamma\") matches no tensor"));
}

TEST(BadInputEdgeTest, ZeroSizeTensorsAreValid) {
  TestServer server;
  v1::MaterializeRequest request;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  Model({Tensor("empty", "[0, 128]"), Tensor("s", "[]")}),
                  &request)
                  .ok());
  grpc::ClientContext context;
  v1::MaterializeResponse response;
  grpc::Status status = server.Stub()->Materialize(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.tensor_bytes(), 4u);
}

// Issue 10, item 7: a 0-d tensor's box has no ranges, so an empty shard is
// its whole box (a rank's code that builds boxes from shapes needs no
// special case for scalars).
TEST(BadInputEdgeTest, ScalarTakesAnEmptyShard) {
  TestServer server;
  v1::MaterializeRequest request;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  R"({"model": {"tensors": [{"name": "s", "dtype": "float32",
                       "shard": {}, "init": {"constant": {"val": 2.5}}}]}})",
                  &request)
                  .ok());
  ASSERT_TRUE(request.model().tensors(0).has_shard());
  grpc::ClientContext context;
  v1::MaterializeResponse response;
  grpc::Status status =
      server.Stub()->Materialize(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.tensor_bytes(), 4u);
}

TEST(BadInputEdgeTest, MalformedClientNameIsUnauthenticated) {
  TestServer server;
  grpc::ClientContext context;
  TestServer::Identify(context, "not a name");
  v1::GetStatsResponse stats;
  grpc::Status status =
      server.Stub()->GetStats(&context, v1::GetStatsRequest(), &stats);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(status.error_message(), HasSubstr("x-materializer-client"));
}

TEST(BadInputEdgeTest, FetchOfAFailedOrUnknownHandle) {
  TestServer server;
  grpc::ClientContext context;
  v1::FetchRequest fetch;
  fetch.set_handle("h-00000000000000000000000000000000");
  auto reader = server.Stub()->FetchWeights(&context, fetch);
  v1::WeightChunk chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
}

}  // namespace
}  // namespace materializer
