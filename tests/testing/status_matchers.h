#ifndef MATERIALIZER_TESTS_TESTING_STATUS_MATCHERS_H_
#define MATERIALIZER_TESTS_TESTING_STATUS_MATCHERS_H_

// gMock matchers for absl::Status and absl::StatusOr<T>.
//
//   EXPECT_THAT(ValidateTensors(model), IsOk());
//   EXPECT_THAT(ValidateTensors(model),
//               StatusIs(absl::StatusCode::kInvalidArgument,
//                        HasSubstr("shape[1] is -4")));
//   ASSERT_OK_AND_ASSIGN(Layout layout, ComputeLayout(tensors));

#include <ostream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace materializer::testing {

inline const absl::Status& GetStatus(const absl::Status& status) {
  return status;
}

template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

MATCHER(IsOk, "is OK") {
  const absl::Status& status = GetStatus(arg);
  if (!status.ok()) *result_listener << "status is " << status;
  return status.ok();
}

MATCHER_P2(StatusIs, code, message_matcher,
           "has code " + absl::StatusCodeToString(code)) {
  const absl::Status& status = GetStatus(arg);
  *result_listener << "status is " << status;
  return status.code() == code &&
         ::testing::Matches(message_matcher)(std::string(status.message()));
}

}  // namespace materializer::testing

#define MATERIALIZER_TEST_CONCAT_INNER_(a, b) a##b
#define MATERIALIZER_TEST_CONCAT_(a, b) MATERIALIZER_TEST_CONCAT_INNER_(a, b)

#define ASSERT_OK(expr) ASSERT_THAT((expr), ::materializer::testing::IsOk())
#define EXPECT_OK(expr) EXPECT_THAT((expr), ::materializer::testing::IsOk())

#define ASSERT_OK_AND_ASSIGN(lhs, expr)                              \
  ASSERT_OK_AND_ASSIGN_IMPL_(                                        \
      MATERIALIZER_TEST_CONCAT_(status_or_value_, __LINE__), lhs, expr)

#define ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                               \
  ASSERT_TRUE(statusor.ok()) << statusor.status();      \
  lhs = std::move(statusor).value()

#endif  // MATERIALIZER_TESTS_TESTING_STATUS_MATCHERS_H_
