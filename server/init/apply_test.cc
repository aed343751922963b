#include "server/init/apply.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/count_nonzero.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/eye.h>
#include <ATen/ops/from_blob.h>
#include <ATen/CPUGeneratorImpl.h>
#include <dlfcn.h>

#include <cmath>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "google/protobuf/text_format.h"
#include "server/init/init_math.h"
#include "server/init/seed.h"
#include "server/init/shard.h"
#include "server/memory/arena_views.h"
#include "server/spec/layout.h"
#include "server/spec/validate.h"
#include "tests/testing/status_matchers.h"

namespace materializer::init {
namespace {

// Validates, resolves, allocates on a CPU pool and initializes `text`.
class Materialized {
 public:
  explicit Materialized(const std::string& text) {
    memory::DeviceConfig cpu;
    cpu.name = "cpu";
    cpu.capacity_bytes = uint64_t{4} << 30;
    pool_ = memory::DevicePool::Create({cpu}).value();
    v1::ModelSpec model;
    EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &model));
    // These tests are about torch mode (the default is portable).
    if (model.rng() == v1::RNG_MODE_UNSPECIFIED) {
      model.set_rng(v1::RNG_MODE_TORCH);
    }
    tensors_ = spec::ValidateTensors(model).value();
    EXPECT_OK(ApplyShards(model, model.rng(), tensors_));
    Resolution resolution = ResolveInits(model, tensors_).value();
    spec::Layout layout = spec::ComputeLayout(tensors_).value();
    memory::Reservation r =
        pool_->Reserve("test", "cpu", layout.arena_bytes).value();
    arena_ = memory::Arena::Allocate(std::move(r), tensors_, layout).value();
    status_ = ApplyInits(tensors_, resolution.inits, model.seed(), model.rng(),
                         *arena_);
  }

  const absl::Status& status() const { return status_; }

  at::Tensor Get(const std::string& name) const {
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (tensors_[i].name == name) return arena_->tensors().views[i];
    }
    ADD_FAILURE() << "no tensor " << name;
    return at::Tensor();
  }

 private:
  std::unique_ptr<memory::DevicePool> pool_;
  std::vector<spec::TensorDesc> tensors_;
  std::unique_ptr<memory::Arena> arena_;
  absl::Status status_;
};

TEST(ApplyInitsTest, DeterministicSchemesGiveExactValuesForEveryDtype) {
  const char* dtypes[] = {"float32", "float64", "float16",       "bfloat16",
                          "int8",    "int16",   "int32",         "int64",
                          "uint8",   "bool",    "float8_e4m3fn", "float8_e5m2"};
  std::string text;
  for (const char* dtype : dtypes) {
    for (const char* scheme : {"zeros", "ones", "constant"}) {
      absl::StrAppend(&text, "tensors { name: \"", scheme, ".", dtype,
                      "\" shape: [ 33, 7 ] dtype: \"", dtype, "\" }\n");
    }
  }
  text += R"pb(
    init_rules {
      pattern: "zeros.*"
      init { zeros {} }
    }
    init_rules {
      pattern: "ones.*"
      init { ones {} }
    }
    init_rules {
      pattern: "constant.bool"
      init { constant { val: 1 } }
    }
    init_rules {
      pattern: "constant.*"
      init { constant { val: 3 } }
    }
  )pb";
  Materialized m(text);
  ASSERT_OK(m.status());
  for (const char* dtype : dtypes) {
    const std::string d = dtype;
    const double constant = d == "bool" ? 1.0 : 3.0;
    at::Tensor zeros = m.Get("zeros." + d).to(at::kDouble);
    at::Tensor ones = m.Get("ones." + d).to(at::kDouble);
    at::Tensor constants = m.Get("constant." + d).to(at::kDouble);
    EXPECT_TRUE(zeros.eq(0).all().item<bool>()) << d;
    EXPECT_TRUE(ones.eq(1).all().item<bool>()) << d;
    EXPECT_TRUE(constants.eq(constant).all().item<bool>()) << d;
  }
}

