#include "server/init/portable/portable.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/init/portable/generate.h"
#include "server/init/seed.h"
#include "tests/testing/status_matchers.h"

namespace materializer::init::portable {
namespace {

using ::materializer::testing::IsOk;
using ::materializer::testing::StatusIs;
using ::testing::HasSubstr;

constexpr spec::DType kFloatDTypes[] = {
    spec::DType::kFloat32, spec::DType::kFloat64,      spec::DType::kBFloat16,
    spec::DType::kFloat16, spec::DType::kFloat8E4M3FN, spec::DType::kFloat8E5M2,
};

std::vector<Distribution> AllDistributions() {
  return {Distribution::Constant(0.3), Distribution::Uniform(-0.25, 0.75),
          Distribution::Normal(0.5, 2.0),
          Distribution::TruncNormal(0.1, 1.0, -2.0, 1.5)};
}

PortableRequest Request(spec::DType dtype, const Distribution& dist,
                        std::vector<int64_t> shape) {
  PortableRequest r;
  r.seed = 1234;
  r.name_hash = NameHash("layers.0.weight");
  r.dtype = dtype;
  r.dist = dist;
  r.shape = std::move(shape);
  return r;
}

std::string Fill(const PortableRequest& r, FillOptions options = {}) {
  absl::StatusOr<int64_t> bytes = PortableOutputBytes(r);
  EXPECT_THAT(bytes, IsOk());
  std::string out(static_cast<size_t>(*bytes), '\xAB');
  EXPECT_THAT(FillPortable(r, out.data(), options), IsOk());
  return out;
}

std::string Describe(const PortableRequest& r) {
  std::string box = "full";
  if (r.box) {
    box = "";
    for (size_t d = 0; d < r.box->offset.size(); ++d) {
      absl::StrAppend(&box, d ? "," : "", r.box->offset[d], "+",
                      r.box->length[d]);
    }
  }
  return absl::StrCat(spec::Name(r.dtype), " dist ",
                      static_cast<int>(r.dist.kind), " box ", box);
}

// Calls fn(k, linear) for the k-th element of the box (box row-major) at
// full-tensor linear index `linear`.
template <class Fn>
void ForEachBoxElement(const std::vector<int64_t>& shape, const Box& box,
                       Fn fn) {
  const int rank = static_cast<int>(shape.size());
  std::vector<int64_t> idx(rank, 0);
  const int64_t n = NumElements(box);
  for (int64_t k = 0; k < n; ++k) {
    int64_t linear = 0;
    for (int d = 0; d < rank; ++d) {
      linear = linear * shape[d] + box.offset[d] + idx[d];
    }
    fn(k, linear);
    for (int d = rank - 1; d >= 0; --d) {
      if (++idx[d] < box.length[d]) break;
      idx[d] = 0;
    }
  }
}

// The bytes of a box cut out of the full tensor's bytes.
std::string Slice(const std::string& full, const std::vector<int64_t>& shape,
                  const Box& box, int64_t item) {
  std::string out;
  ForEachBoxElement(shape, box, [&](int64_t, int64_t linear) {
    out.append(full, static_cast<size_t>(linear * item),
               static_cast<size_t>(item));
  });
  return out;
}

// Writes a box's bytes into their place in the full tensor's bytes.
void Scatter(const std::string& piece, const std::vector<int64_t>& shape,
             const Box& box, int64_t item, std::string* full) {
  ForEachBoxElement(shape, box, [&](int64_t k, int64_t linear) {
    full->replace(static_cast<size_t>(linear * item), static_cast<size_t>(item),
                  piece, static_cast<size_t>(k * item),
                  static_cast<size_t>(item));
  });
}

TEST(PortableTest, KeyIsTorchModesPerTensorSeed) {
  const uint64_t s = DeriveSeed(1234, "h.0.attn.c_attn.weight");
  const PhiloxKey key = TensorKey(1234, NameHash("h.0.attn.c_attn.weight"));
  EXPECT_EQ(key.key0, static_cast<uint32_t>(s));
  EXPECT_EQ(key.key1, static_cast<uint32_t>(s >> 32));
}

// Pinned outputs: the first float32 normals of one tensor, and a hash of
// every (distribution, dtype) fill of a (7, 45) tensor. The same table is in
// tests/python/test_portable_reference.py, computed there from the NumPy
// reference. A change here changes every portable tensor: that
// is a new rng definition, not a fix.
TEST(PortableTest, PinnedKnownAnswers) {
  PortableRequest r =
      Request(spec::DType::kFloat32, Distribution::Normal(0, 1), {8});
  r.seed = 1;
  r.name_hash = NameHash("w");
  const std::string bytes = Fill(r);
  const uint32_t want[8] = {0xbecd0428, 0xbdfdb512, 0xbe8f61f1, 0x3f3174b0,
                            0xbe9d82e8, 0x3fd382f3, 0xbe3400da, 0x3f8ede6f};
  for (int i = 0; i < 8; ++i) {
    uint32_t got;
    std::memcpy(&got, bytes.data() + 4 * i, 4);
    EXPECT_EQ(got, want[i]) << "element " << i;
  }

  // FNV-1a 64 of the bytes, [distribution][dtype] in the orders above.
  const uint64_t kHashes[4][6] = {
      {0xe7f46f34c1bfe74f, 0x8b982b0f0221d829, 0xcecb7ef4c90df999,
       0xd3cae27dbc2f9a9c, 0xa95e2166f6c5ef0d, 0x999c1f5be903efa6},
      {0xda1355a4fbf6409a, 0xfe57bbc56c76ea78, 0xa04c57d50f060d1c,
       0x89a7e366d9f604f2, 0x726ced07cb3623d2, 0xe391ac6d676b90e5},
      {0x9a5774d3adb99977, 0xbe559318a189ad50, 0x3c710dda4d467a11,
       0x0acbf9884fed8306, 0x80b190b9d99c66e2, 0x2111b74502a0814d},
      {0x7991792667698f1b, 0x3eb5d585abb36649, 0x1110104765a3df35,
       0xf73a841a1db1af9c, 0x6dd32668deaa2e74, 0xcf51e382cf2994ac},
  };
  const std::vector<Distribution> dists = AllDistributions();
  std::string table;
  for (size_t d = 0; d < dists.size(); ++d) {
    absl::StrAppend(&table, "{");
    for (size_t t = 0; t < 6; ++t) {
      const uint64_t got =
          Fnv1a64(Fill(Request(kFloatDTypes[t], dists[d], {7, 45})));
      absl::StrAppend(&table, "0x", absl::Hex(got, absl::kZeroPad16),
                      t < 5 ? ", " : "},\n");
      EXPECT_EQ(got, kHashes[d][t])
          << "distribution " << d << " dtype " << spec::Name(kFloatDTypes[t]);
    }
  }
  if (HasFailure()) std::cout << "hashes now:\n" << table;
}

TEST(PortableTest, EveryCpuPathGivesTheScalarBytes) {
  const std::vector<CpuPath> paths = AvailableCpuPaths();
  ASSERT_FALSE(paths.empty());
  ASSERT_EQ(paths.front(), CpuPath::kScalar);
  for (CpuPath path : paths) std::cout << "path: " << CpuPathName(path) << "\n";
  struct Case {
    std::vector<int64_t> shape;
    std::optional<Box> box;
  };
  const std::vector<Case> cases = {
      {{4099}, std::nullopt},
      {{3, 1000}, Box{{1, 17}, {2, 901}}},  // heads and tails in every run
      {{5, 7, 130}, Box{{1, 0, 0}, {3, 7, 130}}},
      {{200, 3}, Box{{0, 1}, {200, 1}}},  // runs of one element
  };
  for (const Case& c : cases) {
    for (spec::DType dtype : kFloatDTypes) {
      for (const Distribution& dist : AllDistributions()) {
        PortableRequest r = Request(dtype, dist, c.shape);
        r.box = c.box;
        const std::string scalar = Fill(r, {1, CpuPath::kScalar});
        for (CpuPath path : paths) {
          EXPECT_EQ(Fill(r, {1, path}), scalar)
              << CpuPathName(path) << " " << Describe(r);
        }
      }
    }
  }
}

TEST(PortableTest, ThreadCountDoesNotChangeTheBytes) {
  for (spec::DType dtype :
       {spec::DType::kFloat32, spec::DType::kBFloat16, spec::DType::kFloat64}) {
    PortableRequest r =
        Request(dtype, Distribution::Normal(0, 0.02), {97, 3001});
    r.box = Box{{3, 5}, {90, 2990}};
    const std::string one = Fill(r, {1, CpuPath::kAuto});
    for (int threads : {2, 3, 5, 8, 0}) {
      EXPECT_EQ(Fill(r, {threads, CpuPath::kAuto}), one)
          << threads << " threads, " << Describe(r);
    }
  }
}

TEST(PortableTest, BoxesAreSlicesOfTheFullTensor) {
  const std::vector<int64_t> shape = {13, 7, 41};
  const std::vector<Box> boxes = {
      Box{{0, 0, 0}, {13, 7, 41}}, Box{{5, 0, 0}, {3, 7, 41}},
      Box{{0, 2, 0}, {13, 3, 41}}, Box{{0, 0, 40}, {13, 7, 1}},
      Box{{12, 6, 40}, {1, 1, 1}}, Box{{2, 1, 3}, {9, 5, 33}},
      Box{{4, 4, 4}, {0, 3, 3}},
  };
  for (spec::DType dtype : kFloatDTypes) {
    for (const Distribution& dist : AllDistributions()) {
      PortableRequest r = Request(dtype, dist, shape);
      const std::string full = Fill(r);
      for (const Box& box : boxes) {
        r.box = box;
        EXPECT_EQ(Fill(r), Slice(full, shape, box, spec::ItemSize(dtype)))
            << Describe(r);
      }
    }
  }
}

TEST(PortableTest, ShardsReassembleToTheFullTensor) {
  struct Layout {
    const char* name;
    std::vector<int64_t> shape;
    std::vector<std::vector<ShardSpec>> shards;
  };
  std::vector<Layout> layouts = {
      {"1-D, uneven last", {1001}, {}},
      {"rows", {37, 64}, {}},
      {"columns", {16, 99}, {}},
      {"2-D blocks", {30, 50}, {}},
  };
  for (int64_t i = 0; i < 4; ++i) layouts[0].shards.push_back({{0, i, 4}});
  for (int64_t i = 0; i < 8; ++i) layouts[1].shards.push_back({{0, i, 8}});
  for (int64_t i = 0; i < 5; ++i) layouts[2].shards.push_back({{1, i, 5}});
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 4; ++j) {
      layouts[3].shards.push_back({{0, i, 3}, {1, j, 4}});
    }
  }
  for (const Layout& layout : layouts) {
    for (spec::DType dtype : kFloatDTypes) {
      PortableRequest r =
          Request(dtype, Distribution::Normal(0, 0.02), layout.shape);
      const std::string full = Fill(r);
      const int64_t item = spec::ItemSize(dtype);
      std::string assembled(full.size(), '\xCD');
      int64_t covered = 0;
      for (const std::vector<ShardSpec>& shard : layout.shards) {
        absl::StatusOr<Box> box = ShardBox(layout.shape, shard);
        ASSERT_THAT(box, IsOk());
        r.box = *box;
        const std::string piece = Fill(r);
        covered += NumElements(*box);
        Scatter(piece, layout.shape, *box, item, &assembled);
      }
      EXPECT_EQ(assembled, full) << layout.name << " " << Describe(r);
      EXPECT_EQ(covered, static_cast<int64_t>(full.size()) / item)
          << layout.name;
    }
  }
}

