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
                         tensors {
                           name: "a.bias"
                           shape: [ 2 ]
                           dtype: "float32"
                         }
                         tensors {
                           name: "b.weight"
                           shape: [ 2 ]
                           dtype: "float32"
                         }
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
                         tensors {
                           name: "w"
                           shape: [ 2 ]
                           dtype: "float32"
                         }
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
                tensors {
                  name: "a.weight"
                  shape: [ 2 ]
                  dtype: "float32"
                }
                tensors {
                  name: "a.bias"
                  shape: [ 2 ]
                  dtype: "float32"
                }
                tensors {
                  name: "c.weight"
                  shape: [ 2 ]
                  dtype: "float32"
                }
                tensors {
                  name: "rope.inv_freq"
                  shape: [ 2 ]
                  dtype: "float32"
                }
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
    EXPECT_THAT(
        Resolve(text).status(),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 AllOf(HasSubstr(c.expected_path), HasSubstr(c.reason))))
        << c.spec;
  }
}

TEST(ResolveInitsTest, SchemeMustSuitTheDtype) {
  EXPECT_THAT(Resolve(R"pb(
                tensors {
                  name: "ids"
                  shape: [ 4 ]
                  dtype: "int64"
                }
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
  EXPECT_THAT(
      Resolve(R"pb(
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

TEST(ResolveInitsTest, TiedTensorsHaveNoInitOfTheirOwn) {
  v1::ModelSpec model;
  ASSERT_TRUE(
      google::protobuf::TextFormat::ParseFromString(R"pb(
                                                      tensors {
                                                        name: "wte.weight"
                                                        shape: [ 4, 2 ]
                                                        dtype: "float32"
                                                      }
                                                      tensors {
                                                        name: "lm_head.weight"
                                                        shape: [ 4, 2 ]
                                                        dtype: "float32"
                                                      }
                                                      init_rules {
                                                        pattern: "lm_head.*"
                                                        init { ones {} }
                                                      }
                                                      init_rules {
                                                        pattern: "*"
                                                        init { zeros {} }
                                                      }
                                                    )pb",
                                                    &model));
  std::vector<spec::TensorDesc> tensors(2);
  for (int i = 0; i < 2; ++i) {
    tensors[i].name = model.tensors(i).name();
    tensors[i].shape = {4, 2};
    tensors[i].numel = 8;
    tensors[i].nbytes = 32;
  }
  tensors[1].tie_root = 0;
  ASSERT_OK_AND_ASSIGN(Resolution r, ResolveInits(model, tensors));
  EXPECT_EQ(r.inits[0].description, "zeros [rule 1 \"*\"]");
  EXPECT_EQ(r.inits[1].description, "tied to wte.weight");
  EXPECT_EQ(r.inits[1].scheme.scheme_case(), v1::InitScheme::SCHEME_NOT_SET);
  // The lm_head rule only matched the tied tensor.
  EXPECT_THAT(r.warnings, ElementsAre(HasSubstr("matches no tensor")));
}

TEST(ResolveInitsTest, ModuleDefaultsGetTheirModulePlan) {
  ASSERT_OK_AND_ASSIGN(Resolution r, Resolve(R"pb(
                         tensors {
                           name: "wte.weight"
                           shape: [ 10, 4 ]
                           dtype: "float32"
                           module_type: "Embedding"
                         }
                         tensors {
                           name: "ln.weight"
                           shape: [ 4 ]
                           dtype: "float32"
                           module_type: "LayerNorm"
                           init { ones {} }
                         }
                         tensors {
                           name: "ln.bias"
                           shape: [ 4 ]
                           dtype: "float32"
                           module_type: "LayerNorm"
                         }
                         modules { name: "wte" padding_idx: 1 }
                         modules { name: "unused" }
                         init_rules {
                           pattern: "*"
                           init { module_default {} }
                         }
                       )pb"));
  ASSERT_NE(r.inits[0].module, nullptr);
  EXPECT_EQ(r.inits[0].module->name, "wte");
  EXPECT_EQ(r.inits[0].description,
            "module_default(Embedding \"wte\": normal(mean=0, std=1), row 1 "
            "zeroed) [rule 0 \"*\"]");
  EXPECT_EQ(r.inits[1].module, nullptr);
  EXPECT_EQ(r.inits[1].description, "ones [tensor init]");
  EXPECT_EQ(r.inits[2].description,
            "module_default(LayerNorm \"ln\": zeros) [rule 0 \"*\"]");
  EXPECT_THAT(r.warnings, ElementsAre(HasSubstr("model.modules[1] (\"unused\") "
                                                "owns no tensor")));
}

TEST(ResolveInitsTest, NewSchemesAreCheckedAgainstTheirTensor) {
  EXPECT_THAT(Resolve(R"pb(
                tensors {
                  name: "b"
                  shape: [ 4 ]
                  dtype: "float32"
                }
                init_rules {
                  pattern: "*"
                  init { xavier_uniform {} }
                }
              )pb")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model.tensors[0] (\"b\")"),
                             HasSubstr("at least 2 dimensions"))));
  EXPECT_THAT(Resolve(R"pb(
                tensors {
                  name: "w"
                  shape: [ 4, 4 ]
                  dtype: "float32"
                }
                init_rules {
                  pattern: "*"
                  init { kaiming_uniform { mode: "avg" } }
                }
              )pb")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model.init_rules[0] (\"*\").init"),
                             HasSubstr("kaiming_uniform.mode"))));
}

TEST(ResolveInitsTest, KnownModuleTypeIsTheLastResort) {
  ASSERT_OK_AND_ASSIGN(Resolution r, Resolve(R"pb(
    tensors {
      name: "fc.weight"
      shape: [ 4, 3 ]
      dtype: "float32"
      module_type: "torch.nn.Linear"
    }
    tensors { name: "fc.bias" shape: [ 4 ] dtype: "float32" module_type: "Linear" }
    tensors { name: "ln.weight" shape: [ 4 ] dtype: "float32" }
    modules { name: "ln" type: "LayerNorm" }
    init_rules {
      pattern: "*.bias"
      init { zeros {} }
    }
  )pb"));
  EXPECT_TRUE(r.inits[0].scheme.has_module_default());
  EXPECT_THAT(r.inits[0].description, HasSubstr("[module default]"));
  EXPECT_EQ(r.inits[1].description, "zeros [rule 0 \"*.bias\"]");
  EXPECT_TRUE(r.inits[2].scheme.has_module_default());  // from model.modules
  // A type module_default does not know (Hugging Face's Conv1D) covers
  // nothing.
  EXPECT_THAT(Resolve(R"pb(
                tensors {
                  name: "c_attn.weight"
                  shape: [ 4, 12 ]
                  dtype: "float32"
                  module_type: "Conv1D"
                }
              )pb")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("1 tensor has no init"),
                             HasSubstr("\"c_attn.weight\""))));
}

}  // namespace
}  // namespace materializer::init
