#include "server/init/fill.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/diag.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/eye.h>
#include <ATen/ops/linalg_qr.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/randperm.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ScalarOps.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/text_format.h"
#include "server/init/init_math.h"
#include "tests/testing/status_matchers.h"

namespace materializer::init {
namespace {

constexpr uint64_t kSeed = 0x1234abcd5678ef01ULL;

at::Generator Gen(uint64_t seed = kSeed) {
  return MakeGenerator(at::Device(at::kCPU), seed);
}

v1::InitScheme Parse(const std::string& text) {
  v1::InitScheme scheme;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &scheme))
      << text;
  return scheme;
}

at::Tensor Filled(std::vector<int64_t> shape, at::ScalarType type,
                  const std::string& scheme, uint64_t seed = kSeed) {
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
  Fill(t, Parse(scheme), Gen(seed), Gen(seed));
  return t;
}

// Bit-for-bit equality (NaN and -0.0 included).
bool SameBits(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         at::equal(a.contiguous().view(at::kByte),
                   b.contiguous().view(at::kByte));
}

TEST(FillTest, TruncNormalIsTorchsOpSequence) {
  for (at::ScalarType type :
       {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
    at::Tensor got = Filled({37, 29}, type,
                            "trunc_normal { mean: 0.1 std: 0.7 a: -1 b: 2.5 }");
    at::Generator g = Gen();
    const double l = (1.0 + LibmErf((-1 - 0.1) / 0.7 / std::sqrt(2.0))) / 2.0;
    const double u = (1.0 + LibmErf((2.5 - 0.1) / 0.7 / std::sqrt(2.0))) / 2.0;
    at::Tensor want = at::empty({37, 29}, at::TensorOptions().dtype(type));
    want.uniform_(2 * l - 1, 2 * u - 1, g);
    // Python passes the numbers as wrapped-number tensors (for float16 the
    // Scalar overload of mul_ would round 0.7 * sqrt(2) to float16 first).
    want.erfinv_()
        .mul_(at::native::wrapped_scalar_tensor(0.7 * std::sqrt(2.0)))
        .add_(at::native::wrapped_scalar_tensor(0.1))
        .clamp_(-1, 2.5);
    EXPECT_TRUE(SameBits(got, want)) << type;
    EXPECT_GE(got.min().item<double>(), -1);
    EXPECT_LE(got.max().item<double>(), 2.5);
  }
}

TEST(FillTest, XavierAndKaimingAreUniformOrNormalWithTorchsBounds) {
  // Conv-shaped: fan_in = 4 * 9, fan_out = 6 * 9.
  const std::vector<int64_t> shape = {6, 4, 3, 3};
  {
    at::Tensor got =
        Filled(shape, at::kFloat,
               "xavier_uniform { gain { nonlinearity: \"relu\" } }");
    const double a = std::sqrt(3.0) * (std::sqrt(2.0) * std::sqrt(2.0 / 90.0));
    at::Generator g = Gen();
    at::Tensor want = at::empty(shape).uniform_(-a, a, g);
    EXPECT_TRUE(SameBits(got, want));
  }
  {
    at::Tensor got =
        Filled(shape, at::kDouble, "xavier_normal { gain { value: 0.5 } }");
    at::Generator g = Gen();
    at::Tensor want = at::empty(shape, at::kDouble)
                          .normal_(0.0, 0.5 * std::sqrt(2.0 / 90.0), g);
    EXPECT_TRUE(SameBits(got, want));
  }
  {
    at::Tensor got = Filled(shape, at::kBFloat16,
                            "kaiming_uniform { a: 0.2 mode: \"fan_out\" }");
    const double gain = std::sqrt(2.0 / (1 + LibmPow(0.2, 2)));
    const double bound = std::sqrt(3.0) * (gain / std::sqrt(54.0));
    at::Generator g = Gen();
    at::Tensor want =
        at::empty(shape, at::kBFloat16).uniform_(-bound, bound, g);
    EXPECT_TRUE(SameBits(got, want));
  }
  {
    at::Tensor got =
        Filled(shape, at::kHalf, "kaiming_normal { nonlinearity: \"relu\" }");
    at::Generator g = Gen();
    at::Tensor want = at::empty(shape, at::kHalf)
                          .normal_(0, std::sqrt(2.0) / std::sqrt(36.0), g);
    EXPECT_TRUE(SameBits(got, want));
  }
}

TEST(FillTest, OrthogonalIsTorchsQrPathAndOrthogonal) {
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{7, 13}, std::vector<int64_t>{13, 7},
        std::vector<int64_t>{4, 3, 2, 2}}) {
    at::Tensor got =
        Filled(shape, at::kFloat, "orthogonal { gain { value: 2 } }");
    // torch.nn.init.orthogonal_, step by step.
    const int64_t rows = shape[0];
    const int64_t cols = got.numel() / rows;
    at::Generator g = Gen();
    at::Tensor flat = at::empty({rows, cols}).normal_(0, 1, g);
    if (rows < cols) flat.t_();
    auto [q, r] = at::linalg_qr(flat);
    q.mul_(at::diag(r, 0).sign());
    if (rows < cols) q.t_();
    at::Tensor want = at::empty(shape);
    want.view_as(q).copy_(q);
    want.mul_(2.0);
    EXPECT_TRUE(SameBits(got, want));
    // (Semi-)orthogonal rows or columns, times the gain.
    at::Tensor m = got.reshape({rows, cols}).to(at::kDouble) / 2;
    at::Tensor gram = rows < cols ? m.matmul(m.t()) : m.t().matmul(m);
    EXPECT_TRUE(
        at::allclose(gram, at::eye(gram.size(0), at::kDouble), 1e-5, 1e-5));
  }
  // float16 / bfloat16: computed in float32, then rounded once.
  at::Tensor half = Filled({9, 5}, at::kBFloat16, "orthogonal {}");
  at::Tensor wide = Filled({9, 5}, at::kFloat, "orthogonal {}");
  EXPECT_TRUE(SameBits(half, wide.to(at::kBFloat16)));
}

