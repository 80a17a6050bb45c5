// Rejoins of restarted workers (RequestRejoin, WatchRejoins, RejoinServed): the state driven by
// a manual clock, and the RPCs through the real client against an in-process server (token).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <thread>

#include "scheduler/scheduler_client.h"
#include "scheduler/scheduler_service.h"
#include "tests/testing/test_scheduler.h"
#include "scheduler/scheduler_state.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

template <typename T>
using Slot = std::optional<StatusOr<T>>;

class RejoinStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SchedulerConfig c;
    c.job_name = "mlp";
    c.num_servers = 1;
    c.num_workers = 3;
    c.heartbeat_timeout = 1000s;
    state_ = std::make_unique<SchedulerState>(c, &clock_);
    for (int i = 0; i < 3; ++i) ASSERT_EQ(Register("mlp-worker-" + std::to_string(i)), 1);
  }
  // Returns the incarnation.
  int64_t Register(const std::string& pod) {
    v1::RegisterRequest r;
    r.set_job("mlp");
    r.set_role(v1::ROLE_WORKER);
    r.set_pod_name(pod);
    auto got = state_->Register(r);
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    return got.ok() ? got->incarnation() : -1;
  }
  void Watch(int32_t rank, int64_t incarnation, bool wait, Slot<v1::WatchRejoinsResponse>* got,
             std::chrono::milliseconds for_ms = 10s, bool stop = false) {
    v1::WatchRejoinsRequest r;
    r.set_rank(rank);
    r.set_incarnation(incarnation);
    r.set_wait(wait);
    r.set_stop(stop);
    state_->WatchRejoins(r, clock_.Now() + for_ms, [got](StatusOr<v1::WatchRejoinsResponse> v) {
      ASSERT_FALSE(got->has_value()) << "answered twice";
      got->emplace(std::move(v));
    });
  }
  void Request(int32_t rank, int64_t incarnation, Slot<v1::RequestRejoinResponse>* got,
               std::chrono::milliseconds for_ms = 10s) {
    v1::RequestRejoinRequest r;
    r.set_rank(rank);
    r.set_incarnation(incarnation);
    state_->RequestRejoin(r, clock_.Now() + for_ms, [got](StatusOr<v1::RequestRejoinResponse> v) {
      ASSERT_FALSE(got->has_value()) << "answered twice";
      got->emplace(std::move(v));
    });
  }
  Status Served(uint64_t id, int32_t donor, int64_t step, const std::string& error = "") {
    v1::RejoinServedRequest r;
    r.set_rejoin_id(id);
    r.set_donor(donor);
    r.set_step(step);
    auto* ks = r.add_key_steps();
    ks->set_key(3);
    ks->set_steps(step + 1);
    r.set_error(error);
    return state_->RejoinServed(r);
  }
  // Registers ranks 0..2 as watchers (no long poll parked).
  void AllWatch() {
    for (int r = 0; r < 3; ++r) {
      Slot<v1::WatchRejoinsResponse> w;
      Watch(r, 1, false, &w);
      ASSERT_TRUE(w.has_value() && w->ok() && !(*w)->has_request());
    }
  }
  ManualClock clock_;
  std::unique_ptr<SchedulerState> state_;
};

TEST_F(RejoinStateTest, NobodyCommittedYetAnswersFresh) {
  ASSERT_EQ(Register("mlp-worker-1"), 2);  // restarted
  Slot<v1::RequestRejoinResponse> got;
  Request(1, 2, &got);
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->ok()) << got->status().ToString();
  EXPECT_TRUE((*got)->fresh());
  EXPECT_EQ(state_->stats().fresh_rejoins, 1);
}

// Every worker restarted at once after training began: the servers are past step 0, so a fresh
// start's broadcast would be refused, and nobody holds the model. The job fails at once, saying
// why (runPolicy.failurePolicy RestartJob then restarts it as a whole), rather than letting each
// restarted program fail on the servers until backoffLimit.
TEST_F(RejoinStateTest, EveryWorkerLostAfterTrainingBeganFailsTheJob) {
  AllWatch();
  for (int r = 0; r < 3; ++r) ASSERT_EQ(Register("mlp-worker-" + std::to_string(r)), 2);
  Slot<v1::RequestRejoinResponse> got;
  Request(1, 2, &got);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->status().code(), StatusCode::kAborted);
  EXPECT_THAT(got->status().message(), HasSubstr("every worker that held the model is gone"));
  EXPECT_EQ(state_->stats().fresh_rejoins, 0);
  const v1::ClusterView view = state_->GetCluster();
  EXPECT_TRUE(view.failed());
  EXPECT_THAT(view.failure_message(), HasSubstr("worker 1 (incarnation 2) asks to rejoin"));
  EXPECT_THAT(view.failure_message(), HasSubstr("failurePolicy: RestartJob"));
}

