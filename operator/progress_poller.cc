#include "operator/progress_poller.h"

#include <pthread.h>

#include <iterator>
#include <set>

#include "common/base/logging.h"
#include "operator/events.h"
#include "operator/exit_checkpoint.h"
#include "operator/elastic_resize.h"
#include "operator/job_status.h"
#include "operator/progress_status.h"
#include "operator/server_takeover.h"

namespace trellis::op {

ProgressPoller::ProgressPoller(KubeClient& client, SchedulerClients& schedulers,
                               ProgressPollerOptions options, ObjectStore* jobs)
    : client_(client), schedulers_(schedulers), options_(std::move(options)), jobs_(jobs) {}

ProgressPoller::~ProgressPoller() { Stop(); }

void ProgressPoller::Start() {
  MutexLock lock(&mu_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { Loop(); });
}

void ProgressPoller::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void ProgressPoller::Loop() {
  pthread_setname_np(pthread_self(), "progress");
  MutexLock lock(&mu_);
  while (!stopping_) {
    const auto next = std::chrono::steady_clock::now() + options_.interval;
    while (!stopping_) {
      if (!cv_.WaitUntil(&mu_, next)) break;
    }
    if (stopping_) break;
    lock.Unlock();
    PollOnce();
    lock.Lock();
  }
}

int ProgressPoller::PollOnce() {
  std::vector<Json> items;
  if (jobs_ && jobs_->usable()) {
    items = jobs_->List();
  } else if (jobs_) {
    return 0;  // the Controller has not listed the jobs yet
  } else {
    auto jobs = client_.List(kTrainingJobs, options_.watch_namespace);
    if (!jobs.ok()) {
      TLOG_WARN << "progress: cannot list TrainingJobs: " << jobs.status().message();
      return 0;
    }
    if (const Json* list = At(*jobs, {"items"}); list && list->is_array()) {
      for (size_t i = 0; i < list->size(); ++i) items.push_back(list->at(i));
    }
  }
  int writes = 0;
  std::set<Key> keep;  // the jobs whose scheduler clients are kept
  std::set<std::string> uids;
  for (const Json& job : items) {
    uids.insert(Str(job, {"metadata", "uid"}));
    const Key key{Str(job, {"metadata", "namespace"}, "default"), Str(job, {"metadata", "name"})};
    // A suspended job writing its exit checkpoint: the reconciler asks its scheduler meanwhile.
    if (const Json* st = At(job, {"status"}); st && ExitCheckpointUnderWay(*st)) keep.insert(key);
    // Restarting too: a pod being replaced may be a worker its scheduler loses meanwhile.
    if (const std::string phase = Str(job, {"status", "phase"}); phase != kRunning && phase != kRestarting) continue;
    keep.insert(key);
    auto r = PollJob(job);
    if (!r.ok()) {
      TLOG_DEBUG << "progress of " << key.first << "/" << key.second << ": " << r.status().message();
    } else if (*r) {
      ++writes;
    }
  }
  // Connections of jobs that ended or went away.
  schedulers_.KeepOnly(keep);
  for (auto it = restarts_seen_.begin(); it != restarts_seen_.end();) {
    it = uids.count(it->first) ? std::next(it) : restarts_seen_.erase(it);
  }
  return writes;
}

StatusOr<bool> ProgressPoller::PollJob(const Json& job) {
  const std::string ns = Str(job, {"metadata", "namespace"}, "default");
  const std::string name = Str(job, {"metadata", "name"});
  TRELLIS_ASSIGN_OR_RETURN(std::shared_ptr<SchedulerClient> c, schedulers_.For(job));
  auto progress = c->GetProgress();
  if (!progress.ok()) {
    schedulers_.Forget(ns, name);  // reconnect next round (a restarted scheduler, a new token)
    return progress.status();
  }
  const Json before = *At(job, {"status"});
  Json status = before;
  auto view = c->GetCluster(0, /*wait_complete=*/false, std::chrono::milliseconds(2000));
  // Workers the scheduler lost for good (elastic jobs), noted in the world they were lost from
  // (before the progress moves it on): a silent one has no failed pod that would tell the
  // reconciler (operator/elastic_resize.h NoteLoss).
  std::vector<std::string> lost;
  if (view.ok()) {
    const int64_t generation = Int(job, {"metadata", "generation"}).value_or(0);
    for (const auto& l : view->lost_workers()) {
      std::string m = NoteLoss(status, name, l.slot(), PodName(name, PodRole::kWorker, l.slot()), l.why(), l.silent(),
                               generation, Clock::now());
      if (!m.empty()) lost.push_back(std::move(m));
    }
  }
  // Servers another server's pod took over (elastic servers): a deleted or silent one has no
  // failed pod that would tell the reconciler (operator/server_takeover.h).
  std::vector<std::string> taken_over;
  if (view.ok()) {
    for (const auto& n : view->servers()) {
      if (n.taken_over_by().empty() || n.lost_pod().empty()) continue;
      std::string m = NoteTakeOver(status, name, n.rank(), n.lost_pod(), TakeOverMessage(n), Clock::now());
      if (!m.empty()) taken_over.push_back(std::move(m));
    }
  }
  // A lost worker back (a late replacement): the grow its scheduler started, followed.
  const std::optional<JobPlan::Event> grow = NoteSchedulersGrow(status, name, *progress, Clock::now());
  ApplyProgress(status, *progress, Clock::now());
  ApplyStoppedFromOutside(status, *progress, Bool(job, {"spec", "runPolicy", "suspend"}), Clock::now());
  // The programs' restarts inside their pods: the scheduler counts what the agents report.
  const std::string uid = Str(job, {"metadata", "uid"});
  ProgramRestartsSeen seen = restarts_seen_[uid];  // kept once the status carries them
  std::vector<std::string> restarted;
  if (view.ok()) {
    restarted = ApplyProgramRestarts(status, *view, seen);
  } else {
    TLOG_DEBUG << "cluster view of " << ns << "/" << name << ": " << view.status().message();
  }
  if (status == before) {
    restarts_seen_[uid] = seen;
    return false;
  }
  Json update = job;
  update["status"] = status;
  auto w = client_.UpdateStatus(kTrainingJobs, ns, name, update);
  if (!w.ok()) return w.status();  // a 409 waits for the next round, with a fresh read
  if (jobs_) jobs_->Written(*w);
  restarts_seen_[uid] = seen;
  if (const Json* r = At(status, {"resumedFrom"}); r && (!At(before, {"resumedFrom"}) || *At(before, {"resumedFrom"}) != *r)) {
    Status e = RecordJobEvent(client_, *w, "Normal", "Resumed", ResumedMessage(name, *r), Clock::now());
    if (!e.ok()) TLOG_WARN << "job " << ns << "/" << name << ": cannot record event: " << e.message();
  }
  for (const auto& m : lost) {
    Status e = RecordJobEvent(client_, *w, "Warning", "WorkerLost", m, Clock::now());
    if (!e.ok()) TLOG_WARN << "job " << ns << "/" << name << ": cannot record event: " << e.message();
  }
  for (const auto& m : taken_over) {
    Status e = RecordJobEvent(client_, *w, "Warning", "ServerTakenOver", m, Clock::now());
    if (!e.ok()) TLOG_WARN << "job " << ns << "/" << name << ": cannot record event: " << e.message();
  }
  if (grow) {
    Status e = RecordJobEvent(client_, *w, grow->type, grow->reason, grow->message, Clock::now());
    if (!e.ok()) TLOG_WARN << "job " << ns << "/" << name << ": cannot record event: " << e.message();
  }
  for (const auto& m : restarted) {
    Status e = RecordJobEvent(client_, *w, "Warning", "ProgramRestarted", "job " + name + ": " + m, Clock::now());
    if (!e.ok()) TLOG_WARN << "job " << ns << "/" << name << ": cannot record event: " << e.message();
  }
  return true;
}

}  // namespace trellis::op
