// common/base/status.h: the error values every part returns.
#include "common/base/status.h"

#include <gtest/gtest.h>

#include <memory>

namespace trellis {
namespace {

TEST(StatusTest, OkByDefault) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_EQ(s, Status::Ok());
}

TEST(StatusTest, ToStringNamesTheCode) {
  EXPECT_EQ(InvalidArgumentError("spec.workers.replicas: must be >= 1, got -2").ToString(),
            "INVALID_ARGUMENT: spec.workers.replicas: must be >= 1, got -2");
  EXPECT_EQ(NotFoundError("x").ToString(), "NOT_FOUND: x");
  EXPECT_EQ(DeadlineExceededError("x").code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(StatusCodeName(StatusCode::kUnauthenticated), "UNAUTHENTICATED");
  EXPECT_EQ(StatusCodeName(StatusCode::kDataLoss), "DATA_LOSS");
  EXPECT_EQ(StatusCodeName(static_cast<StatusCode>(99)), "UNKNOWN");
}

TEST(StatusTest, AnnotatePrefixesTheMessageAndKeepsTheCode) {
  Status s = UnavailableError("connection refused").Annotate("scheduler 10.0.0.1:7000");
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "scheduler 10.0.0.1:7000: connection refused");
  EXPECT_EQ(Status::Ok().Annotate("ignored"), Status::Ok());
}

TEST(StatusTest, Equality) {
  EXPECT_EQ(InternalError("a"), InternalError("a"));
  EXPECT_NE(InternalError("a"), InternalError("b"));
  EXPECT_NE(InternalError("a"), AbortedError("a"));
}

TEST(StatusOrTest, HoldsAValueOrAnError) {
  StatusOr<int> v = 7;
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 7);
  EXPECT_TRUE(v.status().ok());
  StatusOr<int> e = OutOfRangeError("too big");
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kOutOfRange);
}

TEST(StatusOrTest, MoveOnlyValues) {
  StatusOr<std::unique_ptr<int>> p = std::make_unique<int>(3);
  ASSERT_TRUE(p.ok());
  std::unique_ptr<int> taken = std::move(p).value();
  EXPECT_EQ(*taken, 3);
  StatusOr<std::string> s = std::string("abc");
  EXPECT_EQ(s->size(), 3u);
}

Status FailIf(bool fail) { return fail ? AbortedError("failed") : Status::Ok(); }

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError("odd: " + std::to_string(x));
  return x / 2;
}

Status Chain(bool fail, int* steps) {
  TRELLIS_RETURN_IF_ERROR(FailIf(fail));
  ++*steps;
  return Status::Ok();
}

StatusOr<int> Quarter(int x) {
  TRELLIS_ASSIGN_OR_RETURN(int h, Half(x));
  TRELLIS_ASSIGN_OR_RETURN(int q, Half(h));  // two in one scope: the macro names its temps apart
  return q;
}

TEST(StatusMacrosTest, ReturnIfErrorStopsAtTheFirstError) {
  int steps = 0;
  EXPECT_TRUE(Chain(false, &steps).ok());
  EXPECT_EQ(steps, 1);
  EXPECT_EQ(Chain(true, &steps), AbortedError("failed"));
  EXPECT_EQ(steps, 1);
}

TEST(StatusMacrosTest, AssignOrReturn) {
  EXPECT_EQ(*Quarter(12), 3);
  EXPECT_EQ(Quarter(6).status(), InvalidArgumentError("odd: 3"));
  EXPECT_EQ(Quarter(5).status(), InvalidArgumentError("odd: 5"));
}

}  // namespace
}  // namespace trellis
