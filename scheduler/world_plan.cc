#include "scheduler/world_plan.h"

#include <algorithm>
#include <utility>

namespace trellis {

WorldPlan::WorldPlan(int32_t workers, int32_t slots, ElasticBounds bounds, int32_t servers)
    : bounds_(bounds), first_servers_(servers), departed_(std::max(workers, slots), true) {
  current_.set_epoch(0);
  current_.set_from_step(1);
  for (int32_t i = 0; i < workers; ++i) {
    current_.add_members(i);
    departed_[i] = false;
  }
}

bool WorldPlan::IsMember(int32_t slot) const {
  return std::find(current_.members().begin(), current_.members().end(), slot) !=
         current_.members().end();
}

bool WorldPlan::Departed(int32_t slot) const {
  return slot >= 0 && static_cast<size_t>(slot) < departed_.size() && departed_[slot];
}

int64_t WorldPlan::announced_epoch() const {
  return pending_ && pending_->announced_unix_ms ? pending_->epoch : 0;
}

bool WorldPlan::Joining(int32_t slot) const {
  return pending_ && std::find(pending_->joiners.begin(), pending_->joiners.end(), slot) != pending_->joiners.end();
}

std::vector<int32_t> WorldPlan::pending_members() const {
  return pending_ ? pending_->members : std::vector<int32_t>();
}

StatusOr<v1::ResizeResponse> WorldPlan::Resize(int32_t workers, const std::string& reason,
                                               int64_t now_unix_ms) {
  if (!bounds_.enabled) {
    return FailedPreconditionError(
        "the job is not elastic: its size is fixed (set spec.elastic.minWorkers and maxWorkers "
        "to resize a running job; docs/elastic.md)");
  }
  if (workers < bounds_.min_workers || workers > bounds_.max_workers) {
    return InvalidArgumentError("resize to " + std::to_string(workers) +
                                " workers: outside spec.elastic [" +
                                std::to_string(bounds_.min_workers) + ", " +
                                std::to_string(bounds_.max_workers) + "]");
  }
  if (pending_) {
    return FailedPreconditionError(Describe(*pending_) + " is under way; ask again once it took effect");
  }
  v1::ResizeResponse out;
  *out.mutable_current() = current_;
  out.set_epoch(current_.epoch());
  if (workers == size()) return out;
  std::unique_ptr<Pending> p;
  if (workers > size()) {
    p = Grow(workers, std::nullopt);
    if (!p) {  // not reached: slots >= maxWorkers
      return InvalidArgumentError("resize to " + std::to_string(workers) + " workers: the job has " +
                                  std::to_string(departed_.size()) + " worker slots");
    }
  } else {
    // Shrinking keeps the lowest slots, as scaling a set of pods down removes the highest ordinals.
    p = std::make_unique<Pending>();
    p->epoch = current_.epoch() + 1;
    p->members.assign(current_.members().begin(), current_.members().begin() + workers);
  }
  p->info.set_epoch(p->epoch);
  p->info.set_from_workers(size());
  p->info.set_to_workers(workers);
  p->info.set_reason(reason.substr(0, 200));
  p->info.set_asked_unix_ms(now_unix_ms);
  if (p->joiners.empty()) p->announced_unix_ms = now_unix_ms;
  out.set_epoch(p->epoch);
  pending_ = std::move(p);
  return out;
}

std::string WorldPlan::Describe(const Pending& p) const {
  return p.servers > 0 ? "a resize to " + std::to_string(p.servers) + " servers"
                       : "a resize to " + std::to_string(p.members.size()) + " workers";
}

StatusOr<v1::ResizeResponse> WorldPlan::ResizeServers(int32_t servers, const std::set<int32_t>& not_ready,
                                                      const std::string& reason, int64_t now_unix_ms) {
  const int32_t lo = bounds_.min_servers > 0 ? bounds_.min_servers : first_servers_;
  const int32_t hi = bounds_.max_servers > 0 ? bounds_.max_servers : first_servers_;
  if (!bounds_.enabled) {
    return FailedPreconditionError(
        "the job is not elastic: its servers are fixed (set spec.elastic, with minServers and "
        "maxServers, to resize a running job's servers; docs/elastic.md)");
  }
  if (servers < lo || servers > hi) {
    return InvalidArgumentError("resize to " + std::to_string(servers) + " servers: outside spec.elastic [" +
                                std::to_string(lo) + ", " + std::to_string(hi) + "] (minServers, maxServers" +
                                (lo == hi ? ": both default to spec.servers.replicas" : "") + ")");
  }
  if (pending_) {
    return FailedPreconditionError(Describe(*pending_) + " is under way; ask again once it took effect");
  }
  v1::ResizeResponse out;
  *out.mutable_current() = current_;
  out.set_epoch(current_.epoch());
  if (servers == this->servers()) return out;
  auto p = std::make_unique<Pending>();
  p->epoch = current_.epoch() + 1;
  p->members.assign(current_.members().begin(), current_.members().end());
  p->servers = servers;
  for (int32_t r : not_ready) {
    if (r >= this->servers() && r < servers) p->servers_waited.insert(r);
  }
  p->info.set_epoch(p->epoch);
  p->info.set_from_workers(size());
  p->info.set_to_workers(size());
  p->info.set_from_servers(this->servers());
  p->info.set_to_servers(servers);
  p->info.set_reason(reason.substr(0, 200));
  p->info.set_asked_unix_ms(now_unix_ms);
  if (p->servers_waited.empty()) p->announced_unix_ms = now_unix_ms;
  out.set_epoch(p->epoch);
  pending_ = std::move(p);
  return out;
}

bool WorldPlan::ServerReady(int32_t rank, int64_t now_unix_ms) {
  if (!pending_ || pending_->announced_unix_ms || pending_->servers_waited.erase(rank) == 0) return false;
  if (!pending_->servers_waited.empty()) return false;
  pending_->announced_unix_ms = now_unix_ms;
  return true;
}

std::unique_ptr<WorldPlan::Pending> WorldPlan::Grow(int32_t workers, std::optional<int32_t> only) {
  auto p = std::make_unique<Pending>();
  p->epoch = current_.epoch() + 1;
  if (only) {
    p->joiners.push_back(*only);
  } else {
    // Into the slots outside the world, lowest first (the pods scaling up creates).
    const int32_t slots = static_cast<int32_t>(departed_.size());
    for (int32_t s = 0; s < slots && size() + static_cast<int32_t>(p->joiners.size()) < workers; ++s) {
      if (!IsMember(s)) p->joiners.push_back(s);
    }
  }
  if (size() + static_cast<int32_t>(p->joiners.size()) != workers) return nullptr;
  p->members.assign(current_.members().begin(), current_.members().end());
  p->members.insert(p->members.end(), p->joiners.begin(), p->joiners.end());
  std::sort(p->members.begin(), p->members.end());
  return p;
}

bool WorldPlan::IsLost(int32_t slot) const {
  return std::any_of(lost_.begin(), lost_.end(), [&](const v1::LostWorker& l) { return l.slot() == slot; });
}

bool WorldPlan::GrowBack(int32_t slot, int64_t epoch, int64_t now_unix_ms) {
  if (!IsLost(slot) || pending_ || epoch != current_.epoch() + 1 || IsMember(slot) || size() >= bounds_.max_workers) {
    return false;
  }
  std::unique_ptr<Pending> p = Grow(size() + 1, slot);
  p->info.set_epoch(p->epoch);
  p->info.set_from_workers(size());
  p->info.set_to_workers(size() + 1);
  p->info.set_reason("worker " + std::to_string(slot) + " came back after it was lost");
  p->info.set_asked_unix_ms(now_unix_ms);
  pending_ = std::move(p);
  return true;
}

StatusOr<bool> WorldPlan::Adopt(const v1::WorldInfo& world) {
  if (!bounds_.enabled) return InvalidArgumentError("a world handed back for a job that is not elastic");
  const auto& m = world.members();
  const int32_t slots = static_cast<int32_t>(departed_.size());
  const bool ascending = std::adjacent_find(m.begin(), m.end(), [](int32_t a, int32_t b) {
                           return a >= b;
                         }) == m.end();
  // 0 servers: a world of before server resizes (the job's first count).
  const int32_t min_servers = bounds_.min_servers > 0 ? bounds_.min_servers : first_servers_;
  const int32_t max_servers = std::max(bounds_.max_servers, first_servers_);
  const bool servers_ok =
      world.servers() == 0 || (world.servers() >= min_servers && world.servers() <= max_servers);
  if (m.empty() || !ascending || m[0] < 0 || m[m.size() - 1] >= slots || world.from_step() < 1 ||
      world.epoch() < 0 || m.size() < bounds_.min_workers || m.size() > bounds_.max_workers || !servers_ok) {
    return InvalidArgumentError("the world handed back (epoch " + std::to_string(world.epoch()) + ", " +
                                std::to_string(m.size()) +
                                " workers, " + std::to_string(world.servers()) +
                                " servers) is not one of this job's: members must be ascending worker "
                                "slots below " + std::to_string(slots) +
                                ", as many workers and servers as spec.elastic allows");
  }
  if (world.epoch() <= current_.epoch()) return false;
  current_ = world;
  ForgetLostIn(world);
  for (int32_t s = 0; s < slots; ++s) departed_[s] = !IsMember(s);
  pending_.reset();  // one under way at the old scheduler: asked again if still wanted
  decided_.push_back(world);
  if (decided_.size() > kKeptResizes) decided_.erase(decided_.begin());
  return true;
}

void WorldPlan::ForgetLostIn(const v1::WorldInfo& world) {
  const auto& m = world.members();
  lost_.erase(std::remove_if(lost_.begin(), lost_.end(),
                             [&](const v1::LostWorker& l) {
                               return l.epoch() < world.epoch() &&
                                      std::find(m.begin(), m.end(), l.slot()) != m.end();
                             }),
              lost_.end());
}

std::string WorldPlan::JoinerExited(int32_t slot, const std::string& exit) {
  if (!Joining(slot) || pending_->joined.count(slot)) return "";
  const std::string why = "resize to " + std::to_string(pending_->members.size()) + " workers given up: worker " +
                          std::to_string(slot) + " exited (" + exit +
                          ") before it asked to join (its log says why); the job runs on with " +
                          std::to_string(size());
  pending_.reset();
  return why;
}

std::string WorldPlan::ServerExited(int32_t rank, const std::string& exit) {
  // Once announced, the members may be waiting for the decision: the grow goes on (the
  // server's agent restarts it, or the members cannot reach it and say so).
  if (!pending_ || pending_->servers == 0 || pending_->announced_unix_ms || rank < servers() ||
      rank >= pending_->servers) {
    return "";
  }
  const std::string why = "resize to " + std::to_string(pending_->servers) + " servers given up: server " +
                          std::to_string(rank) + " exited (" + exit +
                          ") before it was ready (its log says why); the job runs on with " +
                          std::to_string(servers()) + " servers";
  pending_.reset();
  return why;
}

StatusOr<bool> WorldPlan::Lose(int32_t slot, const std::string& why, int64_t now_unix_ms, bool silent) {
  const bool member = IsMember(slot);
  const bool joined = Joining(slot) && pending_->joined.count(slot);
  if ((!member && !joined) || (pending_ && pending_->lost.count(slot))) return false;
  const auto without = [slot](std::vector<int32_t> v) {
    v.erase(std::remove(v.begin(), v.end(), slot), v.end());
    return v;
  };
  if (member) {
    size_t remaining = 0;  // the current world's members still here
    for (int32_t m : current_.members()) {
      remaining += m != slot && !(pending_ && pending_->lost.count(m)) ? 1 : 0;
    }
    if (remaining < static_cast<size_t>(bounds_.min_workers)) {
      return FailedPreconditionError(
          why + "; the job cannot go on without it: " + std::to_string(remaining) +
          " workers would remain, fewer than spec.elastic.minWorkers (" +
          std::to_string(bounds_.min_workers) + ")");
    }
  }
  if (!pending_) {
    auto p = std::make_unique<Pending>();
    p->epoch = current_.epoch() + 1;
    p->members.assign(current_.members().begin(), current_.members().end());
    p->info.set_epoch(p->epoch);
    p->info.set_from_workers(size());
    p->info.set_reason(("lost " + why).substr(0, 200));
    p->info.set_asked_unix_ms(now_unix_ms);
    pending_ = std::move(p);
  }
  Pending& p = *pending_;
  p.members = without(p.members);
  p.joiners = without(p.joiners);
  p.joined.erase(slot);
  p.reached.erase(slot);
  if (member) p.lost.insert(slot);
  if (!p.announced_unix_ms) {
    // The others must report now (they may be blocked waiting for the lost one): joiners that
    // have not asked yet are left out of this resize (they stay out when they ask).
    for (int32_t j : std::vector<int32_t>(p.joiners)) {
      if (p.joined.count(j)) continue;
      p.joiners.erase(std::remove(p.joiners.begin(), p.joiners.end(), j), p.joiners.end());
      p.members.erase(std::remove(p.members.begin(), p.members.end(), j), p.members.end());
    }
    p.announced_unix_ms = now_unix_ms;
  }
  // A shrink asked for below the lost one: keep minWorkers, with the lowest of those still here.
  for (int32_t m : current_.members()) {
    if (p.members.size() >= static_cast<size_t>(bounds_.min_workers)) break;
    if (!p.lost.count(m) && std::find(p.members.begin(), p.members.end(), m) == p.members.end()) {
      p.members.insert(std::upper_bound(p.members.begin(), p.members.end(), m), m);
    }
  }
  p.info.set_to_workers(static_cast<int32_t>(p.members.size()));
  departed_[slot] = true;
  v1::LostWorker lost;
  lost.set_slot(slot);
  lost.set_epoch(p.epoch);
  lost.set_why(why.substr(0, 1024));
  lost.set_silent(silent);
  lost_.push_back(std::move(lost));
  return true;
}

std::string WorldPlan::AbandonUnreported(int64_t now_unix_ms, int64_t limit_ms) {
  // A loss's resize is never given up: the others cannot go on without it.
  if (!pending_ || !pending_->reached.empty() || !pending_->lost.empty()) return "";
  // A grow's members are asked for steps only once its joiners asked to join: from then on.
  if (now_unix_ms - pending_->announced_unix_ms.value_or(pending_->info.asked_unix_ms()) < limit_ms) return "";
  std::string missing;
  for (int32_t j : pending_->joiners) {
    if (!pending_->joined.count(j)) missing += (missing.empty() ? "" : ", ") + std::to_string(j);
  }
  if (!pending_->servers_waited.empty()) {
    std::string servers;
    for (int32_t r : pending_->servers_waited) servers += (servers.empty() ? "" : ", ") + std::to_string(r);
    const std::string why = "resize to " + std::to_string(pending_->servers) + " servers given up: server " +
                            servers + " did not start and report ready within " +
                            std::to_string(limit_ms / 1000) + " s (its pod or agent must be started)";
    pending_.reset();
    return why;
  }
  const std::string why =
      Describe(*pending_).substr(2) + " given up: " +
      (missing.empty() ? "no worker reached a step boundary within " + std::to_string(limit_ms / 1000) +
                             " s (an elastic program calls Checkpointer::EndStep or Commit every step; "
                             "docs/elastic.md)"
                       : "worker " + missing + " did not start and ask to join within " +
                             std::to_string(limit_ms / 1000) + " s (its pod or agent must be started again)");
  pending_.reset();
  return why;
}

StatusOr<bool> WorldPlan::Reach(int32_t slot, int64_t epoch, int64_t step, int64_t now_unix_ms,
                                v1::WorldInfo* world) {
  for (const v1::WorldInfo& w : decided_) {
    if (w.epoch() == epoch) {  // decided already: a member learning it, or a repeated report
      *world = w;
      return true;
    }
  }
  if (!pending_ || pending_->epoch != epoch) {
    return FailedPreconditionError("no resize to world " + std::to_string(epoch) +
                                   " is under way (the world is " +
                                   std::to_string(current_.epoch()) + ")");
  }
  if (Joining(slot)) {
    pending_->joined.insert(slot);  // it waits for the members' decision
    if (pending_->joined.size() == pending_->joiners.size() && !pending_->announced_unix_ms) {
      pending_->announced_unix_ms = now_unix_ms;
    }
    return false;
  }
  if (step < 0) return InvalidArgumentError("a negative step: " + std::to_string(step));
  if (pending_->lost.count(slot)) {
    return InvalidArgumentError("worker " + std::to_string(slot) + " was lost: the job goes on without it");
  }
  if (!IsMember(slot)) {
    return InvalidArgumentError("worker " + std::to_string(slot) +
                                " is not in the job's world " + std::to_string(current_.epoch()));
  }
  pending_->reached[slot] = std::max(pending_->reached[slot], step);
  return DecideIfReported(now_unix_ms, world);
}

bool WorldPlan::DecideIfReported(int64_t now_unix_ms, v1::WorldInfo* world) {
  if (!pending_ || pending_->reached.empty() ||
      pending_->reached.size() + pending_->lost.size() < static_cast<size_t>(size())) {
    return false;
  }

  int64_t furthest = 0;
  for (const auto& [member, reached] : pending_->reached) furthest = std::max(furthest, reached);
  v1::WorldInfo next;
  next.set_epoch(pending_->epoch);
  // Two after the furthest: a member that reported it did not wait there, so it may push the
  // next step in the old world; it waits at the boundary after that one (world_plan.h).
  next.set_from_step(furthest + 2);
  next.set_servers(pending_->servers > 0 ? pending_->servers : current_.servers());
  for (int32_t m : pending_->members) {
    next.add_members(m);
    departed_[m] = false;  // a joiner
  }
  for (int32_t m : current_.members()) {
    if (std::find(pending_->members.begin(), pending_->members.end(), m) ==
        pending_->members.end()) {
      departed_[m] = true;
    }
  }
  pending_->info.set_from_step(next.from_step());
  pending_->info.set_decided_unix_ms(now_unix_ms);
  resizes_.push_back(pending_->info);
  if (resizes_.size() > kKeptResizes) resizes_.erase(resizes_.begin());
  decided_.push_back(next);
  if (decided_.size() > kKeptResizes) decided_.erase(decided_.begin());
  ForgetLostIn(next);
  current_ = next;
  pending_.reset();
  *world = std::move(next);
  return true;
}

}  // namespace trellis