TEST(ApplyInitsTest, UniformAndNormalHaveTheRequestedDistribution) {
  Materialized m(R"pb(
    tensors {
      name: "u"
      shape: [ 1000, 1000 ]
      dtype: "float32"
    }
    tensors {
      name: "n"
      shape: [ 1000, 1000 ]
      dtype: "float32"
    }
    tensors {
      name: "n16"
      shape: [ 1000, 1000 ]
      dtype: "bfloat16"
    }
    init_rules {
      pattern: "u"
      init { uniform { a: -2 b: 3 } }
    }
    init_rules {
      pattern: "n*"
      init { normal { mean: 0.5 std: 0.02 } }
    }
    seed: 1234
  )pb");
  ASSERT_OK(m.status());
  at::Tensor u = m.Get("u");
  EXPECT_GE(u.min().item<float>(), -2.0f);
  EXPECT_LT(u.max().item<float>(), 3.0f);
  // Mean of U(-2, 3) is 0.5 with std 5/sqrt(12); 1e6 samples: se ~1.4e-3.
  EXPECT_NEAR(u.mean().item<double>(), 0.5, 0.01);
  EXPECT_NEAR(u.std().item<double>(), 5.0 / std::sqrt(12.0), 0.01);
  for (const char* name : {"n", "n16"}) {
    at::Tensor n = m.Get(name).to(at::kDouble);
    EXPECT_NEAR(n.mean().item<double>(), 0.5, 0.001) << name;
    EXPECT_NEAR(n.std().item<double>(), 0.02, 0.001) << name;
  }
}

TEST(ApplyInitsTest, EqualsTorchWithAGeneratorSeededFromTheName) {
  Materialized m(R"pb(
    tensors {
      name: "h.0.w"
      shape: [ 129, 65 ]
      dtype: "float32"
    }
    tensors {
      name: "h.0.b"
      shape: [ 17 ]
      dtype: "bfloat16"
    }
    tensors {
      name: "h.0.u"
      shape: [ 3, 4, 5 ]
      dtype: "float64"
    }
    init_rules {
      pattern: "*.w"
      init { normal { std: 0.02 } }
    }
    init_rules {
      pattern: "*.b"
      init { normal { mean: 1 std: 3 } }
    }
    init_rules {
      pattern: "*.u"
      init { uniform { a: -0.5 b: 0.25 } }
    }
    seed: 99
  )pb");
  ASSERT_OK(m.status());
  auto generator = [](const char* name) {
    at::Generator g = at::make_generator<at::CPUGeneratorImpl>();
    g.set_current_seed(DeriveSeed(99, name));
    return g;
  };
  at::Tensor w =
      at::empty({129, 65}, at::kFloat).normal_(0, 0.02, generator("h.0.w"));
  at::Tensor b =
      at::empty({17}, at::kBFloat16).normal_(1, 3, generator("h.0.b"));
  at::Tensor u = at::empty({3, 4, 5}, at::kDouble)
                     .uniform_(-0.5, 0.25, generator("h.0.u"));
  EXPECT_TRUE(at::equal(m.Get("h.0.w"), w));
  EXPECT_TRUE(at::equal(m.Get("h.0.b"), b));
  EXPECT_TRUE(at::equal(m.Get("h.0.u"), u));
}

TEST(ApplyInitsTest, ValuesDoNotDependOnOtherTensorsOrOrder) {
  const char* rules = R"pb(
    init_rules {
      pattern: "*"
      init { normal {} }
    }
    seed: 5
  )pb";
  Materialized alone(std::string(R"pb(
                       tensors {
                         name: "x"
                         shape: [ 300 ]
                         dtype: "float32"
                       }
                     )pb") +
                     rules);
  Materialized crowd(std::string(R"pb(
                       tensors {
                         name: "z"
                         shape: [ 1000 ]
                         dtype: "float32"
                       }
                       tensors {
                         name: "y"
                         shape: [ 7, 7 ]
                         dtype: "float32"
                       }
                       tensors {
                         name: "x"
                         shape: [ 300 ]
                         dtype: "float32"
                       }
                     )pb") +
                     rules);
  ASSERT_OK(alone.status());
  ASSERT_OK(crowd.status());
  EXPECT_TRUE(at::equal(alone.Get("x"), crowd.Get("x")));
  EXPECT_FALSE(at::equal(crowd.Get("x"), crowd.Get("z").narrow(0, 0, 300)));
}