TEST(FillTest, EyeAndDiracForFloatsIntsAndBool) {
  for (at::ScalarType type :
       {at::kFloat, at::kInt, at::kBool, at::kHalf, at::kFloat8_e4m3fn}) {
    at::Tensor eye = Filled({3, 5}, type, "eye {}");
    EXPECT_TRUE(at::equal(eye.to(at::kFloat), at::eye(3, 5))) << type;
  }
  at::Tensor dirac = Filled({6, 4, 3, 3}, at::kInt, "dirac { groups: 2 }");
  // out_chans_per_grp = 3, min_dim = 3: ones at [g*3 + d, d, 1, 1].
  EXPECT_EQ(dirac.sum().item<int64_t>(), 6);
  for (int64_t g = 0; g < 2; ++g) {
    for (int64_t d = 0; d < 3; ++d) {
      EXPECT_EQ(dirac[g * 3 + d][d][1][1].item<int>(), 1);
    }
  }
  at::Tensor dirac3 = Filled({2, 5, 4}, at::kFloat, "dirac {}");
  EXPECT_EQ(dirac3[1][1][2].item<float>(), 1.0f);
  EXPECT_EQ(dirac3.sum().item<float>(), 2.0f);
}

TEST(FillTest, SparseZeroesCeilOfSparsityRowsPerColumn) {
  at::Tensor got =
      Filled({10, 6}, at::kFloat, "sparse { sparsity: 0.25 std: 2 }");
  for (int64_t col = 0; col < 6; ++col) {
    EXPECT_EQ((got.select(1, col) == 0).sum().item<int64_t>(), 3);  // ceil(2.5)
  }
  // torch.nn.init.sparse_ with torch.randperm drawing from `permutations`.
  at::Generator g = Gen();
  at::Generator perm = Gen();
  at::Tensor want = at::empty({10, 6}).normal_(0, 2, g);
  for (int64_t col = 0; col < 6; ++col) {
    at::Tensor rows = at::randperm(10, perm, at::kLong).narrow(0, 0, 3);
    want.select(1, col).index_fill_(0, rows, 0);
  }
  EXPECT_TRUE(SameBits(got, want));
}

