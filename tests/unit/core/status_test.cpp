// Status/StatusOr semantics and the propagation macros.
#include "gpuopt/core/status.hpp"

#include <gtest/gtest.h>

#include <memory>

namespace gpuopt {
namespace {

StatusOr<int> parse_positive(int value) {
  if (value <= 0) return invalid_argument("value must be positive");
  return value;
}

StatusOr<int> doubled(int value) {
  GPUOPT_ASSIGN_OR_RETURN(int parsed, parse_positive(value));
  return parsed * 2;
}

Status check_both(int a, int b) {
  GPUOPT_RETURN_IF_ERROR(parse_positive(a).status());
  GPUOPT_RETURN_IF_ERROR(parse_positive(b).status().with_context("second argument"));
  return ok_status();
}

TEST(Status, DefaultIsOk) {
  Status status;
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(status.to_string(), "OK");
}

TEST(Status, CarriesCodeAndMessage) {
  Status status = not_found("/sys/bus/pci/devices/0000:01:00.0/current_link_speed");
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_EQ(status.to_string(), "NOT_FOUND: /sys/bus/pci/devices/0000:01:00.0/current_link_speed");
}

TEST(Status, ContextKeepsCode) {
  Status status = data_loss("truncated").with_context("segment 3");
  EXPECT_EQ(status.code(), StatusCode::kDataLoss);
  EXPECT_EQ(status.message(), "segment 3: truncated");
}

TEST(StatusOr, ValueAndErrorPropagate) {
  ASSERT_TRUE(doubled(21).ok());
  EXPECT_EQ(*doubled(21), 42);
  StatusOr<int> failed = doubled(-1);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(failed.value_or(7), 7);
}

TEST(StatusOr, ReturnIfErrorAddsContextToTheFailingStep) {
  EXPECT_TRUE(check_both(1, 2).ok());
  Status status = check_both(1, 0);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "second argument: value must be positive");
}

TEST(StatusOr, OkStatusIsNotAValue) {
  StatusOr<int> wrong{ok_status()};
  EXPECT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInternal);
}

TEST(StatusOr, HoldsMoveOnlyTypes) {
  StatusOr<std::unique_ptr<int>> holder(std::make_unique<int>(5));
  ASSERT_TRUE(holder.ok());
  std::unique_ptr<int> taken = std::move(holder).value();
  EXPECT_EQ(*taken, 5);
}

TEST(StatusCode, NamesAreCanonical) {
  EXPECT_EQ(status_code_name(StatusCode::kResourceExhausted), "RESOURCE_EXHAUSTED");
  EXPECT_EQ(status_code_name(StatusCode::kUnavailable), "UNAVAILABLE");
}

}  // namespace
}  // namespace gpuopt
