#include "server/init/resolve.h"

#include "google/protobuf/text_format.h"
#include "server/spec/validate.h"
#include "tests/testing/status_matchers.h"

namespace materializer::init {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

absl::StatusOr<Resolution> Resolve(const std::string& text) {
  v1::ModelSpec model;
  if (!google::protobuf::TextFormat::ParseFromString(text, &model)) {
    return absl::InternalError("bad text proto in test");
  }
  absl::StatusOr<std::vector<spec::TensorDesc>> tensors =
      spec::ValidateTensors(model);
  if (!tensors.ok()) return tensors.status();
  return ResolveInits(model, *tensors);
}

TEST(ResolveInitsTest, TensorInitBeatsRulesAndFirstRuleWins) {
  ASSERT_OK_AND_ASSIGN(Resolution r, Resolve(R"pb(
    tensors {
      name: "a.weight"
      shape: [ 2 ]
      dtype: "float32"
      init { constant { val: 3 } }
    }
    tensors { name: "a.bias" shape: [ 2 ] dtype: "float32" }
    tensors { name: "b.weight" shape: [ 2 ] dtype: "float32" }
    init_rules {
      pattern: "*.bias"
      init { zeros {} }
    }
    init_rules {
      pattern: "*"
      init { normal { std: 0.02 } }
    }
    init_rules {
      pattern: "b.*"
      init { ones {} }
    }
  )pb"));
  ASSERT_EQ(r.inits.size(), 3u);
  EXPECT_EQ(r.inits[0].description, "constant(val=3) [tensor init]");
  EXPECT_EQ(r.inits[1].description, "zeros [rule 0 \"*.bias\"]");
  EXPECT_EQ(r.inits[2].description, "normal(mean=0, std=0.02) [rule 1 \"*\"]");
  EXPECT_EQ(r.inits[2].scheme.normal().std(), 0.02);
  // Rule 2 matched b.weight, but rule 1 had already covered it.
  EXPECT_THAT(r.warnings,
              ElementsAre(AllOf(HasSubstr("model.init_rules[2] (\"b.*\")"),
                                HasSubstr("covered first"))));
}

TEST(ResolveInitsTest, RuleMatchingNothingIsAWarningNotAnError) {
  ASSERT_OK_AND_ASSIGN(Resolution r, Resolve(R"pb(
    tensors { name: "w" shape: [ 2 ] dtype: "float32" }
    init_rules {
      pattern: "*.gamma"
      init { ones {} }
    }
    init_rules {
      pattern: "*"
      init { zeros {} }
    }
  )pb"));
  EXPECT_THAT(r.warnings, ElementsAre(HasSubstr(
                              "model.init_rules[0] (\"*.gamma\") matches no "
                              "tensor")));
}

TEST(ResolveInitsTest, UncoveredTensorsAreAllListed) {
  EXPECT_THAT(Resolve(R"pb(
                tensors { name: "a.weight" shape: [ 2 ] dtype: "float32" }
                tensors { name: "a.bias" shape: [ 2 ] dtype: "float32" }
                tensors { name: "c.weight" shape: [ 2 ] dtype: "float32" }
                tensors { name: "rope.inv_freq" shape: [ 2 ] dtype: "float32" }
                init_rules {
                  pattern: "*.bias"
                  init { zeros {} }
                }
              )pb")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("3 tensors have no init"),
                             HasSubstr("\"a.weight\", \"c.weight\", "
                                       "\"rope.inv_freq\""),
                             Not(HasSubstr("\"a.bias\"")))));
}

TEST(ResolveInitsTest, HugeUncoveredListIsCappedWithACount) {
  v1::ModelSpec model;
  for (int i = 0; i < 5000; ++i) {
    v1::TensorSpec* t = model.add_tensors();
    t->set_name("layer." + std::to_string(i) + ".weight");
    t->set_dtype("float32");
  }
  auto tensors = spec::ValidateTensors(model);
  ASSERT_TRUE(tensors.ok());
  absl::Status status = ResolveInits(model, *tensors).status();
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument,
                               AllOf(HasSubstr("5000 tensors have no init"),
                                     HasSubstr("more"))));
  EXPECT_LT(status.message().size(), 6000u);
}

