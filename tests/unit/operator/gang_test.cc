// Gang scheduling and Kueue, without a server: the PodGroup a job owns (both APIs, exact JSON),
// what its pods carry, what the PodGroup's and the pods' status make of the job's status.
#include "operator/gang.h"

#include <gtest/gtest.h>

#include "operator/job_status.h"
#include "tests/unit/operator/test_jobs.h"

namespace trellis::op {
namespace {

using testing::ApiJob;
using testing::Condition;
using testing::kT0;
using testing::Spec;
using testing::Step;

// 2 servers, 3 workers: a gang of 6 with the scheduler.
Json GangJob(const std::string& policy_json, const std::string& labels_json = "") {
  Json job = ApiJob(R"({"servers":{"replicas":2},"workers":{"replicas":3,"command":["w"]},
                        "runPolicy":{"schedulingPolicy":)" + policy_json + "}}");
  if (!labels_json.empty()) job["metadata"]["labels"] = *ParseJson(labels_json);
  return job;
}

TEST(PodGroupTest, VolcanoPodGroupHasEveryPodQueueAndPriorityAndIsOwnedByTheJob) {
  Json job = GangJob(R"({"gangScheduler":"volcano","queue":"research","priorityClass":"high"})");
  Json pg = DesiredPodGroup(*JobMetaOf(job), Spec(job));
  EXPECT_EQ(pg, *ParseJson(R"({"apiVersion":"scheduling.volcano.sh/v1beta1","kind":"PodGroup",
      "metadata":{"name":"mlp","namespace":"team","labels":{"trellis.io/job-name":"mlp"},
                  "ownerReferences":[{"apiVersion":"trellis.io/v1alpha1","kind":"TrainingJob","name":"mlp",
                                      "uid":"u-1","controller":true,"blockOwnerDeletion":true}]},
      "spec":{"minMember":6,"queue":"research","priorityClassName":"high"}})"))
      << pg.serialize();
}

TEST(PodGroupTest, CoschedulingPodGroupHasEveryPodAndTheTimeout) {
  Json job = GangJob(R"({"gangScheduler":"scheduler-plugins","scheduleTimeoutSeconds":30})");
  Json pg = DesiredPodGroup(*JobMetaOf(job), Spec(job));
  EXPECT_EQ(Str(pg, {"apiVersion"}), "scheduling.x-k8s.io/v1alpha1");
  EXPECT_EQ(Str(pg, {"kind"}), "PodGroup");
  EXPECT_EQ(Str(pg, {"metadata", "name"}), "mlp");
  EXPECT_EQ(Str(pg.at("metadata").at("ownerReferences").at(0), {"uid"}), "u-1");
  EXPECT_EQ(pg.at("spec"), *ParseJson(R"({"minMember":6,"scheduleTimeoutSeconds":30})")) << pg.serialize();
  // Without a timeout the field is left to the plugin's default.
  Json plain = GangJob(R"({"gangScheduler":"scheduler-plugins"})");
  EXPECT_EQ(DesiredPodGroup(*JobMetaOf(plain), Spec(plain)).at("spec"), *ParseJson(R"({"minMember":6})"));
}

TEST(PodGroupTest, EveryPodJoinsTheVolcanoGangWithSchedulerNameAndPriority) {
  Json job = GangJob(R"({"gangScheduler":"volcano","priorityClass":"high"})");
  auto pods = DesiredPods(*JobMetaOf(job), Spec(job), OperatorSettings{});
  ASSERT_EQ(pods.size(), 6u);
  for (const Json& pod : pods) {
    SCOPED_TRACE(Str(pod, {"metadata", "name"}));
    EXPECT_EQ(Str(pod, {"spec", "schedulerName"}), "volcano");
    EXPECT_EQ(Str(pod, {"spec", "priorityClassName"}), "high");
    EXPECT_EQ(Str(pod, {"metadata", "annotations", "scheduling.k8s.io/group-name"}), "mlp");
    EXPECT_EQ(Str(pod, {"metadata", "annotations", "prometheus.io/scrape"}), "true");  // kept
    EXPECT_FALSE(At(pod, {"metadata", "labels", "scheduling.x-k8s.io/pod-group"}));
  }
}

TEST(PodGroupTest, EveryPodJoinsTheCoschedulingGangAndTheSchedulerNameIsOverridable) {
  Json job = GangJob(R"({"gangScheduler":"scheduler-plugins"})");
  for (const Json& pod : DesiredPods(*JobMetaOf(job), Spec(job), OperatorSettings{})) {
    SCOPED_TRACE(Str(pod, {"metadata", "name"}));
    EXPECT_EQ(Str(pod, {"spec", "schedulerName"}), "scheduler-plugins-scheduler");
    EXPECT_EQ(Str(pod, {"metadata", "labels", "scheduling.x-k8s.io/pod-group"}), "mlp");
    EXPECT_EQ(Str(pod, {"metadata", "labels", "trellis.io/job-name"}), "mlp");  // kept
    EXPECT_FALSE(At(pod, {"metadata", "annotations", "scheduling.k8s.io/group-name"}));
    EXPECT_FALSE(At(pod, {"spec", "priorityClassName"}));
  }
  Json named = GangJob(R"({"gangScheduler":"scheduler-plugins","schedulerName":"gang"})");
  EXPECT_EQ(Str(RolePod(*JobMetaOf(named), Spec(named), PodRole::kWorker, 0, OperatorSettings{}),
                {"spec", "schedulerName"}),
            "gang");
}

TEST(PodGroupTest, ThePolicyWinsOverATemplatesSchedulerName) {
  Json job = GangJob(R"({"gangScheduler":"volcano"})");
  job["spec"]["workers"]["template"] = *ParseJson(R"({"spec":{"schedulerName":"other","priorityClassName":"x",
      "nodeSelector":{"pool":"a"},"containers":[{"name":"trellis"}],"volumes":[]}})");
  Json pod = RolePod(*JobMetaOf(job), Spec(job), PodRole::kWorker, 1, OperatorSettings{});
  EXPECT_EQ(Str(pod, {"spec", "schedulerName"}), "volcano");
  EXPECT_EQ(Str(pod, {"spec", "nodeSelector", "pool"}), "a");
  // No priorityClass in the policy: the template's stays.
  EXPECT_EQ(Str(pod, {"spec", "priorityClassName"}), "x");
}