TEST(FillTest, ArangeInFloat64OrInt64ThenCast) {
  at::Tensor ints = Filled({2, 3}, at::kChar, "arange { start: -3 step: 2 }");
  EXPECT_TRUE(at::equal(
      ints, at::tensor({-3, -1, 1, 3, 5, 7}, at::kChar).view({2, 3})));
  at::Tensor halfs = Filled({5}, at::kHalf, "arange { start: 0.5 step: 0.1 }");
  at::Tensor want = (at::arange(5, at::kDouble) * 0.1 + 0.5).to(at::kHalf);
  EXPECT_TRUE(SameBits(halfs, want));
  // 2^53 + 2, + 1: not a float64, but int64 arithmetic is exact.
  at::Tensor longs =
      Filled({3}, at::kLong, "arange { start: 9007199254740994 step: 1 }");
  EXPECT_EQ(longs[1].item<int64_t>(), 9007199254740995LL);
}

TEST(FillTest, RopeInvFreqFollowsHuggingFace) {
  RopeParams p;
  p.base = 10000;
  p.dim = 64;
  at::Tensor inv = RopeInvFreq(p);
  ASSERT_EQ(inv.numel(), 32);
  EXPECT_EQ(inv.scalar_type(), at::kFloat);
  at::Tensor want =
      at::pow(10000.0, at::arange(0, 64, 2, at::kLong).to(at::kFloat) / 64)
          .reciprocal() *
      1.0;
  EXPECT_TRUE(SameBits(inv, want));
  EXPECT_EQ(inv[0].item<float>(), 1.0f);

  p.type = RopeType::kLinear;
  p.factor = 4;
  EXPECT_TRUE(SameBits(RopeInvFreq(p), want / 4.0));

  // llama3: short wavelengths kept, long ones divided by the factor.
  p.type = RopeType::kLlama3;
  p.base = 500000;
  p.factor = 8;
  p.original_max_position_embeddings = 8192;
  RopeParams plain = p;
  plain.type = RopeType::kDefault;
  at::Tensor base = RopeInvFreq(plain);
  at::Tensor llama = RopeInvFreq(p);
  EXPECT_EQ(llama[0].item<float>(), base[0].item<float>());
  EXPECT_EQ(llama[31].item<float>(), (base[31] / 8.0).item<float>());
  EXPECT_TRUE((llama <= base).all().item<bool>());

  // yarn: the first dimensions extrapolate, the last interpolate.
  p.type = RopeType::kYarn;
  p.base = 10000;
  p.factor = 4;
  p.original_max_position_embeddings = 4096;
  plain.base = 10000;
  at::Tensor yarn = RopeInvFreq(p);
  at::Tensor ten_k = RopeInvFreq(plain);
  EXPECT_EQ(yarn[0].item<float>(), ten_k[0].item<float>());
  EXPECT_NEAR(yarn[31].item<float>(), ten_k[31].item<float>() / 4, 1e-9);
}

TEST(FillTest, ZeroElementTensorsDrawNothing) {
  at::Generator g = Gen();
  at::Tensor empty = at::empty({0, 5});
  Fill(empty, Parse("kaiming_uniform {}"), g);
  Fill(empty, Parse("orthogonal {}"), g);
  at::Tensor after = at::empty({4}).uniform_(0, 1, g);
  at::Generator fresh = Gen();
  EXPECT_TRUE(SameBits(after, at::empty({4}).uniform_(0, 1, fresh)));
}

