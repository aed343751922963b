#include "server/init/module_plan.h"

#include <cmath>

#include "google/protobuf/text_format.h"
#include "server/init/schemes.h"
#include "server/spec/validate.h"
#include "tests/testing/status_matchers.h"

namespace materializer::init {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Plans `text`; tensors whose init is module_default (own or through the
// first matching rule "*") are the module_default ones.
struct Planned {
  std::vector<spec::TensorDesc> tensors;
  absl::StatusOr<ModulePlans> plans;
};

Planned Plan(const std::string& text, bool all_module_default = true) {
  v1::ModelSpec model;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &model));
  Planned out{spec::ValidateTensors(model).value(),
              absl::InternalError("unset")};
  std::vector<bool> is_default(out.tensors.size());
  for (int i = 0; i < model.tensors_size(); ++i) {
    is_default[i] = model.tensors(i).has_init()
                        ? model.tensors(i).init().has_module_default()
                        : all_module_default;
  }
  out.plans = PlanModuleDefaults(model, out.tensors, is_default);
  return out;
}

const ModuleSlot* Slot(const ModulePlan& plan, const std::string& local) {
  for (const ModuleSlot& slot : plan.slots) {
    if (slot.local_name == local) return &slot;
  }
  return nullptr;
}

TEST(ModulePlanTest, LinearIsKaimingSqrt5ThenBiasBound) {
  Planned p = Plan(R"pb(
    tensors {
      name: "fc.weight"
      shape: [ 30, 20 ]
      dtype: "float32"
      module_type: "torch.nn.Linear"
    }
    tensors {
      name: "fc.bias"
      shape: [ 30 ]
      dtype: "float32"
    }
  )pb");
  ASSERT_OK(p.plans.status());
  const ModulePlan& plan = *p.plans->by_tensor[0];
  EXPECT_EQ(p.plans->by_tensor[1].get(), &plan);
  EXPECT_EQ(plan.name, "fc");
  EXPECT_EQ(plan.type, "Linear");
  ASSERT_EQ(plan.slots.size(), 2u);
  EXPECT_EQ(plan.slots[0].local_name, "weight");
  EXPECT_EQ(plan.slots[0].op.kaiming_uniform().a(), std::sqrt(5.0));
  EXPECT_EQ(plan.slots[1].op.uniform().a(), -1 / std::sqrt(20.0));
  EXPECT_EQ(plan.slots[1].op.uniform().b(), 1 / std::sqrt(20.0));
  EXPECT_TRUE(plan.slots[0].write && plan.slots[1].write);
  EXPECT_EQ(DescribeModuleDefault(plan, 0),
            "module_default(Linear \"fc\": kaiming_uniform(a=2.23606797749979, "
            "mode=fan_in, nonlinearity=leaky_relu))");
}

TEST(ModulePlanTest, TypeNamesAndModuleSpecs) {
  EXPECT_EQ(CanonicalModuleType("torch.nn.Linear"), "Linear");
  EXPECT_EQ(CanonicalModuleType("nn.Conv2d"), "Conv2d");
  EXPECT_EQ(CanonicalModuleType("torch.nn.modules.sparse.Embedding"),
            "Embedding");
  EXPECT_EQ(CanonicalModuleType("mylib.Linear"), "mylib.Linear");
  EXPECT_EQ(ModuleOf("a.b.weight"), "a.b");
  EXPECT_EQ(LocalName("a.b.weight"), "weight");
  EXPECT_EQ(ModuleOf("weight"), "");

  // The ModuleSpec gives the type; padding_idx counts from the end.
  Planned p = Plan(R"pb(
    tensors {
      name: "wte.weight"
      shape: [ 10, 4 ]
      dtype: "float32"
    }
    modules { name: "wte" type: "nn.Embedding" padding_idx: -1 }
    modules { name: "gone" type: "Linear" }
  )pb");
  ASSERT_OK(p.plans.status());
  EXPECT_EQ(p.plans->by_tensor[0]->type, "Embedding");
  EXPECT_EQ(p.plans->by_tensor[0]->padding_idx, 9);
  EXPECT_TRUE(p.plans->by_tensor[0]->slots[0].op.has_normal());
  ASSERT_EQ(p.plans->warnings.size(), 1u);
  EXPECT_THAT(p.plans->warnings[0],
              HasSubstr("model.modules[1] (\"gone\") owns no tensor"));
}