TEST(PodGroupTest, JobsWithoutAPolicyGetNoSchedulerFields) {
  Json job = ApiJob(testing::kSpec);
  for (const Json& pod : DesiredPods(*JobMetaOf(job), Spec(job), OperatorSettings{})) {
    EXPECT_FALSE(At(pod, {"spec", "schedulerName"}));
    EXPECT_FALSE(At(pod, {"spec", "priorityClassName"}));
    EXPECT_FALSE(At(pod, {"metadata", "annotations", "scheduling.k8s.io/group-name"}));
  }
}

TEST(KueueTest, TheQueueLabelStaysOnTheJobNotOnItsPods) {
  // Kueue admits the job through suspend; the label on pods would have its pod integration
  // gate and queue each pod again, one by one.
  Json job = GangJob(R"({})", R"({"kueue.x-k8s.io/queue-name":"team-a","kueue.x-k8s.io/priority-class":"p",
                                  "app":"demo"})");
  for (const Json& pod : DesiredPods(*JobMetaOf(job), Spec(job), OperatorSettings{})) {
    EXPECT_FALSE(At(pod, {"metadata", "labels", "kueue.x-k8s.io/queue-name"}));
    EXPECT_FALSE(At(pod, {"metadata", "labels", "kueue.x-k8s.io/priority-class"}));
    EXPECT_EQ(Str(pod, {"metadata", "labels", "app"}), "demo");
  }
}

