// The scheduler's side of worker crash recovery for in-process worker tests: a real scheduler
// (in process) for one job, the workers' registrations (registering again is a restart: the next
// incarnation) and the rejoin calls a WorkerSetup needs. Used by worker_rejoin_test (through the
// Checkpointer) and rejoin_keeper_test (the keeper itself).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "scheduler/scheduler_client.h"
#include "scheduler/scheduler_service.h"
#include "tests/testing/test_scheduler.h"
#include "worker-lib/src/worker_setup.h"

namespace trellis::testing {

class RejoinScheduler {
 public:
  // Starts the scheduler of `job` for `workers` workers and registers each once.
  Status Start(const std::string& job, int workers) {
    job_ = job;
    SchedulerConfig sc;
    sc.job_name = job;
    sc.num_workers = workers;
    TRELLIS_ASSIGN_OR_RETURN(scheduler_, StartTestScheduler(sc, ""));
    TRELLIS_ASSIGN_OR_RETURN(client_, ConnectTestClient(*scheduler_, ""));
    incarnation_.assign(workers, 0);
    for (int r = 0; r < workers; ++r) Register(r);
    return Status::Ok();
  }
  // Registers worker `rank` (again: its agent restarted it); its incarnation, 0 on failure.
  int64_t Register(int rank) {
    v1::RegisterRequest r;
    r.set_job(job_);
    r.set_role(v1::ROLE_WORKER);
    r.set_pod_name(job_ + "-worker-" + std::to_string(rank));
    auto got = client_->Register(r);
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    return incarnation_[rank] = got.ok() ? got->incarnation() : 0;
  }
  // The rejoin calls of worker `rank` under its current incarnation.
  void Hook(int rank, WorkerSetup* s) {
    using namespace std::chrono_literals;
    SchedulerClient* c = client_.get();
    const int64_t inc = incarnation_[rank];
    s->incarnation = inc;
    s->request_rejoin = [c, rank, inc] { return c->RequestRejoin(rank, inc, 10s); };
    s->watch_rejoins = [c, rank, inc](SchedulerClient::WatchMode m, std::chrono::milliseconds w) {
      return c->WatchRejoins(rank, inc, m, w);
    };
    s->rejoin_served = [c](const v1::RejoinServedRequest& r) { return c->RejoinServed(r); };
  }
  SchedulerServer& server() { return *scheduler_; }

 private:
  std::string job_;
  std::unique_ptr<SchedulerServer> scheduler_;
  std::unique_ptr<SchedulerClient> client_;
  std::vector<int64_t> incarnation_;
};

}  // namespace trellis::testing