TEST(ModulePlanTest, BadModuleInputsAreNamed) {
  const struct {
    const char* spec;
    const char* reason;
  } cases[] = {
      {R"pb(tensors {
              name: "fc.weight"
              shape: [ 3, 2 ]
              dtype: "float32"
            })pb",
       "model.tensors[0] (\"fc.weight\"): module_default needs the type of "
       "module \"fc\""},
      {R"pb(tensors {
              name: "fc.weight"
              shape: [ 3, 2 ]
              dtype: "float32"
              module_type: "Transformer"
            })pb",
       "does not know the module type \"Transformer\""},
      {R"pb(tensors {
              name: "fc.gamma"
              shape: [ 3 ]
              dtype: "float32"
              module_type: "Linear"
            })pb",
       "Linear has no tensor \"gamma\" (its tensors: bias, weight)"},
      {R"pb(tensors {
              name: "fc.weight"
              shape: [ 3 ]
              dtype: "float32"
              module_type: "Linear"
            })pb",
       "Linear.weight is 2-D; the tensor has shape [3]"},
      {R"pb(tensors {
              name: "c.weight"
              shape: [ 3, 2, 3 ]
              dtype: "float32"
              module_type: "Conv2d"
            })pb",
       "Conv2d.weight is 4-D"},
      {R"pb(tensors {
              name: "fc.bias"
              shape: [ 3 ]
              dtype: "float32"
              module_type: "Linear"
            })pb",
       "model.tensors[0] (\"fc.bias\"): module_default (Linear \"fc\"): "
       "reset_parameters() draws \"fc.weight\" first"},
      {R"pb(tensors {
              name: "fc.weight"
              shape: [ 3, 2 ]
              dtype: "int32"
              module_type: "Linear"
            })pb",
       "needs a floating-point dtype; the tensor is int32"},
      {R"pb(tensors {
              name: "e.weight"
              shape: [ 5, 2 ]
              dtype: "float32"
            }
            modules { name: "e" type: "Embedding" padding_idx: 5 })pb",
       "padding_idx is 5; it must be within [-5, 5)"},
      {R"pb(tensors {
              name: "e.weight"
              shape: [ 5, 2 ]
              dtype: "float32"
            }
            modules { name: "e" type: "Linear" padding_idx: 1 })pb",
       "model.modules[0] (\"e\"): padding_idx applies to Embedding"},
      {R"pb(tensors {
              name: "e.weight"
              shape: [ 5, 2 ]
              dtype: "float32"
              module_type: "Linear"
            }
            modules { name: "e" type: "Embedding" })pb",
       "type \"Embedding\" disagrees with model.tensors[0] (\"e.weight\")"},
      {R"pb(tensors {
              name: "e.weight"
              shape: [ 5, 2 ]
              dtype: "float32"
            }
            modules { name: "e" type: "Embedding" }
            modules { name: "e" type: "Embedding" })pb",
       "model.modules[1] (\"e\"): the name repeats model.modules[0]"},
      {R"pb(tensors {
              name: "m.weight"
              shape: [ 5, 2 ]
              dtype: "float32"
              module_type: "Linear"
            }
            tensors {
              name: "m.bias"
              shape: [ 5 ]
              dtype: "float32"
              module_type: "Embedding"
            })pb",
       "cannot tell the type of module \"m\""},
      {R"pb(tensors {
              name: "attn.out_proj.weight"
              shape: [ 4, 4 ]
              dtype: "float32"
              module_type: "MultiheadAttention"
            })pb",
       "out_proj is a Linear submodule of its own"},
      {R"pb(tensors {
              name: "rnn.weight_hr_l0"
              shape: [ 2, 4 ]
              dtype: "float32"
              module_type: "GRU"
            })pb",
       "GRU has no tensor \"weight_hr_l0\""},
      {R"pb(tensors {
              name: "rnn.weight_ih_l0"
              shape: [ 10, 3 ]
              dtype: "float32"
              module_type: "LSTM"
            })pb",
       "gate size 10 is not a multiple of 4"},
      // weight_ih_l0 comes first and its input size is unknown.
      {R"pb(tensors {
              name: "rnn.weight_hh_l0"
              shape: [ 8, 2 ]
              dtype: "float32"
              module_type: "LSTM"
            })pb",
       "model.tensors[0] (\"rnn.weight_hh_l0\"): module_default (LSTM "
       "\"rnn\"): "
       "reset_parameters() draws \"rnn.weight_ih_l0\" first"},
      {R"pb(tensors {
              name: "b.weight"
              shape: [ 3, 0, 2 ]
              dtype: "float32"
              module_type: "Bilinear"
            })pb",
       "in1_features (weight.size(1)) is 0"},
  };
  for (const auto& c : cases) {
    EXPECT_THAT(
        Plan(c.spec).plans.status(),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.reason)))
        << c.spec;
  }
}