TEST(ApplyInitsTest, ZeroSizeAndScalarTensors) {
  Materialized m(R"pb(
    tensors {
      name: "empty"
      shape: [ 0, 4 ]
      dtype: "float32"
    }
    tensors { name: "scalar" dtype: "float32" }
    init_rules {
      pattern: "*"
      init { constant { val: -7.25 } }
    }
  )pb");
  ASSERT_OK(m.status());
  EXPECT_EQ(m.Get("empty").numel(), 0);
  EXPECT_EQ(m.Get("scalar").item<float>(), -7.25f);
}

at::Generator Generator(uint64_t seed, const char* name) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>();
  g.set_current_seed(DeriveSeed(seed, name));
  return g;
}

TEST(ApplyInitsTest, EveryNewSchemeThroughRules) {
  Materialized m(R"pb(
    tensors {
      name: "tn"
      shape: [ 40, 30 ]
      dtype: "float32"
    }
    tensors {
      name: "xu"
      shape: [ 40, 30 ]
      dtype: "float32"
    }
    tensors {
      name: "kn"
      shape: [ 8, 4, 3, 3 ]
      dtype: "float64"
    }
    tensors {
      name: "or"
      shape: [ 20, 50 ]
      dtype: "bfloat16"
    }
    tensors {
      name: "ey"
      shape: [ 4, 6 ]
      dtype: "int32"
    }
    tensors {
      name: "di"
      shape: [ 4, 4, 3 ]
      dtype: "bool"
    }
    tensors {
      name: "sp"
      shape: [ 10, 7 ]
      dtype: "float16"
    }
    tensors {
      name: "ar"
      shape: [ 2, 5 ]
      dtype: "int64"
    }
    tensors {
      name: "em"
      shape: [ 9 ]
      dtype: "float32"
    }
    tensors {
      name: "rf"
      shape: [ 16 ]
      dtype: "float32"
    }
    init_rules {
      pattern: "tn"
      init { trunc_normal { std: 0.02 } }
    }
    init_rules {
      pattern: "xu"
      init { xavier_uniform {} }
    }
    init_rules {
      pattern: "kn"
      init { kaiming_normal { mode: "fan_out" } }
    }
    init_rules {
      pattern: "or"
      init { orthogonal {} }
    }
    init_rules {
      pattern: "ey"
      init { eye {} }
    }
    init_rules {
      pattern: "di"
      init { dirac {} }
    }
    init_rules {
      pattern: "sp"
      init { sparse { sparsity: 0.5 } }
    }
    init_rules {
      pattern: "ar"
      init { arange { start: 10 step: -1 } }
    }
    init_rules {
      pattern: "em"
      init { empty {} }
    }
    init_rules {
      pattern: "rf"
      init { rope_inv_freq {} }
    }
    seed: 11
  )pb");
  ASSERT_OK(m.status());
  const double a = std::sqrt(3.0) * std::sqrt(2.0 / 70.0);
  at::Generator g = Generator(11, "xu");
  EXPECT_TRUE(at::equal(m.Get("xu"), at::empty({40, 30}).uniform_(-a, a, g)));
  EXPECT_LE(m.Get("tn").abs().max().item<float>(), 2.0f);
  EXPECT_TRUE(at::equal(m.Get("ey"), at::eye(4, 6, at::kInt)));
  EXPECT_EQ(m.Get("di").sum().item<int64_t>(), 4);
  for (int64_t col = 0; col < 7; ++col) {
    EXPECT_EQ((m.Get("sp").select(1, col) == 0).sum().item<int64_t>(), 5);
  }
  EXPECT_EQ(m.Get("ar")[1][4].item<int64_t>(), 1);
  EXPECT_EQ(at::count_nonzero(m.Get("em")).item<int64_t>(), 0);
  EXPECT_EQ(m.Get("rf")[0].item<float>(), 1.0f);
  at::Tensor o = m.Get("or").to(at::kDouble);
  EXPECT_TRUE(
      at::allclose(o.matmul(o.t()), at::eye(20, at::kDouble), 0.02, 0.02));
}

