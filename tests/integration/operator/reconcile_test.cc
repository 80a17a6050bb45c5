// The reconciler against the API double, one Reconcile call at a time with a fake clock: each
// test drives the world (pod phases) through the double's API like a kubelet would.
#include <gtest/gtest.h>

#include "operator/object_cache.h"
#include "tests/integration/operator/reconcile_fixture.h"

namespace trellis::op::testing {
namespace {

using std::chrono::seconds;
using Names = std::vector<std::string>;

constexpr char kTwoByTwo[] = R"({"image":"img:1","servers":{"replicas":2},"workers":{"replicas":2,"command":["w"]},
    "runPolicy":{"ttlSecondsAfterFinished":60,"backoffLimit":1}})";

TEST_F(ReconcileTest, CreateRunSucceedThenTtlDeletesJobAndCascades) {
  CreateJob("mlp", kTwoByTwo);
  Reconcile("mlp");
  EXPECT_EQ(PodNames("mlp"),
            (Names{"mlp-scheduler", "mlp-server-0", "mlp-server-1", "mlp-worker-0", "mlp-worker-1"}));
  EXPECT_EQ(Phase("mlp"), "Pending");
  EXPECT_TRUE(client_->Get(kSecrets, "default", "mlp-token").ok());
  EXPECT_TRUE(client_->Get(kServices, "default", "mlp-scheduler").ok());
  EXPECT_TRUE(client_->Get(kConfigMaps, "default", "mlp-config").ok());
  // Events are recorded on transitions.
  auto events = client_->List(kEvents, "default");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->at("items").size(), 1u);
  EXPECT_EQ(Str(events->at("items").at(0), {"reason"}), "JobCreated");

  SetAllPodsPhase("mlp", "Running");
  now_ += seconds(5);
  Reconcile("mlp");
  Json job = GetJob("mlp");
  EXPECT_EQ(Str(job, {"status", "phase"}), "Running");
  EXPECT_EQ(Str(job, {"status", "workers"}), "2/2");
  EXPECT_EQ(Condition(job, "Running"), "True");

  SetPodPhase("mlp-worker-0", "Succeeded", 0);
  SetPodPhase("mlp-worker-1", "Succeeded", 0);
  now_ += seconds(5);
  auto requeue = Reconcile("mlp");
  job = GetJob("mlp");
  EXPECT_EQ(Str(job, {"status", "phase"}), "Succeeded");
  EXPECT_EQ(Condition(job, "Succeeded", "reason"), "JobSucceeded");
  EXPECT_EQ(Str(job, {"status", "completionTime"}), FormatTime(now_));
  // cleanPodPolicy Running: the scheduler and servers are gone, the finished workers stay.
  EXPECT_EQ(PodNames("mlp"), (Names{"mlp-worker-0", "mlp-worker-1"}));
  ASSERT_TRUE(requeue);
  EXPECT_EQ(*requeue, seconds(60));

  now_ += seconds(60);
  Reconcile("mlp");
  EXPECT_EQ(client_->Get(kTrainingJobs, "default", "mlp").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(PodNames("mlp"), Names{});  // ownerReferences cascade
  EXPECT_EQ(client_->Get(kSecrets, "default", "mlp-token").status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(Reconcile("mlp"));       // a deleted job is nothing to do
}

TEST_F(ReconcileTest, InvalidSpecFailsWithTheLaunchersMessageAndNoPods) {
  CreateJob("bad", R"({"workers":{"replicas":-2,"command":["w"]},"sliceBytes":"4MB"})");
  Reconcile("bad");
  Json job = GetJob("bad");
  EXPECT_EQ(Str(job, {"status", "phase"}), "Failed");
  EXPECT_EQ(Condition(job, "Failed", "reason"), "InvalidSpec");
  EXPECT_EQ(Condition(job, "Failed", "message"),
            "spec.workers.replicas: must be >= 1, got -2\n"
            "spec.sliceBytes: must be a number of bytes or a quantity such as 512Ki, 4Mi or 1Gi, got \"4MB\"");
  EXPECT_EQ(PodNames("bad"), Names{});
  Reconcile("bad");  // idempotent: nothing changes, no second event
  EXPECT_EQ(client_->List(kEvents, "default")->at("items").size(), 1u);
}

TEST_F(ReconcileTest, RestartedOperatorMidJobCreatesNoDuplicatePods) {
  CreateJob("mlp", kTwoByTwo);
  Reconcile("mlp");
  SetPodPhase("mlp-worker-1", "Running");
  // A new operator process: fresh reconciler, no memory of the first.
  reconciler_ = std::make_unique<Reconciler>(*client_, OperatorSettings{}, [this] { return now_; });
  Reconcile("mlp");
  Reconcile("mlp");
  EXPECT_EQ(PodNames("mlp").size(), 5u);
  Json created = Stats().at("created");
  EXPECT_EQ(created.at("Pod").size(), 5u) << created.serialize();
  EXPECT_EQ(created.at("Secret").size(), 1u);  // the token is not regenerated
}

TEST_F(ReconcileTest, FailingWorkerUnderOnFailureIsRecreatedThenBackoffLimitFailsTheJob) {
  CreateJob("mlp", kTwoByTwo);  // OnFailure (default), backoffLimit 1
  Reconcile("mlp");
  SetAllPodsPhase("mlp", "Running");
  Reconcile("mlp");
  const std::string uid0 = Str(*client_->Get(kPods, "default", "mlp-worker-1"), {"metadata", "uid"});
  SetPodPhase("mlp-worker-1", "Failed", 1);
  Reconcile("mlp");
  Json job = GetJob("mlp");
  EXPECT_EQ(Str(job, {"status", "phase"}), "Restarting");
  EXPECT_EQ(Int(job, {"status", "restarts"}), 1);
  Reconcile("mlp");  // the failed pod is gone: recreated under the same name
  auto pod = client_->Get(kPods, "default", "mlp-worker-1");
  ASSERT_TRUE(pod.ok());
  EXPECT_NE(Str(*pod, {"metadata", "uid"}), uid0);
  SetPodPhase("mlp-worker-1", "Running");
  Reconcile("mlp");
  EXPECT_EQ(Phase("mlp"), "Running");

  SetPodPhase("mlp-worker-0", "Failed", 2);
  Reconcile("mlp");
  job = GetJob("mlp");
  EXPECT_EQ(Str(job, {"status", "phase"}), "Failed");
  EXPECT_EQ(Condition(job, "Failed", "reason"), "BackoffLimitExceeded");
  EXPECT_EQ(PodNames("mlp"), Names{"mlp-worker-0"});  // running pods cleaned up, the failed one kept
}

// With the operator's cache (its watches), the pod watch can lag the job's: the round right after
// a failed pod's delete may still find it Failed in the cache. It is not judged again -- a second
// failure toward backoffLimit failed the job (k8s.lifecycle, once, on a loaded CI machine) and
// no replacement was ever made.
TEST_F(ReconcileTest, AFailedPodItDeletedIsNotCountedAgainWhileTheCacheLags) {
  ObjectCache cache;
  Reconciler reconciler(*client_, OperatorSettings{}, [this] { return now_; }, {}, &cache);
  auto sync = [&](ObjectStore& store, const Resource& r) {  // what the watches would have told
    auto list = client_->List(r, "default");
    ASSERT_TRUE(list.ok()) << list.status().message();
    store.Replace(*list);
    store.MarkSynced();
  };
  auto reconcile = [&] {
    auto r = reconciler.Reconcile("default", "mlp");
    EXPECT_TRUE(r.ok()) << r.status().message();
  };
  CreateJob("mlp", kTwoByTwo);  // OnFailure (default), backoffLimit 1
  sync(cache.jobs, kTrainingJobs);
  sync(cache.pods, kPods);
  reconcile();
  SetAllPodsPhase("mlp", "Running");
  sync(cache.pods, kPods);
  reconcile();
  ASSERT_EQ(Phase("mlp"), "Running");
  const std::string uid0 = Str(*client_->Get(kPods, "default", "mlp-worker-1"), {"metadata", "uid"});
  SetPodPhase("mlp-worker-1", "Failed", 1);
  sync(cache.pods, kPods);
  reconcile();
  EXPECT_EQ(Phase("mlp"), "Restarting");
  EXPECT_FALSE(client_->Get(kPods, "default", "mlp-worker-1").ok()) << "deleted";

  reconcile();  // the cache still has the failed pod, as it was
  Json job = GetJob("mlp");
  EXPECT_EQ(Str(job, {"status", "phase"}), "Restarting") << job.serialize();
  EXPECT_EQ(Int(job, {"status", "restarts"}), 1);
  EXPECT_FALSE(client_->Get(kPods, "default", "mlp-worker-1").ok()) << "not made while the old one seems there";

  sync(cache.pods, kPods);  // the watch catches up: gone
  reconcile();
  auto pod = client_->Get(kPods, "default", "mlp-worker-1");
  ASSERT_TRUE(pod.ok()) << "recreated";
  EXPECT_NE(Str(*pod, {"metadata", "uid"}), uid0);
  SetPodPhase("mlp-worker-1", "Running");
  sync(cache.pods, kPods);
  reconcile();
  EXPECT_EQ(Phase("mlp"), "Running");
  EXPECT_EQ(Int(GetJob("mlp"), {"status", "restarts"}), 1);
}

TEST_F(ReconcileTest, DeadlineExceeded) {
  CreateJob("slow", R"({"workers":{"command":["w"]},"runPolicy":{"activeDeadlineSeconds":30}})");
  auto requeue = Reconcile("slow");
  ASSERT_TRUE(requeue);
  EXPECT_EQ(*requeue, seconds(30));
  SetAllPodsPhase("slow", "Running");
  now_ += seconds(30);
  Reconcile("slow");
  Json job = GetJob("slow");
  EXPECT_EQ(Str(job, {"status", "phase"}), "Failed");
  EXPECT_EQ(Condition(job, "Failed", "reason"), "DeadlineExceeded");
  EXPECT_EQ(PodNames("slow"), Names{});
}

TEST_F(ReconcileTest, SuspendDeletesPodsResumeRecreatesThem) {
  CreateJob("mlp", kTwoByTwo);
  Reconcile("mlp");
  SetAllPodsPhase("mlp", "Running");
  Reconcile("mlp");
  auto patched = client_->MergePatch(kTrainingJobs, "default", "mlp",
                                     *ParseJson(R"({"spec":{"runPolicy":{"suspend":true}}})"));
  ASSERT_TRUE(patched.ok()) << patched.status().message();
  Reconcile("mlp");
  EXPECT_EQ(Phase("mlp"), "Suspended");
  EXPECT_EQ(PodNames("mlp"), Names{});
  ASSERT_TRUE(client_->MergePatch(kTrainingJobs, "default", "mlp",
                                  *ParseJson(R"({"spec":{"runPolicy":{"suspend":false}}})")).ok());
  Reconcile("mlp");
  Json job = GetJob("mlp");
  EXPECT_EQ(Str(job, {"status", "phase"}), "Pending");
  EXPECT_EQ(Condition(job, "Suspended"), "False");
  EXPECT_EQ(PodNames("mlp").size(), 5u);
}

// The scheduler as the reconciler sees it while a suspended job writes its exit checkpoint.
class FakeStopper : public SchedulerCalls {
 public:
  StatusOr<v1::JobProgress> StopJob(const Json& job, const std::string& reason) override {
    ++calls;
    last_job = Str(job, {"metadata", "name"});
    last_reason = reason;
    return answer;
  }
  StatusOr<v1::JobProgress> Progress(const Json& job) override {
    ++progress_calls;
    last_job = Str(job, {"metadata", "name"});
    return answer;
  }
  StatusOr<v1::ResizeResponse> Resize(const Json& job, int workers, const std::string& reason,
                                      int servers) override {
    ++resize_calls;
    last_job = Str(job, {"metadata", "name"});
    last_reason = reason;
    resized_to = workers;
    servers_to = servers;
    return resize_answer;
  }
  StatusOr<v1::JobProgress> answer = v1::JobProgress();
  StatusOr<v1::ResizeResponse> resize_answer = v1::ResizeResponse();
  int calls = 0, progress_calls = 0, resize_calls = 0, resized_to = 0, servers_to = 0;
  std::string last_job, last_reason;
};

// spec.runPolicy.suspend set to `on`, five seconds later on the fake clock.
void SetSuspend(KubeClient& client, Clock::time_point* now, bool on) {
  ASSERT_TRUE(client.MergePatch(kTrainingJobs, "default", "mlp",
                                *ParseJson(std::string(R"({"spec":{"runPolicy":{"suspend":)") + (on ? "true" : "false") + "}}}"))
                  .ok());
  *now += std::chrono::seconds(5);
}

// A suspended job with checkpoints keeps its pods until rank 0's exit checkpoint is written
// (docs/checkpoints.md#on-kubernetes): the scheduler is asked to stop the job, the status says
// Stopping, and the pods go once the checkpoint is reported (or the grace passes).
TEST_F(ReconcileTest, SuspendWaitsForTheExitCheckpointBeforeDeletingThePods) {
  FakeStopper stopper;
  reconciler_ = std::make_unique<Reconciler>(*client_, OperatorSettings{}, [this] { return now_; },
                                             ReconcileObserver{}, nullptr, &stopper);
  constexpr char kWithCheckpoints[] = R"({"image":"img:1","servers":{"replicas":2},"workers":{"replicas":2,"command":["w"]},
      "checkpoint":{"path":"/ckpt","intervalSteps":100},"runPolicy":{"terminationGracePeriodSeconds":20}})";
  CreateJob("mlp", kWithCheckpoints);
  Reconcile("mlp");
  SetAllPodsPhase("mlp", "Running");
  Reconcile("mlp");
  EXPECT_EQ(stopper.calls, 0) << "a running job is not stopped";
  ASSERT_TRUE(client_->MergePatch(kTrainingJobs, "default", "mlp",
                                  *ParseJson(R"({"spec":{"runPolicy":{"suspend":true}}})")).ok());
  // Rank 0 runs a Checkpointer and has not written the exit checkpoint yet: the pods stay.
  v1::JobProgress writing;
  writing.set_exit_ready(true);
  writing.set_stopping(true);
  writing.mutable_checkpoint()->set_step(200);
  writing.mutable_checkpoint()->set_path("/ckpt/model-000000000200.ckpt");
  stopper.answer = writing;
  auto again = Reconcile("mlp");
  EXPECT_EQ(stopper.calls, 1);
  EXPECT_EQ(stopper.last_reason, "the job was suspended (spec.runPolicy.suspend)");
  EXPECT_EQ(Phase("mlp"), "Suspended");
  EXPECT_EQ(Condition(GetJob("mlp"), "Stopping"), "True");
  EXPECT_EQ(PodNames("mlp").size(), 5u) << "rank 0 is writing the exit checkpoint";
  ASSERT_TRUE(again.has_value());
  EXPECT_LE(*again, std::chrono::seconds(1)) << "looked at again soon";
  EXPECT_EQ(Int(GetJob("mlp"), {"status", "checkpoint", "step"}), 200);

  // The exit checkpoint is reported: the pods go, the status and an Event say which it is.
  now_ += seconds(3);
  writing.mutable_checkpoint()->set_step(233);
  writing.mutable_checkpoint()->set_path("/ckpt/model-000000000233.ckpt");
  writing.mutable_checkpoint()->set_on_exit(true);
  stopper.answer = writing;
  Reconcile("mlp");
  EXPECT_EQ(PodNames("mlp"), Names{});
  Json job = GetJob("mlp");
  EXPECT_EQ(Condition(job, "Stopping"), "False");
  EXPECT_EQ(Int(job, {"status", "checkpoint", "step"}), 233);
  EXPECT_TRUE(Bool(job, {"status", "checkpoint", "onExit"}));
  bool evented = false;
  for (const Json& e : Events()) {
    if (Str(e, {"reason"}) != "ExitCheckpointWritten") continue;
    evented = true;
    EXPECT_NE(Str(e, {"message"}).find("exit checkpoint of step 233 written (/ckpt/model-000000000233.ckpt, 3 s"),
              std::string::npos)
        << Str(e, {"message"});
  }
  EXPECT_TRUE(evented);
  const int calls = stopper.calls;
  Reconcile("mlp");
  EXPECT_EQ(stopper.calls, calls) << "settled: the scheduler is not asked again";

  // Resumed, then suspended again: a rank 0 that never writes it gets the grace, no more.
  SetSuspend(*client_, &now_, false);
  Reconcile("mlp");
  SetAllPodsPhase("mlp", "Running");
  Reconcile("mlp");
  SetSuspend(*client_, &now_, true);
  writing.mutable_checkpoint()->set_on_exit(false);
  stopper.answer = writing;
  Reconcile("mlp");
  EXPECT_EQ(PodNames("mlp").size(), 5u);
  EXPECT_EQ(Condition(GetJob("mlp"), "Stopping"), "True");
  now_ += seconds(19);
  Reconcile("mlp");
  EXPECT_EQ(PodNames("mlp").size(), 5u);
  now_ += seconds(1);
  Reconcile("mlp");
  EXPECT_EQ(PodNames("mlp"), Names{}) << "the grace (20 s) has passed";
  job = GetJob("mlp");
  EXPECT_EQ(Condition(job, "Stopping"), "False");
  EXPECT_EQ(Int(job, {"status", "checkpoint", "step"}), 233) << "the newest checkpoint stays";

  // A scheduler the operator cannot reach is not waited for the whole grace: the pods' agents ask
  // it themselves when they are stopped.
  SetSuspend(*client_, &now_, false);
  Reconcile("mlp");
  SetAllPodsPhase("mlp", "Running");
  Reconcile("mlp");
  SetSuspend(*client_, &now_, true);
  stopper.answer = UnavailableError("connection refused");
  Reconcile("mlp");
  EXPECT_EQ(PodNames("mlp").size(), 5u);
  now_ += seconds(2);
  Reconcile("mlp");
  EXPECT_EQ(PodNames("mlp").size(), 5u) << "a scheduler pod restarting may answer in a moment";
  now_ += seconds(1);
  Reconcile("mlp");
  EXPECT_EQ(PodNames("mlp"), Names{});
  job = GetJob("mlp");
  EXPECT_EQ(Condition(job, "Stopping"), "False");
  bool unreachable = false;
  for (const Json& e : Events()) {
    if (Str(e, {"reason"}) != "SchedulerUnreachable") continue;
    unreachable = true;
    EXPECT_NE(Str(e, {"message"}).find("the operator cannot reach the job's scheduler (connection refused)"),
              std::string::npos) << Str(e, {"message"});
  }
  EXPECT_TRUE(unreachable);

  // A program whose rank 0 writes no exit checkpoint (no Checkpointer, no TrainingState) is not
  // waited for.
  SetSuspend(*client_, &now_, false);
  Reconcile("mlp");
  SetAllPodsPhase("mlp", "Running");
  Reconcile("mlp");
  SetSuspend(*client_, &now_, true);
  stopper.answer = v1::JobProgress();
  Reconcile("mlp");
  EXPECT_EQ(PodNames("mlp"), Names{});
}

