#include "server/init/resolve.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "google/protobuf/text_format.h"
#include "server/init/shard.h"
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
  ASSERT_EQ(r.inits[2].steps.size(), 1u);
  EXPECT_EQ(r.inits[2].steps[0].scheme->normal().std(), 0.02);
  EXPECT_FALSE(r.inits[2].steps[0].region.has_value());
  // A plain init or a rule shows as one step without a region.
  ASSERT_EQ(r.inits[2].step_infos.size(), 1u);
  EXPECT_EQ(r.inits[2].step_infos[0].init(), "normal(mean=0, std=0.02)");
  EXPECT_EQ(r.inits[2].step_infos[0].region_size(), 0);
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
  EXPECT_TRUE(r.inits[1].steps.empty());  // a tie has no steps of its own
  EXPECT_TRUE(r.inits[1].step_infos.empty());
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
  EXPECT_TRUE(r.inits[0].steps[0].scheme->has_module_default());
  EXPECT_THAT(r.inits[0].description, HasSubstr("[module default]"));
  EXPECT_EQ(r.inits[1].description, "zeros [rule 0 \"*.bias\"]");
  // From model.modules.
  EXPECT_TRUE(r.inits[2].steps[0].scheme->has_module_default());
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

namespace materializer::init {
namespace {

using ::materializer::testing::IsOk;
using ::materializer::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// As the engine prepares a request: validate, cut shards, resolve.
absl::StatusOr<Resolution> Prepare(const std::string& text) {
  v1::ModelSpec model;
  if (!google::protobuf::TextFormat::ParseFromString(text, &model)) {
    return absl::InternalError("bad text proto in test");
  }
  absl::StatusOr<std::vector<spec::TensorDesc>> tensors =
      spec::ValidateTensors(model);
  if (!tensors.ok()) return tensors.status();
  absl::Status shards = ApplyShards(model, model.rng(), *tensors);
  if (!shards.ok()) return shards;
  return ResolveInits(model, *tensors);
}

TEST(ResolveStepsTest, StepsCoverTheTensorAndRulesSkipIt) {
  ASSERT_OK_AND_ASSIGN(Resolution r, Prepare(R"pb(
                         rng: RNG_MODE_TORCH
                         tensors {
                           name: "wte.weight"
                           shape: [ 10, 4 ]
                           dtype: "float32"
                           init_steps { init { normal { std: 0.02 } } }
                           init_steps {
                             init { zeros {} }
                             region { offset: 1 length: 1 }
                             region { offset: 0 length: 4 }
                           }
                         }
                         init_rules {
                           pattern: "*"
                           init { ones {} }
                         }
                       )pb"));
  EXPECT_EQ(r.inits[0].description,
            "normal(mean=0, std=0.02) then zeros on [1:2, 0:4] [tensor "
            "init_steps]");
  EXPECT_EQ(r.inits[0].steps.size(), 2u);
  EXPECT_EQ(r.inits[0].step_infos.size(), 2u);
  EXPECT_EQ(r.inits[0].module, nullptr);
  EXPECT_THAT(r.warnings,
              ElementsAre(HasSubstr("all covered first by a per-tensor init")));
}

// A Linear whose weight is recorded as steps: the weight takes no module
// default, and its bias's default still comes from the module's generator
// as a whole (the module plan consumes the weight's draws).
TEST(ResolveStepsTest, StepsReplaceTheModuleDefaultOfTheirTensorOnly) {
  ASSERT_OK_AND_ASSIGN(Resolution r, Prepare(R"pb(
                         rng: RNG_MODE_TORCH
                         tensors {
                           name: "fc.weight"
                           shape: [ 3, 2 ]
                           dtype: "float32"
                           module_type: "Linear"
                           init_steps { init { zeros {} } }
                         }
                         tensors {
                           name: "fc.bias"
                           shape: [ 3 ]
                           dtype: "float32"
                           module_type: "Linear"
                         }
                       )pb"));
  EXPECT_EQ(r.inits[0].module, nullptr);
  ASSERT_NE(r.inits[1].module, nullptr);
  const ModuleSlot& weight = r.inits[1].module->slots[0];
  EXPECT_EQ(weight.local_name, "weight");
  EXPECT_FALSE(weight.write);
  EXPECT_TRUE(weight.consume);
  ASSERT_EQ(r.inits[1].step_infos.size(), 1u);
  EXPECT_THAT(r.inits[1].step_infos[0].init(),
              HasSubstr("module_default(Linear \"fc\""));
}

TEST(ResolveStepsTest, ConflictsAndMisplacedValuesAreRefused) {
  const struct {
    const char* model;
    std::vector<const char*> parts;
  } cases[] = {
      {R"pb(tensors {
              name: "w"
              shape: [ 2 ]
              dtype: "float32"
              init { zeros {} }
              init_steps { init { ones {} } }
            })pb",
       {"model.tensors[0] (\"w\")", "has both init and init_steps"}},
      {R"pb(tensors {
              name: "a"
              shape: [ 2 ]
              dtype: "float32"
              init { ones {} }
            }
            tensors {
              name: "b"
              shape: [ 2 ]
              dtype: "float32"
              tie_to: "a"
              init_steps { init { ones {} } }
            })pb",
       {"model.tensors[1] (\"b\")", "has both tie_to and init_steps"}},
      {R"pb(tensors {
              name: "w"
              shape: [ 1 ]
              dtype: "float32"
            }
            init_rules {
              pattern: "*"
              init { values { data: "\000\000\000\000" } }
            })pb",
       {"model.init_rules[0] (\"*\").init", "values carry one tensor's bytes"}},
      {R"pb(tensors {
              name: "w"
              shape: [ 2 ]
              dtype: "float32"
              init { values { data: "\000\000\000\000" } }
            })pb",
       {"model.tensors[0] (\"w\").init", "values.data has 4 bytes", "needs 8"}},
      // Portable mode: every step needs a portable definition.
      {R"pb(rng: RNG_MODE_PORTABLE
            tensors {
              name: "w"
              shape: [ 4, 4 ]
              dtype: "float32"
              init_steps { init { zeros {} } }
              init_steps {
                init { orthogonal {} }
                region { offset: 0 length: 2 }
                region { offset: 0 length: 4 }
              }
            })pb",
       {"model.tensors[0] (\"w\").init_steps[1]",
        "orthogonal(gain=1) has no portable definition"}},
  };
  for (const auto& c : cases) {
    absl::StatusOr<Resolution> r = Prepare(c.model);
    ASSERT_FALSE(r.ok()) << c.model;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    for (const char* part : c.parts) {
      EXPECT_THAT(std::string(r.status().message()), HasSubstr(part))
          << c.model;
    }
  }
}