TEST(ObservePodGroupTest, ReadsVolcanosUnschedulableCondition) {
  GangObservation o = ObservePodGroup(*ParseJson(R"({"status":{"phase":"Pending","conditions":[
      {"type":"Scheduled","status":"False"},
      {"type":"Unschedulable","status":"True","reason":"NotEnoughResources",
       "message":"6/6 tasks in gang unschedulable: pod group is not ready, 6 Pending, 6 minAvailable"}]}})"));
  EXPECT_EQ(o.unschedulable_reason, "NotEnoughResources");
  EXPECT_EQ(o.unschedulable_message, "6/6 tasks in gang unschedulable: pod group is not ready, 6 Pending, 6 minAvailable");
  EXPECT_TRUE(o.create_error.empty());
  EXPECT_TRUE(ObservePodGroup(*ParseJson(R"({"status":{"phase":"Running","conditions":[
      {"type":"Unschedulable","status":"False"}]}})")).unschedulable_reason.empty());
  EXPECT_TRUE(ObservePodGroup(*ParseJson(R"({"status":{"conditions":"garbage"}})")).unschedulable_reason.empty());
  EXPECT_TRUE(ObservePodGroup(*ParseJson("[1]")).unschedulable_reason.empty());
}

TEST(ObservePodGroupTest, ReadsThePodSchedulersUnschedulableCondition) {
  Json pod = *ParseJson(R"({"metadata":{"name":"mlp-worker-0","labels":{"trellis.io/role":"worker",
      "trellis.io/rank":"0"}},"status":{"phase":"Pending","conditions":[{"type":"PodScheduled","status":"False",
      "reason":"Unschedulable","message":"0/3 nodes are available: 3 Insufficient cpu."}]}})");
  EXPECT_EQ(ObservePod(pod)->unschedulable, "0/3 nodes are available: 3 Insufficient cpu.");
  pod["status"]["phase"] = JStr("Running");  // placed since: the old condition means nothing
  EXPECT_EQ(ObservePod(pod)->unschedulable, "");
  pod["status"]["phase"] = JStr("Pending");
  pod["status"]["conditions"][0]["reason"] = JStr("SchedulingGated");
  EXPECT_EQ(ObservePod(pod)->unschedulable, "");
}

// Every pod of GangJob as the API server lists them, in `phase`, each with the scheduler's
// Unschedulable condition when `unschedulable` is set; read as the reconciler reads them.
std::vector<ObservedPod> GangPods(const std::string& phase, const std::string& unschedulable = "") {
  Json job = GangJob(R"({})");
  std::vector<ObservedPod> pods;
  for (Json pod : DesiredPods(*JobMetaOf(job), Spec(job), OperatorSettings{})) {
    pod["status"] = Json::object();
    pod["status"]["phase"] = JStr(phase);
    if (!unschedulable.empty()) {
      pod["status"]["conditions"] = *ParseJson(R"([{"type":"PodScheduled","status":"False","reason":"Unschedulable"}])");
      pod["status"]["conditions"][0]["message"] = JStr(unschedulable);
    }
    pods.push_back(*ObservePod(pod));
  }
  return pods;
}

TEST(GangStatusTest, UnschedulableGangShowsInTheStatusUntilItIsPlaced) {
  Json job = GangJob(R"({"gangScheduler":"volcano"})");
  GangObservation fresh;
  Step(job, {}, kT0, &fresh);
  EXPECT_EQ(Condition(job["status"], "Unschedulable"), "<none>");  // nothing waited yet

  GangObservation held;
  held.unschedulable_reason = "NotEnoughResources";
  held.unschedulable_message = "6/6 tasks in gang unschedulable";
  JobPlan p = Step(job, GangPods("Pending"), kT0 + std::chrono::seconds(5), &held);
  EXPECT_EQ(Str(p.status, {"phase"}), "Pending");
  EXPECT_EQ(Condition(p.status, "Unschedulable"), "True");
  EXPECT_EQ(Condition(p.status, "Unschedulable", "reason"), "PodGroupUnschedulable");
  EXPECT_EQ(Condition(p.status, "Unschedulable", "message"),
            "job mlp: PodGroup mlp: NotEnoughResources: 6/6 tasks in gang unschedulable");
  EXPECT_EQ(p.event_type, "Warning");
  EXPECT_EQ(p.event_reason, "PodGroupUnschedulable");
  // Still held: no second event.
  EXPECT_TRUE(Step(job, GangPods("Pending"), kT0 + std::chrono::seconds(6), &held).event_type.empty());

  JobPlan placed = Step(job, GangPods("Running"), kT0 + std::chrono::seconds(9), &fresh);
  EXPECT_EQ(Str(placed.status, {"phase"}), "Running");
  EXPECT_EQ(Condition(placed.status, "Unschedulable"), "False");
  EXPECT_EQ(Condition(placed.status, "Unschedulable", "reason"), "PodsScheduled");
}