TEST(ApplyInitsTest, ModuleDefaultDrawsFromOneGeneratorPerModule) {
  Materialized m(R"pb(
    tensors {
      name: "enc.fc.bias"
      shape: [ 6 ]
      dtype: "float32"
    }
    tensors {
      name: "enc.fc.weight"
      shape: [ 6, 5 ]
      dtype: "float32"
    }
    tensors {
      name: "enc.wte.weight"
      shape: [ 7, 3 ]
      dtype: "float32"
    }
    tensors {
      name: "enc.ln.weight"
      shape: [ 3 ]
      dtype: "float32"
    }
    modules { name: "enc.fc" type: "torch.nn.Linear" }
    modules { name: "enc.wte" type: "Embedding" padding_idx: 0 }
    modules { name: "enc.ln" type: "LayerNorm" }
    init_rules {
      pattern: "*"
      init { module_default {} }
    }
    seed: 3
  )pb");
  ASSERT_OK(m.status());
  // Linear: kaiming_uniform_(weight, a=sqrt(5)), then the bias, in that
  // order, from the module's generator (the request lists bias first).
  at::Generator g = Generator(3, "enc.fc");
  const double w =
      std::sqrt(3.0) *
      (std::sqrt(2.0 / (1 + LibmPow(std::sqrt(5.0), 2))) / std::sqrt(5.0));
  at::Tensor weight = at::empty({6, 5}).uniform_(-w, w, g);
  at::Tensor bias =
      at::empty({6}).uniform_(-1 / std::sqrt(5.0), 1 / std::sqrt(5.0), g);
  EXPECT_TRUE(at::equal(m.Get("enc.fc.weight"), weight));
  EXPECT_TRUE(at::equal(m.Get("enc.fc.bias"), bias));
  at::Generator e = Generator(3, "enc.wte");
  at::Tensor table = at::empty({7, 3}).normal_(0, 1, e);
  table[0].fill_(0);
  EXPECT_TRUE(at::equal(m.Get("enc.wte.weight"), table));
  EXPECT_TRUE(m.Get("enc.ln.weight").eq(1).all().item<bool>());
}

TEST(ApplyInitsTest, TiedTensorsAreNotWrittenTwice) {
  Materialized m(R"pb(
    tensors {
      name: "wte.weight"
      shape: [ 9, 4 ]
      dtype: "float32"
    }
    tensors {
      name: "lm_head.weight"
      shape: [ 9, 4 ]
      dtype: "float32"
      tie_to: "wte.weight"
    }
    init_rules {
      pattern: "*"
      init { normal { std: 0.02 } }
    }
    seed: 8
  )pb");
  ASSERT_OK(m.status());
  at::Generator g = Generator(8, "wte.weight");
  at::Tensor want = at::empty({9, 4}).normal_(0, 0.02, g);
  EXPECT_TRUE(at::equal(m.Get("wte.weight"), want));
  EXPECT_TRUE(at::equal(m.Get("lm_head.weight"), want));
}

TEST(ApplyInitsTest, LeavesTheCallersKernelThreadCountAlone) {
  // The init threads run kernels on one thread each; the caller (a server
  // worker) must keep its own count, which sizes the next request's pool.
  using GetMaxThreads = int (*)();
  const auto get_max_threads = reinterpret_cast<GetMaxThreads>(
      dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
  if (get_max_threads == nullptr) GTEST_SKIP() << "LibTorch without OpenMP";
  const int before = get_max_threads();
  Materialized m(R"pb(
    tensors { name: "a" shape: [ 64 ] dtype: "float32" }
    tensors { name: "b" shape: [ 64 ] dtype: "float32" }
    init_rules {
      pattern: "*"
      init { normal {} }
    }
  )pb");
  ASSERT_OK(m.status());
  EXPECT_EQ(get_max_threads(), before);
}

TEST(ApplyInitsCancelTest, CancelledBeforeTheFirstTaskIsCancelled) {
  memory::DeviceConfig cpu;
  cpu.name = "cpu";
  cpu.capacity_bytes = uint64_t{1} << 30;
  auto pool = memory::DevicePool::Create({cpu}).value();
  v1::ModelSpec model;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(R"pb(
    tensors { name: "a" shape: [ 1000 ] dtype: "float32" }
    tensors { name: "b" shape: [ 1000 ] dtype: "float32" }
    init_rules {
      pattern: "*"
      init { normal {} }
    }
  )pb", &model));
  auto tensors = spec::ValidateTensors(model).value();
  auto resolution = ResolveInits(model, tensors).value();
  auto layout = spec::ComputeLayout(tensors).value();
  auto arena = memory::Arena::Allocate(
                   pool->Reserve("t", "cpu", layout.arena_bytes).value(),
                   tensors, layout)
                   .value();
  EXPECT_EQ(ApplyInits(tensors, resolution.inits, 1, v1::RNG_MODE_TORCH,
                       *arena, [] { return true; })
                .code(),
            absl::StatusCode::kCancelled);
  EXPECT_TRUE(ApplyInits(tensors, resolution.inits, 1, v1::RNG_MODE_TORCH,
                         *arena, [] { return false; })
                  .ok());
}

}  // namespace
}  // namespace materializer::init