TEST(ResolveInitsTest, BadParametersNameTheRuleOrTensor) {
  const struct {
    const char* spec;
    const char* expected_path;
    const char* reason;
  } cases[] = {
      {R"pb(init_rules {
              pattern: "*"
              init { normal { std: -1 } }
            })pb",
       "model.init_rules[0] (\"*\").init", "normal.std is -1; it must be >= 0"},
      {R"pb(init_rules {
              pattern: "*"
              init { normal { mean: nan } }
            })pb",
       "model.init_rules[0] (\"*\").init", "normal.mean is nan"},
      {R"pb(init_rules {
              pattern: "*"
              init { uniform { a: 1 b: 0 } }
            })pb",
       "model.init_rules[0] (\"*\").init", "a must be <= b"},
      {R"pb(init_rules {
              pattern: "*"
              init { constant { val: inf } }
            })pb",
       "model.init_rules[0] (\"*\").init", "constant.val is inf"},
      {R"pb(init_rules { pattern: "*" })pb", "model.init_rules[0] (\"*\").init",
       "no scheme is set"},
      {R"pb(init_rules {
              pattern: ""
              init { zeros {} }
            })pb",
       "model.init_rules[0] (\"\")", "pattern is empty"},
      {R"pb(init_rules {
              pattern: "h.[0-3"
              init { zeros {} }
            })pb",
       "model.init_rules[0] (\"h.[0-3\")", "without a ']'"},
      {R"pb(tensors {
              name: "w"
              shape: [ 1 ]
              dtype: "float32"
              init { uniform { b: -3 } }
            })pb",
       "model.tensors[0] (\"w\").init", "a must be <= b"},
  };
  for (const auto& c : cases) {
    std::string text = c.spec;
    if (text.find("tensors") == std::string::npos) {
      text += " tensors { name: \"w\" shape: [ 1 ] dtype: \"float32\" }";
    }
    EXPECT_THAT(Resolve(text).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(c.expected_path),
                               HasSubstr(c.reason))))
        << c.spec;
  }
}

TEST(ResolveInitsTest, SchemeMustSuitTheDtype) {
  EXPECT_THAT(Resolve(R"pb(
                tensors { name: "ids" shape: [ 4 ] dtype: "int64" }
                init_rules {
                  pattern: "*"
                  init { normal {} }
                }
              )pb")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model.tensors[0] (\"ids\")"),
                             HasSubstr("model.init_rules[0] (\"*\") applies"),
                             HasSubstr("needs a floating-point dtype"))));
  EXPECT_THAT(Resolve(R"pb(
                tensors {
                  name: "h"
                  shape: [ 4 ]
                  dtype: "float16"
                  init { constant { val: 1e6 } }
                }
              )pb")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("\"h\""), HasSubstr("overflows float16"))));
  EXPECT_THAT(Resolve(R"pb(
                tensors {
                  name: "m"
                  shape: [ 4 ]
                  dtype: "bool"
                  init { constant { val: 2 } }
                }
              )pb")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bool cannot represent")));
  EXPECT_THAT(Resolve(R"pb(
                tensors {
                  name: "i"
                  shape: [ 4 ]
                  dtype: "int8"
                  init { constant { val: 1.5 } }
                }
              )pb")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("int8 cannot represent")));
  EXPECT_TRUE(Resolve(R"pb(
                tensors {
                  name: "i"
                  shape: [ 4 ]
                  dtype: "int8"
                  init { constant { val: -128 } }
                }
              )pb")
                  .ok());
}

}  // namespace
}  // namespace materializer::init