TEST(ModulePlanTest, OverriddenTensorsStillConsumeTheirDraws) {
  // The weight has its own init; the bias is module_default and needs the
  // weight's draws (and shape) first.
  Planned p = Plan(R"pb(
    tensors {
      name: "fc.weight"
      shape: [ 3, 2 ]
      dtype: "bfloat16"
      module_type: "Linear"
      init { zeros {} }
    }
    tensors {
      name: "fc.bias"
      shape: [ 3 ]
      dtype: "bfloat16"
    }
  )pb");
  ASSERT_OK(p.plans.status());
  EXPECT_EQ(p.plans->by_tensor[0], nullptr);
  const ModulePlan& plan = *p.plans->by_tensor[1];
  const ModuleSlot* weight = Slot(plan, "weight");
  ASSERT_NE(weight, nullptr);
  EXPECT_FALSE(weight->write);
  EXPECT_TRUE(weight->consume);
  EXPECT_EQ(weight->dtype, spec::DType::kBFloat16);
  EXPECT_TRUE(Slot(plan, "bias")->write);

  // Only the weight is module_default: nothing after it needs the bias.
  Planned q = Plan(R"pb(
    tensors {
      name: "fc.weight"
      shape: [ 3, 2 ]
      dtype: "float8_e4m3fn"
      module_type: "Linear"
    }
    tensors {
      name: "fc.bias"
      shape: [ 3 ]
      dtype: "float32"
      init { ones {} }
    }
  )pb");
  ASSERT_OK(q.plans.status());
  ASSERT_EQ(q.plans->by_tensor[0]->slots.size(), 1u);
  EXPECT_EQ(q.plans->by_tensor[0]->slots[0].dtype, spec::DType::kFloat32);
}

TEST(ModulePlanTest, MultiheadAttentionAndItsOutProj) {
  Planned p = Plan(R"pb(
    tensors {
      name: "attn.in_proj_weight"
      shape: [ 12, 4 ]
      dtype: "float32"
      module_type: "MultiheadAttention"
    }
    tensors {
      name: "attn.in_proj_bias"
      shape: [ 12 ]
      dtype: "float32"
      module_type: "MultiheadAttention"
    }
    tensors {
      name: "attn.out_proj.weight"
      shape: [ 4, 4 ]
      dtype: "float32"
      module_type: "NonDynamicallyQuantizableLinear"
    }
    tensors {
      name: "attn.out_proj.bias"
      shape: [ 4 ]
      dtype: "float32"
      module_type: "NonDynamicallyQuantizableLinear"
    }
    tensors {
      name: "attn.bias_v"
      shape: [ 1, 1, 4 ]
      dtype: "float32"
      module_type: "MultiheadAttention"
    }
  )pb");
  ASSERT_OK(p.plans.status());
  const ModulePlan& mha = *p.plans->by_tensor[0];
  EXPECT_EQ(mha.type, "MultiheadAttention");
  // bias_k is absent but drawn before bias_v: consumed with shape [1, 1, 4].
  const ModuleSlot* bias_k = Slot(mha, "bias_k");
  ASSERT_NE(bias_k, nullptr);
  EXPECT_TRUE(bias_k->consume);
  EXPECT_EQ(bias_k->shape, (std::vector<int64_t>{1, 1, 4}));
  EXPECT_TRUE(Slot(mha, "in_proj_weight")->op.has_xavier_uniform());
  EXPECT_TRUE(Slot(mha, "in_proj_bias")->op.has_zeros());
  EXPECT_TRUE(Slot(mha, "bias_v")->op.has_xavier_normal());
  // out_proj is a Linear whose bias MultiheadAttention zeroes.
  const ModulePlan& out = *p.plans->by_tensor[2];
  EXPECT_EQ(out.name, "attn.out_proj");
  EXPECT_TRUE(Slot(out, "weight")->op.has_kaiming_uniform());
  EXPECT_TRUE(Slot(out, "bias")->op.has_zeros());
}

