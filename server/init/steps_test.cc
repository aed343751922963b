#include "server/init/steps.h"

#include <string>
#include <vector>

#include "google/protobuf/text_format.h"
#include "server/spec/limits.h"
#include "server/spec/validate.h"
#include "tests/testing/status_matchers.h"

namespace materializer::init {
namespace {

using ::materializer::testing::IsOk;
using ::materializer::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Resolves the steps of the model's only tensor.
absl::StatusOr<std::vector<ResolvedStep>> Resolve(
    const std::string& tensor_text, v1::RngMode rng = v1::RNG_MODE_TORCH) {
  v1::ModelSpec model;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(
      "tensors { " + tensor_text + " }", &model))
      << tensor_text;
  std::vector<spec::TensorDesc> tensors = spec::ValidateTensors(model).value();
  return ResolveInitSteps(0, model.tensors(0), tensors[0], rng);
}

constexpr char kEmbedding[] = R"pb(
  name: "wte.weight"
  shape: [ 10, 4 ]
  dtype: "float32"
  init_steps { init { normal { std: 0.02 } } }
  init_steps {
    init { zeros {} }
    region { offset: 1 length: 1 }
    region { offset: 0 length: 4 }
  }
)pb";

TEST(ResolveInitStepsTest, StepsKeepTheirOrderRegionsAndDescriptions) {
  ASSERT_OK_AND_ASSIGN(std::vector<ResolvedStep> steps, Resolve(kEmbedding));
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_FALSE(steps[0].region.has_value());
  ASSERT_TRUE(steps[1].region.has_value());
  EXPECT_THAT(steps[1].region->offset, ElementsAre(1, 0));
  EXPECT_THAT(steps[1].region->length, ElementsAre(1, 4));
  EXPECT_EQ(DescribeSteps(steps),
            "normal(mean=0, std=0.02) then zeros on [1:2, 0:4]");
  const std::vector<v1::InitStepInfo> infos = StepInfos(steps);
  ASSERT_EQ(infos.size(), 2u);
  EXPECT_EQ(infos[0].init(), "normal(mean=0, std=0.02)");
  EXPECT_EQ(infos[0].region_size(), 0);
  EXPECT_EQ(infos[1].init(), "zeros");
  ASSERT_EQ(infos[1].region_size(), 2);
  EXPECT_EQ(infos[1].region(0).offset(), 1);
  EXPECT_EQ(infos[1].region(0).length(), 1);
  // The region is a tensor of its own for its scheme.
  spec::TensorDesc tensor;
  tensor.name = "wte.weight";
  tensor.shape = {10, 4};
  const spec::TensorDesc target = StepTarget(tensor, steps[1]);
  EXPECT_THAT(target.shape, ElementsAre(1, 4));
  EXPECT_EQ(target.numel, 4u);
  EXPECT_FALSE(target.is_shard());
}

TEST(ResolveInitStepsTest, ARegionThatIsTheWholeTensorIsNone) {
  ASSERT_OK_AND_ASSIGN(std::vector<ResolvedStep> steps, Resolve(R"pb(
                         name: "w"
                         shape: [ 3 ]
                         dtype: "float32"
                         init_steps {
                           init { ones {} }
                           region { offset: 0 length: 3 }
                         }
                       )pb"));
  EXPECT_FALSE(steps[0].region.has_value());
  EXPECT_EQ(DescribeSteps(steps), "ones");
}

TEST(ResolveInitStepsTest, LongSequencesAreAbbreviated) {
  std::string text = R"pb(name: "w"
                          shape: [ 8 ]
                          dtype: "float32"
                          init_steps { init { zeros {} } })pb";
  for (int k = 1; k < 6; ++k) {
    text +=
        " init_steps { init { ones {} } region { offset: " + std::to_string(k) +
        " length: 1 } }";
  }
  ASSERT_OK_AND_ASSIGN(std::vector<ResolvedStep> steps, Resolve(text));
  EXPECT_EQ(DescribeSteps(steps),
            "zeros then ones on [1:2] then ones on [2:3] then ... (6 steps)");
}