// The CUDA kernel's work split (one thread per block, FillBoxBlock), run
// on the host thread by thread: it must write exactly FillPortable's bytes.
template <Dist kDist, Format kFormat>
std::string FillByBlocks(const PortableRequest& r) {
  absl::StatusOr<KernelParams> k = MakeKernelParams(r);
  EXPECT_THAT(k, IsOk());
  const Box box = r.box.has_value() ? *r.box : FullBox(r.shape);
  absl::StatusOr<RunLayout> layout = MakeRunLayout(r.shape, box);
  EXPECT_THAT(layout, IsOk());
  std::string out(static_cast<size_t>(*PortableOutputBytes(r)), '\x77');
  const int64_t per_run = BlocksPerRun(*layout, kFormat == Format::kFloat64);
  for (int64_t t = 0; t < layout->num_runs * per_run; ++t) {
    FillBoxBlock<kDist, kFormat>(
        *k, *layout, per_run, t,
        reinterpret_cast<typename Store<kFormat>::T*>(out.data()));
  }
  return out;
}

TEST(PortableTest, CudaThreadMappingWritesTheSameBytes) {
  struct Case {
    std::vector<int64_t> shape;
    std::optional<Box> box;
  };
  const std::vector<Case> cases = {
      {{1000}, std::nullopt},
      {{3, 1000}, Box{{1, 17}, {2, 901}}},
      {{200, 3}, Box{{0, 1}, {200, 1}}},
      {{5, 7, 130}, Box{{1, 2, 5}, {3, 4, 100}}},
      {{}, std::nullopt},
  };
  for (const Case& c : cases) {
    PortableRequest r =
        Request(spec::DType::kFloat32, Distribution::Normal(0, 1), c.shape);
    r.box = c.box;
    EXPECT_EQ((FillByBlocks<Dist::kNormal, Format::kFloat32>(r)), Fill(r));
    r.dtype = spec::DType::kBFloat16;
    r.dist = Distribution::Uniform(-1, 1);
    EXPECT_EQ((FillByBlocks<Dist::kUniform, Format::kBFloat16>(r)), Fill(r));
    r.dtype = spec::DType::kFloat8E5M2;
    r.dist = Distribution::TruncNormal(0, 1, -2, 2);
    EXPECT_EQ((FillByBlocks<Dist::kTruncNormal, Format::kFloat8E5M2>(r)),
              Fill(r));
    r.dtype = spec::DType::kFloat64;
    r.dist = Distribution::Normal(0, 1);
    EXPECT_EQ((FillByBlocks<Dist::kNormal, Format::kFloat64>(r)), Fill(r));
  }
}