namespace materializer::init {
namespace {

at::Generator TorchGenerator(uint64_t seed, const char* name) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>();
  g.set_current_seed(DeriveSeed(seed, name));
  return g;
}

bool SameBits(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         at::equal(a.contiguous().view(at::kByte),
                   b.contiguous().view(at::kByte));
}

// Torch mode: the steps run in order on the tensor's one generator, each
// on the view t[region], as the same calls in Python do (docs/init.md,
// "Init steps"): an embedding drawn then its padding row zeroed, a
// uniform over columns, kaiming over a block of rows (fans from the
// block), values over a corner.
TEST(ApplyStepsTest, TorchModeRunsTheCallsOnRegionViewsInOrder) {
  const float corner[] = {1.5f, -2.0f, 0.25f, 8.0f, -0.0f, 3.0f};
  std::string data;
  for (float v : corner) {
    data.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  Materialized m(
      absl::StrReplaceAll(R"pb(
                            seed: 41
                            tensors {
                              name: "emb.weight"
                              shape: [ 10, 8 ]
                              dtype: "float32"
                              init_steps { init { normal { std: 0.02 } } }
                              init_steps {
                                init { zeros {} }
                                region { offset: 3 length: 1 }
                                region { offset: 0 length: 8 }
                              }
                              init_steps {
                                init { uniform { a: -1 b: 1 } }
                                region { offset: 0 length: 10 }
                                region { offset: 2 length: 3 }
                              }
                              init_steps {
                                init { kaiming_uniform { a: 2.23606797749979 } }
                                region { offset: 5 length: 5 }
                                region { offset: 0 length: 8 }
                              }
                              init_steps {
                                init { values { data: "CORNER" } }
                                region { offset: 0 length: 2 }
                                region { offset: 0 length: 3 }
                              }
                            }
                          )pb",
                          {{"CORNER", absl::CEscape(data)}}));
  ASSERT_OK(m.status());
  at::Generator g = TorchGenerator(41, "emb.weight");
  at::Tensor want = at::empty({10, 8}, at::kFloat);
  want.normal_(0, 0.02, g);
  want.narrow(0, 3, 1).zero_();
  want.narrow(1, 2, 3).uniform_(-1, 1, g);
  at::Tensor rows = want.narrow(0, 5, 5);
  // kaiming_uniform_(t[5:10], a=sqrt(5)): fan_in 8 (the block's columns).
  const double gain = CalculateGain("leaky_relu", 2.23606797749979).value();
  const double bound = std::sqrt(3.0) * gain / std::sqrt(8.0);
  rows.uniform_(-bound, bound, g);
  want.narrow(0, 0, 2).narrow(1, 0, 3).copy_(
      at::from_blob(const_cast<float*>(corner), {2, 3}, at::kFloat));
  EXPECT_TRUE(SameBits(m.Get("emb.weight"), want));
  // Row 3 is zero where no later step wrote.
  EXPECT_EQ(m.Get("emb.weight")[3].narrow(0, 5, 3).abs().sum().item<float>(),
            0.0f);
}

// One step without a region is the plain init, byte for byte, in both
// modes (backward compatible).
TEST(ApplyStepsTest, OneStepWithoutARegionIsThePlainInit) {
  for (const char* rng : {"RNG_MODE_TORCH", "RNG_MODE_PORTABLE"}) {
    for (const char* scheme :
         {"trunc_normal { std: 0.5 }", "kaiming_normal { mode: \"fan_out\" }",
          "arange { start: 3 }"}) {
      const std::string tensor = R"pb(name: "w"
                                      shape: [ 10, 8 ]
                                      dtype: "bfloat16")pb";
      Materialized plain(absl::StrCat("seed: 3 rng: ", rng, " tensors { ",
                                      tensor, " init { ", scheme, " } }"));
      Materialized step(absl::StrCat("seed: 3 rng: ", rng, " tensors { ",
                                     tensor, " init_steps { init { ", scheme,
                                     " } } }"));
      ASSERT_OK(plain.status());
      ASSERT_OK(step.status());
      EXPECT_TRUE(SameBits(plain.Get("w"), step.Get("w"))) << rng << scheme;
    }
  }
}