TEST(ResolveInitStepsTest, BadStepsNameTheTensorTheStepAndTheReason) {
  const struct {
    const char* tensor;
    std::vector<const char*> parts;
  } cases[] = {
      {R"pb(name: "w"
            shape: [ 4, 4 ]
            dtype: "float32"
            init_steps { init { module_default {} } })pb",
       {"model.tensors[0] (\"w\").init_steps[0]",
        "module_default cannot be a step"}},
      {R"pb(name: "w"
            shape: [ 4, 4 ]
            dtype: "float32"
            init_steps { init { zeros {} } }
            init_steps {
              init { ones {} }
              region { offset: 0 length: 1 }
            })pb",
       {"init_steps[1]", "region has 1 ranges for a tensor of 2 dimensions"}},
      {R"pb(name: "w"
            shape: [ 4, 4 ]
            dtype: "float32"
            init_steps { init { zeros {} } }
            init_steps {
              init { ones {} }
              region { offset: 3 length: 2 }
              region { offset: 0 length: 4 }
            })pb",
       {"init_steps[1]", "region[0] is offset 3 length 2",
        "inside the dimension's size 4"}},
      {R"pb(name: "w"
            shape: [ 4, 4 ]
            dtype: "float32"
            init_steps {
              init { zeros {} }
              region { offset: 0 length: 2 }
              region { offset: 0 length: 4 }
            })pb",
       {"init_steps[0]", "must cover the whole tensor"}},
      {R"pb(name: "w"
            shape: [ 4 ]
            dtype: "float32"
            init_steps { init { zeros {} } }
            init_steps { init { empty {} } })pb",
       {"init_steps[1]", "empty writes nothing"}},
      {R"pb(name: "w"
            shape: [ 4 ]
            dtype: "float32"
            init_steps { init {} })pb",
       {"init_steps[0].init", "no scheme is set"}},
      {R"pb(name: "w"
            shape: [ 4 ]
            dtype: "float32"
            init_steps { init { normal { std: -1 } } })pb",
       {"init_steps[0].init", "normal.std is -1"}},
      // The scheme is checked against the region: its shape, its fans,
      // its values' size, its range.
      {R"pb(name: "w"
            shape: [ 4, 4 ]
            dtype: "float32"
            init_steps { init { zeros {} } }
            init_steps {
              init { dirac {} }
              region { offset: 0 length: 1 }
              region { offset: 0 length: 4 }
            })pb",
       {"init_steps[1].init", "on region [0:1, 0:4]",
        "dirac needs a 3-, 4- or 5-D tensor", "shape [1, 4]"}},
      {R"pb(name: "w"
            shape: [ 4, 4 ]
            dtype: "float32"
            init_steps { init { zeros {} } }
            init_steps {
              init { values { data: "\000\000\000\000" } }
              region { offset: 2 length: 1 }
              region { offset: 0 length: 4 }
            })pb",
       {"init_steps[1].init", "on region [2:3, 0:4]",
        "values.data has 4 bytes; shape [1, 4] of float32 needs 16"}},
      {R"pb(name: "w"
            shape: [ 4, 4 ]
            dtype: "float16"
            init_steps { init { zeros {} } }
            init_steps {
              init { normal { std: 10000 } }
              region { offset: 2 length: 1 }
              region { offset: 0 length: 4 }
            })pb",
       {"init_steps[1].init", "normal.mean and normal.std",
        "beyond float16's largest finite value"}},
      // torch cannot view t[0:4, 0:2, 0:2] of a [4, 3, 4] tensor as a
      // [4, 4] matrix (Python's orthogonal_ raises on it).
      {R"pb(name: "w"
            shape: [ 4, 3, 4 ]
            dtype: "float32"
            init_steps { init { zeros {} } }
            init_steps {
              init { orthogonal {} }
              region { offset: 0 length: 4 }
              region { offset: 0 length: 2 }
              region { offset: 0 length: 2 }
            })pb",
       {"init_steps[1]", "orthogonal on region [0:4, 0:2, 0:2]",
        "view size is not compatible"}},
  };
  for (const auto& c : cases) {
    absl::StatusOr<std::vector<ResolvedStep>> steps = Resolve(c.tensor);
    ASSERT_FALSE(steps.ok()) << c.tensor;
    EXPECT_EQ(steps.status().code(), absl::StatusCode::kInvalidArgument);
    for (const char* part : c.parts) {
      EXPECT_THAT(std::string(steps.status().message()), HasSubstr(part))
          << c.tensor;
    }
  }
}