TEST(FillTest, FillModuleConsumesDrawsOfTensorsItDoesNotWrite) {
  // Linear(20 -> 30): only the bias is written; the weight's draws come
  // first, into scratch.
  ModulePlan plan;
  plan.name = "fc";
  plan.type = "Linear";
  ModuleSlot weight;
  weight.local_name = "weight";
  weight.shape = {30, 20};
  weight.op.mutable_kaiming_uniform()->set_a(std::sqrt(5.0));
  weight.consume = true;
  ModuleSlot bias;
  bias.local_name = "bias";
  bias.tensor = 0;
  bias.shape = {30};
  bias.op.mutable_uniform()->set_a(-1 / std::sqrt(20.0));
  bias.op.mutable_uniform()->set_b(1 / std::sqrt(20.0));
  bias.write = true;
  plan.slots = {weight, bias};
  std::vector<at::Tensor> views = {at::empty({30})};
  FillModule(plan, views, at::Device(at::kCPU), Gen(7));

  at::Generator g = Gen(7);
  const double gain = std::sqrt(2.0 / (1 + LibmPow(std::sqrt(5.0), 2)));
  const double w_bound = std::sqrt(3.0) * (gain / std::sqrt(20.0));
  at::empty({30, 20}).uniform_(-w_bound, w_bound, g);
  at::Tensor want =
      at::empty({30}).uniform_(-1 / std::sqrt(20.0), 1 / std::sqrt(20.0), g);
  EXPECT_TRUE(SameBits(views[0], want));
}

TEST(FillTest, EmbeddingPaddingRowIsZeroed) {
  ModulePlan plan;
  plan.name = "wte";
  plan.type = "Embedding";
  plan.padding_idx = 2;
  ModuleSlot weight;
  weight.local_name = "weight";
  weight.tensor = 0;
  weight.shape = {5, 3};
  weight.op.mutable_normal();
  weight.write = true;
  plan.slots = {weight};
  std::vector<at::Tensor> views = {at::empty({5, 3}, at::kHalf)};
  FillModule(plan, views, at::Device(at::kCPU), Gen(3));
  at::Generator g = Gen(3);
  at::Tensor want = at::empty({5, 3}, at::kHalf).normal_(0, 1, g);
  want[2].fill_(0);
  EXPECT_TRUE(SameBits(views[0], want));
}

}  // namespace
}  // namespace materializer::init