TEST(PortableTest, DistributionsHaveTheirMoments) {
  PortableRequest r =
      Request(spec::DType::kFloat32, Distribution::Normal(0, 1), {1 << 20});
  auto moments = [](const std::string& bytes) {
    const float* v = reinterpret_cast<const float*>(bytes.data());
    const int64_t n = static_cast<int64_t>(bytes.size() / 4);
    double sum = 0, sum2 = 0, lo = v[0], hi = v[0];
    for (int64_t i = 0; i < n; ++i) {
      sum += v[i];
      sum2 += double(v[i]) * v[i];
      lo = std::min<double>(lo, v[i]);
      hi = std::max<double>(hi, v[i]);
    }
    const double mean = sum / n;
    return std::array<double, 4>{mean, std::sqrt(sum2 / n - mean * mean), lo,
                                 hi};
  };
  std::array<double, 4> m = moments(Fill(r));
  EXPECT_NEAR(m[0], 0.0, 0.005);
  EXPECT_NEAR(m[1], 1.0, 0.005);
  EXPECT_GT(m[3], 4.0);
  EXPECT_LT(m[2], -4.0);

  r.dist = Distribution::Uniform(-3, 5);
  m = moments(Fill(r));
  EXPECT_NEAR(m[0], 1.0, 0.02);
  EXPECT_NEAR(m[1], 8 / std::sqrt(12.0), 0.01);
  EXPECT_GE(m[2], -3.0);
  EXPECT_LE(m[3], 5.0);

  // Standard normal truncated to [-2, 2]: variance 0.7737.
  r.dist = Distribution::TruncNormal(0, 1, -2, 2);
  m = moments(Fill(r));
  EXPECT_NEAR(m[0], 0.0, 0.005);
  EXPECT_NEAR(m[1], std::sqrt(0.773741), 0.005);
  EXPECT_GE(m[2], -2.0);
  EXPECT_LE(m[3], 2.0);

  // One tail: [1, 3] of N(0, 1); mean 1.5101 (truncated-normal formula).
  r.dist = Distribution::TruncNormal(0, 1, 1, 3);
  m = moments(Fill(r));
  EXPECT_NEAR(m[0], 1.5101, 0.005);
  EXPECT_GE(m[2], 1.0);
  EXPECT_LE(m[3], 3.0);
}

