#include "server/init/portable/portable_cuda.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/init/portable/portable.h"
#include "tests/testing/status_matchers.h"

namespace materializer::init::portable {
namespace {

using ::materializer::testing::IsOk;

// requires-gpu: skips, printing why, where there is no device (or no CUDA
// in this build); on a GPU machine every case must match the CPU bytes.
class PortableCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!PortableCudaBuilt()) {
      GTEST_SKIP() << "CUDA kernels not built (no nvcc at build time)";
    }
    absl::StatusOr<int> devices = PortableCudaDeviceCount();
    if (!devices.ok()) GTEST_SKIP() << devices.status().message();
  }
};

std::string CpuBytes(const PortableRequest& r) {
  std::string out(static_cast<size_t>(*PortableOutputBytes(r)), '\0');
  EXPECT_THAT(FillPortable(r, out.data()), IsOk());
  return out;
}

std::string CudaBytes(const PortableRequest& r) {
  std::string out(static_cast<size_t>(*PortableOutputBytes(r)), '\x5A');
  EXPECT_THAT(FillPortableCudaToHost(r, out.data()), IsOk());
  return out;
}

TEST_F(PortableCudaTest, MatchesTheCpuBitForBit) {
  const spec::DType dtypes[] = {
      spec::DType::kFloat32,      spec::DType::kFloat64,
      spec::DType::kBFloat16,     spec::DType::kFloat16,
      spec::DType::kFloat8E4M3FN, spec::DType::kFloat8E5M2,
  };
  const Distribution dists[] = {
      Distribution::Constant(0.3),
      Distribution::Uniform(-0.25, 0.75),
      Distribution::Normal(0.5, 2.0),
      Distribution::Normal(0.0, 0.02),
      Distribution::TruncNormal(0.1, 1.0, -2.0, 1.5),
      Distribution::TruncNormal(0.0, 0.02, -2.0, 2.0),
      Distribution::Normal(0.0, 1e-40),  // subnormal float32 outputs
  };
  struct Case {
    std::vector<int64_t> shape;
    std::optional<Box> box;
  };
  const std::vector<Case> cases = {
      {{1 << 20}, std::nullopt},
      {{7, 45}, std::nullopt},
      {{3, 1000}, Box{{1, 17}, {2, 901}}},
      {{200, 3}, Box{{0, 1}, {200, 1}}},
      {{5, 7, 130}, Box{{1, 0, 0}, {3, 7, 130}}},
      {{int64_t{1} << 20, int64_t{1} << 20},
       Box{{(int64_t{1} << 20) - 2, (int64_t{1} << 20) - 100}, {2, 100}}},
      {{}, std::nullopt},
  };
  for (const Case& c : cases) {
    for (spec::DType dtype : dtypes) {
      for (const Distribution& dist : dists) {
        PortableRequest r;
        r.seed = 1234;
        r.name_hash = NameHash("layers.0.weight");
        r.dtype = dtype;
        r.dist = dist;
        r.shape = c.shape;
        r.box = c.box;
        EXPECT_EQ(CudaBytes(r), CpuBytes(r))
            << spec::Name(dtype) << " dist " << static_cast<int>(dist.kind)
            << " rank " << c.shape.size();
      }
    }
  }
}

TEST_F(PortableCudaTest, LargeTensorMatches) {
  // 256 Mi float32 normals (1 GiB): the grid-stride loop and 64-bit indices.
  PortableRequest r;
  r.seed = 7;
  r.name_hash = NameHash("big");
  r.dtype = spec::DType::kFloat32;
  r.dist = Distribution::Normal(0, 1);
  r.shape = {int64_t{1} << 28};
  EXPECT_EQ(CudaBytes(r), CpuBytes(r));
}

}  // namespace
}  // namespace materializer::init::portable
