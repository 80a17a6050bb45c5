// Local groups' bootstrap keys: the state driven by a manual clock, and the RPCs through the
// real client against an in-process server on 127.0.0.1 (token checked).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <thread>

#include "scheduler/scheduler_client.h"
#include "scheduler/scheduler_service.h"
#include "scheduler/scheduler_state.h"
#include "tests/testing/test_scheduler.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

class GroupKeyStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SchedulerConfig c;
    c.job_name = "mlp";
    state_ = std::make_unique<SchedulerState>(c, &clock_);
  }
  Status Publish(const std::string& group, const std::string& key) {
    v1::PublishGroupKeyRequest r;
    r.set_group(group);
    r.set_key(key);
    return state_->PublishGroupKey(r);
  }
  // The answer lands in `*got` (inline or later).
  void Get(const std::string& group, std::chrono::milliseconds wait,
           std::optional<StatusOr<std::string>>* got) {
    v1::GetGroupKeyRequest r;
    r.set_group(group);
    state_->GetGroupKey(r, clock_.Now() + wait, [got](StatusOr<std::string> v) {
      ASSERT_FALSE(got->has_value()) << "answered twice";
      got->emplace(std::move(v));
    });
  }
  ManualClock clock_;
  std::unique_ptr<SchedulerState> state_;
};

TEST_F(GroupKeyStateTest, PublishThenGet) {
  ASSERT_TRUE(Publish("mlp-w0-1/rs", std::string("\0id\x7f", 4)).ok());
  std::optional<StatusOr<std::string>> got;
  Get("mlp-w0-1/rs", 1s, &got);
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->ok()) << got->status().ToString();
  EXPECT_EQ(**got, std::string("\0id\x7f", 4));  // bytes, NULs included
}

TEST_F(GroupKeyStateTest, GetWaitsForThePublish) {
  std::optional<StatusOr<std::string>> a, b;
  Get("g/rs", 10s, &a);
  Get("g/rs", 10s, &b);
  EXPECT_FALSE(a.has_value());
  EXPECT_EQ(state_->stats().waiters, 2);
  EXPECT_EQ(state_->NextDeadline(), clock_.Now() + 10s);
  clock_.Advance(5s);
  state_->Sweep();  // not yet at the deadline
  EXPECT_FALSE(a.has_value());
  ASSERT_TRUE(Publish("g/rs", "key").ok());
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(a->value(), "key");
  EXPECT_EQ(b->value(), "key");
  EXPECT_EQ(state_->stats().waiters, 0);
}

TEST_F(GroupKeyStateTest, UnpublishedGroupFailsAtTheDeadline) {
  std::optional<StatusOr<std::string>> got;
  Get("mlp-w3-2/ag", 2s, &got);
  clock_.Advance(2s);
  state_->Sweep();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got->status().message(), HasSubstr("group \"mlp-w3-2/ag\": no key published"));
  EXPECT_THAT(got->status().message(), HasSubstr("2000 ms"));
  // The abandoned name takes no room: a later publish and get still work.
  ASSERT_TRUE(Publish("mlp-w3-2/ag", "k").ok());
}

TEST_F(GroupKeyStateTest, RepublishingOverwrites) {
  ASSERT_TRUE(Publish("g/rs", "old").ok());
  ASSERT_TRUE(Publish("g/rs", "new").ok());
  std::optional<StatusOr<std::string>> got;
  Get("g/rs", 1s, &got);
  EXPECT_EQ(got->value(), "new");
}

TEST_F(GroupKeyStateTest, BadNamesAndKeysAreInvalidArgument) {
  const std::string big(SchedulerState::kMaxGroupKeyBytes + 1, 'x');
  Status st = Publish("g", big);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("key must be 1 to 1024 bytes, got 1025"));
  EXPECT_TRUE(Publish("g", std::string(SchedulerState::kMaxGroupKeyBytes, 'x')).ok());
  EXPECT_EQ(Publish("g", "").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Publish("", "k").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Publish(std::string(257, 'n'), "k").code(), StatusCode::kInvalidArgument);
  std::optional<StatusOr<std::string>> got;
  Get("", 1s, &got);
  EXPECT_EQ(got->status().code(), StatusCode::kInvalidArgument);
}

TEST_F(GroupKeyStateTest, OldestPublishedGroupMakesRoom) {
  for (size_t i = 0; i < SchedulerState::kMaxGroupKeys; ++i) {
    ASSERT_TRUE(Publish("g" + std::to_string(i), "k").ok());
  }
  ASSERT_TRUE(Publish("new", "k").ok());  // evicts g0
  std::optional<StatusOr<std::string>> g1, g0;
  Get("g1", 1s, &g1);
  EXPECT_EQ(g1->value(), "k");
  Get("g0", 1s, &g0);  // gone: waits (and takes the room of g1, the next oldest)
  EXPECT_FALSE(g0.has_value());
  state_->Shutdown();  // answers g0 while it is still in scope
}

TEST_F(GroupKeyStateTest, ShutdownAnswersWaiters) {
  std::optional<StatusOr<std::string>> got;
  Get("g", 10s, &got);
  state_->Shutdown();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->status().code(), StatusCode::kUnavailable);
}

class GroupKeyServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SchedulerConfig config;
    config.job_name = "mlp";
    auto server = testing::StartTestScheduler(config, "s3cret");
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
  }
  std::unique_ptr<SchedulerClient> Client(const std::string& token) {
    auto c = testing::ConnectTestClient(*server_, token);
    EXPECT_TRUE(c.ok());
    return std::move(c).value();
  }
  std::unique_ptr<SchedulerServer> server_;
};

TEST_F(GroupKeyServiceTest, RoundTripAndLongPoll) {
  auto publisher = Client("s3cret"), getter = Client("s3cret");
  StatusOr<std::string> waited = InternalError("not run");
  std::thread t([&] { waited = getter->GetGroupKey("mlp-w0-1/rs", 30s); });
  // Published whether the getter is already parked or not: it gets the key either way.
  ASSERT_TRUE(publisher->PublishGroupKey("mlp-w0-1/rs", std::string(128, '\x01')).ok());
  t.join();
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  EXPECT_EQ(*waited, std::string(128, '\x01'));
}

TEST_F(GroupKeyServiceTest, UnpublishedGroupIsDeadlineExceeded) {
  auto c = Client("s3cret");
  auto r = c->GetGroupKey("nobody/rs", 300ms);
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(r.status().message(), HasSubstr("GetGroupKey"));
}

TEST_F(GroupKeyServiceTest, WrongTokenIsUnauthenticated) {
  auto bad = Client("wrong");
  Status st = bad->PublishGroupKey("g/rs", "k");
  EXPECT_EQ(st.code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(bad->GetGroupKey("g/rs", 1s).status().code(), StatusCode::kUnauthenticated);
  auto none = Client("");
  EXPECT_EQ(none->PublishGroupKey("g/rs", "k").code(), StatusCode::kUnauthenticated);
}

TEST_F(GroupKeyServiceTest, OversizeKeyIsInvalidArgument) {
  auto c = Client("s3cret");
  Status st = c->PublishGroupKey("g/rs", std::string(2000, 'x'));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("1024 bytes"));
}

}  // namespace
}  // namespace trellis