namespace materializer::init {
namespace {

// The part `box` of `full`.
at::Tensor Slice(at::Tensor full, const portable::Box& box) {
  for (size_t d = 0; d < box.offset.size(); ++d) {
    full = full.narrow(static_cast<int64_t>(d), box.offset[d], box.length[d]);
  }
  return full;
}

std::string ValuesText(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  std::string bytes(static_cast<const char*>(c.data_ptr()), c.nbytes());
  std::string text = "values { data: \"";
  for (unsigned char b : bytes) {
    absl::StrAppend(&text, "\\", absl::Dec(b >> 6), absl::Dec((b >> 3) & 7),
                    absl::Dec(b & 7));
  }
  return text + "\" }";
}

// FillBox gives each part of a tensor exactly the same slice of Fill on
// the whole (the portable fill of a shard of a computed buffer or a
// values step), for boxes of every kind: inner, at the edges, empty-free
// single rows and columns, and the whole.
TEST(FillBoxTest, EveryPartIsTheSliceOfTheWhole) {
  struct Shape {
    std::vector<int64_t> shape;
    std::vector<portable::Box> boxes;
  };
  const Shape two_d{{9, 70000},
                    {{{0, 0}, {9, 70000}},
                     {{2, 5}, {3, 7}},
                     {{4, 0}, {1, 70000}},
                     {{0, 69990}, {9, 10}},
                     {{6, 3}, {3, 2}}}};
  const Shape three_d{
      {6, 4, 5},
      {{{0, 0, 0}, {6, 4, 5}}, {{1, 1, 2}, {4, 2, 3}}, {{3, 0, 0}, {2, 4, 5}}}};
  const Shape one_d{{64}, {{{0}, {64}}, {{5}, {20}}, {{63}, {1}}}};
  struct Scheme {
    std::string text;
    const Shape* shape;
    std::vector<at::ScalarType> types;
  };
  const std::vector<Scheme> schemes = {
      {"eye {}", &two_d, {at::kFloat, at::kFloat8_e4m3fn, at::kBool, at::kInt}},
      {"dirac { groups: 2 }",
       &three_d,
       {at::kFloat, at::kBFloat16, at::kFloat8_e5m2, at::kLong}},
      {"arange { start: -3 step: 0.25 }",
       &two_d,
       {at::kFloat, at::kDouble, at::kHalf, at::kFloat8_e4m3fn}},
      {"arange { start: 7 step: -3 }", &three_d, {at::kLong, at::kInt}},
      {"rope_inv_freq { scaling { type: \"yarn\" factor: 4 "
       "original_max_position_embeddings: 64 } }",
       &one_d,
       {at::kFloat, at::kBFloat16, at::kDouble}},
      {"constant { val: 1.5 }", &three_d, {at::kFloat, at::kFloat8_e4m3fn}},
  };
  for (const Scheme& scheme : schemes) {
    for (at::ScalarType type : scheme.types) {
      const at::TensorOptions options = at::TensorOptions().dtype(type);
      at::Tensor whole = at::empty(scheme.shape->shape, options);
      Fill(whole, Parse(scheme.text), std::nullopt);
      for (const portable::Box& box : scheme.shape->boxes) {
        at::Tensor part = at::empty(box.length, options);
        FillBox(part, Parse(scheme.text), scheme.shape->shape, box);
        EXPECT_TRUE(SameBits(part, Slice(whole, box).contiguous()))
            << scheme.text << " " << type << " box at "
            << absl::StrJoin(box.offset, ",");
      }
    }
  }
  // values: the part of the bytes the box covers.
  at::Tensor source = at::randn({7, 5}).to(at::kBFloat16);
  const portable::Box box{{2, 1}, {4, 3}};
  at::Tensor part =
      at::empty(box.length, at::TensorOptions().dtype(at::kBFloat16));
  FillBox(part, Parse(ValuesText(source)), {7, 5}, box);
  EXPECT_TRUE(SameBits(part, Slice(source, box).contiguous()));
}

// In torch mode a step fills the view t[region] as Python's call on that
// view does: arange and values copy the region's values in, whatever the
// view's strides.
TEST(FillTest, RegionViewsTakeArangeAndValuesInPlace) {
  at::Tensor t = at::zeros({5, 6}, at::TensorOptions().dtype(at::kDouble));
  at::Tensor region = t.narrow(0, 1, 3).narrow(1, 2, 2);  // not contiguous
  Fill(region, Parse("arange { start: 10 step: 2 }"), std::nullopt);
  // t[1:4, 2:4].copy_((torch.arange(6, dtype=float64) * 2 + 10).reshape(3, 2))
  at::Tensor want = at::zeros({5, 6}, at::TensorOptions().dtype(at::kDouble));
  want.narrow(0, 1, 3).narrow(1, 2, 2).copy_(
      at::arange(6, at::TensorOptions().dtype(at::kDouble))
          .mul(2)
          .add(10)
          .reshape({3, 2}));
  EXPECT_TRUE(SameBits(t, want));

  at::Tensor ints = at::zeros({4, 4}, at::TensorOptions().dtype(at::kInt));
  at::Tensor column = ints.narrow(1, 3, 1);
  at::Tensor values = at::tensor({7, -8, 9, 1 << 30}, at::kInt).reshape({4, 1});
  Fill(column, Parse(ValuesText(values)), std::nullopt);
  EXPECT_TRUE(at::equal(ints.narrow(1, 3, 1), values));
  EXPECT_EQ(ints.narrow(1, 0, 3).abs().sum().item<int64_t>(), 0);
}

}  // namespace
}  // namespace materializer::init
