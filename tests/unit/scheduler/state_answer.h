// Captures the answer of an asynchronous SchedulerState call (Barrier, GetCluster, ...): the
// tests drive the state on a manual clock and check whether, and with what, it has answered.
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <utility>

#include "scheduler/scheduler_state.h"

namespace trellis::testing {

template <typename T>
struct Answer {
  std::optional<StatusOr<T>> got;
  SchedulerState::Callback<T> Cb() {
    return [this](StatusOr<T> v) {
      ASSERT_FALSE(got.has_value()) << "answered twice";
      got.emplace(std::move(v));
    };
  }
  bool done() const { return got.has_value(); }
  const Status& status() const { return got->status(); }
};

}  // namespace trellis::testing