// Resumed while rank 0 writes the exit checkpoint: the scheduler stops the job all the same, so
// the pods still go once it is written, and their replacements resume from it.
TEST_F(ReconcileTest, ResumedWhileTheExitCheckpointIsWrittenRestartsThePodsAfterIt) {
  FakeStopper stopper;
  reconciler_ = std::make_unique<Reconciler>(*client_, OperatorSettings{}, [this] { return now_; },
                                             ReconcileObserver{}, nullptr, &stopper);
  CreateJob("mlp", R"({"image":"img:1","workers":{"replicas":1,"command":["w"]},"checkpoint":{"path":"/ckpt"}})");
  Reconcile("mlp");
  SetAllPodsPhase("mlp", "Running");
  Reconcile("mlp");
  const Names running = PodNames("mlp");
  ASSERT_EQ(running.size(), 3u);
  ASSERT_TRUE(client_->MergePatch(kTrainingJobs, "default", "mlp",
                                  *ParseJson(R"({"spec":{"runPolicy":{"suspend":true}}})")).ok());
  v1::JobProgress writing;
  writing.set_exit_ready(true);
  stopper.answer = writing;
  Reconcile("mlp");
  ASSERT_EQ(Condition(GetJob("mlp"), "Stopping"), "True");
  ASSERT_TRUE(client_->MergePatch(kTrainingJobs, "default", "mlp",
                                  *ParseJson(R"({"spec":{"runPolicy":{"suspend":false}}})")).ok());
  now_ += seconds(1);
  Reconcile("mlp");
  EXPECT_EQ(PodNames("mlp"), running) << "held: rank 0 is still writing";
  writing.mutable_checkpoint()->set_step(40);
  writing.mutable_checkpoint()->set_path("/ckpt/model-000000000040.ckpt");
  writing.mutable_checkpoint()->set_on_exit(true);
  stopper.answer = writing;
  Reconcile("mlp");
  EXPECT_EQ(PodNames("mlp"), Names{}) << "the stopped job's pods go";
  EXPECT_EQ(Condition(GetJob("mlp"), "Stopping"), "False");
  Reconcile("mlp");
  EXPECT_EQ(PodNames("mlp").size(), 3u) << "and come back to resume from the exit checkpoint";
}