TEST_F(RejoinStateTest, LowestRankLiveWatcherServesAndTheAnswerCarriesItsCommit) {
  AllWatch();
  ASSERT_EQ(Register("mlp-worker-0"), 2);  // rank 0 restarted: no longer a donor
  Slot<v1::WatchRejoinsResponse> donor_poll;
  Watch(1, 1, true, &donor_poll);
  EXPECT_FALSE(donor_poll.has_value());  // parked
  Slot<v1::RequestRejoinResponse> got;
  Request(0, 2, &got);
  ASSERT_TRUE(donor_poll.has_value());  // rank 1 is the lowest live watcher
  ASSERT_TRUE(donor_poll->ok());
  ASSERT_TRUE((*donor_poll)->has_request());
  EXPECT_EQ((*donor_poll)->rejoiner(), 0);
  EXPECT_FALSE(got.has_value());  // waits for the donor
  EXPECT_EQ(Served((*donor_poll)->rejoin_id(), 1, 57).code(), StatusCode::kOk);
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->ok()) << got->status().ToString();
  EXPECT_FALSE((*got)->fresh());
  EXPECT_EQ((*got)->donor(), 1);
  EXPECT_EQ((*got)->step(), 57);
  EXPECT_EQ((*got)->rejoin_id(), (*donor_poll)->rejoin_id());
  ASSERT_EQ((*got)->key_steps_size(), 1);
  EXPECT_EQ((*got)->key_steps(0).steps(), 58);
  EXPECT_EQ(state_->stats().rejoins, 1);
  EXPECT_EQ(state_->stats().waiters, 0);
  // Served once: a second report names the id as not pending.
  Status again = Served((*donor_poll)->rejoin_id(), 1, 57);
  EXPECT_EQ(again.code(), StatusCode::kNotFound);
  EXPECT_THAT(again.message(), HasSubstr("is not pending"));
}

TEST_F(RejoinStateTest, RequestQueuedUntilTheDonorPollsAndDeadOrExitedWorkersAreSkipped) {
  AllWatch();
  v1::ReportExitRequest exit;
  exit.set_role(v1::ROLE_WORKER);
  exit.set_rank(0);
  exit.set_incarnation(1);
  exit.set_exit_code(0);
  ASSERT_TRUE(state_->ReportExit(exit).ok());  // rank 0 finished: not a donor
  ASSERT_EQ(Register("mlp-worker-2"), 2);
  Slot<v1::RequestRejoinResponse> got;
  Request(2, 2, &got);
  EXPECT_FALSE(got.has_value());
  Slot<v1::WatchRejoinsResponse> poll;
  Watch(1, 1, true, &poll);  // finds the queued request at once
  ASSERT_TRUE(poll.has_value() && poll->ok() && (*poll)->has_request());
  EXPECT_EQ((*poll)->rejoiner(), 2);
  ASSERT_TRUE(Served((*poll)->rejoin_id(), 1, 3, "stash failed: server 1 gone").ok());
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->status().code(), StatusCode::kAborted);
  EXPECT_THAT(got->status().message(),
              HasSubstr("donor worker 1 could not serve it: stash failed: server 1 gone"));
}

TEST_F(RejoinStateTest, DonorThatNeverServesIsDeadlineExceededNamingIt) {
  AllWatch();
  ASSERT_EQ(Register("mlp-worker-2"), 2);
  Slot<v1::RequestRejoinResponse> got;
  Request(2, 2, &got, 3s);
  EXPECT_EQ(state_->NextDeadline(), clock_.Now() + 3s);
  clock_.Advance(3s);
  state_->Sweep();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got->status().message(),
              HasSubstr("of worker 2 (incarnation 2): donor worker 0 did not stash its last "
                        "commit within 3000 ms"));
  EXPECT_EQ(state_->stats().waiters, 0);
  // The donor's late report finds nothing; its poll gets nothing.
  Slot<v1::WatchRejoinsResponse> poll;
  Watch(0, 1, false, &poll);
  ASSERT_TRUE(poll.has_value() && poll->ok());
  EXPECT_FALSE((*poll)->has_request());
}