// Portable mode: step k draws from stream k, over its region as a tensor
// of its own; step 0 is the plain init. Shards (rows, columns, blocks) hold
// exactly their slice of the full tensor after every step.
TEST(ApplyStepsTest, PortableStepsGiveEveryShardItsSlice) {
  const char* steps = R"pb(
    init_steps { init { normal { std: 0.5 } } }
    init_steps {
      init { uniform { a: 2 b: 3 } }
      region { offset: 1 length: 4 }
      region { offset: 3 length: 9 }
    }
    init_steps {
      init { arange { start: 100 } }
      region { offset: 4 length: 3 }
      region { offset: 0 length: 13 }
    }
    init_steps {
      init { xavier_normal {} }
      region { offset: 0 length: 7 }
      region { offset: 10 length: 3 }
    }
    init_steps {
      init { zeros {} }
      region { offset: 2 length: 1 }
      region { offset: 0 length: 13 }
    })pb";
  auto tensor = [&](const std::string& name, const std::string& extra) {
    return absl::StrCat("tensors { name: \"", name,
                        "\" shape: [ 7, 13 ] dtype: \"bfloat16\" ", extra,
                        " }");
  };
  Materialized full(
      absl::StrCat("rng: RNG_MODE_PORTABLE seed: 5 ", tensor("w", steps)));
  Materialized plain(absl::StrCat("rng: RNG_MODE_PORTABLE seed: 5 ",
                                  tensor("w", "init { normal { std: 0.5 } }")));
  ASSERT_OK(full.status());
  ASSERT_OK(plain.status());
  const at::Tensor whole = full.Get("w");
  // Step 0 is the plain init where no later step wrote (row 0, columns
  // 0..9), and only there.
  EXPECT_TRUE(
      SameBits(whole[0].narrow(0, 0, 10), plain.Get("w")[0].narrow(0, 0, 10)));
  EXPECT_FALSE(SameBits(whole[1], plain.Get("w")[1]));
  // Step 2 (arange over rows 4..6) counts within its region: 100 + i.
  EXPECT_EQ(whole[4][0].item<float>(), 100);
  EXPECT_EQ(whole[6][9].item<float>(), 100 + 2 * 13 + 9);
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>
      boxes = {{{0, 0}, {4, 13}}, {{4, 0}, {3, 13}}, {{0, 0}, {7, 5}},
               {{0, 5}, {7, 8}},  {{2, 4}, {3, 6}},  {{6, 12}, {1, 1}},
               {{3, 0}, {0, 13}}};
  for (const auto& [offset, length] : boxes) {
    std::string box;
    for (size_t d = 0; d < 2; ++d) {
      absl::StrAppend(&box, " box { offset: ", offset[d],
                      " length: ", length[d], " }");
    }
    Materialized shard(
        absl::StrCat("rng: RNG_MODE_PORTABLE seed: 5 ",
                     tensor("w", absl::StrCat(steps, " shard {", box, " }"))));
    ASSERT_OK(shard.status());
    at::Tensor want = whole;
    for (int64_t d = 0; d < 2; ++d) {
      want = want.narrow(d, offset[d], length[d]);
    }
    EXPECT_TRUE(SameBits(shard.Get("w"), want.contiguous()))
        << absl::StrJoin(offset, ",") << " " << absl::StrJoin(length, ",");
  }
}

}  // namespace
}  // namespace materializer::init