TEST(ModulePlanTest, LstmFlagsComeFromThePresentTensors) {
  // 2 layers, bidirectional, with bias and projections (hidden 3, proj 2).
  // bias_ih_l0 is absent: its shape follows from the gate size, so its
  // draws are consumed and the rest stays aligned.
  Planned p = Plan(R"pb(
    tensors {
      name: "rnn.weight_ih_l0"
      shape: [ 12, 5 ]
      dtype: "float32"
      module_type: "LSTM"
    }
    tensors {
      name: "rnn.weight_hh_l0"
      shape: [ 12, 2 ]
      dtype: "float32"
      module_type: "LSTM"
    }
    tensors {
      name: "rnn.bias_hh_l0"
      shape: [ 12 ]
      dtype: "float32"
      module_type: "LSTM"
    }
    tensors {
      name: "rnn.weight_hr_l0"
      shape: [ 2, 3 ]
      dtype: "float32"
      module_type: "LSTM"
    }
    tensors {
      name: "rnn.weight_ih_l0_reverse"
      shape: [ 12, 5 ]
      dtype: "float32"
      module_type: "LSTM"
    }
    tensors {
      name: "rnn.weight_ih_l1"
      shape: [ 12, 4 ]
      dtype: "float32"
      module_type: "LSTM"
    }
  )pb");
  ASSERT_OK(p.plans.status());
  const ModulePlan& plan = *p.plans->by_tensor[0];
  std::vector<std::string> order;
  for (const ModuleSlot& slot : plan.slots) order.push_back(slot.local_name);
  // Slots after the last written one are dropped.
  EXPECT_THAT(
      order, ::testing::ElementsAre(
                 "weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0",
                 "weight_hr_l0", "weight_ih_l0_reverse", "weight_hh_l0_reverse",
                 "bias_ih_l0_reverse", "bias_hh_l0_reverse",
                 "weight_hr_l0_reverse", "weight_ih_l1"));
  const ModuleSlot* b = Slot(plan, "bias_ih_l0");
  EXPECT_TRUE(b->consume);
  EXPECT_EQ(b->shape, (std::vector<int64_t>{12}));
  EXPECT_EQ(Slot(plan, "weight_hh_l0_reverse")->shape,
            (std::vector<int64_t>{12, 2}));
  EXPECT_EQ(Slot(plan, "weight_hr_l0_reverse")->shape,
            (std::vector<int64_t>{2, 3}));
  // stdv = 1 / sqrt(hidden_size = 12 / 4).
  EXPECT_EQ(plan.slots[0].op.uniform().b(), 1.0 / std::sqrt(3.0));
}

TEST(ModulePlanTest, NormsAreDeterministicAndTakeAnyDtype) {
  Planned p = Plan(R"pb(
    tensors {
      name: "bn.weight"
      shape: [ 4 ]
      dtype: "float32"
      module_type: "BatchNorm2d"
    }
    tensors {
      name: "bn.bias"
      shape: [ 4 ]
      dtype: "float32"
      module_type: "BatchNorm2d"
    }
    tensors {
      name: "bn.running_mean"
      shape: [ 4 ]
      dtype: "float32"
      kind: TENSOR_KIND_BUFFER
      module_type: "BatchNorm2d"
    }
    tensors {
      name: "bn.running_var"
      shape: [ 4 ]
      dtype: "float32"
      kind: TENSOR_KIND_BUFFER
      module_type: "BatchNorm2d"
    }
    tensors {
      name: "bn.num_batches_tracked"
      dtype: "int64"
      kind: TENSOR_KIND_BUFFER
      module_type: "BatchNorm2d"
    }
  )pb");
  ASSERT_OK(p.plans.status());
  const ModulePlan& plan = *p.plans->by_tensor[0];
  EXPECT_TRUE(Slot(plan, "running_var")->op.has_ones());
  EXPECT_TRUE(Slot(plan, "num_batches_tracked")->op.has_zeros());
  EXPECT_TRUE(Slot(plan, "weight")->op.has_ones());
  EXPECT_TRUE(Slot(plan, "bias")->op.has_zeros());
}

}  // namespace
}  // namespace materializer::init