TEST(PortableTest, NarrowDtypesAreTheRoundedFloat32Values) {
  const std::string f32 =
      Fill(Request(spec::DType::kFloat32, Distribution::Normal(0, 3), {5000}));
  const std::string bf16 =
      Fill(Request(spec::DType::kBFloat16, Distribution::Normal(0, 3), {5000}));
  const std::string e4m3 = Fill(
      Request(spec::DType::kFloat8E4M3FN, Distribution::Normal(0, 3), {5000}));
  for (int i = 0; i < 5000; ++i) {
    float x;
    std::memcpy(&x, f32.data() + 4 * i, 4);
    uint16_t b;
    std::memcpy(&b, bf16.data() + 2 * i, 2);
    EXPECT_EQ(b, RoundToNarrow<BFloat16Format>(x)) << i;
    EXPECT_EQ(static_cast<uint8_t>(e4m3[i]),
              RoundToNarrow<Float8E4M3FNFormat>(x))
        << i;
  }
}

TEST(PortableTest, IdentityChangesTheValues) {
  PortableRequest r =
      Request(spec::DType::kFloat32, Distribution::Normal(0, 1), {256});
  const std::string base = Fill(r);
  PortableRequest other = r;
  other.name_hash = NameHash("layers.1.weight");
  EXPECT_NE(Fill(other), base);
  other = r;
  other.seed = 1235;
  EXPECT_NE(Fill(other), base);
  other = r;
  other.stream = 1;
  EXPECT_NE(Fill(other), base);
  // The shape does not enter the key: a longer tensor starts the same.
  other = r;
  other.shape = {512};
  EXPECT_EQ(Fill(other).substr(0, base.size()), base);
}

