// The reconciler against the API double, one Reconcile call at a time with a fake clock: each
// test drives the world (pod phases) through the double's API like a kubelet would.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "operator/reconciler.h"
#include "tests/integration/operator/double_fixture.h"

namespace trellis::op::testing {

class ReconcileTest : public DoubleTest {
 protected:
  void SetUp() override {
    DoubleTest::SetUp();
    reconciler_ = std::make_unique<Reconciler>(*client_, OperatorSettings{}, [this] { return now_; });
  }
  void TearDown() override {
    reconciler_.reset();
    DoubleTest::TearDown();
  }
  std::optional<Clock::duration> Reconcile(const std::string& job) {
    auto r = reconciler_->Reconcile("default", job);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : std::nullopt;
  }
  std::string Phase(const std::string& job) { return Str(GetJob(job), {"status", "phase"}); }
  // The job's events (reason, type, message), oldest first.
  std::vector<Json> Events() {
    std::vector<Json> out;
    auto list = client_->List(kEvents, "default");
    EXPECT_TRUE(list.ok()) << list.status().message();
    if (const Json* items = list.ok() ? At(*list, {"items"}) : nullptr; items && items->is_array()) {
      for (size_t i = 0; i < items->size(); ++i) out.push_back(items->at(i));
    }
    return out;
  }

  Clock::time_point now_ = Clock::from_time_t(1'800'000'000);
  std::unique_ptr<Reconciler> reconciler_;
};

}  // namespace trellis::op::testing
