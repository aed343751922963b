// LibTorch and gRPC/protobuf in one translation unit, as in the server.
#include <ATen/ATen.h>
#include <google/protobuf/stubs/common.h>

#include "gtest/gtest.h"
#include "materializer/v1/materializer.pb.h"

static_assert(GOOGLE_PROTOBUF_VERSION >= 3021000,
              "LibTorch's bundled protobuf headers shadow the system ones");

namespace {

TEST(HeaderIsolationTest, ProtobufAndTorchWorkTogether) {
  materializer::v1::TensorSpec spec;
  spec.set_name("w");
  spec.add_shape(3);
  materializer::v1::TensorSpec parsed;
  ASSERT_TRUE(parsed.ParseFromString(spec.SerializeAsString()));
  EXPECT_EQ(parsed.name(), "w");
  at::Tensor t = at::empty({parsed.shape(0)}, at::kMeta);
  EXPECT_EQ(t.numel(), 3);
}

}  // namespace