// Checkpoints on no volume die with the pods: said once, when the job's objects are created.
// A short resumed run can end between two of the progress poller's rounds: the job's final
// status still says where it resumed from and its last checkpoint, asked of its scheduler once
// as it ends.
TEST_F(ReconcileTest, AnEndingJobTakesItsSchedulersLastProgressIntoItsStatus) {
  FakeStopper stopper;
  reconciler_ = std::make_unique<Reconciler>(*client_, OperatorSettings{}, [this] { return now_; },
                                             ReconcileObserver{}, nullptr, &stopper);
  CreateJob("mlp", kTwoByTwo);
  Reconcile("mlp");
  SetAllPodsPhase("mlp", "Running");
  now_ += seconds(5);
  Reconcile("mlp");
  EXPECT_EQ(stopper.progress_calls, 0) << "a running job's progress is the poller's";
  EXPECT_EQ(At(GetJob("mlp"), {"status", "resumedFrom"}), nullptr);

  v1::JobProgress last;
  last.set_reported(true);
  last.set_step(250);
  last.set_total_steps(256);
  last.set_samples_per_second(3000);
  last.set_eta_seconds(1);
  last.mutable_resumed_from()->set_step(96);
  last.mutable_resumed_from()->set_path("/ckpt/model-000000000096.ckpt");
  last.mutable_checkpoint()->set_step(224);
  last.mutable_checkpoint()->set_path("/ckpt/model-000000000224.ckpt");
  stopper.answer = last;
  SetPodPhase("mlp-worker-0", "Succeeded", 0);
  SetPodPhase("mlp-worker-1", "Succeeded", 0);
  now_ += seconds(2);
  Reconcile("mlp");
  Json job = GetJob("mlp");
  EXPECT_EQ(Str(job, {"status", "phase"}), "Succeeded");
  EXPECT_EQ(stopper.progress_calls, 1);
  EXPECT_EQ(stopper.last_job, "mlp");
  EXPECT_EQ(Int(job, {"status", "resumedFrom", "step"}), 96);
  EXPECT_EQ(Str(job, {"status", "resumedFrom", "path"}), "/ckpt/model-000000000096.ckpt");
  EXPECT_EQ(Int(job, {"status", "checkpoint", "step"}), 224);
  // The end's progress, not the running figures.
  EXPECT_EQ(Int(job, {"status", "progress", "step"}), 256);
  EXPECT_EQ(At(job, {"status", "progress", "samplesPerSecond"}), nullptr);
  EXPECT_EQ(At(job, {"status", "progress", "etaSeconds"}), nullptr);
  int resumed = 0;
  for (const Json& e : Events()) {
    if (Str(e, {"reason"}) != "Resumed") continue;
    ++resumed;
    EXPECT_EQ(Str(e, {"message"}), "job mlp resumed from the checkpoint of step 96 (/ckpt/model-000000000096.ckpt)");
  }
  EXPECT_EQ(resumed, 1);
  // Asked once: an ended job's scheduler is not asked again.
  now_ += seconds(5);
  Reconcile("mlp");
  EXPECT_EQ(stopper.progress_calls, 1);

  // A scheduler that does not answer: the job ends all the same.
  CreateJob("mlp2", kTwoByTwo);
  Reconcile("mlp2");
  SetAllPodsPhase("mlp2", "Running");
  Reconcile("mlp2");
  stopper.answer = UnavailableError("connection refused");
  SetPodPhase("mlp2-worker-0", "Succeeded", 0);
  SetPodPhase("mlp2-worker-1", "Succeeded", 0);
  Reconcile("mlp2");
  EXPECT_EQ(Phase("mlp2"), "Succeeded");
  EXPECT_EQ(stopper.progress_calls, 2);
  EXPECT_EQ(At(GetJob("mlp2"), {"status", "resumedFrom"}), nullptr);
}