TEST_F(RejoinStateTest, WatcherPollAnswersEmptyAtItsDeadline) {
  Slot<v1::WatchRejoinsResponse> poll;
  Watch(1, 1, true, &poll, 2s);
  clock_.Advance(2s);
  state_->Sweep();
  ASSERT_TRUE(poll.has_value() && poll->ok());
  EXPECT_FALSE((*poll)->has_request());
}

TEST_F(RejoinStateTest, SecondRequestOfTheSameWorkerReplacesTheFirst) {
  AllWatch();
  ASSERT_EQ(Register("mlp-worker-1"), 2);
  Slot<v1::RequestRejoinResponse> first, second;
  Request(1, 2, &first);
  ASSERT_EQ(Register("mlp-worker-1"), 3);  // died again while rejoining
  Request(1, 3, &second);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->status().code(), StatusCode::kAborted);
  EXPECT_THAT(first->status().message(), HasSubstr("replaced by a newer request"));
  Slot<v1::WatchRejoinsResponse> poll;
  Watch(0, 1, true, &poll);  // only the second is handed out
  ASSERT_TRUE(poll.has_value() && poll->ok() && (*poll)->has_request());
  ASSERT_TRUE(Served((*poll)->rejoin_id(), 0, 9).ok());
  ASSERT_TRUE(second.has_value() && second->ok());
  EXPECT_EQ((*second)->step(), 9);
}

TEST_F(RejoinStateTest, StoppedDonorHandsItsQueuedRequestToTheNextAndThenThereIsNone) {
  AllWatch();
  Slot<v1::WatchRejoinsResponse> parked;
  Watch(0, 1, true, &parked);
  ASSERT_EQ(Register("mlp-worker-2"), 2);
  Slot<v1::RequestRejoinResponse> first;
  Request(2, 2, &first);
  ASSERT_TRUE(parked.has_value() && parked->ok() && (*parked)->has_request());  // handed out
  // Rank 0 stops after taking it: it still serves that one.
  Slot<v1::WatchRejoinsResponse> stop0;
  Watch(0, 1, false, &stop0, 10s, /*stop=*/true);
  ASSERT_TRUE(stop0.has_value() && stop0->ok());
  ASSERT_TRUE(Served((*parked)->rejoin_id(), 0, 4).ok());
  ASSERT_TRUE(first.has_value() && first->ok());
  // The next request goes to rank 1 (rank 0 stopped), queued; rank 1 stops before polling.
  ASSERT_EQ(Register("mlp-worker-2"), 3);
  Slot<v1::RequestRejoinResponse> second;
  Request(2, 3, &second);
  EXPECT_FALSE(second.has_value());
  Slot<v1::WatchRejoinsResponse> stop1;
  Watch(1, 1, false, &stop1, 10s, /*stop=*/true);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->status().code(), StatusCode::kAborted);
  EXPECT_THAT(second->status().message(),
              HasSubstr("donor worker 1 stopped (its training ended) and no other live worker"));
  EXPECT_EQ(state_->stats().waiters, 0);
}

TEST_F(RejoinStateTest, StoppedDonorsQueuedRequestMovesToAnotherDonor) {
  AllWatch();
  ASSERT_EQ(Register("mlp-worker-2"), 2);
  Slot<v1::RequestRejoinResponse> got;
  Request(2, 2, &got);  // queued for rank 0, which has no poll parked
  Slot<v1::WatchRejoinsResponse> stop0;
  Watch(0, 1, false, &stop0, 10s, /*stop=*/true);
  Slot<v1::WatchRejoinsResponse> poll1;
  Watch(1, 1, true, &poll1);
  ASSERT_TRUE(poll1.has_value() && poll1->ok() && (*poll1)->has_request());
  ASSERT_TRUE(Served((*poll1)->rejoin_id(), 1, 8).ok());
  ASSERT_TRUE(got.has_value() && got->ok());
  EXPECT_EQ((*got)->donor(), 1);
}

