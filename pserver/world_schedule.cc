#include "pserver/world_schedule.h"

#include <utility>

namespace trellis {

std::string World::Describe() const {
  std::string out = "world " + std::to_string(epoch) + " {";
  bool first = true;
  for (size_t i = 0; i < members.size(); ++i) {
    if (!members[i]) continue;
    if (!first) out += ", ";
    out += std::to_string(i);
    first = false;
  }
  return out + "}";
}

WorldSchedule::WorldSchedule(int32_t slots, int32_t initial) : slots_(slots) {
  auto w = std::make_shared<World>();
  w->members.assign(slots, false);
  for (int32_t i = 0; i < initial; ++i) w->members[i] = true;
  w->size = initial;
  current_ = std::move(w);
}

std::shared_ptr<const World> WorldSchedule::Current() const {
  MutexLock lock(&mu_);
  return current_;
}

StatusOr<std::shared_ptr<const World>> WorldSchedule::Make(
    int64_t epoch, const std::vector<int32_t>& members) const {
  if (epoch < 0) return InvalidArgumentError("a negative world epoch: " + std::to_string(epoch));
  if (members.empty()) return InvalidArgumentError("a world of no workers");
  auto w = std::make_shared<World>();
  w->epoch = epoch;
  w->members.assign(slots_, false);
  for (int32_t m : members) {
    if (m < 0 || m >= slots_) {
      return InvalidArgumentError("worker " + std::to_string(m) + " is not a slot of this job [0, " +
                                  std::to_string(slots_) + ")");
    }
    if (w->members[m]) return InvalidArgumentError("worker " + std::to_string(m) + " named twice");
    w->members[m] = true;
  }
  w->size = static_cast<int32_t>(members.size());
  return std::shared_ptr<const World>(std::move(w));
}

bool WorldSchedule::IsCurrent(const World& world) const {
  MutexLock lock(&mu_);
  return current_->epoch == world.epoch && current_->members == world.members;
}

Status WorldSchedule::Advance(std::shared_ptr<const World> world) {
  MutexLock lock(&mu_);
  if (world->epoch <= current_->epoch) {
    return FailedPreconditionError(world->Describe() + " announced, but " + current_->Describe() +
                                   " is already in force");
  }
  current_ = std::move(world);
  return Status::Ok();
}

}  // namespace trellis