TEST(PortableTest, EmptyAndScalarTensors) {
  PortableRequest r =
      Request(spec::DType::kFloat32, Distribution::Normal(0, 1), {0, 5});
  EXPECT_THAT(PortableOutputBytes(r), IsOk());
  EXPECT_EQ(*PortableOutputBytes(r), 0);
  EXPECT_THAT(FillPortable(r, nullptr), IsOk());
  r.shape = {};
  const std::string scalar = Fill(r);
  ASSERT_EQ(scalar.size(), 4u);
  r.shape = {1};
  EXPECT_EQ(Fill(r), scalar);
}

TEST(PortableTest, RejectsBadRequests) {
  auto check = [](PortableRequest r, const std::string& message) {
    char out[64];
    EXPECT_THAT(
        FillPortable(r, out),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)));
  };
  check(Request(spec::DType::kInt32, Distribution::Normal(0, 1), {4}),
        "not int32");
  check(Request(spec::DType::kFloat32, Distribution::Normal(0, -1), {4}),
        "normal.std is -1");
  check(Request(spec::DType::kFloat32, Distribution::Normal(NAN, 1), {4}),
        "normal.mean is nan");
  check(Request(spec::DType::kFloat32, Distribution::Uniform(1, 0), {4}),
        "uniform.a (1) must be <= uniform.b (0)");
  check(
      Request(spec::DType::kFloat32, Distribution::Uniform(-1e308, 1e308), {4}),
      "b - a overflows");
  check(Request(spec::DType::kFloat32, Distribution::TruncNormal(0, 0, -2, 2),
                {4}),
        "trunc_normal.std is 0");
  check(Request(spec::DType::kFloat32, Distribution::TruncNormal(0, 1, 2, 2),
                {4}),
        "must be < trunc_normal.b");
  check(Request(spec::DType::kBFloat16, Distribution::Normal(0, 1e39), {4}),
        "outside float32's range");
  check(Request(spec::DType::kFloat32, Distribution::Normal(0, 1),
                {int64_t{1} << 31, int64_t{1} << 31}),
        "2^62 or more elements");
  PortableRequest r =
      Request(spec::DType::kFloat32, Distribution::Normal(0, 1), {4, 4});
  r.box = Box{{0, 3}, {4, 2}};
  check(r, "box dimension 1");
  // float64 computes in double: 1e39 is fine there.
  EXPECT_THAT(ValidatePortableRequest(Request(
                  spec::DType::kFloat64, Distribution::Normal(0, 1e39), {4})),
              IsOk());
}

}  // namespace
}  // namespace materializer::init::portable