TEST_F(RejoinStateTest, BadRequestsAreRefused) {
  Slot<v1::RequestRejoinResponse> got;
  Request(7, 1, &got);
  EXPECT_EQ(got->status().code(), StatusCode::kInvalidArgument);
  got.reset();
  Request(1, 5, &got);  // not its incarnation
  EXPECT_EQ(got->status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(got->status().message(), HasSubstr("incarnation 5 is not the current one (1)"));
  Slot<v1::WatchRejoinsResponse> poll;
  Watch(1, 2, false, &poll);
  EXPECT_EQ(poll->status().code(), StatusCode::kFailedPrecondition);
  AllWatch();
  ASSERT_EQ(Register("mlp-worker-2"), 2);
  got.reset();
  Request(2, 2, &got);
  Slot<v1::WatchRejoinsResponse> p0;
  Watch(0, 1, true, &p0);
  ASSERT_TRUE(p0.has_value() && p0->ok() && (*p0)->has_request());
  EXPECT_EQ(Served((*p0)->rejoin_id(), 1, 3).code(), StatusCode::kInvalidArgument);  // not its
  state_->Shutdown();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->status().code(), StatusCode::kUnavailable);
}

class RejoinServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SchedulerConfig config;
    config.job_name = "mlp";
    config.num_workers = 2;
    auto server = testing::StartTestScheduler(config, "s3cret");
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
  }
  std::unique_ptr<SchedulerClient> Client(const std::string& token) {
    auto c = testing::ConnectTestClient(*server_, token);
    EXPECT_TRUE(c.ok());
    return std::move(c).value();
  }
  void RegisterWorker(SchedulerClient& c, const std::string& pod) {
    v1::RegisterRequest r;
    r.set_job("mlp");
    r.set_role(v1::ROLE_WORKER);
    r.set_pod_name(pod);
    ASSERT_TRUE(c.Register(r).ok());
  }
  std::unique_ptr<SchedulerServer> server_;
};

TEST_F(RejoinServiceTest, DonorServesARestartedWorkerOverGrpc) {
  auto donor = Client("s3cret"), rejoiner = Client("s3cret");
  RegisterWorker(*donor, "mlp-worker-0");
  RegisterWorker(*rejoiner, "mlp-worker-1");
  ASSERT_TRUE(donor->WatchRejoins(0, 1, SchedulerClient::WatchMode::kRegister, 1s).ok());
  RegisterWorker(*rejoiner, "mlp-worker-1");  // incarnation 2
  std::thread watcher([&] {
    // Bounded: a few polls at most (the request is queued for rank 0 whenever it polls).
    for (int i = 0; i < 20; ++i) {
      auto t = donor->WatchRejoins(0, 1, SchedulerClient::WatchMode::kPoll, 500ms);
      ASSERT_TRUE(t.ok()) << t.status().ToString();
      if (!t->has_request()) continue;
      v1::RejoinServedRequest done;
      done.set_rejoin_id(t->rejoin_id());
      done.set_donor(0);
      done.set_step(12);
      ASSERT_TRUE(donor->RejoinServed(done).ok());
      return;
    }
    ADD_FAILURE() << "the donor never got the request";
  });
  auto got = rejoiner->RequestRejoin(1, 2, 20s);
  watcher.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->step(), 12);
  EXPECT_EQ(got->donor(), 0);
}

TEST_F(RejoinServiceTest, WrongTokenIsUnauthenticatedAndNoDonorIsDeadlineExceededByTheClient) {
  auto bad = Client("wrong");
  EXPECT_EQ(bad->RequestRejoin(0, 1, 1s).status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(bad->WatchRejoins(0, 1, SchedulerClient::WatchMode::kRegister, 1s).status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(bad->RejoinServed(v1::RejoinServedRequest()).code(), StatusCode::kUnauthenticated);
  auto c = Client("s3cret");
  RegisterWorker(*c, "mlp-worker-0");
  RegisterWorker(*c, "mlp-worker-1");
  ASSERT_TRUE(c->WatchRejoins(0, 1, SchedulerClient::WatchMode::kRegister, 1s).ok());  // rank 0 watches but never serves
  RegisterWorker(*c, "mlp-worker-1");
  auto r = c->RequestRejoin(1, 2, 400ms);
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(r.status().message(), HasSubstr("donor worker 0 did not stash"));
}

}  // namespace
}  // namespace trellis
