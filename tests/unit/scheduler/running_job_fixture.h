// A scheduler state with job "mlp" running: 2 servers (registered and ready on 127.0.0.1:7000
// and :7001) and 2 workers registered, on a manual clock. A test fixture derives from it and
// sets the timeouts it exercises in Configure (the hook runs before the state is built).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "scheduler/scheduler_state.h"

namespace trellis::testing {

class RunningJobTest : public ::testing::Test {
 protected:
  // The config hook: adjust `c` before it is validated and the state is made.
  virtual void Configure(SchedulerConfig& c) { (void)c; }

  void SetUp() override {
    using namespace std::chrono_literals;
    SchedulerConfig c;
    c.job_name = "mlp";
    c.num_servers = 2;
    c.num_workers = 2;
    c.slice_bytes = 16;
    c.heartbeat_timeout = 10s;
    c.replacement_timeout = 60s;
    Configure(c);
    ASSERT_TRUE(ValidateSchedulerConfig(c).ok());
    state_ = std::make_unique<SchedulerState>(c, &clock_);
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(Reg(v1::ROLE_SERVER, "mlp-server-" + std::to_string(i)).ok());
      v1::ReportReadyRequest r;
      r.set_role(v1::ROLE_SERVER);
      r.set_rank(i);
      r.set_address("127.0.0.1:" + std::to_string(7000 + i));
      ASSERT_TRUE(state_->ReportReady(r).ok());
      ASSERT_TRUE(Reg(v1::ROLE_WORKER, "mlp-worker-" + std::to_string(i)).ok());
    }
  }
  // Registers pod `pod` of job "mlp" in `role` (a restart or replacement reuses the pod name).
  StatusOr<v1::RegisterResponse> Reg(v1::Role role, const std::string& pod) {
    v1::RegisterRequest r;
    r.set_job("mlp");
    r.set_role(role);
    r.set_pod_name(pod);
    r.set_host("127.0.0.1");
    return state_->Register(r);
  }

  ManualClock clock_;
  std::unique_ptr<SchedulerState> state_;
};

}  // namespace trellis::testing