TEST_F(ReconcileTest, CheckpointsOnNoVolumeGetAWarningOnceAndAVolumeIsMounted) {
  CreateJob("bare", R"({"image":"img:1","workers":{"replicas":1,"command":["w"]},"checkpoint":{"path":"/ckpt"}})");
  CreateJob("kept", R"({"image":"img:1","workers":{"replicas":1,"command":["w"]},
      "checkpoint":{"path":"/ckpt","volume":{"persistentVolumeClaim":{"claimName":"c"}}}})");
  for (int i = 0; i < 2; ++i) {
    Reconcile("bare");
    Reconcile("kept");
  }
  int warned = 0;
  for (const Json& e : Events()) {
    if (Str(e, {"reason"}) != "CheckpointsNotPersistent") continue;
    ++warned;
    EXPECT_EQ(Str(e, {"involvedObject", "name"}), "bare");
    EXPECT_EQ(Str(e, {"type"}), "Warning");
    EXPECT_NE(Str(e, {"message"}).find("spec.checkpoint.path /ckpt is on no volume"), std::string::npos);
  }
  EXPECT_EQ(warned, 1);
  auto pod = client_->Get(kPods, "default", "kept-worker-0");
  ASSERT_TRUE(pod.ok());
  EXPECT_NE(pod->serialize().find(R"("claimName":"c")"), std::string::npos) << pod->serialize();
}