// Portable mode checks the requests each step makes, for the shard's part
// of the step's region: the same answer for every shard, empty ones too.
TEST(ResolveStepsTest, PortableStepsAreCheckedForEveryShard) {
  for (const char* shard : {"", "shard { split { dim: 0 index: 0 count: 2 } }",
                            "shard { split { dim: 0 index: 7 count: 8 } }"}) {
    const std::string model = absl::StrReplaceAll(
        R"pb(rng: RNG_MODE_PORTABLE
             tensors {
               name: "w"
               shape: [ 4, 8 ]
               dtype: "float32" SHARD
               init_steps { init { zeros {} } }
               init_steps {
                 init { normal { std: STD } }
                 region { offset: 2 length: 2 }
                 region { offset: 0 length: 8 }
               }
             })pb",
        {{"SHARD", shard}});
    EXPECT_THAT(Prepare(absl::StrReplaceAll(model, {{"STD", "1"}})), IsOk())
        << shard;
    EXPECT_THAT(Prepare(absl::StrReplaceAll(model, {{"STD", "1e38"}})),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("model.tensors[0] (\"w\").init_steps"
                                         "[1].init: on region [2:4, 0:8]"),
                               HasSubstr("normal.mean and normal.std"))))
        << shard;
  }
}

}  // namespace
}  // namespace materializer::init