TEST(GangStatusTest, PodsTheSchedulerCannotPlaceShowInTheStatus) {
  Json job = GangJob(R"({"gangScheduler":"scheduler-plugins"})");
  GangObservation ok;
  JobPlan p = Step(job, GangPods("Pending", "0/1 nodes are available: 1 Insufficient cpu."), kT0, &ok);
  EXPECT_EQ(Condition(p.status, "Unschedulable"), "True");
  EXPECT_EQ(Condition(p.status, "Unschedulable", "reason"), "PodsUnschedulable");
  EXPECT_EQ(Condition(p.status, "Unschedulable", "message"),
            "job mlp: 6 of 6 pods cannot be scheduled; scheduler (pod mlp-scheduler): 0/1 nodes are available: "
            "1 Insufficient cpu.");
  // A plain job (no gang) says so too: it is the same wait.
  Json plain = ApiJob(testing::kSpec);
  JobPlan q = Step(plain, GangPods("Pending", "0/1 nodes are available"), kT0);
  EXPECT_EQ(Condition(q.status, "Unschedulable", "reason"), "PodsUnschedulable");
}

TEST(GangStatusTest, APodGroupTheServerRefusesCreatesNoPodAndSaysWhy) {
  Json job = GangJob(R"({"gangScheduler":"volcano"})");
  GangObservation refused;
  refused.create_error = "cannot create PodGroup mlp (scheduling.volcano.sh/v1beta1) (is Volcano installed?): 404";
  JobPlan p = Step(job, {}, kT0, &refused);
  EXPECT_TRUE(p.create.empty());
  EXPECT_EQ(Str(p.status, {"phase"}), "Pending");
  EXPECT_EQ(Condition(p.status, "Unschedulable", "reason"), "PodGroupNotCreated");
  EXPECT_EQ(Condition(p.status, "Unschedulable", "message"), "job mlp: " + refused.create_error);
  // The Warning wins over the Normal "created" event of the same round.
  EXPECT_EQ(p.event_type, "Warning");
  EXPECT_EQ(p.event_reason, "PodGroupNotCreated");
  // Once the PodGroup exists, the pods are created.
  GangObservation ok;
  JobPlan later = Step(job, {}, kT0 + std::chrono::seconds(30), &ok);
  EXPECT_EQ(later.create.size(), 6u);
  EXPECT_EQ(Condition(later.status, "Unschedulable"), "False");
}

TEST(GangStatusTest, SuspendingEndsTheWait) {
  Json job = GangJob(R"({"gangScheduler":"volcano"})");
  GangObservation held;
  held.unschedulable_reason = "NotEnoughResources";
  Step(job, GangPods("Pending"), kT0, &held);
  job["spec"]["runPolicy"]["suspend"] = Json::boolean(true);
  JobPlan s = Step(job, GangPods("Pending"), kT0 + std::chrono::seconds(1));
  EXPECT_EQ(Str(s.status, {"phase"}), "Suspended");
  EXPECT_EQ(s.remove.size(), 6u);
  EXPECT_EQ(Condition(s.status, "Unschedulable"), "False");
  EXPECT_EQ(Condition(s.status, "Unschedulable", "reason"), "JobSuspended");
}

}  // namespace
}  // namespace trellis::op
