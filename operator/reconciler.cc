#include "operator/reconciler.h"

#include <iterator>

#include "common/base/logging.h"
#include "common/base/random_token.h"
#include "operator/elastic_resize.h"
#include "operator/events.h"
#include "operator/exit_checkpoint.h"
#include "operator/plan_phases.h"
#include "operator/progress_status.h"

namespace trellis::op {
namespace {

// The server's part of a client error: "HTTP 422 Invalid: Pod \"x\" is invalid: ..." without the
// "POST /api/v1/..." the client puts in front.
std::string ServerMessage(const Status& s) {
  const std::string& m = s.message();
  const size_t http = m.find("HTTP ");
  return http == std::string::npos ? m : m.substr(http);
}

// The condition reason of a refusal that retrying may cure.
std::string TransientReason(const Status& s) {
  switch (s.code()) {
    case StatusCode::kPermissionDenied: return "Forbidden";
    case StatusCode::kResourceExhausted: return "TooManyRequests";
    case StatusCode::kUnauthenticated: return "Unauthorized";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kUnavailable: return "ServerUnavailable";
    default: return "CreateError";
  }
}

bool OwnedBy(const Json& obj, const std::string& uid) {
  if (const Json* owners = At(obj, {"metadata", "ownerReferences"}); owners && owners->is_array()) {
    for (size_t k = 0; k < owners->size(); ++k) {
      if (Str(owners->at(k), {"uid"}) == uid) return true;
    }
  }
  return false;
}

Resource PodGroups(GangScheduler g) { return {"apis/" + PodGroupApiOf(g).group_version, "podgroups"}; }

}  // namespace

bool PermanentRefusal(const Status& s) { return s.code() == StatusCode::kInvalidArgument; }

Reconciler::Reconciler(KubeClient& client, OperatorSettings settings, Now now, ReconcileObserver observer,
                       ObjectCache* cache, SchedulerCalls* schedulers)
    : client_(client),
      settings_(std::move(settings)),
      now_(std::move(now)),
      observer_(std::move(observer)),
      cache_(cache),
      schedulers_(schedulers) {}

StatusOr<Json> Reconciler::Read(const Resource& r, ObjectStore* store, const std::string& ns,
                                const std::string& name) {
  if (!store || !store->usable()) return client_.Get(r, ns, name);
  if (auto o = store->Get(ns, name)) return *std::move(o);
  return NotFoundError(r.plural + " " + ns + "/" + name + " not in the cache");
}

StatusOr<std::vector<Json>> Reconciler::ReadPods(const std::string& ns, const std::string& job) {
  if (cache_ && cache_->pods.usable()) return cache_->pods.ListByLabel(ns, job);
  TRELLIS_ASSIGN_OR_RETURN(Json list, client_.List(kPods, ns, JobSelector(job)));
  std::vector<Json> out;
  if (const Json* items = At(list, {"items"}); items && items->is_array()) {
    for (size_t i = 0; i < items->size(); ++i) out.push_back(items->at(i));
  }
  return out;
}

Status Reconciler::Ensure(const Resource& r, ObjectStore* store, const std::string& ns, const Json& obj) {
  const std::string name = Str(obj, {"metadata", "name"});
  if (store && store->usable() && store->Get(ns, name)) return Status::Ok();
  auto s = client_.Create(r, ns, obj);
  if (s.ok()) {
    if (store) store->Written(*s);
    return Status::Ok();
  }
  if (s.status().code() == StatusCode::kAlreadyExists) return Status::Ok();
  return Status(s.status().code(), "the API server refused " + Str(obj, {"kind"}) + " " + ns + "/" + name + ": " +
                                       ServerMessage(s.status()));
}

void Reconciler::Refresh(const std::string& ns, const std::string& name) {
  if (!cache_) return;
  auto job = client_.Get(kTrainingJobs, ns, name);
  if (job.ok()) cache_->jobs.Written(*job);
}

StatusOr<std::optional<Clock::duration>> Reconciler::Reconcile(const std::string& ns, const std::string& name) {
  constexpr int kAttempts = 5;
  for (int i = 1;; ++i) {
    phase_.reset();
    auto r = Guarded(ns, name);
    if (r.ok() && observer_.on_phase && phase_) observer_.on_phase(ns + "/" + name, *phase_);
    if (r.ok() || r.status().code() != StatusCode::kAborted || i == kAttempts) return r;
    TLOG_INFO << "job " << ns << "/" << name << ": status write conflicted, reconciling again";
    Refresh(ns, name);  // the cache had not seen the change yet
  }
}

StatusOr<std::optional<Clock::duration>> Reconciler::Guarded(const std::string& ns, const std::string& name) {
  std::string what;
  try {
    return Attempt(ns, name);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "unknown exception";
  }
  // A bug meets this job's content: fail the job, keep serving every other one.
  TLOG_ERROR << "job " << ns << "/" << name << ": reconcile threw: " << what << "; marking the job Failed";
  try {
    return FailJob(ns, name, "ReconcileError",
                   "the operator cannot reconcile this job (" + what + "); fix the TrainingJob and apply it again");
  } catch (const std::exception& e) {
    return InternalError("job " + ns + "/" + name + ": cannot mark the job Failed: " + e.what());
  } catch (...) {
    return InternalError("job " + ns + "/" + name + ": cannot mark the job Failed");
  }
}

StatusOr<std::optional<Clock::duration>> Reconciler::Attempt(const std::string& ns, const std::string& name) {
  auto job = Read(kTrainingJobs, cache_ ? &cache_->jobs : nullptr, ns, name);
  if (!job.ok() && job.status().code() == StatusCode::kNotFound) {
    phase_ = "";
    return std::optional<Clock::duration>();
  }
  if (!job.ok()) return job.status();
  if (At(*job, {"metadata", "deletionTimestamp"})) return std::optional<Clock::duration>();
  TRELLIS_ASSIGN_OR_RETURN(JobMeta meta, JobMetaOf(*job));

  // The job model judges the object exactly as the API server sent it, unless it held parts
  // nested too deep to read (json_util.h), which it never sees.
  // An elastic job's spec is the world's (operator/elastic_resize.h): its pods and job file
  // follow the workers that train now; a replicas outside spec.elastic is a refused resize.
  const StatusOr<JobSpec> spec = [&]() -> StatusOr<JobSpec> {
    if (auto deep = FindTooDeep(*job)) {
      return InvalidArgumentError(*deep + ": nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    }
    StatusOr<JobSpec> parsed = ParseJobSpec(job->serialize());
    if (!parsed.ok()) parsed = ParseAtWorldReplicas(*job, parsed.status());
    if (!parsed.ok()) return parsed;
    return WorldSpec(*parsed, *job);
  }();

  TRELLIS_ASSIGN_OR_RETURN(std::vector<Json> pod_objects, ReadPods(ns, name));
  const Clock::time_point now = now_();
  ForgetOldDeletes(now);
  std::vector<ObservedPod> pods;
  for (const Json& pod : pod_objects) {
    // Only pods this job controls: a same-named job deleted and recreated owns new ones.
    if (!OwnedBy(pod, meta.uid)) continue;
    auto o = ObservePod(pod);
    if (!o) continue;
    if (o->deleting) {
      deleted_pods_.erase(o->uid);  // the cache has caught up
    } else if (deleted_pods_.count(o->uid)) {
      o->deleting = true;  // deleted by an earlier round; the pod watch has not told yet
    }
    pods.push_back(*o);
  }

  // The PodGroup comes before the plan: the plan creates no pod while it cannot exist.
  const bool gang_job = spec.ok() && spec->runPolicy.schedulingPolicy.gangScheduler.has_value();
  const std::string old_phase = Str(*job, {"status", "phase"});
  const bool may_run = spec.ok() && !spec->runPolicy.suspend && old_phase != kSucceeded && old_phase != kFailed;
  std::optional<GangObservation> gang;
  if (gang_job && may_run) {
    TRELLIS_ASSIGN_OR_RETURN(gang, EnsurePodGroup(meta, *spec));
  }

  JobPlan plan = PlanJob(*job, spec, pods, now, gang ? &*gang : nullptr);

  if (plan.delete_job) {
    TLOG_INFO << "job " << ns << "/" << name << ": ttlSecondsAfterFinished passed, deleting it";
    Status s = client_.Delete(kTrainingJobs, ns, name);
    if (!s.ok() && s.code() != StatusCode::kNotFound) return s;
    phase_ = "";
    return std::optional<Clock::duration>();
  }

  if (schedulers_ && spec.ok() && !spec->checkpoint.path.empty()) {
    if (spec->runPolicy.suspend && !plan.remove.empty() && !ExitCheckpointSettled(plan.status)) {
      AwaitExitCheckpoint(*job, *spec, pods, &plan, now);
    } else if (!spec->runPolicy.suspend && ExitCheckpointUnderWay(plan.status)) {
      // Resumed while the exit checkpoint was being written: the job's scheduler stops it all
      // the same, so the pods still go once it is written, and new ones resume from it.
      plan.create.clear();
      const bool held = AwaitExitCheckpoint(*job, *spec, pods, &plan, now);
      if (!held) {
        for (const auto& p : pods) {
          if (!p.deleting) plan.remove.push_back(p.name);
        }
      }
    }
  }

  if (schedulers_ && (plan.resize || plan.follow_resize)) FollowResize(*job, &plan, now);

  // The job ends this round: its scheduler's last progress goes into the final status (the
  // poller polls every few seconds; a short resumed run ends between two polls).
  std::optional<Json> resumed;
  const std::string end_phase = Str(plan.status, {"phase"});
  if (schedulers_ && Terminal(end_phase) && !old_phase.empty() && !Terminal(old_phase)) {
    const StatusOr<v1::JobProgress> last = schedulers_->Progress(*job);
    if (!last.ok()) {
      TLOG_DEBUG << "job " << ns << "/" << name << ": no last progress: " << last.status().message();
    } else if (ApplyLastProgress(plan.status, *last, end_phase == kSucceeded, now)) {
      resumed = *At(plan.status, {"resumedFrom"});
    }
  }

  // Status first: a restart is counted before its pod is deleted, so a crash in between can
  // only over-count, never restart without limit.
  Json current = *job;
  const Json* old_status = At(*job, {"status"});
  if (!old_status || *old_status != plan.status) {
    TRELLIS_ASSIGN_OR_RETURN(current, WriteStatus(*job, plan.status));
    const std::string old_phase = old_status ? Str(*old_status, {"phase"}) : "";
    const std::string new_phase = Str(plan.status, {"phase"});
    if (old_phase != new_phase) {
      TLOG_INFO << "job " << ns << "/" << name << ": " << (old_phase.empty() ? "new" : old_phase) << " -> "
                << new_phase << (plan.event_message.empty() ? "" : ": " + plan.event_message);
    }
  }
  phase_ = Str(plan.status, {"phase"});
  if (!plan.event_type.empty()) {
    Status s = RecordEvent(*job, plan.event_type, plan.event_reason, plan.event_message);
    if (!s.ok()) TLOG_WARN << "job " << ns << "/" << name << ": cannot record event: " << s.message();
  }
  if (resumed) {
    Status s = RecordEvent(*job, "Normal", "Resumed", ResumedMessage(name, *resumed));
    if (!s.ok()) TLOG_WARN << "job " << ns << "/" << name << ": cannot record event: " << s.message();
  }
  for (const auto& e : plan.events) {  // one per restart; the phase's own is there already
    if (e.reason == plan.event_reason && e.message == plan.event_message) continue;
    Status s = RecordEvent(*job, e.type, e.reason, e.message);
    if (!s.ok()) TLOG_WARN << "job " << ns << "/" << name << ": cannot record event: " << s.message();
  }

  if (spec.ok()) {
    bool first = false;  // the job's objects were created just now
    Status made = CreateObjects(meta, *spec, plan, &first);
    if (made.ok() && first && !CheckpointsOnAVolume(*spec)) {
      const std::string m = "spec.checkpoint.path " + spec->checkpoint.path +
                            " is on no volume: the checkpoints die with the pods. Set spec.checkpoint.volume (a "
                            "persistentVolumeClaim or any volume source) or mount one there in the pod templates";
      TLOG_WARN << "job " << ns << "/" << name << ": " << m;
      Status e = RecordEvent(current, "Warning", "CheckpointsNotPersistent", m);
      if (!e.ok()) TLOG_WARN << "job " << ns << "/" << name << ": cannot record event: " << e.message();
    }
    // A lost race on the ConfigMap (409) is the next reconcile's; anything else is the job's news.
    if (!made.ok() && made.code() != StatusCode::kAborted) return ReportRefusal(current, plan.status, made);
    if (!made.ok()) return made;
    if (Str(plan.status, {"phase"}) != kFailed) {
      // An earlier refusal is cured: say so on the condition.
      if (const Json* conds = At(plan.status, {"conditions"}); conds && conds->is_array()) {
        for (size_t i = 0; i < conds->size(); ++i) {
          if (Str(conds->at(i), {"type"}) != "FailedCreate" || Str(conds->at(i), {"status"}) != "True") continue;
          Json st = plan.status;
          SetCondition(st, "FailedCreate", false, "Created", "every object of the job was created", now);
          TRELLIS_ASSIGN_OR_RETURN(current, WriteStatus(current, st));
          break;
        }
      }
    }
  }
  for (const auto& pod_name : plan.remove) {
    Status s = client_.Delete(kPods, ns, pod_name);
    if (!s.ok() && s.code() != StatusCode::kNotFound) return s;
    if (!cache_) continue;  // read from the API server: nothing lags
    for (const ObservedPod& p : pods) {
      if (p.name == pod_name && !p.uid.empty()) deleted_pods_[p.uid] = now;
    }
  }
  if (gang_job && !may_run) TRELLIS_RETURN_IF_ERROR(RemovePodGroup(meta, *spec));
  return plan.requeue_after;
}

void Reconciler::ForgetOldDeletes(Clock::time_point now) {
  // A pod deleted at once (never scheduled) leaves no deletionTimestamp to catch up with.
  for (auto it = deleted_pods_.begin(); it != deleted_pods_.end();) {
    it = now - it->second > std::chrono::minutes(5) ? deleted_pods_.erase(it) : std::next(it);
  }
}

bool Reconciler::AwaitExitCheckpoint(const Json& job, const JobSpec& spec, const std::vector<ObservedPod>& pods,
                                     JobPlan* plan, Clock::time_point now) {
  bool workers_running = false;
  for (const auto& p : pods) workers_running |= p.role == PodRole::kWorker && p.phase == "Running" && !p.deleting;
  const StatusOr<v1::JobProgress> progress =
      workers_running ? schedulers_->StopJob(job, "the job was suspended (spec.runPolicy.suspend)")
                      : StatusOr<v1::JobProgress>(UnavailableError("no worker runs"));
  const ExitCheckpointStep step = StepExitCheckpoint(
      plan->status, progress, workers_running, std::chrono::seconds(spec.runPolicy.TerminationGraceSeconds()), now);
  if (step.hold_pods) {
    plan->remove.clear();
    // The checkpoint takes a step and a file write: look again soon, not at the next resync.
    const Clock::duration soon = std::chrono::milliseconds(500);
    plan->requeue_after = plan->requeue_after ? std::min(*plan->requeue_after, soon) : soon;
  }
  if (step.event) {
    TLOG_INFO << "job " << Str(job, {"metadata", "namespace"}, "default") << "/" << Str(job, {"metadata", "name"})
              << ": " << step.event->message;
    plan->events.push_back(*step.event);
  }
  return step.hold_pods;
}

void Reconciler::FollowResize(const Json& job, JobPlan* plan, Clock::time_point now) {
  const std::string ns = Str(job, {"metadata", "namespace"}, "default");
  const std::string name = Str(job, {"metadata", "name"});
  // A resize takes a step or two and the next ping (about a second): look again soon.
  auto again = [&](Clock::duration after) {
    plan->requeue_after = plan->requeue_after ? std::min(*plan->requeue_after, after) : after;
  };
  bool pending = plan->follow_resize;
  if (plan->resize) {
    const ResizeAsk& ask = *plan->resize;
    const StatusOr<v1::ResizeResponse> answer =
        ask.servers ? schedulers_->Resize(job, 0, ask.reason, ask.to) : schedulers_->Resize(job, ask.to, ask.reason, 0);
    int64_t pending_epoch = 0;
    if (!answer.ok() && answer.status().code() == StatusCode::kFailedPrecondition) {
      if (auto p = schedulers_->Progress(job); p.ok()) pending_epoch = p->resize_pending_epoch();
    }
    if (!ApplyResizeAnswer(plan->status, name, ask, answer, pending_epoch, now, &plan->events)) {
      TLOG_INFO << "job " << ns << "/" << name << ": cannot ask its scheduler for the resize yet: "
                << answer.status().message();
      again(std::chrono::seconds(2));
      return;
    }
    pending = Str(plan->status, {"lastResize", "outcome"}) == kResizePending;
  }
  if (!pending) return;
  if (auto p = schedulers_->Progress(job); p.ok()) {
    pending = ApplyResizeProgress(plan->status, name, *p, now, &plan->events);
  }
  if (pending) again(std::chrono::milliseconds(500));
}

StatusOr<GangObservation> Reconciler::EnsurePodGroup(const JobMeta& meta, const JobSpec& spec) {
  const GangScheduler g = *spec.runPolicy.schedulingPolicy.gangScheduler;
  const Resource r = PodGroups(g);
  const std::string what = "PodGroup " + PodGroupName(meta.name) + " (" + PodGroupApiOf(g).group_version + ")";
  GangObservation o;
  // Why the server said no, in the words a cluster admin acts on.
  auto refused = [&](const Status& s, const char* verb) {
    std::string hint;
    if (s.code() == StatusCode::kNotFound) {
      hint = g == GangScheduler::kVolcano ? " (the API server does not serve it: is Volcano installed?)"
                                          : " (the API server does not serve it: are the scheduler-plugins CRDs installed?)";
    } else if (s.code() == StatusCode::kPermissionDenied) {
      hint = " (the operator's ClusterRole needs " + std::string(verb) + " on podgroups of this group)";
    }
    o.create_error = std::string("cannot ") + verb + " " + what + hint + ": " + s.message();
  };
  auto existing = client_.Get(r, meta.ns, PodGroupName(meta.name));
  if (existing.ok()) return ObservePodGroup(*existing);
  if (existing.status().code() == StatusCode::kUnavailable) return existing.status();
  if (existing.status().code() != StatusCode::kNotFound) {
    refused(existing.status(), "get");
    return o;
  }
  auto created = client_.Create(r, meta.ns, DesiredPodGroup(meta, spec));
  if (created.ok() || created.status().code() == StatusCode::kAlreadyExists) return o;
  if (created.status().code() == StatusCode::kUnavailable) return created.status();
  refused(created.status(), "create");
  TLOG_WARN << "job " << meta.ns << "/" << meta.name << ": " << o.create_error;
  return o;
}

Status Reconciler::RemovePodGroup(const JobMeta& meta, const JobSpec& spec) {
  const Resource r = PodGroups(*spec.runPolicy.schedulingPolicy.gangScheduler);
  // Get first: a finished job is looked at every resync, and a group that is gone (or an API
  // that is not served) needs nothing.
  auto existing = client_.Get(r, meta.ns, PodGroupName(meta.name));
  if (!existing.ok()) return existing.status().code() == StatusCode::kNotFound ? Status::Ok() : existing.status();
  if (!OwnedBy(*existing, meta.uid)) return Status::Ok();  // a same-named job's, not ours to delete
  Status s = client_.Delete(r, meta.ns, PodGroupName(meta.name));
  return s.ok() || s.code() == StatusCode::kNotFound ? Status::Ok() : s;
}

Status Reconciler::CreateObjects(const JobMeta& meta, const JobSpec& spec, const JobPlan& plan, bool* first) {
  if (plan.ensure_support) TRELLIS_RETURN_IF_ERROR(EnsureSupport(meta, spec, first));
  ObjectStore* pods = cache_ ? &cache_->pods : nullptr;
  for (const DesiredPod& pod : plan.create) {
    TRELLIS_RETURN_IF_ERROR(Ensure(kPods, pods, meta.ns, BuildPod(meta, spec, pod, settings_)));
  }
  return Status::Ok();
}

StatusOr<std::optional<Clock::duration>> Reconciler::ReportRefusal(const Json& job, Json status,
                                                                   const Status& refusal) {
  const std::string ns = Str(job, {"metadata", "namespace"}, "default");
  const std::string name = Str(job, {"metadata", "name"});
  const bool permanent = PermanentRefusal(refusal);
  const std::string& message = refusal.message();
  const Clock::time_point now = now_();
  TLOG_WARN << "job " << ns << "/" << name << ": " << message << (permanent ? "; the job fails" : "; retrying");
  if (permanent) {
    status["phase"] = JStr(kFailed);
    if (!At(status, {"completionTime"})) status["completionTime"] = JStr(FormatTime(now));
    SetCondition(status, "Failed", true, "FailedCreate", message, now);
    for (const char* transient : {"Running", "Restarting"}) {
      if (const Json* c = At(status, {"conditions"}); c && c->is_array()) {
        for (size_t i = 0; i < c->size(); ++i) {
          if (Str(c->at(i), {"type"}) == transient && Str(c->at(i), {"status"}) == "True") {
            SetCondition(status, transient, false, "FailedCreate", message, now);
            break;
          }
        }
      }
    }
  } else {
    SetCondition(status, "FailedCreate", true, TransientReason(refusal), message, now);
  }
  const Json* old = At(job, {"status"});
  Json updated = job;
  if (!old || *old != status) {
    auto w = WriteStatus(job, status);
    if (!w.ok()) {
      TLOG_WARN << "job " << ns << "/" << name << ": cannot write the refusal into the status: " << w.status().message();
      return permanent ? w.status() : refusal;
    }
    updated = *w;
  }
  Status e = RecordEvent(updated, "Warning", "FailedCreate", message);
  if (!e.ok()) TLOG_WARN << "job " << ns << "/" << name << ": cannot record event: " << e.message();
  phase_ = Str(status, {"phase"});
  if (permanent) return std::optional<Clock::duration>();  // the status change brings the clean-up
  return refusal;                                          // retried with back-off
}

StatusOr<std::optional<Clock::duration>> Reconciler::FailJob(const std::string& ns, const std::string& name,
                                                             const std::string& reason, const std::string& message) {
  auto job = client_.Get(kTrainingJobs, ns, name);
  if (!job.ok() && job.status().code() == StatusCode::kNotFound) {
    phase_ = "";
    return std::optional<Clock::duration>();
  }
  if (!job.ok()) return job.status();
  const Json* old = At(*job, {"status"});
  Json st = old && old->is_object() ? *old : Json::object();
  phase_ = kFailed;
  if (Str(st, {"phase"}) == kFailed) return std::optional<Clock::duration>();
  const Clock::time_point now = now_();
  st["phase"] = JStr(kFailed);
  if (!At(st, {"completionTime"})) st["completionTime"] = JStr(FormatTime(now));
  SetCondition(st, "Failed", true, reason, message, now);
  TRELLIS_ASSIGN_OR_RETURN(Json updated, WriteStatus(*job, st));
  Status e = RecordEvent(updated, "Warning", reason, message);
  if (!e.ok()) TLOG_WARN << "job " << ns << "/" << name << ": cannot record event: " << e.message();
  return std::optional<Clock::duration>();
}

StatusOr<Json> Reconciler::WriteStatus(const Json& job, const Json& status) {
  // Only what the status subresource looks at: a job's spec may be megabytes, and parts of it
  // may not have survived reading (kTooDeep).
  Json u = Json::object();
  u["apiVersion"] = JStr(kGroupVersion);
  u["kind"] = JStr("TrainingJob");
  const std::string ns = Str(job, {"metadata", "namespace"}, "default");
  const std::string name = Str(job, {"metadata", "name"});
  Put(u, {"metadata", "name"}, JStr(name));
  Put(u, {"metadata", "namespace"}, JStr(ns));
  for (const char* k : {"uid", "resourceVersion"}) {
    if (const Json* v = At(job, {"metadata", k}); v && v->is_string()) Put(u, {"metadata", k}, *v);
  }
  u["status"] = status;
  auto w = client_.UpdateStatus(kTrainingJobs, ns, name, u);
  if (w.ok() && cache_) cache_->jobs.Written(*w);
  return w;
}

Status Reconciler::EnsureSupport(const JobMeta& meta, const JobSpec& spec, bool* first) {
  ObjectStore* secrets = cache_ ? &cache_->secrets : nullptr;
  ObjectStore* configmaps = cache_ ? &cache_->configmaps : nullptr;
  auto secret = Read(kSecrets, secrets, meta.ns, TokenSecretName(meta.name));
  if (!secret.ok() && secret.status().code() != StatusCode::kNotFound) return secret.status();
  if (!secret.ok()) {
    TRELLIS_ASSIGN_OR_RETURN(std::string token, RandomToken());
    TRELLIS_RETURN_IF_ERROR(Ensure(kSecrets, secrets, meta.ns, TokenSecret(meta, token)));
    *first = true;
  }
  // The job file follows the spec (a suspended job may be resized before it resumes); the
  // scheduler reads it when it starts.
  Json want = JobConfigMap(meta, spec);
  auto cm = Read(kConfigMaps, configmaps, meta.ns, ConfigMapName(meta.name));
  if (!cm.ok() && cm.status().code() != StatusCode::kNotFound) return cm.status();
  if (!cm.ok()) {
    TRELLIS_RETURN_IF_ERROR(Ensure(kConfigMaps, configmaps, meta.ns, want));
  } else if (Str(*cm, {"data", "job.yaml"}) != Str(want, {"data", "job.yaml"})) {
    // The cached copy holds only what the operator reads: the update starts from the server's.
    auto full = configmaps && configmaps->usable() ? client_.Get(kConfigMaps, meta.ns, ConfigMapName(meta.name)) : cm;
    if (!full.ok()) return full.status();
    Json updated = *full;
    if (const Json* data = At(want, {"data"})) updated["data"] = *data;
    auto u = client_.Update(kConfigMaps, meta.ns, ConfigMapName(meta.name), updated);
    // A conflict is retried by the next reconcile; a refusal is the job's.
    if (!u.ok()) {
      return Status(u.status().code(), "the API server refused the update of ConfigMap " + meta.ns + "/" +
                                           ConfigMapName(meta.name) + ": " + ServerMessage(u.status()));
    }
    if (configmaps) configmaps->Written(*u);
  }
  return Ensure(kServices, cache_ ? &cache_->services : nullptr, meta.ns, SchedulerService(meta, settings_));
}

Status Reconciler::RecordEvent(const Json& job, const std::string& type, const std::string& reason,
                               const std::string& message) {
  return RecordJobEvent(client_, job, type, reason, message, now_());
}

}  // namespace trellis::op
