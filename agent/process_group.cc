#include "agent/process_group.h"

#include <poll.h>
#include <signal.h>

#include <algorithm>

#include "common/config/env_names.h"
#include "common/process/local_group_name.h"
#include "common/base/logging.h"
#include "common/base/net.h"

namespace trellis {

ProcessGroup::ProcessGroup(std::vector<std::unique_ptr<Subprocess>> children,
                           std::string group_name, std::chrono::milliseconds grace)
    : children_(std::move(children)),
      group_name_(std::move(group_name)),
      grace_(grace),
      ended_(children_.size()) {}

ProcessGroup::~ProcessGroup() {
  children_.clear();  // each Subprocess stops and reaps its child
  // A group that died before all its processes attached leaves shm names behind.
  UnlinkLocalGroupSegments(group_name_);
}

std::optional<ExitStatus> ProcessGroup::WaitFor(std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  while (true) {
    size_t running = 0;
    for (size_t i = 0; i < children_.size(); ++i) {
      if (ended_[i]) continue;
      ended_[i] = children_[i]->Poll();
      if (!ended_[i]) {
        ++running;
      } else if (!ended_[i]->ok() && !first_failure_) {
        first_failure_ = ended_[i];
        TLOG_WARN << "local rank " << i << " " << ended_[i]->Describe()
                  << "; stopping the other local processes of this pod";
        for (auto& c : children_) (void)c->Signal(SIGTERM);
        kill_at_ = Clock::now() + grace_;
      }
    }
    if (running == 0) return first_failure_ ? *first_failure_ : ExitStatus{};
    const auto now = Clock::now();
    if (kill_at_ && now >= *kill_at_) {
      for (size_t i = 0; i < children_.size(); ++i) {
        if (!ended_[i]) (void)children_[i]->Signal(SIGKILL);
      }
      kill_at_.reset();
    }
    if (now >= deadline) return std::nullopt;
    auto until = kill_at_ ? std::min(deadline, *kill_at_) : deadline;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count() + 1;
    // Sleep until a child exits (pidfds) or the time is up.
    std::vector<pollfd> fds;
    for (size_t i = 0; i < children_.size(); ++i) {
      if (!ended_[i] && children_[i]->exit_fd() >= 0) {
        fds.push_back({children_[i]->exit_fd(), POLLIN, 0});
      }
    }
    if (fds.size() < running) ms = std::min<int64_t>(ms, 10);  // no pidfd: check again soon
    poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(ms, 1000)));
  }
}

Status ProcessGroup::Signal(int signo) {
  Status first = Status::Ok();
  for (auto& c : children_) {
    Status s = c->Signal(signo);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

StatusOr<std::unique_ptr<Process>> ProcessGroupSpawner::Spawn(const SpawnOptions& options) {
  std::string group = "local";
  if (auto it = options.env.find(kEnvLocalGroup); it != options.env.end()) group = it->second;
  UnlinkLocalGroupSegments(group);  // a stale group of the same name must not be joined
  std::vector<std::unique_ptr<Subprocess>> children;
  for (int l = 0; l < size_; ++l) {
    SpawnOptions o = options;
    o.env[kEnvLocalRank] = std::to_string(l);
    o.env[kEnvLocalSize] = std::to_string(size_);
    o.env[kEnvLocalGroup] = group;
    // Every local process serves its own /metrics: rank 0 keeps the agent's port.
    if (l > 0 && o.env.count(kEnvMetricsPort)) {
      TRELLIS_ASSIGN_OR_RETURN(int port, PickFreePort("0.0.0.0"));
      o.env[kEnvMetricsPort] = std::to_string(port);
    }
    auto child = Subprocess::Start(o);
    if (!child.ok()) {
      return child.status().Annotate("starting local rank " + std::to_string(l) + " of " +
                                     std::to_string(size_));
    }
    (*child)->set_destructor_grace(grace_);
    children.push_back(std::move(child).value());
  }
  return std::unique_ptr<Process>(new ProcessGroup(std::move(children), group, grace_));
}

}  // namespace trellis
