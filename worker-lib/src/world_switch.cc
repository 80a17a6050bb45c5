#include "worker-lib/src/world_switch.h"

#include <algorithm>
#include <utility>

#include "common/base/logging.h"

namespace trellis {

WorldSwitch::WorldSwitch(int32_t slot, int64_t incarnation, int32_t num_workers,
                         const v1::WorldInfo& initial, Hooks hooks,
                         std::chrono::milliseconds wait)
    : slot_(slot), slots_(num_workers), incarnation_(incarnation), hooks_(std::move(hooks)), wait_(wait) {
  MutexLock lock(&mu_);
  v1::WorldInfo w = initial;
  if (w.members().empty()) {
    w.set_epoch(0);
    w.set_from_step(1);
    for (int32_t i = 0; i < num_workers; ++i) w.add_members(i);
  }
  Adopt(w);
}

void WorldSwitch::Adopt(const v1::WorldInfo& world) {
  world_ = world;
  const auto& m = world_.members();
  const auto it = std::find(m.begin(), m.end(), slot_);
  size_.store(m.size(), std::memory_order_relaxed);
  if (it == m.end()) {
    left_message_ = "worker " + std::to_string(slot_) + " left the job at step " +
                    std::to_string(world_.from_step() - 1) + ": the job was resized to " +
                    std::to_string(m.size()) + " workers (docs/elastic.md); stop and exit 0";
    left_.store(true, std::memory_order_relaxed);
  } else {
    rank_.store(static_cast<int>(it - m.begin()), std::memory_order_relaxed);
    left_message_.clear();  // a joiner was out of the world it started in
    left_.store(false, std::memory_order_relaxed);
  }
}

WorldView WorldSwitch::view() const {
  MutexLock lock(&mu_);
  return WorldView{world_.epoch(), world_.from_step(), rank(), size(), left(), slots_};
}

std::pair<int64_t, std::vector<int32_t>> WorldSwitch::Current() const {
  MutexLock lock(&mu_);
  return {world_.epoch(), std::vector<int32_t>(world_.members().begin(), world_.members().end())};
}

v1::WorldInfo WorldSwitch::Info() const {
  MutexLock lock(&mu_);
  return world_;
}

std::string WorldSwitch::LeftMessage() const {
  MutexLock lock(&mu_);
  return left_message_;
}

void WorldSwitch::FollowLocked(int64_t epoch) {
  if (pending_epoch_ == 0 && epoch > world_.epoch()) {
    pending_epoch_ = epoch;
    reported_at_ = -1;
    decided_.reset();
  }
}

Status WorldSwitch::Report(int64_t epoch, int64_t step, bool wait) {
  v1::ReachStepRequest req;
  req.set_rank(slot_);
  req.set_incarnation(incarnation_);
  req.set_epoch(epoch);
  req.set_step(step);
  req.set_wait(wait);
  const auto deadline = std::chrono::steady_clock::now() + wait_;
  while (true) {
    auto r = hooks_.reach_step(req, wait_);
    if (!r.ok()) {
      return r.status().Annotate("resize to world " + std::to_string(epoch) +
                                 ": reporting step " + std::to_string(step));
    }
    if (r->decided()) {
      MutexLock lock(&mu_);
      if (pending_epoch_ == epoch && !decided_) decided_ = *r;
      return Status::Ok();
    }
    {
      MutexLock lock(&mu_);
      if (decided_ || pending_epoch_ != epoch) return Status::Ok();  // learnt meanwhile
    }
    if (!wait) return Status::Ok();
    if (std::chrono::steady_clock::now() >= deadline) {
      return DeadlineExceededError(
          "resize to world " + std::to_string(epoch) + ": the other workers did not reach a " +
          "step boundary within " + std::to_string(wait_.count()) + " ms");
    }
  }
}

Status WorldSwitch::Join() {
  if (!hooks_.reach_step || !left()) return Status::Ok();
  int64_t epoch;
  {
    MutexLock lock(&mu_);
    epoch = world_.epoch() + 1;
    FollowLocked(epoch);
  }
  // A joiner has no step: it asks to join (-1) and waits for the decision.
  Status st = Report(epoch, -1, /*wait=*/true);
  MutexLock lock(&mu_);
  std::optional<v1::WorldInfo> world;
  if (decided_) world = decided_->world();
  pending_epoch_ = 0;
  decided_.reset();
  if (!st.ok()) {
    // No grow under way, or one without this slot: the worker stays out of the job.
    const StatusCode code = st.code();
    if (code == StatusCode::kFailedPrecondition || code == StatusCode::kInvalidArgument) return Status::Ok();
    return st.Annotate("worker " + std::to_string(slot_) + ": asking to join");
  }
  const auto& m = world ? world->members() : world_.members();
  if (!world || std::find(m.begin(), m.end(), slot_) == m.end()) return Status::Ok();
  Adopt(*world);
  joined_from_ = world->from_step();
  TLOG_INFO << "worker " << slot_ << ": joins world " << world_.epoch() << " from step " << joined_from_
            << ": rank " << rank() << " of " << size();
  return Status::Ok();
}

int64_t WorldSwitch::joined_from() const {
  MutexLock lock(&mu_);
  return joined_from_;
}

Status WorldSwitch::AnnounceJoined() {
  int64_t epoch;
  std::vector<int32_t> members;
  {
    MutexLock lock(&mu_);
    if (joined_from_ == 0) return Status::Ok();
    epoch = world_.epoch();
    members.assign(world_.members().begin(), world_.members().end());
  }
  return hooks_.announce(epoch, members).Annotate("joining world " + std::to_string(epoch) + ": telling the servers");
}

void WorldSwitch::OnAnnounced(int64_t epoch) {
  if (!hooks_.reach_step || left()) return;
  int64_t step;
  {
    MutexLock lock(&mu_);
    FollowLocked(epoch);
    // Reported already (or decided), or no boundary passed yet: the next boundary reports.
    if (pending_epoch_ != epoch || reported_at_ >= 0 || decided_ || last_boundary_ < 0) return;
    step = last_boundary_;
    reported_at_ = step;  // the training thread waits at the next boundary from now on
  }
  Status st = Report(epoch, step, /*wait=*/false);
  if (!st.ok()) TLOG_WARN << "worker " << slot_ << ": " << st.ToString();
}

Status WorldSwitch::AtBoundary(int64_t step) {
  if (!hooks_.resize_epoch || left()) return Status::Ok();
  int64_t epoch = 0;
  bool report = false, wait = false;
  {
    MutexLock lock(&mu_);
    last_boundary_ = step;
    FollowLocked(hooks_.resize_epoch());
    if (pending_epoch_ == 0) return Status::Ok();
    epoch = pending_epoch_;
    if (!decided_) {
      report = true;
      // The first report does not wait; the boundary after it does (world_plan.h says why that
      // cannot deadlock).
      wait = reported_at_ >= 0 && step > reported_at_;
      if (reported_at_ < 0) reported_at_ = step;
    }
  }
  if (report) TRELLIS_RETURN_IF_ERROR(Report(epoch, step, wait));
  std::optional<v1::ReachStepResponse> decided;
  {
    MutexLock lock(&mu_);
    if (!decided_) return Status::Ok();
    const int64_t last_old = decided_->world().from_step() - 1;
    if (step < last_old) return Status::Ok();  // a step or two more in the old world
    if (step > last_old) {
      return InternalError("resize to world " + std::to_string(decided_->world().epoch()) +
                           ": it starts at step " + std::to_string(decided_->world().from_step()) +
                           " but this worker already finished step " + std::to_string(step));
    }
    decided = decided_;
  }
  return Switch(*decided);
}

Status WorldSwitch::Switch(const v1::ReachStepResponse& decided) {
  const v1::WorldInfo& world = decided.world();
  const auto& m = world.members();
  const bool member = std::find(m.begin(), m.end(), slot_) != m.end();
  if (member && decided.has_shard_map()) {
    const std::vector<std::string> addresses(decided.server_addresses().begin(),
                                             decided.server_addresses().end());
    Status st = hooks_.move_servers
                    ? hooks_.move_servers(decided.shard_map(), addresses)
                    : UnimplementedError("this worker cannot move slices between servers");
    TRELLIS_RETURN_IF_ERROR(st.Annotate("resize to world " + std::to_string(world.epoch()) + " (" +
                                        std::to_string(addresses.size()) + " servers)"));
  }
  if (member) {
    const std::vector<int32_t> members(m.begin(), m.end());
    TRELLIS_RETURN_IF_ERROR(hooks_.announce(world.epoch(), members)
                                .Annotate("resize to world " + std::to_string(world.epoch()) +
                                          ": telling the servers"));
  }
  MutexLock lock(&mu_);
  Adopt(world);
  pending_epoch_ = 0;
  reported_at_ = -1;
  decided_.reset();
  if (member) {
    TLOG_INFO << "worker " << slot_ << ": world " << world.epoch() << " from step "
              << world.from_step() << ": rank " << rank() << " of " << size()
              << (decided.has_shard_map() ? ", " + std::to_string(decided.server_addresses_size()) +
                                                " servers"
                                          : "");
  } else {
    TLOG_INFO << left_message_;
  }
  return Status::Ok();
}

}  // namespace trellis