TEST(ResolveInitStepsTest, OrthogonalRegionsTorchCanView) {
  // Rows of a matrix, and a slab of whole trailing dimensions, view as a
  // matrix; in float16 the fill goes through a contiguous float32 copy.
  for (const char* tensor : {
           R"pb(name: "w"
                shape: [ 6, 4 ]
                dtype: "float32"
                init_steps { init { zeros {} } }
                init_steps {
                  init { orthogonal {} }
                  region { offset: 2 length: 3 }
                  region { offset: 0 length: 4 }
                })pb",
           R"pb(name: "w"
                shape: [ 6, 4 ]
                dtype: "float64"
                init_steps { init { zeros {} } }
                init_steps {
                  init { orthogonal {} }
                  region { offset: 0 length: 6 }
                  region { offset: 1 length: 2 }
                })pb",
           R"pb(name: "w"
                shape: [ 4, 3, 2 ]
                dtype: "float32"
                init_steps { init { zeros {} } }
                init_steps {
                  init { orthogonal {} }
                  region { offset: 1 length: 2 }
                  region { offset: 0 length: 3 }
                  region { offset: 0 length: 2 }
                })pb",
           R"pb(name: "w"
                shape: [ 4, 3, 2 ]
                dtype: "float16"
                init_steps { init { zeros {} } }
                init_steps {
                  init { orthogonal {} }
                  region { offset: 0 length: 4 }
                  region { offset: 1 length: 2 }
                  region { offset: 0 length: 1 }
                })pb",
       }) {
    EXPECT_THAT(Resolve(tensor), IsOk()) << tensor;
  }
}

TEST(CanViewTest, FollowsTorchsRule) {
  using internal::CanView;
  // A column of a (4, 3) tensor viewed as (4, 1): yes; two columns of a
  // (4, 3, 2) tensor merged: no; a whole inner block: yes.
  // (Each case checked against torch's Tensor.view.)
  EXPECT_TRUE(CanView({4, 1}, {3, 1}, {4, 1}));
  EXPECT_TRUE(CanView({4, 2, 1}, {6, 2, 1}, {4, 2}));  // t[:, 1:3, 0:1]
  EXPECT_FALSE(
      CanView({4, 2, 2}, {12, 4, 1}, {4, 4}));  // [4, 3, 4] t[:, :2, :2]
  EXPECT_TRUE(CanView({2, 3, 2}, {6, 2, 1}, {2, 6}));
  EXPECT_TRUE(CanView({4, 1, 2}, {6, 2, 1}, {4, 2}));  // size-1 dims skip
  EXPECT_TRUE(CanView({0, 5}, {1, 1}, {0, 5}));
  EXPECT_TRUE(CanView({}, {}, {1}));
}

TEST(CheckInitLimitsTest, StepsPerTensorAndPerRequest) {
  v1::ModelSpec model;
  v1::TensorSpec* t = model.add_tensors();
  t->set_name("w");
  for (int k = 0; k <= spec::kMaxInitStepsPerTensor; ++k) {
    t->add_init_steps()->mutable_init()->mutable_zeros();
  }
  EXPECT_THAT(CheckInitLimits(model),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model.tensors[0] (\"w\").init_steps"),
                             HasSubstr("1025 steps; the limit is 1024 per "
                                       "tensor"))));
  t->mutable_init_steps()->RemoveLast();
  EXPECT_THAT(CheckInitLimits(model), IsOk());
  // 1025 tensors of 1024 steps: past 2^20 in the last one.
  const v1::TensorSpec full = *t;
  for (int i = 1;
       i <= spec::kMaxInitStepsPerRequest / spec::kMaxInitStepsPerTensor; ++i) {
    v1::TensorSpec* next = model.add_tensors();
    *next = full;
    next->set_name("w" + std::to_string(i));
  }
  EXPECT_THAT(CheckInitLimits(model),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model.tensors[1024] (\"w1024\")"),
                             HasSubstr("more than 1048576 init steps"))));
}

TEST(CheckInitLimitsTest, ValuesBytesPerRequest) {
  v1::ModelSpec model;
  const std::string half(spec::kMaxValuesBytesPerRequest / 2, '\0');
  v1::TensorSpec* a = model.add_tensors();
  a->set_name("a");
  a->mutable_init()->mutable_values()->set_data(half);
  v1::TensorSpec* b = model.add_tensors();
  b->set_name("b");
  b->add_init_steps()->mutable_init()->mutable_zeros();
  b->add_init_steps()->mutable_init()->mutable_values()->set_data(half);
  EXPECT_THAT(CheckInitLimits(model), IsOk());  // exactly the limit
  b->add_init_steps()->mutable_init()->mutable_values()->set_data("x");
  EXPECT_THAT(
      CheckInitLimits(model),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("model.tensors[1] (\"b\")"),
                     HasSubstr("literal values to 134217729 bytes; the limit "
                               "is 134217728 bytes per request"))));
}

}  // namespace
}  // namespace materializer::init