TEST_F(ReconcileTest, JobResizedWhileSuspendedResumesWithTheNewSizeAndJobFile) {
  CreateJob("mlp", kTwoByTwo);
  Reconcile("mlp");
  ASSERT_TRUE(client_->MergePatch(kTrainingJobs, "default", "mlp",
                                  *ParseJson(R"({"spec":{"runPolicy":{"suspend":true}}})")).ok());
  Reconcile("mlp");
  ASSERT_TRUE(client_->MergePatch(kTrainingJobs, "default", "mlp",
                                  *ParseJson(R"({"spec":{"workers":{"replicas":3},"runPolicy":{"suspend":false}}})"))
                  .ok());
  Reconcile("mlp");
  EXPECT_EQ(PodNames("mlp"), (Names{"mlp-scheduler", "mlp-server-0", "mlp-server-1", "mlp-worker-0", "mlp-worker-1",
                                    "mlp-worker-2"}));
  auto cm = client_->Get(kConfigMaps, "default", "mlp-config");
  ASSERT_TRUE(cm.ok());
  auto spec = ParseJobSpec(Str(*cm, {"data", "job.yaml"}));
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->workers.replicas, 3);  // the restarted scheduler expects 3 workers
}

// An elastic job (docs/elastic.md#resizing-a-job-on-kubernetes) resized while suspended: its
// world was 2, the next run's pods and job file are 3.
TEST_F(ReconcileTest, ElasticJobResizedWhileSuspendedResumesWithTheNewSizeAndJobFile) {
  CreateJob("el", R"({"image":"img:1","servers":{"replicas":1},"workers":{"replicas":2,"command":["w"]},
      "elastic":{"minWorkers":1,"maxWorkers":3}})");
  Reconcile("el");
  EXPECT_EQ(Int(GetJob("el"), {"status", "world", "workers"}), 2);
  ASSERT_TRUE(client_->MergePatch(kTrainingJobs, "default", "el",
                                  *ParseJson(R"({"spec":{"runPolicy":{"suspend":true}}})")).ok());
  Reconcile("el");
  ASSERT_TRUE(client_->MergePatch(kTrainingJobs, "default", "el",
                                  *ParseJson(R"({"spec":{"workers":{"replicas":3},"runPolicy":{"suspend":false}}})"))
                  .ok());
  Reconcile("el");
  EXPECT_EQ(PodNames("el"), (Names{"el-scheduler", "el-server-0", "el-worker-0", "el-worker-1", "el-worker-2"}));
  EXPECT_EQ(Int(GetJob("el"), {"status", "world", "workers"}), 3);
  auto cm = client_->Get(kConfigMaps, "default", "el-config");
  ASSERT_TRUE(cm.ok());
  auto spec = ParseJobSpec(Str(*cm, {"data", "job.yaml"}));
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->workers.replicas, 3);
}

TEST_F(ReconcileTest, StatusWriteConflictIsRetriedFromAFreshRead) {
  CreateJob("mlp", kTwoByTwo);
  // Someone edits the job between the reconciler's read and its status write (the clock is read
  // in between): the first write gets 409 Conflict; the retry reads again and wins.
  int calls = 0;
  reconciler_ = std::make_unique<Reconciler>(*client_, OperatorSettings{}, [&] {
    if (calls++ == 0) {
      EXPECT_TRUE(client_->MergePatch(kTrainingJobs, "default", "mlp",
                                      *ParseJson(R"({"metadata":{"labels":{"edited":"yes"}}})")).ok());
    }
    return now_;
  });
  Reconcile("mlp");  // without the retry this returns ABORTED and the helper fails the test
  Json job = GetJob("mlp");
  EXPECT_EQ(Str(job, {"status", "phase"}), "Pending");
  EXPECT_EQ(Str(job, {"metadata", "labels", "edited"}), "yes");
  EXPECT_GE(calls, 2);
  EXPECT_EQ(PodNames("mlp").size(), 5u);
}

}  // namespace
}  // namespace trellis::op::testing
