#include "operator/reconciler.h"

#include <fstream>

#include "common/logging.h"
#include "operator/job_status.h"

namespace trellis::op {
namespace {

// Creation that tolerates "already there": a restarted operator meets its own objects.
Status CreateIfMissing(KubeClient& c, const Resource& r, const std::string& ns, const Json& obj) {
  auto s = c.Create(r, ns, obj);
  if (s.ok() || s.status().code() == StatusCode::kAlreadyExists) return Status::Ok();
  return s.status();
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

StatusOr<std::string> RandomToken() {
  std::ifstream in("/dev/urandom", std::ios::binary);
  unsigned char buf[32];
  if (!in.read(reinterpret_cast<char*>(buf), sizeof buf)) return InternalError("cannot read /dev/urandom");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char b : buf) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

Reconciler::Reconciler(KubeClient& client, OperatorSettings settings, Now now, ReconcileObserver observer)
    : client_(client), settings_(std::move(settings)), now_(std::move(now)), observer_(std::move(observer)) {}

StatusOr<std::optional<Clock::duration>> Reconciler::Reconcile(const std::string& ns, const std::string& name) {
  constexpr int kAttempts = 5;
  for (int i = 1;; ++i) {
    phase_.reset();
    auto r = Attempt(ns, name);
    if (r.ok() && observer_.on_phase && phase_) observer_.on_phase(ns + "/" + name, *phase_);
    if (r.ok() || r.status().code() != StatusCode::kAborted || i == kAttempts) return r;
    TLOG_INFO << "job " << ns << "/" << name << ": status write conflicted, reconciling again";
  }
}

StatusOr<std::optional<Clock::duration>> Reconciler::Attempt(const std::string& ns, const std::string& name) {
  auto job = client_.Get(kTrainingJobs, ns, name);
  if (!job.ok() && job.status().code() == StatusCode::kNotFound) {
    phase_ = "";
    return std::optional<Clock::duration>();
  }
  if (!job.ok()) return job.status();
  if (At(*job, {"metadata", "deletionTimestamp"})) return std::optional<Clock::duration>();
  TRELLIS_ASSIGN_OR_RETURN(JobMeta meta, JobMetaOf(*job));

  // The job model judges the object exactly as the API server sent it.
  StatusOr<JobSpec> spec = ParseJobSpec(job->serialize());

  TRELLIS_ASSIGN_OR_RETURN(Json pod_list, client_.List(kPods, ns, JobSelector(name)));
  std::vector<ObservedPod> pods;
  if (const Json* items = At(pod_list, {"items"}); items && items->is_array()) {
    for (size_t i = 0; i < items->size(); ++i) {
      const Json& pod = items->at(i);
      // Only pods this job controls: a same-named job deleted and recreated owns new ones.
      bool ours = false;
      if (const Json* owners = At(pod, {"metadata", "ownerReferences"}); owners && owners->is_array()) {
        for (size_t k = 0; k < owners->size(); ++k) ours |= Str(owners->at(k), {"uid"}) == meta.uid;
      }
      if (!ours) continue;
      if (auto o = ObservePod(pod)) pods.push_back(*o);
    }
  }

  // The PodGroup comes before the plan: the plan creates no pod while it cannot exist.
  const bool gang_job = spec.ok() && spec->runPolicy.schedulingPolicy.gangScheduler.has_value();
  const std::string old_phase = Str(*job, {"status", "phase"});
  const bool may_run = spec.ok() && !spec->runPolicy.suspend && old_phase != kSucceeded && old_phase != kFailed;
  std::optional<GangObservation> gang;
  if (gang_job && may_run) {
    TRELLIS_ASSIGN_OR_RETURN(gang, EnsurePodGroup(meta, *spec));
  }

  const Clock::time_point now = now_();
  JobPlan plan = PlanJob(*job, spec, pods, now, gang ? &*gang : nullptr);

  if (plan.delete_job) {
    TLOG_INFO << "job " << ns << "/" << name << ": ttlSecondsAfterFinished passed, deleting it";
    Status s = client_.Delete(kTrainingJobs, ns, name);
    if (!s.ok() && s.code() != StatusCode::kNotFound) return s;
    phase_ = "";
    return std::optional<Clock::duration>();
  }

  // Status first: a restart is counted before its pod is deleted, so a crash in between can
  // only over-count, never restart without limit.
  const Json* old_status = At(*job, {"status"});
  if (!old_status || *old_status != plan.status) {
    Json update = *job;
    update["status"] = plan.status;
    auto s = client_.UpdateStatus(kTrainingJobs, ns, name, update);
    if (!s.ok()) return s.status();
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

  if (plan.ensure_support) TRELLIS_RETURN_IF_ERROR(EnsureSupport(meta, *spec));
  if (!plan.create.empty()) {
    for (const Json& pod : DesiredPods(meta, *spec, settings_)) {
      const std::string pod_name = Str(pod, {"metadata", "name"});
      if (std::find(plan.create.begin(), plan.create.end(), pod_name) == plan.create.end()) continue;
      TRELLIS_RETURN_IF_ERROR(CreateIfMissing(client_, kPods, ns, pod));
    }
  }
  for (const auto& pod_name : plan.remove) {
    Status s = client_.Delete(kPods, ns, pod_name);
    if (!s.ok() && s.code() != StatusCode::kNotFound) return s;
  }
  if (gang_job && !may_run) TRELLIS_RETURN_IF_ERROR(RemovePodGroup(meta, *spec));
  return plan.requeue_after;
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

Status Reconciler::EnsureSupport(const JobMeta& meta, const JobSpec& spec) {
  auto secret = client_.Get(kSecrets, meta.ns, TokenSecretName(meta.name));
  if (!secret.ok() && secret.status().code() != StatusCode::kNotFound) return secret.status();
  if (!secret.ok()) {
    TRELLIS_ASSIGN_OR_RETURN(std::string token, RandomToken());
    TRELLIS_RETURN_IF_ERROR(CreateIfMissing(client_, kSecrets, meta.ns, TokenSecret(meta, token)));
  }
  // The job file follows the spec (a suspended job may be resized before it resumes); the
  // scheduler reads it when it starts.
  Json want = JobConfigMap(meta, spec);
  auto cm = client_.Get(kConfigMaps, meta.ns, ConfigMapName(meta.name));
  if (!cm.ok() && cm.status().code() != StatusCode::kNotFound) return cm.status();
  if (!cm.ok()) {
    TRELLIS_RETURN_IF_ERROR(CreateIfMissing(client_, kConfigMaps, meta.ns, want));
  } else if (Str(*cm, {"data", "job.yaml"}) != Str(want, {"data", "job.yaml"})) {
    Json updated = *cm;
    updated["data"] = want.at("data");
    auto u = client_.Update(kConfigMaps, meta.ns, ConfigMapName(meta.name), updated);
    if (!u.ok()) return u.status();  // a conflict is retried by the next reconcile
  }
  return CreateIfMissing(client_, kServices, meta.ns, SchedulerService(meta, settings_));
}

Status Reconciler::RecordEvent(const Json& job, const std::string& type, const std::string& reason,
                               const std::string& message) {
  const std::string ns = Str(job, {"metadata", "namespace"}, "default");
  const std::string name = Str(job, {"metadata", "name"});
  const std::string now = FormatTime(now_());
  Json ev = Json::object();
  ev["apiVersion"] = JStr("v1");
  ev["kind"] = JStr("Event");
  // Unique per transition: the job's resourceVersion names the state that caused it.
  Put(ev, {"metadata", "name"}, JStr(name + "." + Str(job, {"metadata", "resourceVersion"}) + "." +
                                      std::to_string(std::hash<std::string>{}(reason + message) % 100000)));
  Put(ev, {"metadata", "namespace"}, JStr(ns));
  Json ref = Json::object();
  ref["apiVersion"] = JStr(kGroupVersion);
  ref["kind"] = JStr("TrainingJob");
  ref["name"] = JStr(name);
  ref["namespace"] = JStr(ns);
  ref["uid"] = JStr(Str(job, {"metadata", "uid"}));
  ev["involvedObject"] = ref;
  ev["type"] = JStr(type);
  ev["reason"] = JStr(reason);
  ev["message"] = JStr(message.size() > 1024 ? message.substr(0, 1021) + "..." : message);
  ev["firstTimestamp"] = JStr(now);
  ev["lastTimestamp"] = JStr(now);
  ev["count"] = Json::number(1);
  Put(ev, {"source", "component"}, JStr("trellis-operator"));
  return CreateIfMissing(client_, kEvents, ns, ev);
}

}  // namespace trellis::op
