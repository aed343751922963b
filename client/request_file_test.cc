#include "client/request_file.h"

#include <string>

#include "tests/testing/status_matchers.h"

namespace materializer::client {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(RequestFileTest, ReadsAnExample) {
  ASSERT_OK_AND_ASSIGN(v1::MaterializeRequest request,
                       ReadRequestFile("examples/mlp.json"));
  EXPECT_EQ(request.model().tensors_size(), 10);
  EXPECT_EQ(request.model().tensors(0).name(), "net.fc0.weight");
  EXPECT_EQ(request.model().seed(), 1234u);
  EXPECT_EQ(request.label(), "mlp example");
}

TEST(RequestFileTest, PlanRequestFieldsOnlyAreAccepted) {
  ASSERT_OK_AND_ASSIGN(
      v1::MaterializeRequest request,
      ParseRequestFile(R"({"model": {"tensors": [{"name": "w", "shape": [2],
                          "dtype": "float32"}]}, "placement": {"device": "cpu"}})",
                       "plan.json"));
  EXPECT_EQ(request.placement().device(), "cpu");
}

TEST(RequestFileTest, UnknownFieldNamesTheFileAndTheField) {
  EXPECT_THAT(ParseRequestFile(R"({"model": {"tensorz": []}})", "typo.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("typo.json is not a PlanRequest or "
                                       "MaterializeRequest"),
                             HasSubstr("tensorz"))));
}

TEST(RequestFileTest, SyntaxErrorHasNoBlankLines) {
  absl::StatusOr<v1::MaterializeRequest> request =
      ParseRequestFile("{\"model\": {\"seed\": ", "broken.json");
  ASSERT_THAT(request, StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("broken.json")));
  EXPECT_THAT(std::string(request.status().message()), Not(HasSubstr("\n\n")));
}

TEST(RequestFileTest, MissingFileIsAnError) {
  EXPECT_THAT(ReadRequestFile("no/such/file.json"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("cannot read no/such/file.json")));
}

}  // namespace
}  // namespace materializer::client
