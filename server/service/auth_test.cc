#include "server/service/auth.h"

#include "gtest/gtest.h"

namespace materializer::service {
namespace {

TEST(ClientNameProblemTest, AcceptsTypicalNamesRejectsOthers) {
  EXPECT_EQ(ClientNameProblem("trainer-7"), "");
  EXPECT_EQ(ClientNameProblem("alice@example.com"), "");
  EXPECT_EQ(ClientNameProblem("job:42.rank+0_x"), "");
  EXPECT_NE(ClientNameProblem(""), "");
  EXPECT_NE(ClientNameProblem(std::string(129, 'a')), "");
  EXPECT_NE(ClientNameProblem("has space"), "");
  EXPECT_NE(ClientNameProblem("slash/y"), "");
}

TEST(IsLoopbackAddressTest, RecognisesLoopbackForms) {
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1:50051"));
  EXPECT_TRUE(IsLoopbackAddress("127.1.2.3:0"));
  EXPECT_TRUE(IsLoopbackAddress("localhost:50051"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:50051"));
  EXPECT_FALSE(IsLoopbackAddress("0.0.0.0:50051"));
  EXPECT_FALSE(IsLoopbackAddress("[::]:50051"));
  EXPECT_FALSE(IsLoopbackAddress("10.0.0.5:50051"));
  EXPECT_FALSE(IsLoopbackAddress("128.0.0.1:1"));
}

}  // namespace
}  // namespace materializer::service
